"""GET /divergence: feed the pure analysis with the fleet's latest results of one key."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import PairsMode, Tolerance, consensus
from numparity_server.analysis.policy import Policy
from numparity_server.divergence import repository
from numparity_server.divergence.repository import LatestResult
from numparity_server.divergence.schemas import DivergenceKey, DivergenceOut, Excluded
from numparity_server.kit.db import writing
from numparity_server.kit.errors import NotFound
from numparity_server.reads.explanations import explanations_among
from numparity_server.reads.fingerprints import load_fingerprints, with_values
from numparity_server.reads.traces import load_traces

log = logging.getLogger(__name__)

FP64_VARIANT = "fp64-reference"
BASELINE_VARIANT = "strict"
# Members each group lists when the caller says nothing (the API's page_default).
MEMBERS_LIMIT = 50


def divergence(
    *, session: Session, suite: str, workload: str, variant: str, tensor: str | None = None,
    workload_version: int | None = None, policy: Policy | None = None,
    pairs: PairsMode = "baseline", pairs_limit: int | None = None, pairs_offset: int = 0,
    pairs_origin: bool = False, members_limit: int | None = MEMBERS_LIMIT,
) -> DivergenceOut:
    """Groups by ``tensor``, or by the whole result when None (never a default tensor a
    workload may lack); NotFound naming the tensors there are when none has ``tensor``.

    ``pairs="baseline"``: each group against the baseline (group 1); ``"all"``: a page
    of the full matrix, ``pairs_limit`` pairs from ``pairs_offset``, with origin ops for
    every pair of the page only with ``pairs_origin``. Each group lists its first
    ``members_limit`` members (None: all; the API always bounds it). Comparisons come
    from the kept ones, or are computed once and kept (design §3.3.7)."""
    latest = repository.latest_ok_results(session, suite=suite, workload=workload,
                                          variant=variant)
    if not latest:
        raise NotFound(f"no ok results for suite {suite!r}, workload {workload!r}, "
                       f"variant {variant!r}")
    version = (workload_version if workload_version is not None
               else consensus.newest_version(latest))
    # Other input or parameter bytes are a bug on that node, not a divergence (design
    # §2.1): such results, and those of another version, are left out and named.
    comparable, left_out = consensus.comparable(
        latest, version=version, support_of=lambda r: consensus.Support(1, r.node))
    if not comparable:
        raise NotFound(f"no ok results of {workload!r} version {version} for variant "
                       f"{variant!r}")
    manifests: dict[str | None, tuple[tuple[str, str, str], ...]] = {}
    members = [_member(result, manifests) for result in comparable]

    reference_hash = baseline_hash = None
    if variant != FP64_VARIANT and tensor is not None:
        reference_hash = _consensus_hash(session, suite, workload, FP64_VARIANT, tensor, version)
        baseline_hash = _consensus_hash(session, suite, workload, BASELINE_VARIANT, tensor,
                                        version, device="cpu")
    policy = policy or Policy()
    plan = analysis.plan_divergence(
        members=members, tensor=tensor, workload=workload, policy_version=policy.version,
        pairs=pairs, limit=pairs_limit, offset=pairs_offset, origins=pairs_origin,
        reference=reference_hash, baseline=baseline_hash)
    if not plan.groups:
        names = dict.fromkeys(name for m in members for name, _kind, _hash in m.tensors)
        raise NotFound(f"no result of {workload!r} under {variant!r} has a tensor {tensor!r}; "
                       f"its tensors: {', '.join(names) or 'none'}")
    comparisons = _comparisons(session, plan,
                               lambda dtype: policy.tolerance(workload, dtype))
    report = plan.report(comparisons, members_limit=members_limit)
    _with_explanations(session, report, plan.groups, (suite, workload, variant))
    key = DivergenceKey(suite=suite, workload=workload, workload_version=version,
                        variant=variant, tensor=tensor)
    excluded = [Excluded(node=r.node, run_id=r.run_id, reason=reason)
                for r, reason in left_out[:members_limit]]
    return DivergenceOut.model_validate({
        "key": key, **report, "pairs_limit": pairs_limit,
        "pairs_offset": pairs_offset, "members_limit": members_limit,
        "excluded": excluded, "excluded_total": len(left_out)})


def _comparisons(session: Session, plan: analysis.DivergencePlan,
                 tolerance_for: Callable[[str], Tolerance]) -> dict[str, dict[str, Any]]:
    """Every comparison the plan shows, by key: the kept ones read, the others (and those
    whose fingerprints' values have arrived since) computed and kept.

    Only the comparisons to compute load fingerprints and traces: a question asked
    before reads a row per comparison, whatever the manifests' sizes."""
    keys = plan.keys()
    kept = repository.kept_comparisons(session, keys)
    awaited = {digest for found in kept.values() for digest in found.awaiting}
    arrived = with_values(session, awaited) if awaited else set()
    stale = {key for key, found in kept.items() if arrived.intersection(found.awaiting)}
    comparisons = {key: found.value for key, found in kept.items() if key not in stale}
    missing = (keys - kept.keys()) | stale
    if not missing:
        return comparisons
    hashes, trace_hashes = plan.needs(missing)
    computed = plan.compute(missing, fingerprints=load_fingerprints(session, hashes),
                            traces=load_traces(session, trace_hashes),
                            tolerance_for=tolerance_for)
    comparisons.update((record.key, record.value) for record in computed)
    complete = [record for record in computed if record.complete]
    if complete:
        try:
            with writing(session):
                repository.keep_comparisons(session, complete, refreshed=stale)
        except OperationalError as exc:
            # A database that cannot take the write now (SQLite busy past its timeout, a
            # read-only replica) costs the next request a computation, not this answer.
            log.warning("divergence: %d comparisons not kept: %s", len(complete), exc)
    return comparisons


# Findings beside one pair of groups: the newest per direction and pair of nodes.
EXPLANATIONS_PER_PAIR = 10


def _with_explanations(session: Session, report: dict[str, Any],
                       groups: Sequence[analysis.Group], key: tuple[str, str, str]) -> None:
    """Each pair gets `explanations`: what `explain` found between a node of one group and
    a node of the other (design §2.11), read once for every member of the pairs' groups."""
    shown = {side for pair in report["pairs"] for side in (pair["a"], pair["b"])}
    nodes = {group.id: {member.node for member in group.members} for group in groups
             if group.id in shown}
    if not nodes:
        return
    found = explanations_among(session=session, nodes=set().union(*nodes.values()),
                               keys={key}).get(key, [])
    for pair in report["pairs"]:
        side_a, side_b = nodes[pair["a"]], nodes[pair["b"]]
        pair["explanations"] = [
            e.model_dump(mode="json") for e in found
            if (e.node in side_a and e.against_node in side_b)
            or (e.node in side_b and e.against_node in side_a)][:EXPLANATIONS_PER_PAIR]


def _member(result: LatestResult,
            manifests: dict[str | None, tuple[tuple[str, str, str], ...]]) -> analysis.Member:
    """The result as the analysis sees it; members of one manifest share its tensors."""
    tensors = manifests.get(result.manifest_hash)
    if tensors is None:
        tensors = tuple((e["name"], e["kind"], e["hash"]) for e in result.entries)
        manifests[result.manifest_hash] = tensors
    return analysis.Member(
        node=result.node, run_id=result.run_id, env_key=result.env_key,
        environment=result.environment, tensors=tensors, device=result.device,
        trace=result.trace_hash, manifest=result.manifest_hash,
    )


def _consensus_hash(session: Session, suite: str, workload: str, variant: str, tensor: str,
                    version: int | None, device: str | None = None) -> str | None:
    """The usual hash of ``tensor`` (``consensus.usual``) among the latest ok results of
    another variant."""
    holders = []
    for outcome, support, entries in repository.outcome_counts(
            session, suite=suite, workload=workload, variant=variant):
        if version is not None and outcome.workload_version != version:
            continue
        if device is not None and outcome.device != device:
            continue
        digest = next((e["hash"] for e in entries if e["name"] == tensor), None)
        if digest is not None:
            holders.append((digest, support))
    return consensus.usual(consensus.tally(holders))

