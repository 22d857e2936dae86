"""numparity agent: run reference workloads, fingerprint every tensor, upload.

The public surface is small (in the style of httpx): everything else lives in
private modules. Names that need torch are imported lazily, so `import
numparity_agent` (and the CLI's parent process) stays light. Tests and benches drive
the private parts through `numparity_agent.testing` (internal, stable for them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Built", "Recorder", "Workload", "__version__", "capture_environment", "fingerprint",
    "run_suite",
]

if TYPE_CHECKING:
    from numparity_agent._environment import capture_environment
    from numparity_agent._fingerprint import fingerprint
    from numparity_agent._suite import run_suite
    from numparity_agent._workloads._base import Built, Recorder, Workload

_LAZY = {
    "capture_environment": "numparity_agent._environment",
    "fingerprint": "numparity_agent._fingerprint",
    "run_suite": "numparity_agent._suite",
    # What a user workload factory may return instead of (model, inputs): a Workload
    # subclass, whose build gives a Built and whose run records into a Recorder.
    "Built": "numparity_agent._workloads._base",
    "Recorder": "numparity_agent._workloads._base",
    "Workload": "numparity_agent._workloads._base",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'numparity_agent' has no attribute {name!r}")
