"""Helpers shared by the agent tests (a unique module name: tests/ has no packages)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parents[1] / "agent"
# sitecustomize.py, fake_gpus.py and pynvml.py: fake GPUs for the agent's processes.
FAKE_CUDA = Path(__file__).resolve().parent / "fake_cuda"

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


def fake_gpu(n: int, **fields: object) -> dict[str, object]:
    """Fake GPU number `n` of fake_cuda/fake_gpus.py: an A100 with its own UUID, serial
    and PCI bus id, and the node's 2 threads, unless `fields` say otherwise."""
    return {"uuid": f"GPU-00000000-0000-4000-8000-{n:012x}", "serial": f"13202210{n:05d}",
            "pci_bus_id": f"00000000:{7 + n:02X}:00.0", "name": "NVIDIA A100-SXM4-80GB",
            "cc": "8.0", "threads": 2, **fields}


def fake_gpu_env(gpus: list[dict[str, object]], **overrides: str) -> dict[str, str]:
    """clean_env for an agent on a node with the fake `gpus` (fake_cuda/fake_gpus.py)."""
    env = clean_env(**overrides)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_CUDA), env["PYTHONPATH"]])
    env["NUMPARITY_TEST_FAKE_GPUS"] = json.dumps(gpus)
    return env
