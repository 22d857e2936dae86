"""A result pair compared in parts (``analysis.result_pair``): the parts cover the tensors
both results have, each a bounded unit of work, and together they say what comparing the
whole manifests at once says."""

from __future__ import annotations

import random

import numpy as np
from helpers.documents import tensor_entry

from numparity_server.analysis import (
    compare_manifests,
    compare_part,
    fingerprint_from_wire,
    part_bounds,
    summarize,
)
from numparity_server.analysis import result_pair as result_pair_module
from numparity_server.analysis.tolerance import default_tolerance


def test_parts_cover_the_common_tensors_each_a_bounded_unit():
    rng = random.Random(3)
    limit, chunk = result_pair_module.PART_ELEMENTS, result_pair_module.CHUNK
    for _case in range(40):
        size = rng.randrange(1, 2000)
        manifest_a = [(f"t{i}", "layer", f"a{i}") for i in range(size)]
        # b lacks some names, and holds some of a's tensors bit for bit (same hash).
        manifest_b = [(name, kind, digest if rng.random() < 0.3 else "b" + digest[1:])
                      for name, kind, digest in manifest_a if rng.random() < 0.9]
        counts = {digest: rng.choice([1, 1000, limit // 3, limit * 2])
                  for manifest in (manifest_a, manifest_b) for _n, _k, digest in manifest
                  if rng.random() < 0.7}
        by_name = {name: digest for name, _kind, digest in manifest_b}
        pairs = [(digest, by_name[name]) for name, _kind, digest in manifest_a
                 if name in by_name]
        bounds = part_bounds(manifest_a, manifest_b, counts)
        # Contiguous, in order, every common tensor once.
        assert [start for start, _stop in bounds] == [0, *(stop for _s, stop in bounds[:-1])]
        assert (bounds[-1][1] if bounds else 0) == len(pairs)
        for start, stop in bounds:
            assert 0 < stop - start <= chunk
            values = sum(max(counts[a], counts[b]) for a, b in pairs[start:stop]
                         if a != b and a in counts and b in counts)
            assert values <= limit or stop - start == 1
        # Without whole values, parts are CHUNK tensors each: the fewest bounded ones.
        plain = part_bounds(manifest_a, manifest_b, {})
        assert [stop - start for start, stop in plain[:-1]] == [chunk] * (len(plain) - 1)


def test_parts_together_are_the_whole_comparison():
    """The oracle: ``compare_manifests`` over the whole manifests, every fingerprint at
    hand; the parts' rows, concatenated, are its rows, and the summary counts them."""
    rng = np.random.default_rng(11)
    tensors_a, tensors_b = [], []
    for i in range(700):
        array = rng.standard_normal(16).astype(np.float32)
        tensors_a.append(tensor_entry(f"t{i:03d}", "layer" if i % 5 else "output", i, array))
        if i % 7:  # b lacks every seventh
            other = array * np.float32(1 + 1e-3 * (i % 3))
            tensors_b.append(tensor_entry(f"t{i:03d}", "layer" if i % 5 else "output", i, other))
    fingerprints = {t["hash"]: fingerprint_from_wire(t) for t in (*tensors_a, *tensors_b)}
    manifest_a = [(t["name"], t["kind"], t["hash"]) for t in tensors_a]
    manifest_b = [(t["name"], t["kind"], t["hash"]) for t in tensors_b]
    asked: list[int] = []

    def fingerprints_of(hashes):
        asked.append(len(hashes))
        return {digest: fingerprints[digest] for digest in hashes}

    expected = compare_manifests(manifest_b, manifest_a, fingerprints)
    bounds = part_bounds(manifest_a, manifest_b, {})
    assert len(bounds) == 3  # 600 common tensors, 256 a part
    parts = [compare_part(manifest_a, manifest_b, bound, fingerprints_of,
                          tolerance_for=default_tolerance) for bound in bounds]
    assert max(asked) <= 2 * result_pair_module.CHUNK
    rows = [row for part in parts for row in part.rows]
    assert [{k: v for k, v in row.items() if k != "order"} for row in rows] == [
        {k: v for k, v in row.items() if k != "order"} for row in expected]
    summary = summarize(manifest_a, manifest_b, parts, fingerprints_of,
                        tolerance_for=default_tolerance, bounds=bounds)
    assert summary["tensors_total"] == len(expected) == 600
    assert summary["tensors_only_in_a_total"] == 100
    assert summary["parts"] == [list(bound) for bound in bounds]
    verdicts = {v: sum(row["verdict"] == v for row in expected)
                for v in summary["summary"]["verdicts"]}
    assert summary["summary"]["verdicts"] == verdicts
    # Kept and read back, a part is the same part.
    for part in parts:
        again = type(part).from_dict(part.to_dict())
        assert (again.rows, again.nonfinite, again.awaiting) == (
            part.rows, part.nonfinite, part.awaiting)
