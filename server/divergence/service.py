"""GET /divergence: feed the pure analysis with the fleet's latest results of one key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import consensus
from numparity_server.analysis.policy import Policy
from numparity_server.divergence import repository
from numparity_server.divergence.repository import LatestResult
from numparity_server.divergence.schemas import DivergenceKey, DivergenceOut, Excluded
from numparity_server.kit.errors import NotFound
from numparity_server.reads.explanations import explanations_among
from numparity_server.reads.fingerprints import load_fingerprints
from numparity_server.reads.traces import load_traces

FP64_VARIANT = "fp64-reference"
BASELINE_VARIANT = "strict"


def divergence(
    *, session: Session, suite: str, workload: str, variant: str, tensor: str | None = None,
    workload_version: int | None = None, policy: Policy | None = None,
) -> DivergenceOut:
    """Groups by ``tensor``, or by the whole result when None (never a default tensor a
    workload may lack); NotFound naming the tensors there are when none has ``tensor``."""
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
    excluded = [Excluded(node=r.node, run_id=r.run_id, reason=reason) for r, reason in left_out]
    if not comparable:
        raise NotFound(f"no ok results of {workload!r} version {version} for variant "
                       f"{variant!r}")
    members = [_member(result) for result in comparable]
    groups, _ = analysis.group_members(members, tensor)
    if not groups:
        names = dict.fromkeys(name for m in members for name, _kind, _hash in m.tensors)
        raise NotFound(f"no result of {workload!r} under {variant!r} has a tensor {tensor!r}; "
                       f"its tensors: {', '.join(names) or 'none'}")
    wanted = {group.hash for group in groups}
    for group in groups:
        wanted.update(digest for _name, _kind, digest in group.representative.tensors)

    reference = baseline = None
    if variant != FP64_VARIANT and tensor is not None:
        reference_hash = _consensus_hash(session, suite, workload, FP64_VARIANT, tensor, version)
        baseline_hash = _consensus_hash(session, suite, workload, BASELINE_VARIANT, tensor,
                                        version, device="cpu")
        wanted.update(h for h in (reference_hash, baseline_hash) if h)
    loaded = load_fingerprints(session, wanted)
    # The representatives' op traces: origin ops per pair of groups (design §3.3.14).
    traces = load_traces(session, {digest for group in groups
                                   if (digest := group.representative.trace) is not None})
    if variant != FP64_VARIANT and tensor is not None:
        reference = loaded.get(reference_hash) if reference_hash else None
        baseline = loaded.get(baseline_hash) if baseline_hash else None

    policy = policy or Policy()
    report = analysis.divergence_report(
        members=members, tensor=tensor, fingerprints=loaded,
        tolerance_for=lambda dtype: policy.tolerance(workload, dtype),
        reference=reference, baseline=baseline, traces=traces,
    )
    _with_explanations(session, report, groups, (suite, workload, variant))
    key = DivergenceKey(suite=suite, workload=workload, workload_version=version,
                        variant=variant, tensor=tensor)
    return DivergenceOut.model_validate({"key": key, **report, "excluded": excluded})


# Findings beside one pair of groups: the newest per direction and pair of nodes.
EXPLANATIONS_PER_PAIR = 10


def _with_explanations(session: Session, report: dict[str, Any],
                       groups: Sequence[analysis.Group], key: tuple[str, str, str]) -> None:
    """Each pair gets `explanations`: what `explain` found between a node of one group and
    a node of the other (design §2.11), read once for every member of every group."""
    nodes = {group.id: {member.node for member in group.members} for group in groups}
    found = explanations_among(session=session, nodes=set().union(*nodes.values()),
                               keys={key}).get(key, [])
    for pair in report["pairs"]:
        side_a, side_b = nodes[pair["a"]], nodes[pair["b"]]
        pair["explanations"] = [
            e.model_dump(mode="json") for e in found
            if (e.node in side_a and e.against_node in side_b)
            or (e.node in side_b and e.against_node in side_a)][:EXPLANATIONS_PER_PAIR]


def _member(result: LatestResult) -> analysis.Member:
    return analysis.Member(
        node=result.node, run_id=result.run_id, env_key=result.env_key,
        environment=result.environment,
        tensors=tuple((e["name"], e["kind"], e["hash"]) for e in result.entries),
        device=result.device, trace=result.trace_hash,
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

