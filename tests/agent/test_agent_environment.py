"""The environment document (design §2.5 and the pinned interface)."""

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers.agent import A100, clean_env, run_agent

from numparity_agent._environment import capture_environment, compute_env_key

TOP_KEYS = {
    "env_key",
    "python",
    "platform",
    "cpu",
    "threads",
    "torch",
    "numpy",
    "knobs",
    "env_vars",
    "gpus",
    "unknown",
}


def test_document_has_the_pinned_shape():
    env = capture_environment(env_vars={})
    assert set(env) == TOP_KEYS
    assert set(env["cpu"]) == {
        "model",
        "flags",
        "logical_cpus",
        "capability",
        "aten_cpu_capability_env",
    }
    assert set(env["threads"]) == {"num_threads", "num_interop_threads", "parallel_info"}
    assert {
        "version",
        "git_version",
        "config",
        "cuda",
        "cudnn",
        "nccl",
        "mkldnn_available",
        "mkl_available",
        "openmp_available",
    } <= set(env["torch"])
    assert env["torch"]["version"] == torch.__version__
    assert env["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["cpu"]["flags"].split() == sorted(set(env["cpu"]["flags"].split()))
    assert env["knobs"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert env["gpus"] == [] and env["torch"]["cuda"] is None
    assert env["env_key"] == compute_env_key(env)


def test_env_key_ignores_identity_and_unknown_but_not_numerics():
    env = capture_environment(env_vars={})
    renamed = json.loads(json.dumps(env))
    renamed["platform"]["hostname"] = "elsewhere"
    renamed["unknown"] = {"gpus.0.serial": "Not Supported"}
    assert compute_env_key(renamed) == env["env_key"]
    renamed["env_vars"] = {"MKL_CBWR": "COMPATIBLE"}
    assert compute_env_key(renamed) != env["env_key"]


def test_env_command_reports_the_nodes_thread_configuration():
    proc = run_agent("env", env=clean_env(OMP_NUM_THREADS="1", MKL_CBWR="COMPATIBLE"))
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert env["threads"]["num_threads"] == 1
    assert env["env_vars"] == {"MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}


class FakeNVMLError(Exception):
    pass


def fake_gpu(monkeypatch):
    """A GPU that is not there: torch.cuda answers as on an A100 node."""
    props = A100
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)


def test_gpu_properties_and_nvml_fields(monkeypatch):
    fake_gpu(monkeypatch)
    handles = {}

    def serial(handle):
        raise FakeNVMLError("Not Supported")

    pynvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
        nvmlDeviceGetHandleByUUID=lambda uuid: handles.setdefault("uuid", uuid),
        nvmlDeviceGetEccMode=lambda handle: (1, 1),
        nvmlDeviceGetSerial=serial,
    )
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    env = capture_environment(env_vars={})
    (gpu,) = env["gpus"]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB" and gpu["compute_capability"] == "8.0"
    assert gpu["sm_count"] == 108 and gpu["memory_bytes"] == 85_899_345_920
    assert gpu["driver"] == "550.54.15" and gpu["cuda_driver"] == "12.4"
    assert gpu["ecc"] is True and gpu["serial"] is None
    assert handles["uuid"] == "GPU-8f3a2c1e-0000-4000-8000-000000000017"
    assert "Not Supported" in env["unknown"]["gpus.0.serial"]
    # The UUID is identity, not numerics: another card of the same model, same key.
    other = json.loads(json.dumps(env))
    other["gpus"][0]["uuid"] = "another"
    assert compute_env_key(other) == env["env_key"]


def test_gpu_without_nvml_records_unknowns_with_reason(monkeypatch):
    fake_gpu(monkeypatch)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    env = capture_environment(env_vars={})
    assert env["gpus"][0]["driver"] is None
    assert env["unknown"]["gpus.0.driver"] == "nvidia-ml-py (pynvml) not installed"


@pytest.mark.parametrize("name", ["capture_environment", "fingerprint", "run_suite"])
def test_public_surface(name):
    import numparity_agent

    assert callable(getattr(numparity_agent, name))
    assert numparity_agent.__version__ == "0.1.0"


def test_anonymous_devices_report_no_uuid_or_serial(monkeypatch):
    """NUMPARITY_ANONYMOUS_DEVICES: a second agent node on a machine whose GPUs another
    node reports sends them without UUID and serial (no claim on them, design §3.1)."""
    from numparity_agent._environment import without_identity

    gpus = [{"index": 0, "uuid": "GPU-1", "serial": "S1", "name": "A100"}]
    monkeypatch.delenv("NUMPARITY_ANONYMOUS_DEVICES", raising=False)
    assert without_identity([dict(g) for g in gpus]) == gpus
    monkeypatch.setenv("NUMPARITY_ANONYMOUS_DEVICES", "1")
    assert without_identity([dict(g) for g in gpus]) == [
        {"index": 0, "uuid": None, "serial": None, "name": "A100"}]
