"""The fleet's usual answer: one rule for every feature that needs it.

A set of results is summarised as answers (a manifest hash, a tensor hash, the pair of
input and parameter hashes) with their ``Support``: how many nodes give the answer and
the first of them by name. The usual answer is the one most nodes give; of a tie, the
one whose first node name sorts first (in code point order, as Python compares
strings; the database queries order names the same way, ``kit.db.codepoint_order``),
then the answer's own text. /divergence, /compare's broken inputs, the audit, /metrics,
the fleet page and the demo report all call this module, so they name the same answer.
Each counts voters, not devices (``in_voters``): a node's devices without a stable
identity are one voter.

The input and parameter bytes are the same on every node by construction (design
§2.1): a result on other bytes than the fleet's is a bug on that node (broken inputs),
not a divergence. A hash a result does not report (None: an agent that could not
compute it) differs from nothing: such a result is neither broken nor evidence of what
the fleet's bytes are.

A usual answer judges a node (the audit's suspects) only as a majority with a quorum:
more than half of the nodes give it, and a node has at least ``min_peers`` peers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

Answer = TypeVar("Answer", bound=Hashable)
Inputs = tuple[str | None, str | None]  # (input_hash, param_hash)


@dataclass(frozen=True)
class Support:
    """How many nodes give an answer, and the first of them by name."""

    nodes: int
    first_node: str

    def __add__(self, other: Support) -> Support:
        return Support(self.nodes + other.nodes, min(self.first_node, other.first_node))


def tally(holders: Iterable[tuple[Answer, Support]]) -> dict[Answer, Support]:
    """Support per answer, adding up the parts (rows per environment, per outcome …)."""
    found: dict[Answer, Support] = {}
    for answer, support in holders:
        found[answer] = found[answer] + support if answer in found else support
    return found


def in_voters(answers: Mapping[Answer, Support],
              unstable: Iterable[tuple[Answer, str, int]]) -> dict[Answer, Support]:
    """``answers`` counted in devices, counted in voters (design §3.3.12, "Peers are
    voters"): a device known by a UUID or serial is a voter, but all the devices of one
    node without a stable identity (known by slot only, or a claim of another node's
    device) that give one answer are one voter. ``unstable`` names them, as (answer,
    node, devices) — only where a node has several matters; each gives its answer
    ``devices - 1`` fewer voters. Every usual answer is chosen on these counts, so a
    node cannot multiply its vote by reporting made-up devices."""
    extra: dict[Answer, int] = {}
    for answer, _node, devices in unstable:
        if answer in answers and devices > 1:
            extra[answer] = extra.get(answer, 0) + devices - 1
    return {answer: Support(support.nodes - extra.get(answer, 0), support.first_node)
            for answer, support in answers.items()}


def usual(answers: Mapping[Answer, Support]) -> Answer | None:
    """The answer most nodes give; ties to the first node name, then the answer's text."""
    if not answers:
        return None
    return min(answers, key=_rule(answers))


def ranked(answers: Mapping[Answer, Support]) -> list[Answer]:
    """Every answer, by the same rule: the usual one first (/divergence's groups 1..n, so
    its baseline, group 1, is the usual answer)."""
    return sorted(answers, key=_rule(answers))


def _rule(answers: Mapping[Answer, Support]) -> Callable[[Answer], tuple[int, str, str]]:
    return lambda a: (-answers[a].nodes, answers[a].first_node, str(a))


@dataclass(frozen=True)
class Majority:
    answer: str
    holders: int  # nodes giving it
    nodes: int  # nodes with any answer


def majority(answers: Mapping[str, Support], *, min_peers: int) -> Majority | None:
    """The usual answer when it judges: more than half of the nodes give it and each node
    has at least ``min_peers`` peers. A split without a strict majority judges nobody."""
    found = usual(answers)
    if found is None:
        return None
    holders = answers[found].nodes
    total = sum(support.nodes for support in answers.values())
    return Majority(found, holders, total) if judges(holders, total, min_peers=min_peers) \
        else None


def judges(holders: int, nodes: int, *, min_peers: int) -> bool:
    """A usual answer held by ``holders`` of ``nodes`` is a majority with a quorum."""
    return nodes - 1 >= min_peers and 2 * holders > nodes


def fleet_inputs(answers: Mapping[Inputs, Support]) -> Inputs | None:
    """The fleet's (input_hash, param_hash): the usual pair among results that report at
    least one of them."""
    return usual({inputs: support for inputs, support in answers.items()
                  if inputs != (None, None)})


def broken_inputs(own: Inputs, fleet: Inputs | None) -> list[str]:
    """The names of the hashes in which ``own`` differs from the fleet's; a hash either
    side does not report (None) differs from nothing."""
    if fleet is None:
        return []
    return [name for name, mine, theirs in (("input_hash", own[0], fleet[0]),
                                             ("param_hash", own[1], fleet[1]))
            if mine is not None and theirs is not None and mine != theirs]


class VersionedResult(Protocol):
    """What ``comparable`` reads of a result: its workload version and input bytes."""

    @property
    def workload_version(self) -> int | None: ...
    @property
    def input_hash(self) -> str | None: ...
    @property
    def param_hash(self) -> str | None: ...


Result = TypeVar("Result", bound=VersionedResult)


def fleet_version(results: Iterable[Result], *, support_of: Callable[[Result], Support]
                  ) -> int | None:
    """The workload version the fleet compares: the one most voters report (each result
    counted with ``support_of``), of a tie the newest; None when none reports one. Not
    merely the newest: one node claiming the next version would otherwise leave every
    other node's results out as "another version". A rollout moves it once most voters
    run the new agent."""
    versions = tally((r.workload_version, support_of(r)) for r in results
                     if r.workload_version is not None)
    if not versions:
        return None
    return min(versions, key=lambda v: (-versions[v].nodes, -v))


def comparable(results: Iterable[Result], *, version: int | None,
               support_of: Callable[[Result], Support],
               crowded: Callable[[Result], Iterable[tuple[str, int]]] = lambda _r: ()
               ) -> tuple[list[Result], list[tuple[Result, str]]]:
    """The results ``/divergence`` compares: those of workload version ``version`` (all of
    them when None) on the fleet's input and parameter bytes (``fleet_inputs`` among that
    version's results, each counted with ``support_of``, in voters: ``crowded`` names a
    result's (node, devices) without a stable identity, ``in_voters``); and the others,
    each with why it is left out, those of another version first."""
    left_out: list[tuple[Result, str]] = []
    same_version: list[Result] = []
    for result in results:
        if version is not None and result.workload_version != version:
            left_out.append((result, f"workload version {result.workload_version}, "
                                     f"not {version}"))
        else:
            same_version.append(result)
    per_node: dict[tuple[Inputs, str], int] = {}
    for result in same_version:
        for node, devices in crowded(result):
            found = ((result.input_hash, result.param_hash), node)
            per_node[found] = per_node.get(found, 0) + devices
    fleet = fleet_inputs(in_voters(
        tally(((r.input_hash, r.param_hash), support_of(r)) for r in same_version),
        [(inputs, node, devices) for (inputs, node), devices in per_node.items()]))
    kept: list[Result] = []
    for result in same_version:
        broken = broken_inputs((result.input_hash, result.param_hash), fleet)
        if broken:
            left_out.append((result, f"{' and '.join(broken)} differ from the fleet's: "
                                     "broken inputs, not a divergence"))
        else:
            kept.append(result)
    return kept, left_out
