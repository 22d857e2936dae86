"""Fake GPUs in every Python process started with this folder on PYTHONPATH and
NUMPARITY_TEST_FAKE_GPUS set (see fake_gpus.py): the agent and its children."""

import os

if os.environ.get("NUMPARITY_TEST_FAKE_GPUS"):
    import fake_gpus

    fake_gpus.install()
