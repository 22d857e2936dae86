"""GET /divergence: feed the pure analysis with the fleet's latest results of one key."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import PairsMode, Tolerance, consensus
from numparity_server.analysis.policy import Policy
from numparity_server.divergence import repository
from numparity_server.divergence.schemas import DivergenceKey, DivergenceOut, Excluded
from numparity_server.goldens import drift as goldens
from numparity_server.kit.compute import Budget, Postponed, unbounded
from numparity_server.kit.db import after_read, release, writing
from numparity_server.kit.errors import NotFound
from numparity_server.reads import environments as reads_environments
from numparity_server.reads.explanations import explanations_of_key
from numparity_server.reads.fingerprints import load_fingerprints
from numparity_server.reads.kept import keep_comparisons, usable_comparisons
from numparity_server.reads.traces import load_traces

log = logging.getLogger(__name__)

FP64_VARIANT = "fp64-reference"
BASELINE_VARIANT = "strict"
# Members each group lists when the caller says nothing (the API's page_default).
MEMBERS_LIMIT = 50
# Session.info key: the comparisons a request computed, by key (``comparisons``).
_COMPUTED = "numparity_divergence_computed"


def divergence(
    *, session: Session, suite: str, workload: str, variant: str, tensor: str | None = None,
    workload_version: int | None = None, policy: Policy | None = None,
    pairs: PairsMode = "baseline", pairs_limit: int | None = None, pairs_offset: int = 0,
    pairs_origin: bool = False, members_limit: int | None = MEMBERS_LIMIT,
    members_offset: int = 0, budget: Budget | None = None,
) -> DivergenceOut:
    """Groups by ``tensor``, or by the whole result when None (never a default tensor a
    workload may lack); NotFound naming the tensors there are when none has ``tensor``.

    ``pairs="baseline"``: each group against the baseline (group 1); ``"all"``: a page
    of the full matrix, ``pairs_limit`` pairs from ``pairs_offset``, with origin ops for
    every pair of the page only with ``pairs_origin``. Each group lists its first
    ``members_limit`` members from ``members_offset`` (None: all; the API always bounds
    it), and the counts of all. Comparisons come
    from the kept ones, or are computed once and kept (design §3.3.7)."""
    answers = repository.counted_answers(session, suite=suite, workload=workload,
                                         variant=variant)
    if not answers:
        raise NotFound(f"no ok results for suite {suite!r}, workload {workload!r}, "
                       f"variant {variant!r}")
    version = (workload_version if workload_version is not None
               else consensus.fleet_version(answers, support_of=lambda a: a.support))
    # Other input or parameter bytes are a bug on that node, not a divergence (design
    # §2.1): such results, and those of another version, are left out and named.
    # Counted in voters: a node's devices without a stable identity are one (§3.3.12).
    crowded = repository.crowded_answers(session, suite=suite, workload=workload,
                                         variant=variant)
    crowded_of: dict[tuple[int, int, str], list[tuple[str, int]]] = defaultdict(list)
    for outcome, environment, model, node, devices in crowded:
        crowded_of[(outcome, environment, model)].append((node, devices))
    comparable, left_out = consensus.comparable(
        answers, version=version, support_of=lambda answer: answer.support,
        crowded=lambda a: crowded_of.get((a.outcome, a.environment_id, a.model), ()))
    if not comparable:
        raise NotFound(f"no ok results of {workload!r} version {version} for variant "
                       f"{variant!r}")
    ranked, lacking, voters = analysis.group_answers(comparable, tensor, crowded)
    if not ranked:
        names = dict.fromkeys(name for a in comparable for name, _kind, _hash in a.tensors)
        raise NotFound(f"no result of {workload!r} under {variant!r} has a tensor {tensor!r}; "
                       f"its tensors: {', '.join(names) or 'none'}")
    # Each group lists its first members by name; the counts say how many there are.
    members = _Members(session, (suite, workload, variant), answers,
                       None if members_limit is None else members_offset + members_limit)
    groups = [analysis.Group(id=number, hash=digest, members=tuple(members(held)),
                             counted=analysis.counted(held, voters[digest]),
                             nondeterministic=any(a.repeats_agree is False for a in held))
              for number, (digest, held) in enumerate(ranked, start=1)]
    reference_hash = baseline_hash = None
    if variant != FP64_VARIANT and tensor is not None:
        reference_hash = _consensus_hash(session, suite, workload, FP64_VARIANT, tensor, version)
        baseline_hash = _consensus_hash(session, suite, workload, BASELINE_VARIANT, tensor,
                                        version, device="cpu")
    policy = policy or Policy()
    plan = analysis.plan_groups(
        groups, [member.node for member in members(lacking)], tensor=tensor,
        workload=workload, policy_version=policy.version, pairs=pairs, limit=pairs_limit,
        offset=pairs_offset, origins=pairs_origin, reference=reference_hash,
        baseline=baseline_hash, without_total=sum(answer.devices for answer in lacking))
    kept, pending = comparisons(session, plan, lambda dtype: policy.tolerance(workload, dtype),
                                budget)
    report = plan.report(kept, members_limit=members_limit, members_offset=members_offset,
                         flattened=reads_environments.flattened(
                             session, {a.env_key: a.environment_id for a in answers}),
                         pending=pending)
    _with_explanations(session, report, ranked, (suite, workload, variant))
    key = DivergenceKey(suite=suite, workload=workload, workload_version=version,
                        variant=variant, tensor=tensor)
    reasons = {answer.outcome: reason for answer, reason in left_out}
    excluded = [Excluded(node=member.node, run_id=member.run_id, reason=reasons[outcome])
                for outcome, member in members.outcomes([a for a, _ in left_out])]
    return DivergenceOut.model_validate({
        "key": key, **report, "pairs_limit": pairs_limit,
        "pairs_offset": pairs_offset, "members_limit": members_limit,
        "members_offset": members_offset,
        "excluded": excluded[analysis.members_page(members_limit, members_offset)],
        "excluded_total": sum(answer.devices for answer, _ in left_out),
        # Drift from a pin shows even when every device moved together (one group).
        "pins": goldens.divergence_pins(
            session=session, policy=policy, suite=suite, workload=workload, variant=variant,
            workload_version=version, tensor=tensor,
            groups=[(group.id, group.hash) for group in groups]),
        "pending": len(pending)})


@dataclass(frozen=True)
class AnswerAccuracy:
    """What the fp64 judge says of one answer's tensor (design §3.3.8): its RMSE against
    the float64 answer, within the limit the strict CPU answer sets or not."""

    tensor: str
    acceptable: bool | None
    rmse: float | None
    limit: float | None


def answer_accuracy(*, session: Session, policy: Policy, suite: str, workload: str,
                    variant: str, tensors: Sequence[tuple[str, str, str]],
                    usual: dict[tuple[str, ...], str | None] | None = None
                    ) -> AnswerAccuracy | None:
    """The fp64 judge of an answer (its manifest's ``tensors``), on its ``output`` (else
    its first output tensor), kept like /divergence's judgements: the usual answer of a
    column is not the right one when this says not acceptable. None where nothing can
    judge it (the fp64-reference variant itself, no float64 answer of the tensor).
    ``usual`` keeps the usual hashes found between calls (one page judges many answers
    of a workload against the same float64 and strict answers)."""
    if variant == FP64_VARIANT:
        return None
    outputs = [(name, digest) for name, kind, digest in tensors if kind == "output"]
    named = [item for item in outputs if item[0] == "output"] or outputs[:1]
    if not named:
        return None
    (tensor, digest), = named
    usual = {} if usual is None else usual

    def usual_hash(variant: str, device: str | None = None) -> str | None:
        key = (workload, variant, tensor, device or "")
        if key not in usual:
            usual[key] = _consensus_hash(session, suite, workload, variant, tensor, None,
                                         device=device)
        return usual[key]

    reference = usual_hash(FP64_VARIANT)
    if reference is None:
        return None
    baseline = usual_hash(BASELINE_VARIANT, "cpu")
    group = analysis.Group(id=1, hash=digest, members=())
    plan = analysis.plan_groups([group], [], tensor=tensor, workload=workload,
                                policy_version=policy.version, traced=False,
                                reference=reference, baseline=baseline)
    kept, _pending = comparisons(session, plan, lambda dtype: policy.tolerance(workload, dtype))
    judged = kept.get(plan.fp64[group.id])
    if judged is None:
        return None
    return AnswerAccuracy(tensor, judged.get("acceptable"), judged.get("rmse"),
                          judged.get("limit"))


def comparisons(session: Session, plan: analysis.DivergencePlan,
                tolerance_for: Callable[[str], Tolerance], budget: Budget | None = None
                ) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Every comparison the plan shows, by key: the kept ones read, the others (and those
    whose fingerprints' values have arrived since) computed and kept; and the origin
    keys left for a later request (``budget``'s time ran out before them).

    Only the comparisons to compute load fingerprints (without their whole values,
    read a tensor at a time when compared) and traces, and they compute holding no
    database connection (``kit.db.release``): first the answers' comparisons and fp64
    judgements, one unit; then each origin, a unit of its own (an alignment)."""
    budget = budget or unbounded()
    found_values, stale = usable_comparisons(session, plan.keys())
    # Those this request computed already (another variant of the workload page): inside
    # a snapshot they are kept only once it ends (kit.db.after_read).
    earlier: dict[str, dict[str, Any]] = session.info.setdefault(_COMPUTED, {})
    for key in plan.keys() & earlier.keys():
        found_values[key] = earlier[key]
        stale.discard(key)
    missing = (plan.keys() - found_values.keys()) | stale
    if not missing:
        return found_values, set()
    hashes, _traces = plan.needs(missing)
    fingerprints = load_fingerprints(session, hashes)
    release(session)
    origins = {pair.origin_key for pair in plan.pairs if pair.origin_key} & missing
    computed: list[analysis.ComparisonRecord] = []
    pending: set[str] = set()

    def compute(unit: list[str]) -> list[analysis.ComparisonRecord]:
        # An origin's two traces are read (and parsed) for it alone.
        _fingerprints, trace_hashes = plan.needs(unit) if origins & set(unit) else ({}, set())
        traces = load_traces(session, trace_hashes)
        release(session)
        return plan.compute(unit, fingerprints=fingerprints, traces=traces,
                            tolerance_for=tolerance_for)

    # The pairs' comparisons and fp64 judgements run whatever the time spent: the answer
    # cannot do without them (only an origin can be pending). A request that reads
    # several keys (the workload page's variants) spent its time on the first ones.
    answers = sorted(missing - origins)
    if answers:
        computed += budget.run(("divergence", *answers), partial(compute, answers),
                               always=True)
    for key in sorted(origins):
        try:
            computed += budget.run(("divergence", key), partial(compute, [key]))
        except Postponed:
            pending.add(key)
    found_values.update((record.key, record.value) for record in computed)
    complete = [record for record in computed if record.complete]
    earlier.update((record.key, record.value) for record in complete)
    if complete:
        # Kept once the read's snapshot ends, if it runs in one (kit.db.snapshot).
        after_read(session, partial(_keep, session, complete, stale))
    return found_values, pending


def _keep(session: Session, complete: list[analysis.ComparisonRecord], stale: set[str]
          ) -> None:
    try:
        with writing(session, changes_answers=False):
            keep_comparisons(session, complete, refreshed=stale)
    except OperationalError as exc:
        # A database that cannot take the write now (SQLite busy past its timeout, a
        # read-only replica) costs the next request a computation, not this answer.
        log.warning("divergence: %d comparisons not kept: %s", len(complete), exc)


# Findings beside one pair of groups: the newest per direction and pair of nodes.
EXPLANATIONS_PER_PAIR = 10


def _with_explanations(session: Session, report: dict[str, Any],
                       ranked: Sequence[tuple[str, Sequence[analysis.Answer]]],
                       key: tuple[str, str, str]) -> None:
    """Each pair gets `explanations`: what `explain` found between a node of one group and
    a node of the other (design §2.11). The key's findings are few (one per `explain`
    run): each side's node is placed in a group by its latest answer, so the groups'
    members are never sent to the database."""
    if not report["pairs"]:
        return
    suite, workload, variant = key
    found = explanations_of_key(session=session, suite=suite, workload=workload,
                                variant=variant)
    if not found:
        for pair in report["pairs"]:
            pair["explanations"] = []
        return
    group_of = {answer.outcome: number for number, (_digest, held) in enumerate(ranked, 1)
                for answer in held}
    outcomes = repository.outcomes_of_nodes(
        session, suite=suite, workload=workload, variant=variant,
        nodes={name for e in found for name in (e.node, e.against_node)})
    groups_of = {name: {group_of[o] for o in held if o in group_of}
                 for name, held in outcomes.items()}
    for pair in report["pairs"]:
        a, b = pair["a"], pair["b"]
        pair["explanations"] = [
            e.model_dump(mode="json") for e in found
            if (a in groups_of.get(e.node, ()) and b in groups_of.get(e.against_node, ()))
            or (b in groups_of.get(e.node, ()) and a in groups_of.get(e.against_node, ()))
        ][:EXPLANATIONS_PER_PAIR]


class _Members:
    """The first members of each set of answers, read once for all of them: members of a
    set are those of its outcomes (every answer of an outcome falls in one group)."""

    def __init__(self, session: Session, key: tuple[str, str, str],
                 answers: Sequence[analysis.Answer], limit: int | None) -> None:
        suite, workload, variant = key
        # At least one a group, its representative (the answer's lists are cut to
        # ``limit`` when they are made).
        self.limit = None if limit is None else max(limit, 1)
        # An outcome's answers differ only in environment and device model.
        by_outcome = {answer.outcome: answer for answer in answers}
        models = {(answer.outcome, answer.environment_id): answer.model for answer in answers}
        holders: dict[int, int] = {}
        for answer in answers:
            holders[answer.outcome] = holders.get(answer.outcome, 0) + answer.devices
        environments = {answer.environment_id: answer for answer in answers}
        self.listed: dict[int, list[analysis.Member]] = {}
        for row in repository.first_members(session, suite=suite, workload=workload,
                                            variant=variant, outcomes=holders,
                                            limit=self.limit):
            answer, env = by_outcome[row.outcome_id], environments[row.environment_id]
            self.listed.setdefault(row.outcome_id, []).append(analysis.Member(
                node=row.node, run_id=row.run_id, env_key=env.env_key,
                environment=env.environment, tensors=answer.tensors, device=answer.slot,
                trace=answer.trace, manifest=answer.manifest,
                model=models[(row.outcome_id, row.environment_id)]))

    def outcomes(self, answers: Sequence[analysis.Answer]
                 ) -> list[tuple[int, analysis.Member]]:
        """The first members of these answers by node name (then slot), with their
        outcomes."""
        found = [(outcome, member) for outcome in {answer.outcome for answer in answers}
                 for member in self.listed.get(outcome, [])]
        found.sort(key=lambda item: (item[1].node, item[1].device))
        return found[:self.limit] if self.limit is not None else found

    def __call__(self, answers: Sequence[analysis.Answer]) -> list[analysis.Member]:
        return [member for _outcome, member in self.outcomes(answers)]


def _consensus_hash(session: Session, suite: str, workload: str, variant: str, tensor: str,
                    version: int | None, device: str | None = None) -> str | None:
    """The usual hash of ``tensor`` (``consensus.usual``, counted in voters) among the
    latest ok results of another variant."""
    answers = [answer for answer in repository.counted_answers(
                   session, suite=suite, workload=workload, variant=variant)
               if (version is None or answer.workload_version == version)
               and (device is None or answer.slot == device)]
    ranked, _without, _voters = analysis.group_answers(
        answers, tensor, repository.crowded_answers(session, suite=suite, workload=workload,
                                                    variant=variant))
    return ranked[0][0] if ranked else None

