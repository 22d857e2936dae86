"""The agent synchronises the device it measured, never torch's current one (issue 42,
item 10): `torch.cuda.synchronize()` without a device waits for cuda:0 (and creates a
context there), so a timing on cuda:2 would stop its clock before cuda:2 finished, and a
traced pass would hash copies from cuda:2 that have not arrived.

The GPU is not there: tensors say they are on cuda:2 and compute on the CPU, and the
runtime records every synchronisation (tests/helpers/fake_cuda/on_gpu.py).
"""

from types import SimpleNamespace

import torch
from helpers.fake_cuda.on_gpu import FakeCudaRuntime, on_gpu
from torch import nn

from numparity_agent import _child, _trace
from numparity_agent._fingerprint import tensor_hash
from numparity_agent._trace import DeferredHashes
from numparity_agent._workloads._base import Built, Recorder, Workload
from numparity_agent.testing import run_workload, variant

GPU = torch.device("cuda", 2)


class Squares(Workload):
    """A workload whose tensors are on a given device: x, and the column sums of x*x."""

    name = "squares"

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        x = torch.linspace(-1.0, 1.0, 4096, dtype=torch.float64).to(dtype).reshape(64, 64)
        return Built(model=nn.Identity(), inputs={"x": on_gpu(x, device)})

    def run(self, built: Built, recorder: Recorder) -> None:
        x = built.inputs["x"]
        recorder.record("output", "output", (x * x).sum(0))


def test_a_timed_run_waits_for_the_device_it_ran_on(monkeypatch):
    with FakeCudaRuntime(monkeypatch) as cuda:
        result = run_workload(Squares(), variant=variant("default"), device=GPU, repeats=2)
    assert result["status"] == "ok", result
    # Around each repeat's build and its timed run: cuda:2, every time.
    assert len(cuda.synchronized) >= 3 * 2
    assert set(cuda.synchronized) == {GPU}
    # And what was measured is what the CPU computes (the oracle).
    x = torch.linspace(-1.0, 1.0, 4096, dtype=torch.float64).to(torch.float32).reshape(64, 64)
    (output,) = [t for t in result["tensors"] if t["name"] == "output"]
    assert output["hash"] == tensor_hash((x * x).sum(0))


def test_a_traced_pass_waits_for_the_device_its_copies_come_from(monkeypatch):
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with FakeCudaRuntime(monkeypatch) as cuda:
        pending = DeferredHashes()
        index = pending.add(on_gpu(values, GPU))
        assert cuda.synchronized == []  # copied without waiting
        (reference, dtype, shape), = pending.resolve()
    assert cuda.synchronized == [GPU]
    assert index == 0 and dtype == "float32" and shape == [3, 4]
    assert reference == _trace.reference(tensor_hash(values))


def test_a_childs_device_initialisation_waits_for_its_own_device():
    """The child's `device_init` phase: CUDA initialised, one allocation on the device,
    and that device synchronised (a fake runtime, as a CPU build has none)."""
    calls: list[tuple[str, object]] = []
    cuda = SimpleNamespace(
        is_available=lambda: True, init=lambda: calls.append(("init", None)),
        synchronize=lambda device=None: calls.append(("synchronize", device)))
    fake_torch = SimpleNamespace(
        cuda=cuda, empty=lambda *shape, device=None: calls.append(("empty", device)))
    _child._init_device(fake_torch, GPU)
    assert calls == [("init", None), ("empty", GPU), ("synchronize", GPU)]
