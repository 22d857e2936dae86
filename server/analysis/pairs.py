"""One comparison of two distinct answers of a key, and the content it depends on
(design §3.3.7).

/divergence groups a key's members by their answer: a manifest hash when grouping by the
whole result, a tensor's hash when grouping by one tensor. What the comparison of answer
b against answer a says — verdict, basis, metrics, evidence, the tensor that decided, the
first divergent layer, the largest jump, the first NaN/Inf — reads only content: the two
answers, the two groups' representatives' manifests (the layers it walks) and the
fingerprints they name, and the tolerances (the workload's, under the policy). Nothing of
it depends on which nodes give the answers, nor how many. So it is computed once and
kept, content-addressed, under a key naming exactly that content (``pair_key``); a
repeated question costs a look-up and a new answer one comparison with the baseline.

Two more comparisons are kept the same way: the origin ops of two representatives
(``origin_key``: their op traces and manifests, the workload, the policy), and a group's
fp64 judgement (``fp64_key``: its tensor, the float64 answer and the strict baseline).
What depends on the members is not kept but computed per request: the attribution
(their environments), the explanations (their nodes), the notes naming a group's
representative.

Two things a key cannot see:

- The whole values of a large tensor reach the server after its fingerprint (design
  §2.8), and a verdict from values replaces one from the sketch. A record lists the
  fingerprints it read without their values (``awaiting``); once one of them has its
  values, the record is computed again.
- The code: ``COMPARISON_VERSION`` is part of every key. Change what a comparison
  computes (a metric, a rule, a field) and bump it; the old records are then never read
  again, and retention drops them.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._json import json_safe
from .compare import compare, no_evidence
from .fingerprint import Fingerprint
from .groups import Group, Member
from .judge import JUDGE_TOL_PER_RTOL, judge
from .layers import (
    LAYER,
    Manifest,
    compare_manifests,
    first_divergent_layer,
    first_nonfinite,
    largest_jump,
)
from .origin import origin_ops
from .tolerance import Tolerance, default_tolerance
from .trace import Trace
from .verdicts import result_verdict

ToleranceFor = Callable[[str], Tolerance]

# Part of every key: bump it when what a comparison computes changes.
COMPARISON_VERSION = 3

PAIR, ORIGIN, FP64 = "pair", "origin", "fp64"


@dataclass(frozen=True)
class ComparisonRecord:
    """A computed comparison as it is kept: ``value`` (JSON-ready) under ``key``.

    ``hash_a``/``hash_b`` are the content the key names first — the two answers (pair),
    the two op traces (origin), the group's tensor and the float64 answer (fp64) — so a
    record whose content is no longer stored can be dropped. ``awaiting``: the
    fingerprints it read without their whole values. ``complete`` is False when a hash it
    needed is not stored at all: such a comparison is shown, never kept.
    """

    key: str
    kind: str
    hash_a: str
    hash_b: str
    value: dict[str, Any]
    awaiting: tuple[str, ...] = ()
    complete: bool = True


def key_of(*parts: str | int) -> str:
    """The sha256 of the parts' canonical JSON: a kept comparison's key."""
    canonical = json.dumps(list(parts), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


_key = key_of


def pair_key(a: Group, b: Group, *, tensor: str | None, workload: str,
             policy_version: str) -> str:
    """The key of answer b compared with answer a: the two answers, the tensor grouped by
    ("" for the whole result), the workload (its tolerances), the policy's version, and
    the representatives' manifests. With the whole result the manifests are the answers;
    with one tensor they are not (two members with the same output may differ in a
    layer), and the layers walked are the representatives'. Two groups of one CUDA device are judged
    in CUDA's isclose arithmetic (``pair_semantics``): that is part of the key (the keys
    of CPU judgements are as they were)."""
    cuda = ("cuda",) if pair_semantics(a, b) == "cuda" else ()
    return _key(PAIR, COMPARISON_VERSION, a.hash, b.hash, tensor or "", workload,
                policy_version, _manifest(a.representative), _manifest(b.representative),
                *cuda)


def pair_semantics(a: Group, b: Group) -> str:
    """Whose isclose arithmetic judges b against a: CUDA's only when every member of
    both groups is one and the same CUDA device (`closeness.semantics_of`: results of
    two devices are compared on the CPU, as assert_close compares them), the CPU's
    otherwise -- two answers of a fleet come from different devices."""
    if a.counted or b.counted or a.semantics != "cuda" or b.semantics != "cuda":
        return "cpu"
    devices = {(member.node, member.device) for member in (*a.members, *b.members)}
    return "cuda" if len(devices) == 1 else "cpu"


def origin_key(a: Group, b: Group, *, workload: str, policy_version: str) -> str | None:
    """The key of the origin ops of b's representative against a's: their op traces,
    their manifests (what names an op's output, and the recorded outputs compared), the
    workload and the policy's version. None when a representative has no trace."""
    trace_a, trace_b = a.representative.trace, b.representative.trace
    if trace_a is None or trace_b is None:
        return None
    return origin_key_of(trace_a, trace_b, _manifest(a.representative),
                         _manifest(b.representative), workload=workload,
                         policy_version=policy_version)


def origin_key_of(trace_a: str, trace_b: str, manifest_a: str, manifest_b: str, *,
                  workload: str, policy_version: str) -> str:
    """The origin ops' key from its content: /divergence's representatives and /compare's
    two results share it, so a pair of traces is aligned once for both."""
    return _key(ORIGIN, COMPARISON_VERSION, trace_a, trace_b, manifest_a, manifest_b,
                workload, policy_version)


def fp64_key(group: Group, *, reference: str, baseline: str | None, workload: str,
             policy_version: str) -> str:
    """The key of a group's fp64 judgement: its tensor, the float64 answer's, the strict
    baseline's, the workload and the policy's version."""
    return _key(FP64, COMPARISON_VERSION, group.hash, reference, baseline or "", workload,
                policy_version)


def _manifest(member: Member) -> str:
    return member.manifest_hash


# ---- the comparisons ---------------------------------------------------------------------


def compare_answers(a: Group, b: Group, *, key: str, tensor: str | None,
                    fingerprints: Mapping[str, Fingerprint],
                    tolerance_for: ToleranceFor | None = None) -> ComparisonRecord:
    """Group b's answer against group a's (the reference), from their representatives.

    With ``tensor`` None, the result verdict: the worst of the tensors, ``decided_by``
    naming which; with a tensor, that tensor's verdict (``decided_by`` None). Either way
    the first divergent layer, the largest jump and the first NaN/Inf of the
    representatives' manifests.
    """
    candidate, reference = b.representative.tensors, a.representative.tensors
    read = _differing(candidate, reference)
    semantics = pair_semantics(a, b)
    if tensor is not None:
        comparison = no_evidence()
        if a.hash in fingerprints and b.hash in fingerprints:
            expected = fingerprints[a.hash]
            comparison = compare(fingerprints[b.hash], expected, tolerance=(
                tolerance_for(expected.dtype) if tolerance_for is not None else None),
                semantics=semantics)
        read |= {a.hash, b.hash}
        decided = {"verdict": comparison.verdict, "basis": comparison.basis,
                   "metrics": comparison.metrics, "evidence": comparison.evidence,
                   "decided_by": None}
        layers = compare_manifests(candidate, reference, fingerprints, kinds=(LAYER,),
                                   tolerance_for=tolerance_for, semantics=semantics)
    else:
        rows = compare_manifests(candidate, reference, fingerprints,
                                 tolerance_for=tolerance_for, semantics=semantics)
        verdict = result_verdict(rows)
        row = next((r for r in rows if verdict and r["name"] == verdict.tensor), None)
        decided = {"verdict": verdict.verdict if verdict else "divergent",
                   "basis": row["basis"] if row else "stats",
                   "metrics": row["metrics"] if row else {},
                   "evidence": row["evidence"] if row else "no tensor in common",
                   "decided_by": verdict.tensor if verdict else None}
        layers = [row for row in rows if row["kind"] == LAYER]
    value = {
        **decided,
        "semantics": semantics,
        "first_divergent_layer": first_divergent_layer(layers),
        "largest_jump": largest_jump(layers),
        # Where NaN or Inf first appear in b and not in a (layers first): the place to
        # look when the verdict is nonfinite.
        "first_nonfinite": first_nonfinite(candidate, reference, fingerprints),
    }
    return _record(key, PAIR, a.hash, b.hash, value, read, fingerprints)


def origin_between(a: Group, b: Group, *, key: str, traces: Mapping[str, Trace],
                   fingerprints: Mapping[str, Fingerprint],
                   tolerance_for: ToleranceFor | None = None) -> ComparisonRecord | None:
    """The origin ops of group b's representative against group a's, from their op
    traces (design §3.3.14); None when a trace is not stored."""
    first, second = a.representative, b.representative
    trace_a, trace_b = traces.get(first.trace or ""), traces.get(second.trace or "")
    if trace_a is None or trace_b is None:
        return None
    found = origin_ops(trace_a, trace_b, manifest_a=first.tensors, manifest_b=second.tensors,
                       fingerprints=fingerprints, tolerance_for=tolerance_for)
    return _record(key, ORIGIN, trace_a.hash, trace_b.hash, found.to_dict(),
                   _differing(second.tensors, first.tensors), fingerprints)


def fp64_judgement(group: Group, *, key: str, fingerprints: Mapping[str, Fingerprint],
                   reference: str, baseline: str | None,
                   tolerance_for: ToleranceFor | None = None) -> ComparisonRecord | None:
    """The fp64 judge (design §3.3.8) of the group's tensor: its RMSE against the float64
    answer ``reference`` within m times the strict ``baseline``'s plus the fixed term.
    None when the group's or the reference's fingerprint is not stored."""
    own, expected = fingerprints.get(group.hash), fingerprints.get(reference)
    if own is None or expected is None:
        return None
    strict = fingerprints.get(baseline) if baseline else None

    def rmse(fingerprint: Fingerprint) -> float | None:
        against = compare(fingerprint, expected)
        # A NaN or Inf the float64 answer does not have is an unbounded error.
        return math.inf if against.verdict == "nonfinite" else against.metrics.get("rmse")

    baseline_rmse = rmse(strict) if strict is not None else None
    # The judge's fixed term is absolute; outputs come at any scale, so scale it by the
    # float64 answer's RMS (the workloads' outputs are of order 1, as dynamo's are).
    rtol = _tolerance(own, tolerance_for).rtol
    tol = JUDGE_TOL_PER_RTOL * rtol * _rms(expected)
    read = {group.hash, reference, *([baseline] if baseline else [])}
    return _record(key, FP64, group.hash, reference,
                   judge(rmse(own), baseline_rmse, own.dtype, tol).to_dict(), read,
                   fingerprints)


def _tolerance(fingerprint: Fingerprint, tolerance_for: ToleranceFor | None) -> Tolerance:
    if tolerance_for is not None:
        return tolerance_for(fingerprint.dtype)
    return default_tolerance(fingerprint.dtype)


def _rms(fingerprint: Fingerprint) -> float:
    if fingerprint.has_values:
        squares, count = 0.0, 0
        for chunk in fingerprint.value_chunks():
            finite = chunk[np.isfinite(chunk)].astype(np.float64)
            squares += float(np.dot(finite, finite))
            count += finite.size
        if count:
            return math.sqrt(squares / count) or 1.0
    l2, count = (fingerprint.stats or {}).get("l2"), fingerprint.count
    if l2 and count:
        return float(l2) / math.sqrt(count)
    return 1.0


def _differing(candidate: Manifest, reference: Manifest) -> set[str]:
    """The hashes a comparison of the two manifests reads beyond their names: of each
    tensor both have under one name, when its bits differ, both sides'."""
    by_name = {name: digest for name, _kind, digest in candidate}
    read: set[str] = set()
    for name, _kind, digest in reference:
        own = by_name.get(name)
        if own is not None and own != digest:
            read.update((own, digest))
    return read


def _record(key: str, kind: str, hash_a: str, hash_b: str, value: dict[str, Any],
            read: Iterable[str], fingerprints: Mapping[str, Fingerprint]
            ) -> ComparisonRecord:
    read = set(read)
    awaiting = tuple(sorted(digest for digest in read if digest in fingerprints
                            and not fingerprints[digest].has_values))
    return ComparisonRecord(key, kind, hash_a, hash_b, json_safe(value), awaiting,
                            complete=all(digest in fingerprints for digest in read))


def needed(a: Group, b: Group, *, tensor: str | None) -> set[str]:
    """The fingerprints ``compare_answers`` (and ``origin_between``) of b against a read:
    every tensor of both representatives' manifests, and with a tensor the two answers."""
    hashes = {digest for member in (a.representative, b.representative)
              for _name, _kind, digest in member.tensors}
    if tensor is not None:
        hashes.update((a.hash, b.hash))
    return hashes
