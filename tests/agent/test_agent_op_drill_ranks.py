"""`--fault-drill op:collective` (design §2.6, issue 44): a fault inside a collective,
in the rank process that runs it.

`collectives` runs its all-reduce, all-gather and reduce-scatter in four forked gloo
ranks (each three times: REPEATS) and records each rank's first answer of each. The drill
numbers the ranks' calls rank by rank (rank 0's nine, then rank 1's ...): call 0 is rank
0's first all-reduce, 3 its first all-gather, 6 its first reduce-scatter, 9·r + k the
same of rank r. Each drilled run is compared with one clean run bit for bit (int32
views) and with an independent numpy recomputation of the collectives from the ranks'
inputs.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest
import torch

from numparity_agent.testing import load_workload, run_workload
from numparity_agent.testing import variant as get_variant

CPU = torch.device("cpu")
STRICT = get_variant("strict")
WORLD, GATHER, LENGTH = 4, 1024, 840 * 16
SHARE = LENGTH // WORLD
NAMES = ("all_reduce.w4", "all_gather.w4", "reduce_scatter.w4")


def run(spec: str | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The result and the recorded tensors' values by name (in the document up to 4096
    elements, beyond that as `keep_values` gets them)."""
    kept: dict[str, np.ndarray] = {}
    result = run_workload(load_workload("collectives"), variant=STRICT, device=CPU,
                          repeats=1, fault_drill=spec or False,
                          keep_values=lambda digest, raw: kept.__setitem__(digest, raw.copy()))
    assert result["status"] == "ok", result.get("error")
    by_name = {t["name"]: np.frombuffer(base64.b64decode(t["values"]["data"]), dtype="<f4")
               if "values" in t else kept[t["hash"]].view("<f4").reshape(-1)
               for t in result["tensors"]}
    return result, by_name


def words(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint32)


@pytest.fixture(scope="module")
def inputs() -> list[np.ndarray]:
    built = load_workload("collectives").build(dtype=torch.float32, device=CPU)
    return [built.inputs[f"rank{r}"].numpy().copy() for r in range(WORLD)]


@pytest.fixture(scope="module")
def clean(inputs) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    result, values = run()
    # The clean run against numpy: the all-gather is the inputs' heads, exactly; the
    # all-reduce and rank 0's reduce-scatter are the float64 sum to float32's rounding.
    assert np.array_equal(words(values["all_gather.w4"]),
                          words(np.concatenate([x[:GATHER] for x in inputs])))
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    np.testing.assert_allclose(values["all_reduce.w4"], exact, rtol=1e-6, atol=1e-6)
    assert np.array_equal(words(values["reduce_scatter.w4"]),
                          words(values["all_reduce.w4"][:SHARE]))
    return result, values


@pytest.mark.parametrize(("spec", "name", "bits"), [
    ("op:collective,call=0,element=9000,bit=20", "all_reduce.w4", [20]),
    ("op:collective,call=3,element=2500,bit=sign", "all_gather.w4", [31]),
    ("op:collective,call=6,element=77,bit=23,bits=2", "reduce_scatter.w4", [23, 24]),
])
def test_exactly_the_chosen_element_and_bits_of_the_chosen_collective_on_rank_0(
        clean, inputs, spec, name, bits):
    clean_result, clean_values = clean
    result, values = run(spec)
    flip = result["drill"]
    assert (flip["kind"], flip["class"], flip["rank"], flip["calls"]) == \
        ("op", "collective", 0, WORLD * 9)
    assert flip["op"].startswith("c10d.") and flip["bits"] == bits
    assert result["input_hash"] == clean_result["input_hash"]
    # The chosen output differs from the clean one in exactly one element, by exactly
    # the chosen bits; the other collectives' outputs are untouched.
    xor = words(clean_values[name]) ^ words(values[name])
    assert np.flatnonzero(xor).tolist() == [flip["index"]]
    assert int(xor[flip["index"]]) == sum(1 << b for b in bits)
    assert (float(clean_values[name][flip["index"]]), float(values[name][flip["index"]])) \
        == (flip["before"], flip["after"])
    for other in NAMES:
        if other != name:
            assert np.array_equal(words(values[other]), words(clean_values[other])), other
    if name == "all_gather.w4":  # the independent oracle: the ranks' inputs, one bit off
        expected = words(np.concatenate([x[:GATHER] for x in inputs])).copy()
        expected[flip["index"]] ^= np.uint32(1 << 31)
        assert np.array_equal(words(values[name]), expected)
    assert (flip["outcome"], flip["first_changed"], flip["changed"]) == ("seen", name, 1)
    # The collectives' own checks see rank 0 disagree with its repeats and (rank 0
    # alone corrupted) with its peers, or its reduce-scatter with its share of the
    # all-reduce.
    fields = result["collectives"]
    assert fields["repeats_agree"] is False
    if name == "reduce_scatter.w4":
        assert (fields["ranks_agree"], fields["reduce_scatter_matches_all_reduce"]) == \
            (True, False)
    else:
        assert fields["ranks_agree"] is False


def test_a_fault_on_another_rank_is_seen_in_that_ranks_record(clean):
    clean_result, clean_values = clean
    # Rank 2's first all-gather (9·2 + 3): rank 2's answer, recorded as its own (issue 44:
    # with rank 0's alone recorded, it was masked).
    result, values = run("op:collective,call=21,element=100,bit=sign")
    flip = result["drill"]
    assert (flip["rank"], flip["rank_call"], flip["call"]) == (2, 3, 21)
    assert flip["op"] == "c10d._allgather_base_.default" and flip["before"] == -flip["after"]
    changed = [name for name in values
               if not np.array_equal(words(values[name]), words(clean_values[name]))]
    assert changed == ["all_gather.w4.rank2"]
    xor = words(clean_values["all_gather.w4.rank2"]) ^ words(values["all_gather.w4.rank2"])
    assert np.flatnonzero(xor).tolist() == [100] and int(xor[100]) == 1 << 31
    assert (flip["outcome"], flip["first_changed"]) == ("seen", "all_gather.w4.rank2")
    # The ranks' comparison of their answers sees it too.
    fields = result["collectives"]
    assert (fields["ranks_agree"], fields["all_gather_exact"]) == (False, False)
    assert clean_result["collectives"]["ranks_agree"] is True


def test_a_fault_in_a_repeat_is_seen_in_that_repeats_record(clean):
    clean_result, clean_values = clean
    # Rank 1's second all-reduce (9·1 + 1): a fault in one repeat only, as an
    # intermittent device gives.
    result, values = run("op:collective,call=10,element=4000,bit=22")
    flip = result["drill"]
    assert (flip["rank"], flip["rank_call"]) == (1, 1)
    changed = [name for name in values
               if not np.array_equal(words(values[name]), words(clean_values[name]))]
    assert changed == ["all_reduce.w4.rank1.repeat1"]
    xor = words(clean_values[changed[0]]) ^ words(values[changed[0]])
    assert np.flatnonzero(xor).tolist() == [4000] and int(xor[4000]) == 1 << 22
    assert flip["outcome"] == "seen" and result["collectives"]["repeats_agree"] is False


def test_a_stuck_lane_stays_in_its_rank_and_hits_each_later_collective(clean):
    clean_result, clean_values = clean
    result, values = run("op:collective,call=1,element=5,bit=22,stuck")
    flip = result["drill"]
    # Rank 0's second and third all-reduce, its three all-gathers and three
    # reduce-scatters: 8 hits, the first recorded all-reduce spared.
    assert (flip["rank"], flip["hits"]) == (0, 8)
    assert np.array_equal(words(values["all_reduce.w4"]), words(clean_values["all_reduce.w4"]))
    for name in ("all_gather.w4", "reduce_scatter.w4"):
        xor = words(clean_values[name]) ^ words(values[name])
        assert np.flatnonzero(xor).tolist() == [5] and int(xor[5]) == 1 << 22
    assert flip["outcome"] == "seen" and flip["first_changed"] == "all_gather.w4"


def test_the_seed_draws_one_rank_and_call_the_same_every_time():
    first, again = run("op:collective,seed=5")[0]["drill"], run("op:collective,seed=5")[0]["drill"]
    assert first == again and 0 <= first["rank"] < WORLD
    assert first["call"] == 9 * first["rank"] + first["rank_call"]


def test_a_class_the_ranks_never_run_corrupts_nothing(clean):
    clean_result, _ = clean
    for spec in ("op:matmul", "op:elementwise,seed=2"):
        result, _ = run(spec)
        assert result["drill"]["calls"] == 0 and "op" not in result["drill"]
        assert [t["hash"] for t in result["tensors"]] == \
            [t["hash"] for t in clean_result["tensors"]]
        assert result["collectives"]["ranks_agree"] is True
