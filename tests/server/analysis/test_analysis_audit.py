"""The audit's pure statistics on hand-made fleets, no database: usual answers, quorum,
suspect/watch, drills, statuses, stale nodes, inventory, broken inputs, drift, the cost
of determinism."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from numparity_server.analysis.audit import (
    Deviation,
    DeviceLabel,
    Majority,
    classify_suspects,
    majorities,
    suspect_statuses,
    usual_answers,
)
from numparity_server.analysis.broken import broken_results
from numparity_server.analysis.consensus import Support
from numparity_server.analysis.determinism_cost import WallTime, determinism_cost
from numparity_server.analysis.drift import (
    AttributeChange,
    ChangedOutput,
    attribute_changes,
    outputs_changed,
)
from numparity_server.analysis.inventory import InventoryCount, inventory
from numparity_server.analysis.node_status import node_statuses, stale_nodes, status_counts

CNN = ("standard", "cnn", 1, "cpu")
MLP = ("standard", "mlp", 1, "cpu")


def test_the_usual_answer_and_when_it_judges():
    rows = [(1, CNN, "a", 4), (1, CNN, "b", 1),  # 4 of 5: judges
            (2, CNN, "a", 2), (2, CNN, "b", 2),  # a tie: no majority
            (3, CNN, "a", 3),                    # 2 peers only
            (4, CNN, "c", 3), (4, CNN, "d", 1)]  # 3 peers, 3 of 4
    first = {"a": "n2", "b": "n1", "c": "n5", "d": "n0"}
    usual = usual_answers((env, key, answer, Support(nodes, first[answer]))
                          for env, key, answer, nodes in rows)
    assert usual[(1, CNN)] == Majority("a", 4, 5)
    # A usual answer exists even for a tie (the answer of the first node by name) ...
    assert usual[(2, CNN)] == Majority("b", 2, 4)
    judged = majorities(usual, min_peers=3)
    assert set(judged) == {(1, CNN), (4, CNN)}  # ... but does not judge
    assert set(majorities(usual, min_peers=2)) == {(1, CNN), (3, CNN), (4, CNN)}


NODE_DEVICE = {"twice": 1, "once": 2, "spoiled": 3, "elsewhere": 4}
LABELS = {device: DeviceLabel("cpu", None, None, None, None) for device in range(1, 5)}


def deviation(node, key=CNN, runs=1, drills=0, run_id="r9", device=None):
    return Deviation(device=device or NODE_DEVICE[node], node=node, environment=1, key=key,
                     manifest_hash="b", runs=runs, drill_runs=drills, run_id=run_id)


def test_suspect_after_two_runs_watch_after_one_drills_marked():
    majority = {(1, CNN): Majority("a", 4, 5), (1, MLP): Majority("a", 4, 5)}
    deviations = [
        deviation("twice", runs=2, drills=2), deviation("once"),
        # One bad run spoils two workloads: counted per key, the largest count is the node's.
        deviation("spoiled", key=CNN), deviation("spoiled", key=MLP),
        # Not judged: its environment has no majority here.
        Deviation(4, "elsewhere", 2, CNN, "b", 5, 0, "r1")]
    current = {(1, 1, "b"), (3, 1, "b")}  # "once" agrees again
    entries = classify_suspects(deviations, majority, {1: "env-1"}, {(1, CNN): ("peer-run", "cpu")},
                                current, LABELS)
    by_node = {entry.node: entry for entry in entries}
    assert set(by_node) == {"twice", "once", "spoiled"}
    assert by_node["twice"].status == "suspect" and by_node["twice"].drill is True
    assert by_node["twice"].compare.run_a == "peer-run"
    assert by_node["twice"].compare.run_b == "r9"
    assert by_node["once"].status == "watch"
    assert by_node["once"].currently_disagrees is False
    assert by_node["spoiled"].status == "watch"
    assert by_node["spoiled"].disagreeing_runs == 1
    assert [k.workload for k in by_node["spoiled"].keys] == ["cnn", "mlp"]
    assert by_node["twice"].peers == 4 and by_node["twice"].env_key == "env-1"
    assert by_node["twice"].detail == "twice / cpu disagrees with 4 identical peers in 2 runs"
    # The summary's statuses, read without current answers or peer runs, are the same.
    assert suspect_statuses(deviations, majority) == {
        node: entry.status for node, entry in by_node.items()}


def test_each_gpu_of_a_node_is_judged_on_its_own_and_the_node_takes_the_worst():
    """Two GPUs of one node disagree, one in two runs, one in one: two entries naming
    each GPU by slot and UUID; the node is suspect."""
    gpu = "cuda/NVIDIA A100-SXM4-80GB/8.0"
    key = ("standard", "cnn", 1, gpu)
    majority = {(1, key): Majority("a", 6, 8)}
    labels = {11: DeviceLabel("cuda:3", "GPU-3333", "s3", "0000:03:00.0", "NVIDIA A100"),
              12: DeviceLabel("cuda:5", "GPU-5555", None, None, "NVIDIA A100")}
    deviations = [deviation("gpu-17", key=key, runs=2, device=11),
                  deviation("gpu-17", key=key, runs=1, device=12)]
    entries = classify_suspects(deviations, majority, {1: "env-1"}, {}, set(), labels)
    assert [(e.node, e.device, e.device_uuid, e.status) for e in entries] == [
        ("gpu-17", "cuda:3", "GPU-3333", "suspect"), ("gpu-17", "cuda:5", "GPU-5555", "watch")]
    assert entries[0].detail == ("gpu-17 / cuda:3 (NVIDIA A100, UUID GPU-3333, serial s3) "
                                 "disagrees with 7 identical peers in 2 runs")
    assert entries[0].keys[0].device == gpu
    assert suspect_statuses(deviations, majority) == {"gpu-17": "suspect"}


def test_a_node_counts_under_each_of_its_statuses_and_ok_is_none_of_them():
    statuses = node_statuses(["a", "b", "c", "d"], suspects={"a": "suspect", "b": "watch"},
                             nondeterministic={"a"}, stale={"c"})
    assert statuses == {"a": {"suspect", "nondeterministic"}, "b": {"watch"},
                        "c": {"stale"}, "d": {"ok"}}
    assert status_counts(statuses) == {"ok": 1, "suspect": 1, "watch": 1,
                                       "nondeterministic": 1, "stale": 1}


def test_stale_nodes_the_longest_silent_first():
    now = datetime(2026, 11, 25, 12, tzinfo=timezone.utc)
    seen = {"fresh": now - timedelta(hours=1), "gone": now - timedelta(hours=80),
            "quiet": now - timedelta(hours=49.96)}
    found = stale_nodes(seen, now=now, stale_after_hours=48)
    assert [(entry.node, entry.hours_since) for entry in found] == [("gone", 80.0),
                                                                     ("quiet", 50.0)]


def test_inventory_counts_nodes_by_their_current_environment():
    columns = {1: {"gpu_name": None, "torch": "2.13.0"}, 2: {"gpu_name": "A100",
                                                             "torch": "2.13.0"}}
    columns = {env: {**dict.fromkeys(("compute_capability", "driver", "cuda", "cudnn",
                                      "cpu_capability")), **found}
               for env, found in columns.items()}
    found = inventory({"n1": 1, "n2": 2, "n3": 2}, columns)
    assert found["gpu_name"] == [InventoryCount("A100", 2), InventoryCount(None, 1)]
    assert found["torch"] == [InventoryCount("2.13.0", 3)]


def test_broken_inputs_are_the_results_on_other_bytes_than_the_fleets():
    key = ("standard", "cnn", 1, "default")
    found = broken_results([
        (10, key, ("in-a", "p"), Support(5, "n1")),
        (11, key, ("in-b", "p"), Support(1, "n9")),
        (12, key, (None, None), Support(1, "n0")),  # reports no hash: differs from nothing
    ])
    assert set(found) == {11}
    assert found[11].differs == ["input_hash"] and found[11].fleet_input_hash == "in-a"


def test_drift_names_the_attributes_and_the_outputs_that_changed():
    assert attribute_changes({"torch": "2.12", "mkl": "x"}, {"torch": "2.13", "mkl": "x"}) == \
        [AttributeChange("torch", "2.12", "2.13")]
    before = {("standard", "cnn", "default", "cpu"): "m1",
              ("standard", "mlp", "default", "cpu"): "m2"}
    after = {("standard", "cnn", "default", "cpu"): "m3",
             ("standard", "mlp", "default", "cpu"): "m2",
             ("standard", "new", "default", "cpu"): "m4"}
    assert outputs_changed(before, after) == [ChangedOutput("standard", "cnn", "default",
                                                            "cpu")]


def test_the_cost_of_determinism_per_environment_dearest_first():
    # Two and three devices that each timed the same: no spread between them.
    times = [WallTime(1, "cnn", "default", 1.0, 2), WallTime(1, "cnn", "strict", 1.5, 2),
             WallTime(2, "cnn", "default", 1.0, 3), WallTime(2, "cnn", "strict", 3.0, 3),
             WallTime(2, "mlp", "default", 1.0, 3),  # no strict timing: left out
             WallTime(2, "cnn", "bf16-autocast", 9.0, 3)]
    costs = determinism_cost(times, {1: "env-1", 2: "env-2"})
    assert [(cost.env_key, cost.nodes, cost.ratio) for cost in costs] == [
        ("env-2", 3, pytest.approx(3.0)), ("env-1", 2, pytest.approx(1.5))]
    assert [w.workload for w in costs[0].workloads] == ["cnn"]
    assert costs[0].ratio_uncertainty == 0.0 and costs[0].note == "3.00× ± 0.00"


def _devices(environment, variant, seconds, spread=None):
    """WallTimes of one device each: what the audit's aggregate gives for them."""
    return [WallTime(environment, "cnn", variant, s, 1, s * s,
                     spread, 1 if spread is not None else 0) for s in seconds]


def test_the_cost_of_determinism_carries_its_uncertainty_against_an_independent_estimate():
    default = [1.00, 1.10, 0.90, 1.05]
    strict = [1.50, 1.70, 1.40, 1.60]
    (cost,) = determinism_cost(_devices(1, "default", default)
                               + _devices(1, "strict", strict), {1: "env"})
    # The standard error of each mean (numpy, ddof=1), propagated through the quotient.
    se_d = np.std(default, ddof=1) / np.sqrt(4)
    se_s = np.std(strict, ddof=1) / np.sqrt(4)
    ratio = np.mean(strict) / np.mean(default)
    expected = ratio * np.hypot(se_s / np.mean(strict), se_d / np.mean(default))
    assert cost.ratio == pytest.approx(ratio) and cost.ratio_estimate == pytest.approx(ratio)
    assert cost.ratio_uncertainty == pytest.approx(expected)
    assert cost.note == f"{ratio:.2f}× ± {expected:.2f}"


def test_a_cost_within_the_noise_or_from_one_run_is_not_shown():
    # strict 1.2× default from one noisy device with its own spread (± 0.47): hidden.
    noisy = determinism_cost(_devices(1, "default", [1.0], spread=0.3)
                             + _devices(1, "strict", [1.2], spread=0.3), {1: "env"})
    assert noisy[0].ratio is None and noisy[0].ratio_estimate == pytest.approx(1.2)
    assert noisy[0].note == "1.20× ± 0.47: within the noise, not shown"
    # One device, one timed repeat: the uncertainty is unknown, so nothing is shown.
    lone = determinism_cost(_devices(1, "default", [1.0]) + _devices(1, "strict", [2.0]),
                            {1: "env"})
    assert lone[0].ratio is None and lone[0].ratio_uncertainty is None
    assert "one timed run" in lone[0].note
    # The same device's spread when it is small: the effect is measured.
    steady = determinism_cost(_devices(1, "default", [1.0], spread=0.01)
                              + _devices(1, "strict", [2.0], spread=0.01), {1: "env"})
    assert steady[0].ratio == pytest.approx(2.0)
    assert steady[0].ratio_uncertainty == pytest.approx(2.0 * np.hypot(0.01 / 2, 0.01))
