"""The large suite (design §2.2): its workloads built small and pinned, its FLOP formulas
against torch's own flop counter, its GEMM against a float64 recomputation, and how a run
chooses it (command line, NUMPARITY_SUITE, the config file)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.agent import clean_env, run_agent
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from numparity_agent._suite import default_variants
from numparity_agent._workloads import _sizes
from numparity_agent._workloads._sizes import (
    AttentionSize,
    BottleneckSize,
    DecoderSize,
    GEMMSize,
    TrainSize,
)
from numparity_agent._workloads.large import GEMM, Attention, Bottleneck, LargeDecoder, LargeTrain
from numparity_agent.testing import (
    Recorder,
    built_hashes,
    builtin_workloads,
    load_workload,
    main,
    resolve_config,
    run_workload,
    variant,
)

CPU = torch.device("cpu")

# The large suite's definitions at a size a test builds in milliseconds.
SMALL = {
    "gemm": GEMM(GEMMSize(m=16, k=64, n=8, k_square=32)),
    "resnet_block": Bottleneck(BottleneckSize(batch=2, channels=16, width=4, spatial=6)),
    "attention": Attention(AttentionSize(batch=1, heads=2, seq=16, head_dim=8)),
    "decoder": LargeDecoder(DecoderSize(vocab=64, d_model=32, heads=2, layers=2, hidden=48,
                                        seq=12, request_lengths=(5, 12))),
    "train": LargeTrain(TrainSize(batch=8, features=(16, 32, 10), steps=3)),
}
NO_PARAMS = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
# input_hash and param_hash of SMALL in float32. A change that fails here changes the
# large suite's numbers: bump the workload's version instead of editing a hash.
PINNED = {
    "gemm": ("c0896185c5ae182f39bdd71e0bdd25a4b41c9b38b2a893c7910dd53fbec0af5f", NO_PARAMS),
    "resnet_block": ("6c52ac7cb93337833644158774ce30e716f44ba8bb6481250e81befbe4db568f",
                     "3b97562e07abb8652380a581f1ea35900c893507d641198772367ee7e401e9bd"),
    "attention": ("6116a1f49c95c9c04793bedd0558af785ec14af44c6337e730b0e1a1ad0bf2d9", NO_PARAMS),
    "decoder": ("bd80fb7890d82a50fbd62ba2e36083440f3883ea314024538050d8b97a38b47b",
                "c4d0d32953452315b84f53e075938331d4518199105c141848832cd013f331e9"),
    "train": ("35abc4c29356b261eeb3db9bd8074a30c8d6d837ae08d61e07dc986d81e4d511",
              "0341c338b95cc064b8d7974eab717c4b8f2c85116b733b99769a2cecc0f22c52"),
}


VERSIONS = {"gemm": 1, "resnet_block": 1, "attention": 1, "decoder": 2, "train": 1}


def test_the_large_suite_is_its_own_and_built_small_it_is_pinned():
    assert builtin_workloads("large") == list(PINNED) == list(_sizes.LARGE)
    assert "gemm" not in builtin_workloads()  # the standard suite is untouched
    for name, workload in SMALL.items():
        # decoder 2: every position's logits of its batch check recorded (issue 44).
        assert workload.suite == "large" and workload.version == VERSIONS[name], name
        assert type(load_workload(name, "large")) is type(workload), name
        assert built_hashes(workload.build(dtype=torch.float32, device=CPU)) == PINNED[name], name
    # The same definition in the standard suite draws from other streams.
    standard = load_workload("decoder")
    same_size = LargeDecoder(standard.size)
    assert built_hashes(same_size.build(dtype=torch.float32, device=CPU)) != built_hashes(
        standard.build(dtype=torch.float32, device=CPU))


def test_the_full_size_gemm_draws_the_pinned_streams():
    """The pin holds the full size too: a stream's values depend on the counter, not the
    shape, so the small operands are the full ones' first elements."""
    full = GEMM().build(dtype=torch.float32, device=CPU).inputs
    small = SMALL["gemm"].build(dtype=torch.float32, device=CPU).inputs
    for name in ("a", "b"):
        assert full[name].shape == {"a": (4096, 8192), "b": (8192, 4096)}[name]
        assert torch.equal(full[name].reshape(-1)[:small[name].numel()],
                           small[name].reshape(-1))


# torch's flop counter has no formula for the CPU's flash attention kernel: its own SDPA
# formula is given for it, so every attention the workloads compute is counted.
CPU_FLASH = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
             lambda q, k, v, *_args, **_kwargs: sdpa_flop_count(q, k, v)}


@pytest.mark.parametrize("name", list(SMALL))
def test_flop_formulas_are_what_torch_counts(name):
    workload = SMALL[name]
    recorder = Recorder()
    with FlopCounterMode(display=False, custom_mapping=CPU_FLASH) as counter:
        workload.run(workload.build(dtype=torch.float32, device=CPU), recorder)
    size = workload.size
    if "checks" in recorder.fields:  # one SDPA pass per backend this CPU has
        backends = recorder.fields["checks"]["attention_backends_agree"]["backends"]
        assert counter.get_total_flops() == size.flops(backends=1 + len(backends))
    else:
        assert counter.get_total_flops() == size.flops()


def test_full_size_flops_and_a100_estimate():
    assert _sizes.LARGE_GEMM.flops() == 2 * 4096 * 4096 * (8192 + 4096)
    assert _sizes.LARGE_BOTTLENECK.flops() == 2 * 8 * 56 * 56 * (256 * 64 * 2 + 9 * 64 * 64)
    # 1 default pass + 4 backends of 4 * B * H * S^2 * D.
    assert _sizes.LARGE_ATTENTION.flops() == 5 * 4 * 2 * 8 * 2048**2 * 128
    # 412 GFLOP in fp32 at half of 19.5 TFLOP/s.
    assert _sizes.a100_seconds(_sizes.LARGE_GEMM.flops(), "strict") == pytest.approx(
        412.3e9 / 9.75e12, rel=1e-3)
    assert _sizes.a100_seconds(10**12, "bf16-autocast") == pytest.approx(1 / 156)


def test_the_gemm_against_a_float64_recomputation():
    workload = GEMM(GEMMSize(m=64, k=1024, n=48, k_square=256))
    built = workload.build(dtype=torch.float32, device=CPU)
    recorder = Recorder()
    workload.run(built, recorder)
    got = {name: value.numpy().astype(np.float64) for name, _kind, value in recorder.tensors}
    a, b = (built.inputs[n].numpy().astype(np.float64) for n in ("a", "b"))
    for name, k in (("square", 256), ("long_k", 1024)):
        exact = a[:, :k] @ b[:k]
        # The float32 error bound of any summation order: gamma_k * sum |a||b|.
        unit = 2.0**-24
        bound = k * unit / (1 - k * unit) * (np.abs(a[:, :k]) @ np.abs(b[:k]))
        assert np.all(np.abs(got[name] - exact) <= bound), name
        assert not np.array_equal(got[name], exact)  # a real float32 computation


def test_the_block_records_its_convolutions_and_output():
    result = run_workload(SMALL["resnet_block"], variant=variant("default"), device=CPU,
                          repeats=2)
    assert result["status"] == "ok" and result["repeats_agree"] is True
    assert result["suite"] == "large" and result["workload"] == "resnet_block"
    assert [t["name"] for t in result["tensors"]] == ["conv1", "conv2", "conv3", "output"]


def test_large_leaves_out_the_cpu_reference_unless_named():
    assert "fp64-reference" not in default_variants("large")
    assert default_variants("large") == [v for v in default_variants() if v != "fp64-reference"]


def test_the_suite_from_command_line_environment_and_config_file(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text('suite = "large"\n')
    assert resolve_config({}, {}, str(config)).get("suite") == "large"
    resolved = resolve_config({}, {"NUMPARITY_SUITE": "standard"}, str(config))
    assert resolved.get("suite") == "standard"
    assert resolved.sources["suite"] == "NUMPARITY_SUITE"
    assert resolve_config({"suite": "large"}, {"NUMPARITY_SUITE": "standard"}).get(
        "suite") == "large"


def test_an_unknown_suite_or_a_workload_of_another_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("NUMPARITY_SUITE", "huge")
    assert main(["run", "--device", "cpu"]) == 2
    assert "NUMPARITY_SUITE: unknown suite huge; valid: standard, large" in capsys.readouterr().err
    monkeypatch.delenv("NUMPARITY_SUITE")
    assert main(["run", "--suite", "large", "--workloads", "mlp", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "unknown workload(s) mlp in suite large" in err and "resnet_block" in err


def test_run_suite_large_results_say_large(tmp_path):
    """A real run at full size of the cheapest large workload, chosen by the config file."""
    (tmp_path / "agent.toml").write_text('suite = "large"\n')
    out = tmp_path / "doc.json"
    proc = run_agent("run", "--config", str(tmp_path / "agent.toml"), "--workloads",
                     "resnet_block", "--variants", "default", "--repeats", "1", "--device",
                     "cpu", "--output", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert (result["suite"], result["workload"], result["status"]) == (
        "large", "resnet_block", "ok")
    conv3 = next(t for t in result["tensors"] if t["name"] == "conv3")
    assert conv3["shape"] == [8, 256, 56, 56]
    assert math.prod(conv3["shape"]) == _sizes.LARGE_BOTTLENECK.batch * 256 * 56 * 56


def test_explain_refuses_a_large_reference():
    from numparity_agent import _explain

    reference = {"run_id": "r1", "results": [
        {"suite": "large", "workload": "gemm", "variant": "default", "status": "ok",
         "device": "cuda:0", "tensors": []}]}
    with pytest.raises(_explain.ExplainError, match="is of suite large"):
        _explain.targets_of(reference, workloads=None, variants=None, device=None)


def test_suites_lists_both_without_torch():
    code = ("import sys; from numparity_agent.testing import main; main(['suites']); "
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("standard (the default): mlp, cnn")
    gemm = next(line for line in lines if line.strip().startswith("gemm"))
    assert f"{_sizes.LARGE_GEMM.flops() / 1e9:.1f}" in gemm
