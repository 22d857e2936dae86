"""The built-in workloads in-process: pinned inputs, layer names, probes, train (§2.1-2.2)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from agent_test_user_factories import OverflowingTrain

from numparity_agent import _workloads
from numparity_agent._workloads._base import Recorder
from numparity_agent._workloads.train import Adam, Train
from numparity_agent.testing import built_hashes, run_workload, tensor_hash, variant

CPU = torch.device("cpu")

# input_hash and param_hash of every built-in workload in float32, computed once. Any
# change that fails here breaks comparability with results of earlier agent versions:
# bump the workload's version instead of editing a hash.
PINNED = {
    "mlp": (
        "16e0f6770c327b50650b731ef94001be1cc213246071ec8d3e91b4366417b889",
        "d4e4ccc255b9160f12390d7a226e45adc1acaf731b2329f410e7bb18f7fb2147",
    ),
    "cnn": (
        "3d2c60b1a149a7c42a43d3ad0053108c0801a7e9672033871cca726a95432b92",
        "cf543391f45ca2940a3ee097d757db345c4f849939586b33017ae4cf86ae9488",
    ),
    "transformer": (
        "19673b6f1fb51e1d79c2c0c0a119de30fc9018d15a7ef2ab25726196fa8eda6c",
        "9c28e55126a41935df75904259897e31132f3c5165d3b41185d1d8746a298a21",
    ),
    "lstm": (
        "aab94177d8595f7e8a252f4fd288076428fe5eae542628f1f74db363a2b33fd7",
        "d22d48fc43fe58f4aaf108f7cbb787e78cfd864294a6832083bb34ac4271dbd9",
    ),
    "train": (
        "f018c60ec62261bab5b20c1746a3fc144fa760e9ae2ade148c6831c05f2c76b0",
        "4ddc22454e926db1719e3e8eeb9281e3cdd9735b68c93f4573729caf96d309d5",
    ),
    "probes": (
        "0f21f26262d572ba15e008acf3d875ca6eb89930f7e0a2d76f1ee1c16abf487d",
        # sha256 of nothing: the probes have no parameters, only inputs.
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    "decoder": (
        "faf6318bef9686653925dbb106ec768eabb9167aa896a33ad61d69908b4fe60e",
        # The rotary tables are buffers: float64 cos/sin rounded once to float32.
        "a943d3bf8e823e3d641c2818344674193e9fb5c1091144cf16b40a560989f536",
    ),
    "invariance": (
        "a36cbfb27c98bf0c962ac50b95acb411e979124f504d9fea835c952167f23635",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    "collectives": (
        # Ranks 0-7's inputs, whatever the node's world size.
        "9abc3f1f89f6a42822c764c5fd3a0a5f0595a286971940bc88fd1961b6a56b99",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    "data": (
        # The stored images the pipeline crops and augments; no parameters.
        "f5d9565830bf4a1f726d2713d2831205a6c085d7f1f4fe379bdf896b6249bcd4",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
}
VERSIONS = {
    "mlp": 1, "cnn": 1, "transformer": 1, "lstm": 1, "train": 1, "probes": 1, "collectives": 2,
    "decoder": 2, "invariance": 2, "data": 1,
}


def run_once(workload, dtype=torch.float32):
    recorder = Recorder()
    workload.run(workload.build(dtype=dtype, device=CPU), recorder)
    return recorder


def test_every_builtin_workload_is_pinned():
    assert sorted(_workloads.builtin_names()) == sorted(PINNED)
    for name, pinned in PINNED.items():
        workload = _workloads.load(name)
        assert workload.version == VERSIONS[name], name
        assert built_hashes(workload.build(dtype=torch.float32, device=CPU)) == pinned, name


def test_fp64_builds_the_same_numbers_cast_up_exactly():
    for name in ("mlp", "lstm"):
        workload = _workloads.load(name)
        b32 = workload.build(dtype=torch.float32, device=CPU)
        b64 = workload.build(dtype=torch.float64, device=CPU)
        assert b64.inputs["x"].dtype == torch.float64
        assert torch.equal(b64.inputs["x"].float(), b32.inputs["x"])
        for (n32, p32), (n64, p64) in zip(
            b32.model.state_dict().items(), b64.model.state_dict().items(), strict=True
        ):
            assert n32 == n64 and torch.equal(p64.float(), p32)


def test_layers_are_named_by_module_path_in_execution_order():
    names = [name for name, _, _ in run_once(_workloads.load("transformer")).tensors]
    block = ["ln1", "attn.qkv", "attn.sdpa", "attn.proj", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2"]
    expected = [f"blocks.{i}.{layer}" for i in range(2) for layer in block]
    assert names == [*expected, "ln_f", "head", "output"]
    lstm = run_once(_workloads.load("lstm")).tensors
    assert [(n, tuple(t.shape)) for n, _, t in lstm] == [
        ("lstm.output", (8, 32, 64)), ("lstm.h", (1, 8, 64)), ("lstm.c", (1, 8, 64)),
        ("head", (8, 10)), ("output", (8, 10)),
    ]  # fmt: skip
    mlp = run_once(_workloads.load("mlp")).tensors
    assert [n for n, _, _ in mlp] == ["fc1", "act1", "fc2", "act2", "fc3", "output"]


def test_one_thread_changes_long_reductions_but_not_inputs():
    probes = _workloads.load("probes")
    before = torch.get_num_threads()
    hashes = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            built = probes.build(dtype=torch.float32, device=CPU)
            recorder = Recorder()
            probes.run(built, recorder)
            # The same matmul computed directly, under the same thread count.
            a, b = built.inputs["matmul.a"], built.inputs["matmul.b"]
            direct = tensor_hash(torch.mm(a, b))
            hashes.append(
                (
                    built_hashes(built),
                    {n: tensor_hash(t) for n, _, t in recorder.tensors},
                    direct,
                )
            )
    finally:
        torch.set_num_threads(before)
    (inputs1, out1, direct1), (inputs2, out2, direct2) = hashes
    assert inputs1 == inputs2
    # ATen's own parallel sum splits the vector by thread count on any CPU.
    assert out1["sum_long"] != out2["sum_long"]
    # Whether the BLAS's sgemm depends on the thread count depends on the CPU and the
    # BLAS (MKL on a Xeon with AMX: yes; on an AMD EPYC: no). Either way the probe
    # records exactly the product computed under that thread count.
    assert out1["matmul_large_k"] == direct1 and out2["matmul_large_k"] == direct2
    assert out1["cumsum"] == out2["cumsum"]  # a scan is sequential on the CPU


def test_probes_record_fp16_overflow_and_eps_underflow():
    result = run_workload(
        _workloads.load("probes"), variant=variant("default"), device=CPU, repeats=1
    )
    assert result["status"] == "ok", result.get("error")
    fields = result["probes"]
    assert fields["fp16_eps_underflow"] is True and fields["layer_norm_eps_fp16"] == 0.0
    assert "skipped" not in fields  # this torch has fp16 softmax and layer_norm on the CPU
    tensors = {t["name"]: t for t in result["tensors"]}
    assert {t["kind"] for t in tensors.values()} == {"probe"}
    exact, fp16_logits = tensors["softmax_fp16.logits_fp64"], tensors["softmax_fp16.logits"]
    # The same logits: beyond fp16's max in float64, inf in fp16.
    assert exact["stats"]["fp16_overflow"] > 0 and exact["stats"]["inf"] == 0
    assert fp16_logits["dtype"] == "float16"
    assert fp16_logits["stats"]["inf"] == fields["softmax_fp16_overflow"] > 0
    assert fp16_logits["stats"]["inf"] <= exact["stats"]["fp16_overflow"]
    softmax = tensors["softmax_fp16"]["stats"]
    assert softmax["nan"] == fields["softmax_fp16_nan"] > 0
    assert softmax["nan"] < softmax["count"]  # some rows overflow, not all
    # eps 1e-8 is 0 in fp16: the textbook LayerNorm divides 0 by 0 on constant rows.
    manual = tensors["layer_norm_fp16_manual"]["stats"]
    assert manual["nan"] == fields["layer_norm_fp16_manual_nan"] == 16 * 256
    assert tensors["layer_norm_fp16"]["stats"]["nan"] == 0  # F.layer_norm accumulates in fp32


def test_probes_keep_fp16_under_fp64_reference():
    recorder = run_once(_workloads.load("probes"), dtype=torch.float64)
    dtypes = {name: t.dtype for name, _, t in recorder.tensors}
    assert dtypes["matmul_large_k"] == torch.float64 and dtypes["sum_long"] == torch.float64
    assert dtypes["softmax_fp16"] == torch.float16 and dtypes["layer_norm_fp16"] == torch.float16


def test_adam_is_bitwise_torch_optim_adam_on_the_cpu():
    """The oracle: torch.optim.Adam's own (single-tensor CPU) step."""
    built = Train().build(dtype=torch.float32, device=CPU)
    x, y = built.inputs["x"], built.inputs["y"]
    ours_model, torch_model = built.model, copy.deepcopy(built.model)
    ours = Adam(list(ours_model.parameters()), lr=1e-3, eps=1e-8)
    reference = torch.optim.Adam(torch_model.parameters(), lr=1e-3, eps=1e-8)
    for _ in range(3):
        for model, optimizer in ((ours_model, ours), (torch_model, reference)):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_train_records_losses_grads_params():
    result = run_workload(Train(), variant=variant("default"), device=CPU, repeats=1)
    names = [(t["name"], t["kind"]) for t in result["tensors"]]
    assert [n for n, k in names if k == "loss"] == ["loss.step0", "loss.step1", "loss.step2"]
    params = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [n for n, k in names if k == "grad"] == [f"grad.{p}" for p in params]
    assert [n for n, k in names if k == "param"] == [f"param.{p}" for p in params]
    assert [n for n, k in names if k == "layer"] == ["fc1", "act1", "fc2"]
    losses = [t["stats"]["mean"] for t in result["tensors"] if t["kind"] == "loss"]
    assert losses[2] < losses[0]  # it learns
    assert result["train"] == {
        "steps": 3, "grad_scaler": False, "skipped_steps": 0, "scale": None,
    }  # fmt: skip


def test_train_under_fp16_autocast_uses_a_grad_scaler():
    fp16 = variant("fp16-autocast")
    if fp16.skip_reason(CPU):
        pytest.skip(fp16.skip_reason(CPU))
    normal = run_workload(Train(), variant=fp16, device=CPU, repeats=1)
    assert normal["train"] == {
        "steps": 3, "grad_scaler": True, "skipped_steps": 0, "scale": 65536.0,
    }  # fmt: skip
    overflow = run_workload(OverflowingTrain(), variant=fp16, device=CPU, repeats=2)
    assert overflow["status"] == "ok" and overflow["repeats_agree"] is True
    assert overflow["train"]["skipped_steps"] >= 1
    assert overflow["train"]["scale"] < 2.0**100
    assert overflow["knobs"]["autocast"] == "float16"
    # A skipped step leaves the parameters alone: all skipped, they are the initial ones.
    if overflow["train"]["skipped_steps"] == 3:
        initial = OverflowingTrain().build(dtype=torch.float32, device=CPU).model
        final = {t["name"]: t["hash"] for t in overflow["tensors"] if t["kind"] == "param"}
        for name, param in initial.named_parameters():
            assert final[f"param.{name}"] == tensor_hash(param.detach())
