"""The environment of a node with two different GPUs, and the knobs of §2.3.

The GPUs are not there: torch.cuda and NVML (pynvml) are replaced at the edge with
fakes that answer as an A100 (8.0) and a V100 (7.0) behind driver 550.
"""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers.agent import A100, V100, clean_env, run_agent

from numparity_agent._environment import capture_environment, compute_env_key
from numparity_agent.testing import read_knobs


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """pynvml as nvidia-ml-py exposes it, for the devices given by UUID."""

    def __init__(self, devices, driver="550.54.15", cuda_driver=12040):
        self.devices = devices  # "GPU-<uuid>" -> {"ecc": (current, pending), "serial": ...}
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.cuda_driver

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.devices:
            raise FakeNVMLError("Not Found")
        return uuid

    def nvmlDeviceGetEccMode(self, handle):
        ecc = self.devices[handle]["ecc"]
        if ecc is None:
            raise FakeNVMLError("Not Supported")
        return ecc

    def nvmlDeviceGetSerial(self, handle):
        return self.devices[handle]["serial"].encode()  # older bindings answer bytes


def two_gpus(monkeypatch, *cards):
    cards = cards or (A100, V100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: cards[index])
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)


def fake_nvml(monkeypatch, **kwargs):
    nvml = FakeNVML(
        {
            f"GPU-{A100.uuid}": {"ecc": (1, 1), "serial": "1320221012345"},
            f"GPU-{V100.uuid}": {"ecc": (0, 1), "serial": "0323918067890"},
        },
        **kwargs,
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


def test_two_gpus_of_different_architecture(monkeypatch):
    two_gpus(monkeypatch)
    nvml = fake_nvml(monkeypatch)
    env = capture_environment(env_vars={})
    assert env["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB",
            "compute_capability": "8.0",
            "sm_count": 108,
            "memory_bytes": 85_899_345_920,
            "uuid": A100.uuid,
            "driver": "550.54.15",
            "cuda_driver": "12.4",
            "ecc": True,
            "serial": "1320221012345",
        },
        {
            "index": 1,
            "name": "Tesla V100-SXM2-32GB",
            "compute_capability": "7.0",
            "sm_count": 80,
            "memory_bytes": 34_089_730_048,
            "uuid": V100.uuid,
            "driver": "550.54.15",
            "cuda_driver": "12.4",
            "ecc": False,  # current mode off (pending on): what is in force counts
            "serial": "0323918067890",
        },
    ]
    assert env["torch"]["nccl"] == "2.21.5" and env["torch"]["cudnn"] == 90100
    assert not [k for k in env["unknown"] if k.startswith("gpus.")]
    assert nvml.calls == ["init", "shutdown"]


def test_env_key_ignores_uuid_and_serial_but_not_the_driver(monkeypatch):
    two_gpus(monkeypatch)
    fake_nvml(monkeypatch)
    before = capture_environment(env_vars={})

    # Both cards replaced by others of the same models: new UUIDs and serials.
    a100 = SimpleNamespace(**{**vars(A100), "uuid": "00000000-0000-4000-8000-0000000000aa"})
    v100 = SimpleNamespace(**{**vars(V100), "uuid": "00000000-0000-4000-8000-0000000000bb"})
    two_gpus(monkeypatch, a100, v100)
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        FakeNVML(
            {
                f"GPU-{a100.uuid}": {"ecc": (1, 1), "serial": "9999"},
                f"GPU-{v100.uuid}": {"ecc": (0, 1), "serial": "8888"},
            }
        ),
    )
    swapped = capture_environment(env_vars={})
    assert [g["serial"] for g in swapped["gpus"]] == ["9999", "8888"]
    assert swapped["env_key"] == before["env_key"]

    fake_nvml(monkeypatch, driver="560.28.03", cuda_driver=12060)
    upgraded = capture_environment(env_vars={})
    assert upgraded["gpus"][0]["driver"] == "560.28.03"
    assert upgraded["gpus"][0]["cuda_driver"] == "12.6"
    assert upgraded["env_key"] != before["env_key"]


def test_env_key_changes_with_the_gpu_model(monkeypatch):
    two_gpus(monkeypatch)
    fake_nvml(monkeypatch)
    mixed = capture_environment(env_vars={})
    two_gpus(monkeypatch, A100, SimpleNamespace(**{**vars(A100), "uuid": V100.uuid}))
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        FakeNVML(
            {
                f"GPU-{A100.uuid}": {"ecc": (1, 1), "serial": "1"},
                f"GPU-{V100.uuid}": {"ecc": (1, 1), "serial": "2"},
            }
        ),
    )
    assert capture_environment(env_vars={})["env_key"] != mixed["env_key"]


def test_nvml_failures_are_unknown_with_the_reason(monkeypatch):
    two_gpus(monkeypatch)
    nvml = FakeNVML({f"GPU-{A100.uuid}": {"ecc": None, "serial": "1320221012345"}})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    env = capture_environment(env_vars={})
    a100, v100 = env["gpus"]
    assert a100["ecc"] is None and "Not Supported" in env["unknown"]["gpus.0.ecc"]
    assert a100["serial"] == "1320221012345"
    assert v100["ecc"] is None and v100["serial"] is None
    assert "no NVML handle" in env["unknown"]["gpus.1.serial"]
    assert v100["driver"] == "550.54.15"  # system-wide, read without a handle


def test_nvml_init_failure_marks_every_nvml_field_unknown(monkeypatch):
    two_gpus(monkeypatch)
    nvml = FakeNVML({})

    def no_driver():
        raise FakeNVMLError("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    env = capture_environment(env_vars={})
    for index in (0, 1):
        for field in ("driver", "cuda_driver", "ecc", "serial"):
            assert env["gpus"][index][field] is None
            assert "Driver Not Loaded" in env["unknown"][f"gpus.{index}.{field}"]
    assert env["gpus"][1]["compute_capability"] == "7.0"  # torch still answered


def test_every_numeric_knob_of_the_design_is_read():
    knobs = read_knobs()
    expected = {
        # the fp32_precision tree of this torch, then the legacy getters
        "fp32_precision",
        "cuda.matmul.fp32_precision",
        "cudnn.conv.fp32_precision",
        "cudnn.rnn.fp32_precision",
        "mkldnn.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "cuda.matmul.allow_tf32",
        "cudnn.allow_tf32",
        "float32_matmul_precision",
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
        # SDPA backends
        "cuda.flash_sdp_enabled",
        "cuda.mem_efficient_sdp_enabled",
        "cuda.math_sdp_enabled",
        "cuda.cudnn_sdp_enabled",
        # determinism, cuDNN, oneDNN, threads
        "cudnn.enabled",
        "cudnn.benchmark",
        "cudnn.deterministic",
        "mkldnn.enabled",
        "deterministic_algorithms",
        "num_threads",
        "num_interop_threads",
        "CUBLAS_WORKSPACE_CONFIG",
    }
    if not hasattr(torch.backends, "fp32_precision"):  # torch < 2.9: legacy API only
        expected = {k for k in expected if "fp32_precision" not in k}
    assert expected <= set(knobs)
    assert knobs["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert knobs["cudnn.benchmark"] is torch.backends.cudnn.benchmark
    assert knobs["cuda.math_sdp_enabled"] is torch.backends.cuda.math_sdp_enabled()
    assert all(v is None or isinstance(v, bool | int | float | str) for v in knobs.values())


MIX_APIS = """
import json, torch
from numparity_agent._environment import capture_environment
# The new API for cuBLAS, then the legacy one on top: the legacy getters now raise.
torch.backends.cuda.matmul.fp32_precision = "tf32"
torch.backends.fp32_precision = "ieee"
print(json.dumps(capture_environment()))
"""


@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 has no fp32_precision"
)
def test_mixed_tf32_apis_are_recorded_as_unknown_not_guessed():
    proc = subprocess.run(
        [sys.executable, "-c", MIX_APIS],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    knobs, unknown = env["knobs"], env["unknown"]
    # The new tree is read first and says what is in force.
    assert knobs["cuda.matmul.fp32_precision"] == "tf32"
    assert knobs["fp32_precision"] == "ieee"
    for legacy in ("cuda.matmul.allow_tf32", "float32_matmul_precision"):
        assert legacy not in knobs
        assert "mix of the legacy and new APIs" in unknown[f"knobs.{legacy}"]
    assert env["env_key"] == compute_env_key(env)


def test_env_command_is_the_capture_of_a_run(cnn_document):
    """`env` and `run` describe the same node the same way: one capture, one env_key."""
    proc = run_agent("env")
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    recorded = cnn_document["environment"]
    assert env["env_key"] == recorded["env_key"]
    assert env["knobs"] == recorded["knobs"]
    assert set(env) == set(recorded)
