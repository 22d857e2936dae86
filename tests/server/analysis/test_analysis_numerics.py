"""The audit's numerics table and the policy's check requirements (design §3.3.12-13),
from the checks outcomes carry."""

from __future__ import annotations

import pytest

from numparity_server.analysis.fleet_policy import check_violations
from numparity_server.analysis.numerics import Reported, Verdict, numerics
from numparity_server.analysis.policy import PolicyError, parse_policy

HOLDS = {"equal": True, "max_ulp": 0, "max_rel": 0.0}


def breaks(op, ulp=4, rel=1e-6):
    return {"equal": False, "max_ulp": ulp, "max_rel": rel, "op": op}


DECODER_OK = {"batch_invariant": HOLDS, "decode_equals_prefill": HOLDS,
              "attention_backends_agree": {**HOLDS, "op": None}}
DECODER_BATCH = {**DECODER_OK, "batch_invariant": breaks("blocks.0.attn.qkv")}
PROBE_BATCH = {"batch_invariant": {**breaks("matmul_k4096", ulp=12), "ops": ["matmul_k4096"]}}


def test_a_row_per_environment_model_and_variant_naming_the_breaking_op():
    rows = numerics([
        Reported(1, "cpu-a", "standard", "default", "decoder", DECODER_BATCH, 3),
        Reported(1, "cpu-a", "standard", "default", "invariance", PROBE_BATCH, 3),
        Reported(1, "cpu-a", "standard", "strict", "decoder", DECODER_OK, 3),
        Reported(2, "gpu-b", "standard", "default", "decoder", {"decode_equals_prefill":
                                                    breaks(None, ulp=None)}, 2),
        Reported(2, "gpu-b", "standard", "default", "cnn", {}, 2),  # no checks: no say
    ])
    assert [(r.environment, r.model, r.variant) for r in rows] == [
        (1, "cpu-a", "default"), (1, "cpu-a", "strict"), (2, "gpu-b", "default")]
    first, strict, gpu = rows
    # The probe's op first: an operation is what a lab can fix.
    assert first.columns["batch_invariant"] == Verdict(False, "invariance: matmul_k4096")
    assert first.columns["decode_equals_prefill"] == Verdict(True, None)
    assert [(b.workload, b.op, b.max_ulp, b.devices) for b in first.breaks] == [
        ("invariance", "matmul_k4096", 12, 3), ("decoder", "blocks.0.attn.qkv", 4, 3)]
    assert all(v == Verdict(True, None) for v in strict.columns.values())
    assert gpu.columns == {"batch_invariant": None, "attention_backends_agree": None,
                           "decode_equals_prefill": Verdict(False, None)}
    assert gpu.breaks[0].max_ulp is None  # a NaN without a match: no distance


def test_devices_of_one_environment_that_disagree_about_a_check_break_it():
    rows = numerics([Reported(1, "m", "standard", "default", "decoder", DECODER_OK, 5),
                     Reported(1, "m", "standard", "default", "decoder", DECODER_BATCH, 1),
                     Reported(1, "m", "standard", "default", "decoder",
                              {**DECODER_OK, "batch_invariant": breaks("blocks.0.attn.qkv",
                                                                       ulp=9)}, 2)])
    (row,) = rows
    assert row.columns["batch_invariant"] == Verdict(False, "decoder: blocks.0.attn.qkv")
    (only,) = row.breaks
    assert (only.devices, only.max_ulp) == (3, 9)


def test_the_policy_requires_checks_by_workload_and_lists_the_violators():
    policy = parse_policy({"required": {"decoder.batch_invariant": True,
                                        "knobs.cudnn.benchmark": "false"}})
    assert policy.required_checks == {"decoder.batch_invariant": True}
    assert policy.required == {"knobs.cudnn.benchmark": "false"}
    found = check_violations(policy.required_checks, [
        ("node-2", 1, "decoder", "default", DECODER_BATCH),
        ("node-2", 1, "decoder", "fp16", DECODER_BATCH),
        ("node-1", 1, "decoder", "default", DECODER_OK),
        ("node-3", 2, "invariance", "default", PROBE_BATCH),  # another workload's check
        ("node-4", 2, "decoder", "default", None),  # did not report it: not judged
    ])
    assert [(node, env, v.to_dict()) for node, env, v in found] == [
        ("node-2", 1, {"attribute": "decoder.batch_invariant",
                       "value": "false under default, fp16 (at blocks.0.attn.qkv)",
                       "rule": "required", "expected": ["true"]})]


def test_a_check_requirement_must_be_a_boolean_and_changes_the_policy_version():
    with pytest.raises(PolicyError, match="decoder.batch_invariant"):
        parse_policy({"required": {"decoder.batch_invariant": "yes"}})
    plain = parse_policy({})
    assert parse_policy({"required": {}}).version == plain.version
    assert parse_policy({"required": {"decoder.batch_invariant": True}}).version \
        != plain.version


def test_suites_are_kept_apart():
    rows = numerics([Reported(1, "m", "standard", "default", "decoder", DECODER_BATCH, 2),
                     Reported(1, "m", "large", "default", "decoder", DECODER_OK, 2)])
    assert [(r.suite, r.columns["batch_invariant"].holds) for r in rows] == [
        ("large", True), ("standard", False)]
