"""Two results compared tensor by tensor, in bounded memory (design §3.3, GET /compare).

Run b's result (the candidate) against run a's (the reference): a row per tensor both
have by name, in a's execution order, and what the rows say together (the summary: the
verdicts counted, the result's verdict, the outputs'; the first divergent layer, the
largest jump, the first NaN or Inf). It reads only content — the two manifests, the
fingerprints they name, the workload's tolerances — so /compare keeps it by content
(``result_pair_key``) and a page of rows is a slice of what was kept.

The tensors are compared in parts of ``CHUNK`` (``compare_part``): a read computes and
keeps each part on its own, within its computing time, and the summary once every part
is (``summarize``). A part's fingerprints are asked for at once (``fingerprints_of``), and
whole values are decoded a chunk of elements at a time (``StoredValues``): a result of
4,096 tensors of millions of elements each is compared holding a chunk's fingerprints,
never all of them. Lists a result may make as long as its manifest (its outputs, the
tensors only one side has) are kept to their first ``LISTED`` names, with their count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._arrays import DTYPES
from ._json import json_safe
from .bitflip import single_bit_flip
from .compare import VERDICTS
from .fingerprint import Fingerprint
from .layers import (
    LAYER,
    Manifest,
    compare_manifests,
    first_divergent_layer,
    first_nonfinite,
    largest_jump,
)
from .pairs import COMPARISON_VERSION, key_of
from .tolerance import Tolerance
from .verdicts import result_verdict, worst_verdict

# Tensors whose fingerprints are read at once: at most a part's.
CHUNK = 256
# Elements a part compares from whole values (a 5.5-million-element pair takes ~0.15 s on
# a 2-core machine): a part of 256 such tensors would be one unit of ~40 s.
PART_ELEMENTS = 1 << 22
# What comparing two tensors without their whole values (statistics, sketch, sample)
# counts for, in elements.
_WITHOUT_VALUES_COST = 1024
# Names listed of a list as long as a manifest (outputs, tensors of one side only).
LISTED = 50

SUMMARY, ROWS = "summary", "rows"

FingerprintsOf = Callable[[Collection[str]], Mapping[str, Fingerprint]]


def result_pair_key(kind: str, manifest_a: str, manifest_b: str, *,
                    tolerance_for: Callable[[str], Tolerance], semantics: str = "cpu",
                    part: tuple[int, int] | None = None) -> str:
    """The key of b's result against a's (``kind``: its summary, or its rows): the two
    manifests and the tolerance of every dtype (what the workload and the policy make
    them; not their names: 256 results of as many workloads holding one manifest each
    side, under the same tolerances, are one comparison), and whose isclose arithmetic
    judges them (``semantics``: two CUDA devices' results are judged in CUDA's); rows
    are kept a ``part`` (its bounds) at a time."""
    tolerances = [f"{dtype}:{t.rtol!r}:{t.atol!r}" for dtype in DTYPES
                  for t in (tolerance_for(dtype),)]
    # A summary says its rows are kept in parts (before, in one record under "rows").
    layout = "parts" if part is None else f"part:{part[0]}:{part[1]}"
    return key_of(kind, COMPARISON_VERSION, manifest_a, manifest_b, semantics, *tolerances,
                  layout)


def part_bounds(manifest_a: Manifest, manifest_b: Manifest,
                value_counts: Mapping[str, int]) -> list[tuple[int, int]]:
    """The parts of the comparison of the two results: (start, stop) among the tensors
    both have, in a's order. A part is a unit of work a read computes and keeps on its
    own (``compare_part``): at most ``CHUNK`` tensors, and at most ``PART_ELEMENTS``
    elements compared from whole values (``value_counts``: the element count of each
    stored fingerprint that has them) unless one tensor alone is larger."""
    by_name = {name: digest for name, _kind, digest in manifest_b}
    bounds: list[tuple[int, int]] = []
    start = work = 0
    common = [(digest, by_name[name]) for name, _kind, digest in manifest_a if name in by_name]
    for index, (digest, own) in enumerate(common):
        cost = 0 if own == digest else _WITHOUT_VALUES_COST + (
            max(value_counts[digest], value_counts[own])
            if digest in value_counts and own in value_counts else 0)
        if index > start and (index - start == CHUNK or work + cost > PART_ELEMENTS):
            bounds.append((start, index))
            start, work = index, 0
        work += cost
    if start < len(common):
        bounds.append((start, len(common)))
    return bounds


@dataclass(frozen=True)
class PartComparison:
    """The rows of one part: the tensors both results have from ``start`` to ``stop``
    (``part_bounds``), in a's order."""

    rows: list[dict[str, Any]]  # compare_manifests' rows, each with its ``order`` in a
    nonfinite: list[dict[str, Any]]  # where b has NaN or Inf that a has not, in a's order
    awaiting: tuple[str, ...]  # the fingerprints it read without their whole values
    complete: bool  # every fingerprint it read was stored

    def to_dict(self) -> dict[str, Any]:
        """As kept (``from_dict`` reads it back)."""
        return {"rows": self.rows, "nonfinite": json_safe(self.nonfinite),
                "awaiting": list(self.awaiting)}

    @classmethod
    def from_dict(cls, kept: Mapping[str, Any]) -> PartComparison:
        return cls(kept["rows"], kept["nonfinite"], tuple(kept["awaiting"]), complete=True)


def compare_part(manifest_a: Manifest, manifest_b: Manifest, bounds: tuple[int, int],
                 fingerprints_of: FingerprintsOf, *, tolerance_for: Callable[[str], Tolerance],
                 semantics: str = "cpu") -> PartComparison:
    """The part ``bounds`` of result b (``manifest_b``) against result a: its
    fingerprints asked at once, closeness judged in the isclose arithmetic of
    ``semantics``."""
    by_name = {name: digest for name, _kind, digest in manifest_b}
    common = [(order, entry) for order, entry in enumerate(manifest_a) if entry[0] in by_name]
    part = common[bounds[0]:bounds[1]]
    hashes = {digest for _order, (_name, _kind, digest) in part}
    hashes |= {by_name[name] for _order, (name, _kind, _digest) in part}
    fingerprints = fingerprints_of(hashes)
    reference = [entry for _order, entry in part]
    candidate = [(name, kind, by_name[name]) for name, kind, _digest in reference]
    rows = [{**row, "order": order} for (order, _entry), row in zip(part, compare_manifests(
        candidate, reference, fingerprints, tolerance_for=tolerance_for, semantics=semantics),
        strict=True)]
    read: set[str] = set()
    stored: set[str] = set()
    awaiting: set[str] = set()
    nonfinite: list[dict[str, Any]] = []
    for order, (name, kind, digest) in part:
        own = by_name[name]
        if own == digest:
            continue
        read.update((own, digest))
        stored.update(h for h in (own, digest) if h in fingerprints)
        awaiting.update(h for h in (own, digest)
                        if h in fingerprints and not fingerprints[h].has_values)
        found = first_nonfinite([(name, kind, own)], [(name, kind, digest)], fingerprints)
        if found is not None:
            nonfinite.append({**found, "order": order})
    return PartComparison(rows, nonfinite, tuple(sorted(awaiting)), complete=read <= stored)


def summarize(manifest_a: Manifest, manifest_b: Manifest, parts: Sequence[PartComparison],
              fingerprints_of: FingerprintsOf, *, bounds: Sequence[tuple[int, int]],
              tolerance_for: Callable[[str], Tolerance], semantics: str = "cpu"
              ) -> dict[str, Any]:
    """What every part's rows say together (JSON-ready): the fields of /compare's pair
    besides the rows, and ``parts``, the parts' ``bounds`` (where a page's rows are)."""
    rows = [row for part in parts for row in part.rows]
    by_name = {name: digest for name, _kind, digest in manifest_b}
    names_a = {name for name, _kind, _digest in manifest_a}
    layers = [row for row in rows if row["kind"] == LAYER]
    first = first_divergent_layer(layers)
    if first is not None:
        first["bit_flip"] = _bit_flip(first["name"], manifest_a, by_name, fingerprints_of)
    only_a = [name for name, _k, _h in manifest_a if name not in by_name]
    only_b = [name for name, _k, _h in manifest_b if name not in names_a]
    dtypes = sorted({row["dtype"] for row in rows if row["dtype"] is not None})
    nonfinite = [found for part in parts for found in part.nonfinite]
    return json_safe({
        "summary": _summary(rows),
        "semantics": semantics,
        "first_divergent_layer": first,
        "largest_jump": largest_jump(layers),
        # Layers first, then the other tensors, each in a's order (layers.first_nonfinite).
        "first_nonfinite": min(nonfinite, default=None,
                               key=lambda f: (f["kind"] != LAYER, f["order"])),
        "tolerances": {dtype: asdict(tolerance_for(dtype)) for dtype in dtypes},
        "tensors_only_in_a": only_a[:LISTED], "tensors_only_in_a_total": len(only_a),
        "tensors_only_in_b": only_b[:LISTED], "tensors_only_in_b_total": len(only_b),
        "tensors_total": len(rows),
        "parts": [list(bound) for bound in bounds],
    })


def _bit_flip(name: str, manifest_a: Manifest, by_name: Mapping[str, str],
              fingerprints_of: FingerprintsOf) -> dict[str, Any] | None:
    """The one flipped bit of the first divergent layer, when that is all that differs."""
    hash_a = next((h for n, _k, h in manifest_a if n == name), None)
    hash_b = by_name.get(name)
    if hash_a is None or hash_b is None:
        return None
    fingerprints = fingerprints_of({hash_a, hash_b})
    if hash_a in fingerprints and hash_b in fingerprints:
        return single_bit_flip(fingerprints[hash_b], fingerprints[hash_a])
    return None


def _summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    counts = Counter(row["verdict"] for row in rows)
    outputs = [{"name": row["name"], "verdict": row["verdict"]}
               for row in rows if row["kind"] == "output"]
    decided = result_verdict(rows)
    return {"tensors": len(rows),
            "verdicts": {verdict: counts[verdict] for verdict in VERDICTS},
            "result_verdict": decided.to_dict() if decided is not None else None,
            "outputs": outputs[:LISTED], "outputs_total": len(outputs),
            "output_verdict": worst_verdict(o["verdict"] for o in outputs)}
