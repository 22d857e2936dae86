"""The divergence report of one comparison key (GET /divergence): JSON-ready.

Its cost grows with the distinct answers, not their square nor the nodes: each group is
compared with the baseline, group 1 (the usual answer, ``consensus.ranked``), and the
full matrix of pairs only a page at a time, on request. The comparisons themselves are
pure functions of content (``pairs``), kept by the caller under their keys, so the
report is made in three steps:

1. ``plan_divergence`` groups the members and names every comparison the report shows
   by its key (``DivergencePlan.keys``);
2. for the keys not kept, ``DivergencePlan.needs`` says which fingerprints and op traces
   to load and ``DivergencePlan.compute`` computes them;
3. ``DivergencePlan.report`` assembles the answer from the comparisons by key, with what
   depends on the members (groups and their members, attribution, notes) made now.

``divergence_report`` does all three with nothing kept (tests, a CLI).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._json import json_safe
from .attribution import (
    Flattened,
    flatten_members,
    rank_attributes,
    separating_devices,
    separating_environments,
)
from .fingerprint import Fingerprint
from .groups import Group, Member, group_members, members_page
from .origin import no_trace_note
from .pairs import (
    ComparisonRecord,
    ToleranceFor,
    compare_answers,
    fp64_judgement,
    fp64_key,
    needed,
    origin_between,
    origin_key,
    pair_key,
)
from .trace import Trace

PairsMode = Literal["baseline", "all"]

ORIGIN_NOT_ASKED = ("not computed: origin ops are computed for the pairs with the "
                    "baseline (group 1), and for the other pairs of a page of the full "
                    "matrix on request")
TRACE_GONE = "the op trace of a representative is no longer stored"
# A comparison a request's computing time did not reach (the server's kit.compute).
PENDING = ("not computed yet: this request's computing time went to the comparisons "
           "before it; ask again (what was computed is kept, so the next ask goes on)")


@dataclass(frozen=True)
class PlannedPair:
    """Group b compared with group a (the reference: the larger, the baseline in the
    default mode). ``origin``: its origin ops are wanted; ``origin_key`` is None when
    they are not, or a representative has no trace."""

    a: Group
    b: Group
    key: str
    origin: bool
    origin_key: str | None


@dataclass
class DivergencePlan:
    tensor: str | None
    groups: list[Group]
    without: list[str]
    pairs: list[PlannedPair]
    pairs_mode: PairsMode
    pairs_total: int
    traced: bool  # whether origin ops are looked for at all
    fp64: dict[int, str] = field(default_factory=dict)  # group id -> its judgement's key
    reference: str | None = None  # the float64 answer's hash
    baseline: str | None = None  # the strict CPU answer's hash
    without_total: int | None = None  # members without the tensor (None: len(without))

    def keys(self) -> set[str]:
        """Every comparison the report shows, by key."""
        found = {pair.key for pair in self.pairs}
        found.update(pair.origin_key for pair in self.pairs if pair.origin_key)
        found.update(self.fp64.values())
        return found

    def needs(self, missing: Collection[str]) -> tuple[set[str], set[str]]:
        """(fingerprint hashes, op trace hashes) that computing ``missing`` reads."""
        fingerprints: set[str] = set()
        traces: set[str] = set()
        for pair in self.pairs:
            if pair.key in missing or pair.origin_key in missing:
                fingerprints |= needed(pair.a, pair.b, tensor=self.tensor)
            if pair.origin_key in missing:
                traces.update(t for t in (pair.a.representative.trace,
                                          pair.b.representative.trace) if t)
        groups = {group.id: group for group in self.groups}
        for group_id, key in self.fp64.items():
            if key in missing:
                fingerprints.add(groups[group_id].hash)
                fingerprints.update(h for h in (self.reference, self.baseline) if h)
        return fingerprints, traces

    def compute(self, missing: Collection[str], *, fingerprints: Mapping[str, Fingerprint],
                traces: Mapping[str, Trace], tolerance_for: ToleranceFor | None = None
                ) -> list[ComparisonRecord]:
        """The comparisons of ``missing`` (an origin whose trace is not stored, or an fp64
        judgement without the fingerprints, is left out: the report says why)."""
        found: list[ComparisonRecord] = []
        done: set[str] = set()
        for pair in self.pairs:
            if pair.key in missing and pair.key not in done:
                done.add(pair.key)
                found.append(compare_answers(pair.a, pair.b, key=pair.key, tensor=self.tensor,
                                             fingerprints=fingerprints,
                                             tolerance_for=tolerance_for))
            if pair.origin_key and pair.origin_key in missing and pair.origin_key not in done:
                done.add(pair.origin_key)
                origin = origin_between(pair.a, pair.b, key=pair.origin_key, traces=traces,
                                        fingerprints=fingerprints, tolerance_for=tolerance_for)
                if origin is not None:
                    found.append(origin)
        groups = {group.id: group for group in self.groups}
        for group_id, key in self.fp64.items():
            if key in missing and key not in done and self.reference:
                done.add(key)
                judged = fp64_judgement(groups[group_id], key=key, fingerprints=fingerprints,
                                        reference=self.reference, baseline=self.baseline,
                                        tolerance_for=tolerance_for)
                if judged is not None:
                    found.append(judged)
        return found

    def report(self, comparisons: Mapping[str, Mapping[str, Any]], *,
               members_limit: int | None = None, members_offset: int = 0,
               flattened: Flattened | None = None,
               pending: Collection[str] = ()) -> dict[str, Any]:
        """The answer, from the comparisons by key (every key of ``keys`` that could be
        computed). Groups list ``members_limit`` members (all: None) from
        ``members_offset``.
        ``flattened``: every environment of the groups, flattened, by env_key (the
        server keeps them; by default they are flattened from the groups' documents).
        ``pending``: origin keys left for a later request (their note says so)."""
        group_rows = []
        for group in self.groups:
            row = group.to_dict(members_limit, members_offset)
            if self.tensor is not None and self.reference is not None:
                row["fp64"] = comparisons.get(self.fp64.get(group.id, ""))
            group_rows.append(row)
        if flattened is None:
            flattened = flatten_members(self.groups)
        # Attribution reads the members' environments: made per request (a few dozen
        # environments, not the nodes), never kept with the comparison.
        envs = {group.id: set(group.env_counts) for group in self.groups}
        pairs = []
        skipped = False
        for pair in self.pairs:
            separating = (separating_environments(envs[pair.a.id], envs[pair.b.id], flattened)
                          # Devices of one environment: their type, model or capability.
                          or separating_devices(pair.a.model_counts, pair.b.model_counts))
            origin, note = None, None
            if self.traced:
                origin, note = self._origin(pair, comparisons, pending)
                skipped |= not pair.origin
            # Design §3.3.16: a nondeterministic answer is one draw, so an attribute that
            # happens to separate it is no cause; withheld, and said why.
            withheld = nondeterminism_note(pair.a, pair.b)
            pairs.append({
                "a": pair.a.id,
                "b": pair.b.id,
                **comparisons[pair.key],
                "attribution": [] if withheld else separating,
                "indistinguishable": not withheld and len(separating) > 1,
                "nondeterministic": withheld is not None,
                "attribution_withheld": separating if withheld else [],
                "attribution_note": withheld,
                "origin": origin,
                "origin_note": note,
            })
        cut = members_page(members_limit, members_offset)
        return json_safe({
            "tensor": self.tensor,
            "baseline": self.groups[0].id if self.groups else None,
            "groups": group_rows,
            "pairs_mode": self.pairs_mode,
            "pairs_total": self.pairs_total,
            "pairs": pairs,
            "attribution": rank_attributes(self.groups, flattened=flattened),
            "nondeterministic_groups": [g.id for g in self.groups if g.nondeterministic],
            "members_without_tensor": self.without[cut],
            "members_without_tensor_total": (len(self.without) if self.without_total is None
                                             else self.without_total),
            "origin_note": ("origin ops only for the pairs with the baseline (group 1); "
                            "the other pairs of this page have theirs on request")
                           if skipped else None,
        })

    def _origin(self, pair: PlannedPair, comparisons: Mapping[str, Mapping[str, Any]],
                pending: Collection[str] = ()) -> tuple[Mapping[str, Any] | None, str | None]:
        if not pair.origin:
            return None, ORIGIN_NOT_ASKED
        sides = ((pair.a, pair.a.representative), (pair.b, pair.b.representative))
        without = [f"group {group.id}'s representative ({member.node})"
                   for group, member in sides if member.trace is None]
        if without:
            return None, no_trace_note(without)
        found = comparisons.get(pair.origin_key or "")
        if found is None and pair.origin_key in pending:
            return None, PENDING
        return (found, None) if found is not None else (None, TRACE_GONE)


def plan_divergence(
    *,
    members: Sequence[Member],
    tensor: str | None,
    workload: str,
    policy_version: str,
    pairs: PairsMode = "baseline",
    limit: int | None = None,
    offset: int = 0,
    origins: bool = False,
    traced: bool = True,
    reference: str | None = None,
    baseline: str | None = None,
) -> DivergencePlan:
    """Groups and the comparisons to show, by key.

    ``pairs="baseline"``: every group against group 1, ``groups - 1`` pairs, each with its
    origin ops. ``pairs="all"``: the pair matrix (i < j, group j against group i) in
    order; origin ops for those with group 1, and for every pair of the page with
    ``origins``. Either way ``limit`` pairs (None: all) from ``offset``. ``traced``
    False looks for no origin ops. With ``reference`` (the float64 answer's hash of
    ``tensor``) each group gets an fp64 judgement against ``baseline`` (the strict CPU
    answer's hash).
    """
    groups, without = group_members(members, tensor)
    return plan_groups(groups, without, tensor=tensor, workload=workload,
                       policy_version=policy_version, pairs=pairs, limit=limit, offset=offset,
                       origins=origins, traced=traced, reference=reference, baseline=baseline)


def plan_groups(
    groups: list[Group], without: list[str], *, tensor: str | None, workload: str,
    policy_version: str, pairs: PairsMode = "baseline", limit: int | None = None,
    offset: int = 0, origins: bool = False, traced: bool = True,
    reference: str | None = None, baseline: str | None = None,
    without_total: int | None = None,
) -> DivergencePlan:
    """``plan_divergence`` of groups already made (ids 1..n in ``consensus.ranked``
    order): a fleet read from its counts lists only the first members of each group and
    of ``without`` (``without_total`` then says how many lack the tensor)."""
    if pairs == "baseline":
        total = max(len(groups) - 1, 0)
        chosen = [(groups[0], group) for group in groups[1 + offset:][:limit]]
    else:
        chosen, total = _matrix_page(groups, offset, limit)

    def planned(a: Group, b: Group) -> PlannedPair:
        wanted = traced and (a.id == 1 or origins)
        return PlannedPair(
            a, b, pair_key(a, b, tensor=tensor, workload=workload,
                           policy_version=policy_version),
            wanted, origin_key(a, b, workload=workload, policy_version=policy_version)
            if wanted else None)

    fp64 = {}
    if tensor is not None and reference is not None:
        fp64 = {group.id: fp64_key(group, reference=reference, baseline=baseline,
                                   workload=workload, policy_version=policy_version)
                for group in groups}
    return DivergencePlan(tensor, groups, without, [planned(a, b) for a, b in chosen], pairs,
                          total, traced, fp64, reference, baseline, without_total)


def _matrix_page(groups: Sequence[Group], offset: int, limit: int | None
                 ) -> tuple[list[tuple[Group, Group]], int]:
    """The pairs (i < j) in order, ``limit`` from ``offset``, and how many there are;
    whole rows are skipped by arithmetic, so a far page costs its rows, not the matrix."""
    n = len(groups)
    total = n * (n - 1) // 2
    page: list[tuple[Group, Group]] = []
    remaining = total if limit is None else limit
    i, skip = 0, offset
    while i < n and skip >= n - 1 - i:  # whole rows before the page
        skip -= n - 1 - i
        i += 1
    while i < n and remaining > 0:
        for j in range(i + 1 + skip, n):
            if remaining == 0:
                break
            page.append((groups[i], groups[j]))
            remaining -= 1
        skip = 0
        i += 1
    return page, total


def nondeterminism_note(a: Group, b: Group) -> str | None:
    """Why the attribution of a pair is withheld (design §3.3.16), or None: a group some of
    whose results had repeats that disagree is nondeterministic, and an attribute that
    separates it from another answer explains nothing; what does is the op that
    differs on the same inputs (the audit's nondeterministic ops) or a reproduction
    (`explain`). Groups that are each internally repeatable keep their attribution."""
    which = [str(group.id) for group in (a, b) if group.nondeterministic]
    if not which:
        return None
    groups = " and ".join(which)
    return (f"group {groups} {'are' if len(which) > 1 else 'is'} nondeterministic (repeats "
            "of a result there disagree): the split may be the same computation giving "
            "other bits, not the environment, so no attribute is named as its cause; the "
            "audit's nondeterministic ops name the op, and `numparity-agent explain` "
            "reproduces an environment's effect")


def divergence_report(
    *,
    members: Sequence[Member],
    tensor: str | None,
    fingerprints: Mapping[str, Fingerprint],
    tolerance_for: ToleranceFor | None = None,
    reference: Fingerprint | None = None,
    baseline: Fingerprint | None = None,
    traces: Mapping[str, Trace] | None = None,
    pairs: PairsMode = "baseline",
    workload: str = "",
    policy_version: str = "",
) -> dict[str, Any]:
    """The whole report, every comparison computed (nothing kept).

    With ``tensor`` None the groups are by the whole result (its manifest) and each pair
    is judged by the result verdict (the worst of its tensors, ``decided_by`` naming
    which); with a tensor, by that tensor alone. ``fingerprints`` holds at least every
    hash of the groups' representatives' manifests. ``tolerance_for`` (dtype →
    tolerance, the lab's policy) picks one per tensor; without it assert_close's
    defaults. With ``reference`` (the ``fp64-reference`` fingerprint of ``tensor``) each
    group also gets an ``fp64`` judgement against ``baseline`` (the ``strict`` float32
    CPU fingerprint). With ``traces`` (hash → op trace of the representatives) each pair
    gets its origin ops (``origin``, or ``origin_note`` saying why not). ``pairs="all"``:
    every pair of groups. Every float in the result is finite or None.
    """
    plan = plan_divergence(
        members=members, tensor=tensor, workload=workload, policy_version=policy_version,
        pairs=pairs, origins=True, traced=traces is not None,
        reference=reference.hash if reference is not None else None,
        baseline=baseline.hash if baseline is not None else None)
    content = dict(fingerprints)
    for extra in (reference, baseline):
        if extra is not None:
            content.setdefault(extra.hash, extra)
    computed = plan.compute(plan.keys(), fingerprints=content, traces=traces or {},
                            tolerance_for=tolerance_for)
    return plan.report({record.key: record.value for record in computed})
