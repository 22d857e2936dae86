"""The consensus rule with plain values: usual answer, tie-break, inputs, quorum."""

from __future__ import annotations

from dataclasses import dataclass

from numparity_server.analysis.consensus import (
    Support,
    broken_inputs,
    comparable,
    fleet_inputs,
    fleet_version,
    in_voters,
    judges,
    majority,
    ranked,
    tally,
    usual,
)


def test_most_nodes_then_the_first_node_name_then_the_answer():
    assert usual({"x": Support(3, "n9"), "y": Support(2, "n0")}) == "x"
    assert usual({"x": Support(2, "n9"), "y": Support(2, "n0")}) == "y"
    # Code point order, as Python compares strings: "Z" sorts before "a".
    assert usual({"x": Support(2, "alpha"), "y": Support(2, "Zulu")}) == "y"
    assert usual({"b": Support(2, "n1"), "a": Support(2, "n1")}) == "a"
    assert usual({}) is None


def test_ranked_answers_start_with_the_usual_one():
    """/divergence's groups 1..n: group 1, its baseline, is the usual answer."""
    answers = {"x": Support(2, "n9"), "y": Support(2, "n0"), "z": Support(5, "n7"),
               "w": Support(1, "a")}
    assert ranked(answers) == ["z", "y", "x", "w"]
    assert ranked(answers)[0] == usual(answers)
    assert ranked({}) == []


def test_tally_adds_the_parts_of_one_answer():
    answers = tally([("x", Support(2, "n5")), ("y", Support(3, "n1")), ("x", Support(2, "n0"))])
    assert answers == {"x": Support(4, "n0"), "y": Support(3, "n1")}
    assert usual(answers) == "x"


def test_a_missing_hash_differs_from_nothing():
    fleet = fleet_inputs({("a", "p"): Support(3, "n1"), ("b", "p"): Support(1, "n0"),
                          (None, None): Support(5, "m0")})
    assert fleet == ("a", "p")  # results that report neither hash do not vote
    assert broken_inputs(("b", "p"), fleet) == ["input_hash"]
    assert broken_inputs(("b", "q"), fleet) == ["input_hash", "param_hash"]
    assert broken_inputs((None, "p"), fleet) == []
    assert broken_inputs(("b", "p"), None) == []
    assert fleet_inputs({(None, None): Support(2, "n")}) is None


def test_a_majority_judges_only_with_a_quorum():
    assert majority({"a": Support(4, "n"), "b": Support(1, "m")}, min_peers=3).answer == "a"
    assert majority({"a": Support(2, "n"), "b": Support(2, "m")}, min_peers=1) is None
    assert majority({"a": Support(3, "n")}, min_peers=3) is None  # two peers only
    assert judges(3, 4, min_peers=3) and not judges(2, 4, min_peers=1)


@dataclass(frozen=True)
class Result:
    node: str
    workload_version: int | None
    input_hash: str | None
    param_hash: str | None


def test_comparable_results_are_the_fleets_version_on_the_fleets_bytes():
    results = [Result("n1", 2, "a", "p"), Result("n2", 2, "a", "p"), Result("n3", 2, "b", "p"),
               Result("n4", 1, "b", "p"), Result("n5", 2, None, None)]
    one = lambda r: Support(1, r.node)  # noqa: E731
    assert fleet_version(results, support_of=one) == 2
    assert fleet_version([Result("n", None, "a", "p")], support_of=one) is None
    # One node claiming the next version does not move the fleet's (issue 39, finding
    # 1); a tie goes to the newest, and a rollout moves it once most nodes run it.
    claimed = [*results, Result("evil", 3, "a", "p")]
    assert fleet_version(claimed, support_of=one) == 2
    assert fleet_version([Result("n1", 1, "a", "p"), Result("n2", 2, "a", "p")],
                         support_of=one) == 2
    assert fleet_version([*results, *(Result(f"new-{i}", 3, "a", "p") for i in range(5))],
                         support_of=one) == 3
    kept, left_out = comparable(results, version=2,
                                support_of=lambda r: Support(1, r.node))
    # Version 1's "b" does not vote: the fleet's bytes are those of version 2's results.
    assert [r.node for r in kept] == ["n1", "n2", "n5"]
    assert [(r.node, reason) for r, reason in left_out] == [
        ("n4", "workload version 1, not 2"),
        ("n3", "input_hash differ from the fleet's: broken inputs, not a divergence"),
    ]
    everything, none_left = comparable(results[:2] + results[4:], version=None,
                                       support_of=lambda r: Support(1, r.node))
    assert len(everything) == 3 and none_left == []


def test_a_nodes_devices_without_identity_are_one_voter_for_each_answer():
    """Finding 3 (issue 29): node-a's 8 GPUs without a UUID give "wrong"; 4 honest GPUs
    known by UUID give "right". Counted in devices "wrong" is usual (8 > 4); in voters
    it is one voter, and "right" is usual. node-z's 2 such devices split over two
    answers give one voter to each."""
    devices = {"wrong": Support(8 + 1, "node-a"), "right": Support(4 + 1, "node-b")}
    assert usual(devices) == "wrong"
    voted = in_voters(devices, [("wrong", "node-a", 8), ("wrong", "node-z", 1),
                                ("right", "node-z", 1)])
    assert voted == {"wrong": Support(2, "node-a"), "right": Support(5, "node-b")}
    assert usual(voted) == "right" and ranked(voted) == ["right", "wrong"]


def test_an_honest_fleet_has_as_many_voters_as_devices():
    """GPUs known by UUID and one CPU a node: nothing to count apart, the same answers."""
    devices = {"a": Support(3, "n-1"), "b": Support(3, "m-1")}
    assert in_voters(devices, [("a", "n-1", 1), ("b", "m-1", 1)]) == devices
    assert usual(in_voters(devices, [])) == usual(devices) == "b"
