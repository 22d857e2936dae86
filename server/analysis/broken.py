"""Broken inputs across the fleet (design §2.1): the input and parameter bytes of a
workload are the same everywhere by construction, so a result on other bytes than the
fleet's is a bug on that node. The fleet's bytes are ``consensus.fleet_inputs``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .consensus import Inputs, Support, broken_inputs, fleet_inputs, tally

Ref = TypeVar("Ref", bound=Hashable)  # what the caller names a result by (an outcome id)
# (suite, workload, workload_version, variant): results that must share their bytes.
WorkloadKey = tuple[str, str, "int | None", str]


@dataclass(frozen=True)
class BrokenInputs:
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    differs: list[str]  # input_hash, param_hash or both
    input_hash: str | None
    fleet_input_hash: str | None
    param_hash: str | None
    fleet_param_hash: str | None


def broken_results(results: Iterable[tuple[Ref, WorkloadKey, Inputs, Support]]
                   ) -> dict[Ref, BrokenInputs]:
    """``(ref, key, (input_hash, param_hash), support)`` of ok results → the results on
    other bytes than the fleet's, with what differs."""
    holders: dict[WorkloadKey, list[tuple[Inputs, Support]]] = defaultdict(list)
    refs: dict[tuple[WorkloadKey, Inputs], list[Ref]] = defaultdict(list)
    for ref, key, inputs, support in results:
        holders[key].append((inputs, support))
        refs[(key, inputs)].append(ref)
    found: dict[Ref, BrokenInputs] = {}
    for key, held in holders.items():
        hashes = tally(held)
        fleet = fleet_inputs(hashes)
        if fleet is None:
            continue
        for inputs in hashes:
            differing = broken_inputs(inputs, fleet)
            if not differing:
                continue
            for ref in refs[(key, inputs)]:
                found[ref] = BrokenInputs(*key, differs=differing,
                                          input_hash=inputs[0], fleet_input_hash=fleet[0],
                                          param_hash=inputs[1], fleet_param_hash=fleet[1])
    return found
