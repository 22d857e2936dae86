"""`decoder` and `invariance` (design §2.2): their checks against independent recomputations.

Which operations are batch-invariant depends on the CPU's kernels: every verdict is
checked against the same question asked here directly (torch.equal on the two ways of
computing), never against what this machine happens to do; the distances against
numpy's `nulp_diff`.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# numpy 2 no longer re-exports nulp_diff from numpy.testing; it still lives here.
from numpy.testing._private.utils import nulp_diff

from numparity_agent._workloads import _checks
from numparity_agent._workloads import decoder as decoder_module
from numparity_agent.testing import load_workload, run_workload, variant

CPU = torch.device("cpu")


def _run(name: str, variant_name: str = "default") -> dict[str, Any]:
    kept: dict[str, np.ndarray] = {}
    result = run_workload(load_workload(name), variant=variant(variant_name), device=CPU,
                          repeats=1, keep_values=kept.__setitem__)
    assert result["status"] == "ok", result.get("error")
    result["kept"] = kept  # large tensors' values, by hash
    return result


def test_agreement_counts_ulps_as_numpy_does() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype(np.float32)
    b = a.copy()
    b[::7] = np.nextafter(b[::7], np.float32(np.inf))
    b[3] = np.nextafter(np.nextafter(b[3], np.float32(-np.inf)), np.float32(-np.inf))
    found = _checks.agreement(torch.from_numpy(a), torch.from_numpy(b))
    assert not found["equal"]
    assert found["max_ulp"] == int(nulp_diff(a, b).max()) == 2
    nonzero = b != 0
    expected = float(np.max(np.abs(a.astype(np.float64) - b) / np.abs(b.astype(np.float64)))
                     ) if nonzero.all() else None
    assert found["max_rel"] == pytest.approx(expected, rel=1e-12)
    assert _checks.agreement(torch.from_numpy(a), torch.from_numpy(a.copy())) == {
        "equal": True, "max_ulp": 0, "max_rel": 0.0}
    # A NaN without its match: no distance is defined.
    b[0] = np.nan
    assert _checks.agreement(torch.from_numpy(a), torch.from_numpy(b))["max_ulp"] is None


def test_agreement_across_zero_and_in_the_half_precisions() -> None:
    # Across zero: -1 ULP of 0 to +1 ULP is 2 ULPs (+0 and -0 apart by 0: same value).
    tiny = np.float32(np.nextafter(np.float32(0), np.float32(1)))
    a = np.array([-tiny, 1.0, 0.0], dtype=np.float32)
    b = np.array([tiny, 1.0, -0.0], dtype=np.float32)
    found = _checks.agreement(torch.from_numpy(a), torch.from_numpy(b))
    assert not found["equal"] and found["max_ulp"] == int(nulp_diff(a, b).max()) == 2
    # float16 as numpy counts it; bfloat16 against its float32 widening, by hand: the
    # values 1 and 1 + 2 ** -7 are one bfloat16 ULP apart, 3 ULPs for 1 + 3 * 2 ** -7.
    h = np.array([1.0, 2.0, -3.5], dtype=np.float16)
    g = np.array([np.nextafter(h[0], np.float16(2)), 2.0, -3.5], dtype=np.float16)
    assert _checks.agreement(torch.from_numpy(h), torch.from_numpy(g))["max_ulp"] == int(
        nulp_diff(h, g).max())
    one = torch.tensor([1.0, 1.0], dtype=torch.bfloat16)
    other = torch.tensor([1.0 + 2 ** -7, 1.0 + 3 * 2 ** -7], dtype=torch.bfloat16)
    found = _checks.agreement(other, one)
    assert found["max_ulp"] == 3 and found["max_rel"] == pytest.approx(3 * 2 ** -7)


def test_the_comparison_runs_no_op_a_fault_drill_could_corrupt() -> None:
    """The workloads' own comparisons (`decode_equals_prefill`, batch invariance) are the
    agent's bookkeeping, on the host: none of their arithmetic is a torch op a drill (or a
    device's fault) reaches, so a drill's coverage counts only the computation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from numparity_agent._inject import op_class

    class Classes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if op_class(func) is not None:
                self.found.append(str(func))
            return func(*args, **(kwargs or {}))

    a = torch.linspace(-1, 1, 64)
    b = a.clone()
    b[5] = torch.nextafter(b[5], torch.tensor(2.0))
    with Classes() as seen:
        found = _checks.agreement(a, b)
    assert found["max_ulp"] == 1 and seen.found == []


@pytest.fixture(scope="module")
def decoder() -> dict[str, Any]:
    return _run("decoder")


def _tensor(result: dict[str, Any], name: str) -> np.ndarray:
    entry = next(t for t in result["tensors"] if t["name"] == name)
    if entry["hash"] in result["kept"]:
        flat = result["kept"][entry["hash"]]
    else:
        values = entry["values"]
        flat = np.frombuffer(base64.b64decode(values["data"]),
                             dtype=np.dtype(values["dtype"]).newbyteorder("<"))
    return np.array(flat).reshape(entry["shape"])


def test_the_decoder_model_is_a_causal_lm_whose_decode_is_close_to_its_prefill(
        decoder: dict[str, Any]) -> None:
    names = [t["name"] for t in decoder["tensors"]]
    assert names[0] == "tok_emb" and "blocks.1.attn.sdpa" in names and "lm_head" in names
    assert {"output", "decode.logits", "batch.alone", "batch.batched", "sdpa.math"} <= set(
        names)
    prefill, decoded = _tensor(decoder, "output")[0], _tensor(decoder, "decode.logits")[0]
    torch.testing.assert_close(torch.from_numpy(decoded), torch.from_numpy(prefill),
                               rtol=1e-4, atol=1e-4)
    check = decoder["checks"]["decode_equals_prefill"]
    assert check["equal"] == bool(np.array_equal(decoded.view(np.int32),
                                                 prefill.view(np.int32)))
    if not check["equal"]:
        assert check["max_ulp"] == int(nulp_diff(decoded, prefill).max())


def test_batch_invariance_is_the_two_ways_of_computing_compared(
        decoder: dict[str, Any]) -> None:
    alone, batched = _tensor(decoder, "batch.alone"), _tensor(decoder, "batch.batched")
    torch.testing.assert_close(torch.from_numpy(batched), torch.from_numpy(alone),
                               rtol=1e-4, atol=1e-4)
    check = decoder["checks"]["batch_invariant"]
    assert check["equal"] == bool(np.array_equal(alone.view(np.int32), batched.view(np.int32)))
    assert check["requests"] == list(decoder_module.SIZE.request_lengths)
    if check["equal"]:
        assert check["op"] is None
        return
    # The op named is the first layer whose output for a request differs: asked here of
    # the model directly, for the first linear the input meets.
    built = load_workload("decoder").build(dtype=torch.float32, device=CPU)
    model: Any = built.model
    x = model.blocks[0].norm1(model.tok_emb(built.inputs["request0"]))
    padded = torch.zeros(len(decoder_module.SIZE.request_lengths), max(
        decoder_module.SIZE.request_lengths), dtype=torch.int64)
    for i in range(len(decoder_module.SIZE.request_lengths)):
        request = built.inputs[f"request{i}"][0]
        padded[i, :len(request)] = request
    with torch.no_grad():
        qkv_alone = model.blocks[0].attn.qkv(x)
        qkv_batch = model.blocks[0].attn.qkv(model.blocks[0].norm1(model.tok_emb(padded)))
    first_linear_differs = not torch.equal(qkv_batch[:1, :x.shape[1]], qkv_alone)
    assert (check["op"] == "blocks.0.attn.qkv") == first_linear_differs


def test_attention_backends_are_each_compared_with_math(decoder: dict[str, Any]) -> None:
    check = decoder["checks"]["attention_backends_agree"]
    ran = {t["name"].split(".", 1)[1] for t in decoder["tensors"]
           if t["name"].startswith("sdpa.")}
    assert "math" in ran and set(check["backends"]) == ran - {"math"}
    assert set(check["skipped"]) == set(decoder_module.BACKENDS.values()) - ran
    math = _tensor(decoder, "sdpa.math")
    for name in check["backends"]:
        other = _tensor(decoder, f"sdpa.{name}")
        assert check["backends"][name]["equal"] == bool(np.array_equal(
            other.view(np.int32), math.view(np.int32)))
    # The default path's choice, as torch reports it for these shapes.
    q = torch.zeros(1, decoder_module.SIZE.heads, decoder_module.SIZE.seq,
                    decoder_module.SIZE.head_dim)
    choice = torch._fused_sdp_choice(q, q, q, None, 0.0, True)
    from torch.nn.attention import SDPBackend

    expected = next(v for m, v in decoder_module.BACKENDS.items()
                    if int(getattr(SDPBackend, m)) == int(choice))
    assert check["default"] == expected


def test_the_invariance_probe_answers_what_each_op_does_here() -> None:
    result = _run("invariance")
    verdicts = result["invariance"]
    built = load_workload("invariance").build(dtype=torch.float32, device=CPU)
    x = built.inputs
    direct = {
        "matmul_k4096": lambda n: x["matmul_k4096.x"][:n] @ x["matmul_k4096.w"],
        "layer_norm": lambda n: F.layer_norm(x["norm.x"][:n], (1024,)),
        "sum": lambda n: x["sum.x"][:n].sum(dim=-1),
    }
    with torch.no_grad():
        for name, op in direct.items():
            alone = op(1)[:1]
            invariant = all(torch.equal(op(n)[:1], alone) for n in (8, 64))
            assert verdicts[name]["batch_invariant"] == invariant, name
    breaking = [name for name, v in verdicts.items() if not v["batch_invariant"]]
    check = result["checks"]["batch_invariant"]
    assert check["equal"] == (not breaking) and check["ops"] == breaking
    assert check["op"] == (breaking[0] if breaking else None)
    assert all(v["repeatable"] for v in verdicts.values())  # the CPU is deterministic


def test_the_invariance_probe_records_every_row_of_every_batch() -> None:
    """Each op's batches are recorded whole (and the batch of 64 run again), equal to the
    op computed here directly: a wrong value in any row, not only row 0, is a recorded
    bit the peers' answer does not have."""
    from numparity_agent._workloads._base import Recorder

    workload = load_workload("invariance")
    built = workload.build(dtype=torch.float32, device=CPU)
    recorder = Recorder()
    workload.run(built, recorder)
    recorded = {name: tensor for name, _, tensor in recorder.tensors}
    x = built.inputs
    with torch.no_grad():
        for n in (8, 64):
            torch.testing.assert_close(recorded[f"matmul_k1024.batch{n}"],
                                       x["matmul_k1024.x"][:n] @ x["matmul_k1024.w"],
                                       rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(recorded[f"sum.batch{n}"],
                                       x["sum.x"][:n].double().sum(-1).float(),
                                       rtol=1e-5, atol=1e-3)
            torch.testing.assert_close(recorded[f"softmax.batch{n}"],
                                       torch.softmax(x["softmax.x"][:n].double(), -1).float(),
                                       rtol=1e-5, atol=1e-7)
            assert recorded[f"layer_norm.batch{n}"].shape == (n, 1024)
            assert torch.equal(recorded[f"layer_norm.batch{n}"][:1],
                               recorded[f"layer_norm.b{n}"])
    assert torch.equal(recorded["sum.batch64.again"], recorded["sum.batch64"])


def test_a_fault_in_a_row_other_than_row_0_is_seen_in_the_invariance_probe() -> None:
    """Issue 44's finding: only row 0 of each batch was recorded, so a fault in row 3 of
    the batch of 8 changed nothing a peer could compare (`masked`)."""
    row, column = 3, 5
    spec = f"op:matmul,call=1,element={row * 256 + column},bit=exponent"
    result = run_workload(load_workload("invariance"), variant=variant("strict"), device=CPU,
                          repeats=1, fault_drill=spec)
    drill = result["drill"]
    assert (drill["op"], drill["call"]) == ("aten.mm.default", 1)
    assert drill["outcome"] == "seen" and drill["first_changed"] == "matmul_k64.batch8"


def test_on_a_gpu_every_backend_runs_alone_and_a_differing_one_is_named(monkeypatch) -> None:
    """The CUDA path with fakes at the edge (no GPU here): a device where flash agrees
    with math, cuDNN attention differs by one ULP, memory-efficient refuses the shapes,
    and the default path picks cuDNN. Unverified on real GPUs: which backends a given
    GPU and torch run, and by how much they differ."""
    from contextlib import contextmanager

    from torch.nn.attention import SDPBackend

    from numparity_agent._workloads._base import Recorder

    real = F.scaled_dot_product_attention
    active: list[str] = []

    @contextmanager
    def only(member: str):
        active.append(member)
        yield
        active.pop()

    def fake_sdpa(q, k, v, is_causal=False):
        out = real(q, k, v, is_causal=is_causal)
        if active[-1] == "EFFICIENT_ATTENTION":
            raise RuntimeError("No available kernel. Aborting execution.\nmore detail")
        if active[-1] == "CUDNN_ATTENTION":  # one ULP up in one element
            out = out.clone()
            out.view(-1)[3] = torch.nextafter(out.view(-1)[3], torch.tensor(float("inf")))
        return out

    monkeypatch.setattr(decoder_module, "_only_backend", only)
    monkeypatch.setattr(decoder_module.F, "scaled_dot_product_attention", fake_sdpa)
    monkeypatch.setattr(torch, "_fused_sdp_choice",
                        lambda *a: int(SDPBackend.CUDNN_ATTENTION), raising=False)
    q, k, v = (torch.randn(1, 4, 24, 16, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    recorder = Recorder()
    found = decoder_module.attention_backends((q, k, v), recorder)
    assert [name for name, _kind, _t in recorder.tensors] == ["sdpa.math", "sdpa.flash",
                                                             "sdpa.cudnn"]
    assert found["backends"]["flash"] == {"equal": True, "max_ulp": 0, "max_rel": 0.0}
    cudnn = found["backends"]["cudnn"]
    assert (cudnn["equal"], cudnn["max_ulp"]) == (False, 1)
    assert found["skipped"] == {"efficient": "No available kernel. Aborting execution."}
    assert (found["equal"], found["max_ulp"], found["op"], found["default"]) == (
        False, 1, "cudnn", "cudnn")
