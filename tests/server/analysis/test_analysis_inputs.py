"""Which input and parameter bytes are the fleet's, and which results are on others."""

from __future__ import annotations

from collections import Counter

from numparity_server.analysis import broken_inputs, most_common_inputs


def test_the_inputs_most_nodes_hold_are_the_fleets_and_ties_keep_their_order():
    assert most_common_inputs(Counter({("a", "p"): 3, ("b", "p"): 1})) == [("a", "p")]
    tied = Counter()
    for inputs in (("b", "p"), ("a", "p"), ("a", "p"), ("b", "p")):
        tied[inputs] += 1
    assert most_common_inputs(tied) == [("b", "p"), ("a", "p")]  # first met first
    assert most_common_inputs(Counter()) == []


def test_broken_inputs_names_the_hashes_that_differ_and_an_unknown_hash_differs_from_nothing():
    fleet = ("in-0", "par-0")
    assert broken_inputs(("in-0", "par-0"), fleet) == []
    assert broken_inputs(("in-1", "par-0"), fleet) == ["input_hash"]
    assert broken_inputs(("in-1", "par-1"), fleet) == ["input_hash", "param_hash"]
    assert broken_inputs((None, "par-1"), fleet) == ["param_hash"]
    assert broken_inputs(("in-1", None), (None, None)) == []
