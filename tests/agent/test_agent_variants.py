"""The whole suite under every variant, in child processes, on this CPU (design §2.3)."""

import base64
import json

import numpy as np
import pytest
import torch
from helpers.agent import run_agent
from torch import nn

from numparity_agent import _variants
from numparity_agent._suite import default_variants
from numparity_agent.testing import (
    Built,
    Workload,
    builtin_workloads,
    load_workload,
    run_workload,
    unsupported_half_reason,
)

# assert_close's defaults for bfloat16 (design §3.3).
BF16_RTOL = 1.6e-2
CPU = torch.device("cpu")
HALF_VARIANTS = {"fp16-autocast": "float16", "bf16-autocast": "bfloat16"}
# What torch 2.13's oneDNN raises for the float16 LSTM on an AMD EPYC (AVX-512 and
# AVX512-BF16, no AVX512-FP16, no AMX).
ONEDNN_LSTM_ERROR = (
    "could not create a primitive descriptor for the LSTM forward propagation primitive. "
    "Run workload with environment variable ONEDNN_VERBOSE=all to get additional "
    "diagnostic information."
)
ONEDNN_LSTM_MESSAGE = (
    "could not create a primitive descriptor for the LSTM forward propagation primitive"
)


@pytest.fixture(scope="module")
def suite_document(tmp_path_factory):
    """Every built-in workload under every variant, one repeat each."""
    out = tmp_path_factory.mktemp("suite") / "doc.json"
    proc = run_agent("run", "--repeats", "1", "--output", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def results(doc):
    return {(r["workload"], r["variant"]): r for r in doc["results"]}


def output_values(result) -> torch.Tensor:
    output = result["tensors"][-1]
    assert output["kind"] == "output"
    raw = base64.b64decode(output["values"]["data"])
    dtype = output["values"]["dtype"]
    if dtype == "bfloat16":
        tensor = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
    else:
        array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
        tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder("=")))
    return tensor.reshape(output["shape"])


def test_every_variant_reports_every_workload_ok_or_skipped_with_a_reason(suite_document):
    by_key = results(suite_document)
    # Every variant a run makes by default: compiled is opt-in (test_agent_compiled.py).
    assert set(by_key) == {(w, v) for w in builtin_workloads() for v in default_variants()}
    for (workload, variant), result in by_key.items():
        key = (workload, variant)
        assert result["status"] in ("ok", "skipped"), (key, result.get("error"))
        if result["status"] == "ok":
            assert result["input_hash"] and result["tensors"] and "knobs" in result, key
            assert result["device"] == "cpu"
            continue
        assert result["reason"], key
        if result["reason"] == _variants.get(variant).skip_reason(CPU):
            continue  # the whole variant cannot run on this CPU (tf32 without bf16)
        if result["reason"] == load_workload(workload).skip_reason(variant):
            continue  # a workload of one variant (data: the pipeline, under default)
        # Otherwise only a workload oneDNN has no half-precision kernel for on this CPU
        # (the float16 LSTM on a CPU without AVX512-FP16 or AMX): never another error.
        assert variant in HALF_VARIANTS, (key, result["reason"])
        expected = (
            f"oneDNN on this CPU has no {HALF_VARIANTS[variant]} kernel for {workload}: "
            "could not create a primitive descriptor"
        )
        assert result["reason"].startswith(expected), (key, result["reason"])
    # Only the LSTM may meet a missing oneDNN kernel; the rest of fp16-autocast runs.
    if _variants.get("fp16-autocast").skip_reason(CPU) is None:
        for workload in builtin_workloads():
            if workload != "lstm" and load_workload(workload).variants is None:
                assert by_key[(workload, "fp16-autocast")]["status"] == "ok", workload
    # A CPU with native bf16 (AMX or AVX512-BF16) runs tf32 as oneDNN's bf16 fp32 math;
    # one without skips it with the reason.
    tf32_reason = _variants.cpu_bf16_matmul_skip_reason()
    tf32 = by_key[("mlp", "tf32")]
    if tf32_reason:
        assert tf32["status"] == "skipped" and tf32["reason"] == tf32_reason
    else:
        assert tf32["status"] == "ok"
        assert tf32["knobs"]["float32_matmul_precision"] == "medium"
        # oneDNN computes the fp32 matmuls in bf16: the output moves.
        assert tf32["tensors"][-1]["hash"] != by_key[("mlp", "default")]["tensors"][-1]["hash"]


def test_knobs_in_force_are_recorded_per_variant(suite_document):
    by_key = results(suite_document)
    assert by_key[("cnn", "default")]["knobs"]["autocast"] is None
    assert by_key[("cnn", "strict")]["knobs"]["deterministic_algorithms"] is True
    for variant, dtype in (("fp16-autocast", "float16"), ("bf16-autocast", "bfloat16")):
        result = by_key[("mlp", variant)]
        if result["status"] == "ok":
            assert result["knobs"]["autocast"] == dtype
            assert result["tensors"][-1]["dtype"] == dtype


def test_fp64_reference_is_float64_and_differs_from_float32(suite_document):
    by_key = results(suite_document)
    for workload in ("mlp", "cnn", "transformer", "lstm"):
        reference, default = by_key[(workload, "fp64-reference")], by_key[(workload, "default")]
        assert reference["status"] == "ok" and reference["dtype"] == "float64"
        assert reference["device"] == "cpu"
        assert reference["tensors"][-1]["dtype"] == "float64"
        assert reference["tensors"][-1]["hash"] != default["tensors"][-1]["hash"]
        assert reference["input_hash"] != default["input_hash"]  # other dtype, same numbers
        # The float32 answer is within float32 error of the float64 one.
        torch.testing.assert_close(
            output_values(default).double(), output_values(reference), rtol=1e-4, atol=1e-5
        )


def test_bf16_autocast_is_close_to_fp64_within_bf16_tolerance(suite_document):
    by_key = results(suite_document)
    for workload in ("mlp", "cnn", "transformer", "lstm"):
        bf16 = by_key[(workload, "bf16-autocast")]
        if workload == "lstm" and bf16["status"] == "skipped":
            # oneDNN has no bfloat16 LSTM on a CPU without native bf16 (an AMD EPYC with
            # AVX2 alone): skipped with its reason, the others run everywhere.
            assert bf16["reason"].startswith(
                "oneDNN on this CPU has no bfloat16 kernel for lstm: "
                "could not create a primitive descriptor"), bf16["reason"]
            continue
        assert bf16["status"] == "ok", bf16.get("error") or bf16.get("reason")
        reference = output_values(by_key[(workload, "fp64-reference")])
        values = output_values(bf16)
        assert values.dtype == torch.bfloat16
        # bf16's relative tolerance, with an absolute floor relative to the output's scale:
        # near-zero logits carry the absolute error of the larger terms they cancel.
        scale = float(reference.abs().max())
        torch.testing.assert_close(
            values.double(), reference, rtol=BF16_RTOL, atol=BF16_RTOL * scale
        )
        assert not torch.equal(values.double(), reference)


def test_train_and_probe_fields_under_every_variant(suite_document):
    by_key = results(suite_document)
    for variant in default_variants():
        train, probes = by_key[("train", variant)], by_key[("probes", variant)]
        if train["status"] == "ok":
            assert train["train"]["grad_scaler"] is (variant == "fp16-autocast")
            assert train["train"]["skipped_steps"] == 0
        if probes["status"] == "ok":
            assert probes["probes"]["fp16_eps_underflow"] is True
            assert probes["probes"]["softmax_fp16_overflow"] > 0
            fp16 = {t["name"]: t["dtype"] for t in probes["tensors"]}
            assert fp16["softmax_fp16"] == fp16["layer_norm_fp16"] == "float16"


class RaisingWorkload(Workload):
    """Builds a tiny model and raises `exc` when it runs, as a oneDNN kernel would."""

    name = "raising"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def build(self, *, dtype, device):
        return Built(model=nn.Linear(2, 2).to(dtype), inputs={"x": torch.zeros(1, 2, dtype=dtype)})

    def run(self, built, recorder):
        raise self.exc


class FP16Cast(_variants.Variant):
    """A variant that builds the whole workload in float16 (no autocast)."""

    name = "fp16-cast"
    dtype_name = "float16"


def run_raising(exc: Exception, variant) -> dict:
    if isinstance(variant, str):
        variant = _variants.get(variant)
    return run_workload(RaisingWorkload(exc), variant=variant, device=CPU, repeats=1)


@pytest.mark.parametrize(
    ("variant", "dtype"),
    [("fp16-autocast", "float16"), ("bf16-autocast", "bfloat16"), (FP16Cast(), "float16")],
)
def test_onednn_without_a_half_kernel_on_the_cpu_is_skipped_with_the_reason(variant, dtype):
    result = run_raising(RuntimeError(ONEDNN_LSTM_ERROR), variant)
    assert result["status"] == "skipped" and "error" not in result
    assert result["reason"] == (
        f"oneDNN on this CPU has no {dtype} kernel for raising: {ONEDNN_LSTM_MESSAGE}"
    )
    assert result["workload"] == "raising" and result["device"] == "cpu"


@pytest.mark.parametrize("variant", ["default", "strict", "fp64-reference"])
def test_the_same_onednn_error_in_float32_or_float64_fails(variant):
    result = run_raising(RuntimeError(ONEDNN_LSTM_ERROR), variant)
    assert result["status"] == "failed" and "reason" not in result
    assert result["error"].splitlines()[0] == f"RuntimeError: {ONEDNN_LSTM_ERROR}"


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (1x2 and 3x2)"),
        # oneDNN found a kernel but could not create it (memory, say): not "no kernel".
        RuntimeError("could not create a primitive"),
        RuntimeError(f"my wrapper: {ONEDNN_LSTM_ERROR}"),
        ValueError(ONEDNN_LSTM_ERROR),
    ],
)
def test_other_errors_under_fp16_autocast_fail(exc):
    result = run_raising(exc, "fp16-autocast")
    assert result["status"] == "failed" and "reason" not in result
    assert result["error"].splitlines()[0] == f"{type(exc).__name__}: {exc}"


def test_the_onednn_error_is_only_a_skip_on_the_cpu():
    exc = RuntimeError(ONEDNN_LSTM_ERROR)
    variant = _variants.get("fp16-autocast")
    assert unsupported_half_reason(exc, workload="lstm", variant=variant, device=CPU) == (
        f"oneDNN on this CPU has no float16 kernel for lstm: {ONEDNN_LSTM_MESSAGE}"
    )
    cuda = torch.device("cuda", 0)
    assert unsupported_half_reason(exc, workload="lstm", variant=variant, device=cuda) is None
