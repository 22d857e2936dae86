"""The divergence report of one comparison key (GET /divergence): JSON-ready."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._json import json_safe
from .attribution import Flattened, flatten_members, rank_attributes, separating_attributes
from .compare import Comparison, compare, no_evidence
from .fingerprint import Fingerprint
from .groups import Group, Member, group_members
from .judge import JUDGE_TOL_PER_RTOL, judge
from .layers import LAYER, compare_manifests, first_divergent_layer, first_nonfinite, largest_jump
from .origin import no_trace_note, origin_ops
from .tolerance import Tolerance, default_tolerance
from .trace import Trace
from .verdicts import result_verdict

ToleranceFor = Callable[[str], Tolerance]
# Beyond this many groups, origin ops only for the pairs with group 1 (the largest): the
# cost then grows with the groups, not their square, and every group is still traced
# back against the fleet's usual answer.
MAX_ORIGIN_GROUPS = 12


def _tolerance(fingerprint: Fingerprint, tolerance: Tolerance | None,
               tolerance_for: ToleranceFor | None) -> Tolerance | None:
    if tolerance is None and tolerance_for is not None:
        return tolerance_for(fingerprint.dtype)
    return tolerance


def _compare_groups(candidate: Group, reference: Group, fingerprints: Mapping[str, Fingerprint],
                    tolerance: Tolerance | None, tolerance_for: ToleranceFor | None
                    ) -> Comparison:
    if candidate.hash not in fingerprints or reference.hash not in fingerprints:
        return no_evidence()
    expected = fingerprints[reference.hash]
    return compare(fingerprints[candidate.hash], expected,
                   tolerance=_tolerance(expected, tolerance, tolerance_for))


def _origin(a: Group, b: Group, traces: Mapping[str, Trace] | None,
            fingerprints: Mapping[str, Fingerprint], tolerance: Tolerance | None,
            tolerance_for: ToleranceFor | None) -> tuple[dict[str, Any] | None, str | None]:
    """The origin ops of group b's representative against group a's, from their op
    traces; or why there are none."""
    if traces is None:
        return None, None
    sides = ((a, a.representative), (b, b.representative))
    without = [f"group {group.id}'s representative ({member.node})" for group, member in sides
               if member.trace is None]
    if without:
        return None, no_trace_note(without)
    trace_a, trace_b = (traces.get(member.trace or "") for _group, member in sides)
    if trace_a is None or trace_b is None:
        return None, "the op trace of a representative is no longer stored"
    if tolerance_for is None and tolerance is not None:
        tolerance_for = lambda _dtype: tolerance  # noqa: E731 (one tolerance for all)
    found = origin_ops(trace_a, trace_b, manifest_a=a.representative.tensors,
                       manifest_b=b.representative.tensors, fingerprints=fingerprints,
                       tolerance_for=tolerance_for)
    return found.to_dict(), None


def _pair(a: Group, b: Group, fingerprints: Mapping[str, Fingerprint],
          tolerance: Tolerance | None, tolerance_for: ToleranceFor | None,
          flattened: Flattened, tensor: str | None,
          origin: tuple[dict[str, Any] | None, str | None]) -> dict[str, Any]:
    # The larger group (a) is the reference: metrics measure b against a.
    candidate, reference = b.representative.tensors, a.representative.tensors
    decided: dict[str, Any] = {}
    if tensor is not None:
        comparison = _compare_groups(b, a, fingerprints, tolerance, tolerance_for)
        decided = {"verdict": comparison.verdict, "basis": comparison.basis,
                   "metrics": comparison.metrics, "evidence": comparison.evidence}
    else:
        # The whole result: the worst verdict of all its tensors, and which decided.
        rows = compare_manifests(candidate, reference, fingerprints,
                                 tolerance=tolerance, tolerance_for=tolerance_for)
        verdict = result_verdict(rows)
        row = next((r for r in rows if verdict and r["name"] == verdict.tensor), None)
        decided = {"verdict": verdict.verdict if verdict else "divergent",
                   "basis": row["basis"] if row else "stats",
                   "metrics": row["metrics"] if row else {},
                   "evidence": row["evidence"] if row else "no tensor in common",
                   "decided_by": verdict.tensor if verdict else None}
    layers = compare_manifests(candidate, reference, fingerprints, kinds=(LAYER,),
                               tolerance=tolerance, tolerance_for=tolerance_for)
    separating = separating_attributes(a, b, flattened=flattened)
    return {
        "a": a.id,
        "b": b.id,
        **decided,
        "first_divergent_layer": first_divergent_layer(layers),
        "largest_jump": largest_jump(layers),
        # Where NaN or Inf first appear in b and not in a (layers first): the place to
        # look when the verdict is nonfinite.
        "first_nonfinite": first_nonfinite(candidate, reference, fingerprints),
        "attribution": separating,
        "indistinguishable": len(separating) > 1,
        "origin": origin[0],
        "origin_note": origin[1],
    }


def _fp64_judgement(group: Group, fingerprints: Mapping[str, Fingerprint],
                    reference: Fingerprint, baseline: Fingerprint | None,
                    tolerance: Tolerance | None, tolerance_for: ToleranceFor | None
                    ) -> dict[str, Any] | None:
    own = fingerprints.get(group.hash)
    if own is None:
        return None

    def rmse(fingerprint: Fingerprint) -> float | None:
        against = compare(fingerprint, reference)
        # A NaN or Inf the float64 answer does not have is an unbounded error.
        return math.inf if against.verdict == "nonfinite" else against.metrics.get("rmse")

    baseline_rmse = rmse(baseline) if baseline is not None else None
    # The judge's fixed term is absolute; outputs come at any scale, so scale it by the
    # float64 answer's RMS (the workloads' outputs are of order 1, as dynamo's are).
    rtol = (_tolerance(own, tolerance, tolerance_for) or default_tolerance(own.dtype)).rtol
    tol = JUDGE_TOL_PER_RTOL * rtol * _rms(reference)
    return judge(rmse(own), baseline_rmse, own.dtype, tol).to_dict()


def _rms(fingerprint: Fingerprint) -> float:
    if fingerprint.values is not None:
        finite = fingerprint.values[np.isfinite(fingerprint.values)].astype(np.float64)
        if finite.size:
            return float(np.sqrt(np.mean(finite * finite))) or 1.0
    l2, count = (fingerprint.stats or {}).get("l2"), fingerprint.count
    if l2 and count:
        return float(l2) / math.sqrt(count)
    return 1.0


def divergence_report(
    *,
    members: Sequence[Member],
    tensor: str | None,
    fingerprints: Mapping[str, Fingerprint],
    tolerance: Tolerance | None = None,
    tolerance_for: ToleranceFor | None = None,
    reference: Fingerprint | None = None,
    baseline: Fingerprint | None = None,
    traces: Mapping[str, Trace] | None = None,
) -> dict[str, Any]:
    """Groups, the pairwise comparisons and the attribution for one comparison key.

    With ``tensor`` None the groups are by the whole result (its manifest) and each pair
    is judged by the result verdict (the worst of its tensors, ``decided_by`` naming
    which); with a tensor, by that tensor alone.

    ``fingerprints`` holds at least every hash in the groups' representatives'
    manifests. With ``reference`` (the ``fp64-reference`` fingerprint of ``tensor``) each
    group also gets an ``fp64`` judgement against ``baseline`` (the ``strict`` float32
    CPU fingerprint). ``tolerance`` applies to every tensor; ``tolerance_for`` (dtype →
    tolerance, the lab's policy) instead picks one per tensor; neither: assert_close's
    defaults. With ``traces`` (hash → op trace of the groups' representatives) each pair
    gets its origin ops (``origin``, or ``origin_note`` saying why not); past
    ``MAX_ORIGIN_GROUPS`` groups only the pairs with group 1 do, and ``origin_note``
    says so. Every float in the result is finite or None.
    """
    groups, without = group_members(members, tensor)
    group_rows = []
    for group in groups:
        row = group.to_dict()
        if reference is not None and tensor is not None:
            row["fp64"] = _fp64_judgement(group, fingerprints, reference, baseline, tolerance,
                                          tolerance_for)
        group_rows.append(row)
    flattened = flatten_members(groups)
    limited = traces is not None and len(groups) > MAX_ORIGIN_GROUPS
    skipped = (None, f"not computed: {len(groups)} groups, more than {MAX_ORIGIN_GROUPS}; "
                     "origin ops only for the pairs with group 1")
    pairs = [
        _pair(a, b, fingerprints, tolerance, tolerance_for, flattened, tensor,
              skipped if limited and index > 0 else
              _origin(a, b, traces, fingerprints, tolerance, tolerance_for))
        for index, a in enumerate(groups)
        for b in groups[index + 1:]
    ]
    return json_safe({
        "tensor": tensor,
        "groups": group_rows,
        "pairs": pairs,
        "attribution": rank_attributes(groups, flattened=flattened),
        "members_without_tensor": without,
        "origin_note": (f"origin ops only for the pairs with group 1 (the largest): "
                        f"{len(groups)} groups, more than {MAX_ORIGIN_GROUPS}, so the cost "
                        "stays linear in groups") if limited else None,
    })
