"""The audit's pure judgements: usual answers, quorum, suspect/watch, drills."""

from __future__ import annotations

from numparity_server.analysis.audit import (
    Deviation,
    Majority,
    classify_suspects,
    majorities,
    usual_answers,
)
from numparity_server.analysis.consensus import Support

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


def deviation(node, key=CNN, runs=1, drills=0, latest=True, run_id="r9"):
    return Deviation(node=node, environment=1, key=key, manifest_hash="b", runs=runs,
                     drill_runs=drills, run_id=run_id, latest=latest)


def test_suspect_after_two_runs_watch_after_one_drills_marked():
    majority = {(1, CNN): Majority("a", 4, 5), (1, MLP): Majority("a", 4, 5)}
    entries = classify_suspects(
        [deviation("twice", runs=2, drills=2), deviation("once", latest=False),
         # One bad run spoils two workloads: counted per key, the largest count is the node's.
         deviation("spoiled", key=CNN), deviation("spoiled", key=MLP),
         # Not judged: its environment has no majority here.
         Deviation("elsewhere", 2, CNN, "b", 5, 0, "r1", True)],
        majority, {1: "env-1"}, {(1, CNN): "peer-run"})
    by_node = {entry["node"]: entry for entry in entries}
    assert set(by_node) == {"twice", "once", "spoiled"}
    assert by_node["twice"]["status"] == "suspect" and by_node["twice"]["drill"] is True
    assert by_node["twice"]["compare"]["run_a"] == "peer-run"
    assert by_node["twice"]["compare"]["run_b"] == "r9"
    assert by_node["once"]["status"] == "watch"
    assert by_node["once"]["currently_disagrees"] is False
    assert by_node["spoiled"]["status"] == "watch"
    assert by_node["spoiled"]["disagreeing_runs"] == 1
    assert [k["workload"] for k in by_node["spoiled"]["keys"]] == ["cnn", "mlp"]
    assert by_node["twice"]["peers"] == 4 and by_node["twice"]["env_key"] == "env-1"
