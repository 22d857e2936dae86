"""Helpers shared by the tests: imported as ``helpers.<module>``, never from a test module.

``tests/`` is on ``sys.path`` (pytest's rootdir conftest), so this package is importable
from every test folder. User-workload modules that the agent loads by ``module:factory``
(``tests/agent/agent_test_workloads.py``, ``tests/e2e/crafted_pairs.py`` …) stay next to
the tests that run them: they are inputs of the agent, not helpers.
"""
