"""Helpers shared by the agent tests (a unique module name: tests/ has no packages)."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parents[1] / "agent"

# torch.cuda.get_device_properties of GPUs that are not there (tests fake the edge).
A100 = SimpleNamespace(
    name="NVIDIA A100-SXM4-80GB",
    major=8,
    minor=0,
    multi_processor_count=108,
    total_memory=85_899_345_920,
    uuid="8f3a2c1e-0000-4000-8000-000000000017",
)
V100 = SimpleNamespace(
    name="Tesla V100-SXM2-32GB",
    major=7,
    minor=0,
    multi_processor_count=80,
    total_memory=34_089_730_048,
    uuid="1b2c3d4e-0000-4000-8000-000000000042",
)

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
