"""Helpers shared by the agent tests (a unique module name: tests/ has no packages)."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Environment variables that change numerics: tests set them explicitly or not at all.
NUMERIC_PREFIXES = ("OMP_", "MKL_", "KMP_", "ATEN_", "PYTORCH_", "NUMPARITY_")


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NUMERIC_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.update(overrides)
    return env


def run_agent(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    """`python -m numparity_agent ARGS` in a fresh interpreter with a clean environment."""
    return subprocess.run(
        [sys.executable, "-m", "numparity_agent", *args],
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
