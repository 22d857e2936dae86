"""Where in the model two results part: the first divergent layer, the largest jump and
the first NaN or Inf.

Manifests are ``(name, kind, hash)`` in execution order. The reference manifest's order
is the one walked; a layer missing from either side is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ._json import json_safe
from .compare import Comparison, compare, no_evidence
from .fingerprint import Fingerprint
from .tolerance import Tolerance

Manifest = Sequence[tuple[str, str, str]]
LAYER = "layer"
# Relative error measures in order of preference: exact, whole-tensor estimate, sample.
_RELATIVE_ERRORS = ("rel_l2", "rel_l2_est", "max_rel")
# The error a layer can have without any real divergence: one rounding of its dtype.
_EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def compare_hashes(candidate: str, reference: str, fingerprints: Mapping[str, Fingerprint],
                    tolerance: Tolerance | None,
                    tolerance_for: Callable[[str], Tolerance] | None = None,
                    semantics: str = "cpu") -> Comparison:
    if candidate == reference:
        known = fingerprints.get(reference) or Fingerprint(reference, "float32", ())
        return compare(known, known, semantics=semantics)
    if candidate not in fingerprints or reference not in fingerprints:
        return replace(no_evidence(), semantics=semantics)
    a, b = fingerprints[candidate], fingerprints[reference]
    if tolerance_for is not None:
        tolerance = _looser(tolerance_for(a.dtype), tolerance_for(b.dtype))
    return compare(a, b, tolerance=tolerance, semantics=semantics)


def _looser(a: Tolerance, b: Tolerance) -> Tolerance:
    return a if a == b else Tolerance(rtol=max(a.rtol, b.rtol), atol=max(a.atol, b.atol))


def compare_manifests(
    candidate: Manifest,
    reference: Manifest,
    fingerprints: Mapping[str, Fingerprint],
    *,
    kinds: Sequence[str] | None = None,
    tolerance: Tolerance | None = None,
    tolerance_for: Callable[[str], Tolerance] | None = None,
    semantics: str = "cpu",
) -> list[dict[str, Any]]:
    """Per-tensor comparison of ``candidate`` against ``reference``, in reference order.

    Only tensors present in both by name (and of ``kinds`` when given). ``order`` is the
    position in the reference manifest. JSON-ready (infinite metrics become None).
    ``tolerance`` applies to every tensor; ``tolerance_for`` instead gives one per dtype
    (a lab policy), the looser of the two sides' when their dtypes differ. Without
    either, each dtype's default applies. ``semantics``: whose isclose arithmetic
    judges ("cuda" when both results were computed on CUDA devices, ``closeness``).
    """
    if tolerance is not None and tolerance_for is not None:
        raise ValueError("give tolerance or tolerance_for, not both")
    by_name = {name: digest for name, _kind, digest in candidate}
    rows = []
    for order, (name, kind, digest) in enumerate(reference):
        if name not in by_name or (kinds is not None and kind not in kinds):
            continue
        comparison = compare_hashes(by_name[name], digest, fingerprints, tolerance,
                                     tolerance_for, semantics)
        dtype = fingerprints[digest].dtype if digest in fingerprints else None
        rows.append({
            "name": name, "kind": kind, "order": order, "dtype": dtype,
            "verdict": comparison.verdict, "basis": comparison.basis,
            "metrics": json_safe(comparison.metrics), "evidence": comparison.evidence,
            "semantics": comparison.semantics,
        })
    return rows


def first_divergent_layer(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first row (from ``compare_manifests``) that is not identical."""
    for row in rows:
        if row["verdict"] != "identical":
            return {key: row[key] for key in ("name", "order", "verdict", "basis", "metrics")}
    return None


def relative_error(metrics: Mapping[str, float | None]) -> tuple[str, float] | None:
    """The best available relative error of a comparison: (metric name, value)."""
    for name in _RELATIVE_ERRORS:
        value = metrics.get(name)
        if value is not None and math.isfinite(value):
            return name, float(value)
    return None


def largest_jump(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The layer whose relative error grows most over the previous layer's.

    Ratios are taken against at least one rounding of the layer's dtype, so an error
    appearing after identical layers is measured in units of epsilon rather than being
    an infinite jump. None when every layer is identical.
    """
    best: dict[str, Any] | None = None
    previous_error, previous_name = 0.0, None
    for row in rows:
        measured = (("rel_l2", 0.0) if row["verdict"] == "identical"
                    else relative_error(row["metrics"]))
        if measured is None:
            previous_error, previous_name = 0.0, row["name"]
            continue
        metric, error = measured
        floor = _EPSILON.get(row.get("dtype") or "", float(np.finfo(np.float32).eps))
        ratio = error / max(previous_error, floor)
        if error > 0 and (best is None or ratio > best["ratio"]):
            best = {"name": row["name"], "order": row["order"], "previous": previous_name,
                    "metric": metric, "rel_error": error, "ratio": ratio}
        previous_error, previous_name = error, row["name"]
    return best


def _nonfinite_counts(fingerprint: Fingerprint | None) -> tuple[int, int] | None:
    """(NaN count, Inf count) from the stats, else from the values; None if neither."""
    if fingerprint is None:
        return None
    stats = fingerprint.stats or {}
    if stats.get("nan") is not None and stats.get("inf") is not None:
        return int(stats["nan"]), int(stats["inf"])
    if fingerprint.has_values:
        nan = inf = 0
        for chunk in fingerprint.value_chunks():
            if chunk.dtype.kind != "f":
                return 0, 0
            nan += int(np.count_nonzero(np.isnan(chunk)))
            inf += int(np.count_nonzero(np.isinf(chunk)))
        return nan, inf
    return None


def first_nonfinite(
    candidate: Manifest,
    reference: Manifest,
    fingerprints: Mapping[str, Fingerprint],
) -> dict[str, Any] | None:
    """The first tensor where ``candidate`` has NaN or Inf that ``reference`` has not.

    "Has not" includes having them in other counts. Execution order: the layers first,
    then the other tensors, each in the reference manifest's order (``order`` is the
    position there, as in ``compare_manifests``). Only tensors present in both by name,
    with counts known on both sides (stats, else values). None when there is none.
    """
    by_name = {name: digest for name, _kind, digest in candidate}
    walk = sorted(enumerate(reference), key=lambda item: (item[1][1] != LAYER, item[0]))
    for order, (name, kind, digest) in walk:
        own = by_name.get(name)
        if own is None or own == digest:
            continue
        counts = _nonfinite_counts(fingerprints.get(own))
        if counts is None or counts == (0, 0):
            continue
        reference_counts = _nonfinite_counts(fingerprints.get(digest))
        if reference_counts is None or reference_counts == counts:
            continue
        return {"name": name, "kind": kind, "order": order,
                "nan": counts[0], "inf": counts[1],
                "reference_nan": reference_counts[0], "reference_inf": reference_counts[1]}
    return None
