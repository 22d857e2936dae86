"""The environment key under a scheduler (issue 42, 9 and 12): which devices Slurm or
Kubernetes exposed (`CUDA_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`, `SLURM_*`) is not the
environment, so identical nodes keep one key whatever their allocation; what NCCL is
told to do is (its algorithm decides a collective's rounding).

Real agent processes; the GPUs of the fake-GPU cases are fakes at the edge
(tests/helpers/fake_cuda: torch.cuda and NVML for two A100s)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.agent import clean_env, fake_gpu, fake_gpu_env

from numparity_agent._environment import compute_env_key

NODE = [fake_gpu(0), fake_gpu(1)]


def _agents(*runs: tuple[list[str], dict[str, str]]) -> list[str]:
    """Agents started together (their torch imports overlap): each one's stdout."""
    processes = [subprocess.Popen([sys.executable, "-m", "numparity_agent", *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for args, env in runs]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        outputs.append(out)
    return outputs


def test_two_runs_given_gpu_0_and_gpu_1_without_a_gpu_have_one_environment_key(tmp_path):
    runs = []
    for visible in ("0", "1"):
        args = ["run", "--workloads", "mlp", "--variants", "default", "--repeats", "1",
                "--device", "cpu", "--output", str(tmp_path / f"run-{visible}.json")]
        runs.append((args, clean_env(CUDA_VISIBLE_DEVICES=visible, SLURM_JOB_GPUS=visible,
                                     ROCR_VISIBLE_DEVICES=visible)))
    _agents(*runs)
    environments = [json.loads((tmp_path / f"run-{v}.json").read_text())["environment"]
                    for v in ("0", "1")]
    for environment in environments:
        assert not {"CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "ROCR_VISIBLE_DEVICES"} \
            & set(environment["env_vars"])
    assert environments[0]["env_key"] == environments[1]["env_key"]


def test_a_node_is_one_environment_whichever_of_its_gpus_an_allocation_shows():
    """Allocations `1` and `0,1` of two identical GPUs: one key; the GPUs each
    process saw are still listed, with their UUIDs. A GPU of another model is another
    environment."""
    allocations = ("1", "0,1")
    outputs = _agents(*[(["env"], fake_gpu_env(NODE, CUDA_VISIBLE_DEVICES=visible,
                                               SLURM_STEP_GPUS=visible))
                        for visible in allocations])
    documents = {v: json.loads(out) for v, out in zip(allocations, outputs, strict=True)}
    assert len({d["env_key"] for d in documents.values()}) == 1
    assert [g["uuid"] for g in documents["1"]["gpus"]] == [str(NODE[1]["uuid"])[4:]]
    assert len(documents["0,1"]["gpus"]) == 2
    other = json.loads(json.dumps(documents["0,1"]))
    other["gpus"][1]["name"] = "NVIDIA H100 80GB HBM3"
    assert compute_env_key(other) != documents["0,1"]["env_key"]


@pytest.mark.parametrize(("name", "value", "numeric"), [
    ("NCCL_ALGO", "Ring", True),
    ("NCCL_NVLS_ENABLE", "0", True),
    ("NCCL_DEBUG", "INFO", False),
])
def test_nccl_variables_that_change_reductions_are_part_of_the_environment(
        name: str, value: str, numeric: bool) -> None:
    from numparity_agent._knobs import numeric_env_vars

    assert (name in numeric_env_vars({name: value})) is numeric


# cuBLAS and cuBLASLt as a CUDA toolkit ships them, reduced to the calls that say their
# version (the fake at the edge: there is no CUDA here).
_FAKE_CUBLAS = """
int cublasGetProperty(int type, int *value) {
    static const int version[3] = {12, 4, 5};
    if (type < 0 || type > 2) return 7;
    *value = version[type];
    return 0;
}
"""
_FAKE_CUBLASLT = "unsigned long cublasLtGetVersion(void) { return 120405; }\n"


def test_the_cublas_libraries_a_process_loaded_are_in_its_environment(tmp_path):
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the fake cuBLAS libraries with")
    for name, source in (("libcublas.so.12", _FAKE_CUBLAS),
                         ("libcublasLt.so.12", _FAKE_CUBLASLT)):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / name),
                        str(tmp_path / f"{name}.c")], check=True, timeout=120)
    code = ("import ctypes, json, sys\n"
            f"for name in ('libcublas.so.12', 'libcublasLt.so.12'):\n"
            f"    ctypes.CDLL({str(tmp_path)!r} + '/' + name, mode=ctypes.RTLD_GLOBAL)\n"
            "from numparity_agent._environment import capture_environment\n"
            "environment = capture_environment()\n"
            "print(json.dumps([environment['torch'], environment['unknown']]))\n")
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    torch_section, unknown = json.loads(done.stdout)
    assert torch_section["cublas"] == "12.4.5" and torch_section["cublaslt"] == "12.4.5"
    assert not [key for key in unknown if "cublas" in key]
