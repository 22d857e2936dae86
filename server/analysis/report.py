"""The divergence report of one comparison key (GET /divergence): JSON-ready."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._json import json_safe
from .attribution import Flattened, flatten_members, rank_attributes, separating_attributes
from .compare import Comparison, compare, no_evidence
from .fingerprint import Fingerprint
from .groups import Group, Member, group_members
from .judge import JUDGE_TOL_PER_RTOL, judge
from .layers import LAYER, compare_manifests, first_divergent_layer, largest_jump
from .tolerance import Tolerance, default_tolerance


def _compare_groups(candidate: Group, reference: Group, fingerprints: Mapping[str, Fingerprint],
                    tolerance: Tolerance | None) -> Comparison:
    if candidate.hash not in fingerprints or reference.hash not in fingerprints:
        return no_evidence()
    return compare(fingerprints[candidate.hash], fingerprints[reference.hash],
                   tolerance=tolerance)


def _pair(a: Group, b: Group, fingerprints: Mapping[str, Fingerprint],
          tolerance: Tolerance | None, flattened: Flattened) -> dict[str, Any]:
    # The larger group (a) is the reference: metrics measure b against a.
    comparison = _compare_groups(b, a, fingerprints, tolerance)
    layers = compare_manifests(b.representative.tensors, a.representative.tensors,
                               fingerprints, kinds=(LAYER,), tolerance=tolerance)
    separating = separating_attributes(a, b, flattened=flattened)
    return {
        "a": a.id,
        "b": b.id,
        "verdict": comparison.verdict,
        "basis": comparison.basis,
        "metrics": comparison.metrics,
        "first_divergent_layer": first_divergent_layer(layers),
        "largest_jump": largest_jump(layers),
        "attribution": separating,
        "indistinguishable": len(separating) > 1,
    }


def _fp64_judgement(group: Group, fingerprints: Mapping[str, Fingerprint],
                    reference: Fingerprint, baseline: Fingerprint | None,
                    tolerance: Tolerance | None) -> dict[str, Any] | None:
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
    rtol = (tolerance or default_tolerance(own.dtype)).rtol
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
    tensor: str,
    fingerprints: Mapping[str, Fingerprint],
    tolerance: Tolerance | None = None,
    reference: Fingerprint | None = None,
    baseline: Fingerprint | None = None,
) -> dict[str, Any]:
    """Groups, the pairwise comparisons and the attribution for one comparison key.

    ``fingerprints`` holds at least every hash in the groups' representatives'
    manifests. With ``reference`` (the ``fp64-reference`` fingerprint of ``tensor``) each
    group also gets an ``fp64`` judgement against ``baseline`` (the ``strict`` float32
    CPU fingerprint). Every float in the result is finite or None.
    """
    groups, without = group_members(members, tensor)
    group_rows = []
    for group in groups:
        row = group.to_dict()
        if reference is not None:
            row["fp64"] = _fp64_judgement(group, fingerprints, reference, baseline, tolerance)
        group_rows.append(row)
    flattened = flatten_members(groups)
    pairs = [
        _pair(a, b, fingerprints, tolerance, flattened)
        for index, a in enumerate(groups)
        for b in groups[index + 1:]
    ]
    return json_safe({
        "tensor": tensor,
        "groups": group_rows,
        "pairs": pairs,
        "attribution": rank_attributes(groups, flattened=flattened),
        "members_without_tensor": without,
    })
