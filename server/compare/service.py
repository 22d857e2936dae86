"""GET /compare: two runs side by side, result by result and tensor by tensor.

Run a is the reference ("expected") and run b the candidate, as in ``analysis.compare``.
Results are matched by (suite, workload, variant, device). The answer is bounded by its
page, not by what was uploaded (design §3.3.15): every pair carries its summary over all
its tensors, and the tensor rows are listed ``limit`` at a time from ``offset``, counted
across the pairs in order. What reads content only — a pair's summary and rows (two
manifests under the workload's tolerances), the origin ops of two traces — is computed
once, within the request's computing time (``kit.compute``), and kept by content; a
page reads the kept rows of its pairs only. Whatever the computing time did not reach is
answered as pending, and the next ask goes on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis.nondeterminism import marked
from numparity_server.analysis.policy import Policy
from numparity_server.compare import repository
from numparity_server.compare.repository import ResultKey, ResultRow, RunRow
from numparity_server.compare.schemas import (
    CompareOut,
    EnvironmentDifference,
    Inputs,
    NondeterministicOpOut,
    ResultPair,
    ResultSide,
    RunInfo,
)
from numparity_server.compare.schemas import ResultKey as ResultKeyOut
from numparity_server.kit.compute import Budget, Postponed, unbounded
from numparity_server.kit.db import release, writing
from numparity_server.kit.errors import NotFound
from numparity_server.reads.explanations import explanations_among
from numparity_server.reads.fingerprints import (
    FingerprintsOnDemand,
    load_fingerprints,
    value_counts,
)
from numparity_server.reads.kept import keep_comparisons, kept_comparisons, usable_comparisons
from numparity_server.reads.traces import load_traces

log = logging.getLogger(__name__)
PENDING = analysis.PENDING


# Environment attributes listed, and the characters of each value shown: the documents are
# bounded (runs.schemas), but two of them may differ in every one of 10,000 attributes.
ENVIRONMENT_LISTED = 500
VALUE_CHARS = 4096


def compare_runs(
    *, session: Session, policy: Policy, run_a: str, run_b: str,
    workload: str | None = None, variant: str | None = None,
    device_a: str | None = None, device_b: str | None = None,
    limit: int = 50, offset: int = 0, budget: Budget | None = None,
) -> CompareOut:
    """With ``device_a`` (``device_b``) only run a's (b's) results on that device count,
    and run a's are matched with run b's of the same suite, workload and variant on
    ``device_b``: two GPUs of one node's run compare like two runs. The tensor rows of
    the page ``limit``/``offset``; summaries and origins of every pair."""
    budget = budget or unbounded()
    runs = repository.runs_by_id(session, {run_a, run_b})
    missing = [run_id for run_id in dict.fromkeys((run_a, run_b)) if run_id not in runs]
    if missing:
        raise NotFound(" and ".join(f"no run with run_id {run_id!r}" for run_id in missing))
    a, b = runs[run_a], runs[run_b]

    results = repository.results_of_runs(session, {a.pk, b.pk}, workload=workload,
                                         variant=variant)
    results_a = _on_device([r for r in results if r.run_pk == a.pk], device_a, a.run_id,
                           key_device=device_b)
    results_b = _on_device([r for r in results if r.run_pk == b.pk], device_b, b.run_id)
    common = [key for key in results_a if key in results_b]
    if (workload is not None or variant is not None) and not common:
        raise NotFound(_nothing_in_common(a, b, results_a, results_b, workload, variant))

    ok = [key for key in common if _has_tensors(results_a[key]) and _has_tensors(results_b[key])]
    stored = repository.stored_manifests(
        session, {digest for key in ok for side in (results_a, results_b)
                  if (digest := side[key].manifest_hash) is not None})
    compared = [key for key in ok if results_a[key].manifest_hash in stored
                and results_b[key].manifest_hash in stored]
    work = _Work(session, policy, budget)
    summaries = work.summaries({key: (results_a[key], results_b[key]) for key in compared})
    rows = work.rows_of_page(summaries, limit=limit, offset=offset)
    origins = work.origins({key: (results_a[key], results_b[key]) for key in compared})

    pairs = []
    for key in common:
        pair = _pair(results_a[key], results_b[key], key in ok, key in compared,
                     summaries.get(key), rows.get(key, []), origins.get(key), policy)
        if key in work.rows_pending:
            pair.pending = True
            pair.notes.append(PENDING)
        _nondeterminism(pair, results_a[key], results_b[key],
                        same_environment=a.env_key == b.env_key, nodes=(a.node, b.node))
        pairs.append(pair)
    # What explain found between the two nodes, beside each result's split (one query).
    found = explanations_among(session=session, nodes={a.node, b.node},
                               keys={key[:3] for key in common})
    for pair in pairs:
        pair.explanations = [e for e in found.get((pair.suite, pair.workload, pair.variant), [])
                             if {e.node, e.against_node} <= {a.node, b.node}]
    environment = _environment_differences(a, b)
    return CompareOut(
        run_a=_run_info(a), run_b=_run_info(b), workload=workload, variant=variant,
        environment=environment[:ENVIRONMENT_LISTED], environment_total=len(environment),
        pairs=pairs, limit=limit, offset=offset,
        tensors_total=sum(summary["tensors_total"] for summary in summaries.values()
                          if summary is not None),
        pending=work.pending,
        only_in_a=[_key(key) for key in results_a if key not in results_b],
        only_in_b=[_key(key) for key in results_b if key not in results_a],
    )


Sides = tuple[ResultRow, ResultRow]


@dataclass(frozen=True)
class PairComparison:
    """Result b against result a, as /compare judges a pair: its summary and its tensor
    rows (None: pending, the computing time ran out, or a fingerprint is gone)."""

    summary: dict[str, Any] | None
    rows: list[dict[str, Any]]


def compare_pairs(*, session: Session, policy: Policy, pairs: dict[Any, Sides],
                  budget: Budget | None = None) -> tuple[dict[Any, PairComparison], int]:
    """Each pair (reference a, candidate b: two results of any runs, each ok with a
    stored manifest) compared as /compare compares the results of two runs — the same
    kept comparisons, under the policy's tolerances — with every one of its tensor
    rows; and how many comparisons were left pending."""
    work = _Work(session, policy, budget or unbounded())
    summaries = work.summaries(pairs)
    total = sum(s["tensors_total"] for s in summaries.values() if s is not None)
    rows = work.rows_of_page(summaries, limit=total, offset=0) if total else {}
    return ({key: PairComparison(summaries.get(key), rows.get(key, [])) for key in pairs},
            work.pending)


def _semantics(a: ResultRow, b: ResultRow) -> str:
    """CUDA's isclose arithmetic for two results of one CUDA device, else the CPU's."""
    same = a.device_id is not None and a.device_id == b.device_id
    return analysis.semantics_of(a.device, b.device, same_device=same)
Manifest = list[tuple[str, str, str]]  # (name, kind, hash) in execution order
Bounds = tuple[int, int]  # a part of a result pair's tensors (analysis.part_bounds)


class _Work:
    """The kept comparisons of one request: read by key, the missing ones computed within
    its budget and kept; ``pending`` counts those left. A result pair's rows are computed
    and kept a part at a time (``analysis.part_bounds``: at most 256 tensors and 4 Mi
    elements of whole values), each part a unit of ``kit.compute``, and its summary once
    every part is: a pair of 4,096 tensors is spread over as many requests as its
    computing time needs."""

    def __init__(self, session: Session, policy: Policy, budget: Budget) -> None:
        self.session, self.policy, self.budget = session, policy, budget
        self.pending = 0
        self.rows_pending: set[ResultKey] = set()  # pairs whose page rows are left
        self._sides: dict[ResultKey, Sides] = {}
        # The parts this request read or computed (those computed but not kept too: a
        # fingerprint they read is gone), by key.
        self._parts: dict[str, analysis.PartComparison] = {}

    def _key(self, kind: str, sides: Sides, part: Bounds | None = None) -> str:
        a, b = sides
        assert a.manifest_hash is not None and b.manifest_hash is not None
        workload = a.workload
        return analysis.result_pair_key(
            kind, a.manifest_hash, b.manifest_hash,
            tolerance_for=lambda dtype: self.policy.tolerance(workload, dtype),
            semantics=_semantics(a, b), part=part)

    def summaries(self, pairs: dict[ResultKey, Sides]
                  ) -> dict[ResultKey, dict[str, Any] | None]:
        """Each pair's summary (None: pending, or a fingerprint it needs is gone)."""
        self._sides = dict(pairs)
        keys = {key: self._key(analysis.SUMMARY, sides) for key, sides in pairs.items()}
        found, stale = usable_comparisons(self.session, set(keys.values()))
        # Computing, or waiting for another request's computation, holds no connection.
        release(self.session)
        left: set[str] = set()  # summaries this request could not finish
        for key, sides in pairs.items():
            if keys[key] in found:
                continue
            summary = None if keys[key] in left else self._summary(keys[key], sides,
                                                                   refresh=keys[key] in stale)
            if summary is None:
                left.add(keys[key])
                self.pending += 1
            else:
                found[keys[key]] = summary
        return {key: found.get(keys[key]) for key in pairs}

    def _summary(self, key: str, sides: Sides, *, refresh: bool) -> dict[str, Any] | None:
        """The pair's summary from its parts, those not kept computed within the budget
        (None when one is left for a later request); kept once every part is complete."""
        if self.budget.spent():
            return None
        a, b = sides
        manifests = self._manifests(sides)
        bounds = analysis.part_bounds(*manifests, value_counts(
            self.session, {digest for manifest in manifests for _n, _k, digest in manifest}))
        release(self.session)
        if not self._parts_of(sides, bounds, manifests):
            return None
        parts = [self._parts[self._key(analysis.ROWS, sides, bound)] for bound in bounds]
        workload = a.workload
        value = analysis.summarize(
            *manifests, parts, partial(load_fingerprints, self.session),
            tolerance_for=lambda dtype: self.policy.tolerance(workload, dtype),
            semantics=_semantics(a, b), bounds=bounds)
        release(self.session)
        if all(part.complete for part in parts):
            assert a.manifest_hash is not None and b.manifest_hash is not None
            awaiting = tuple(sorted({digest for part in parts for digest in part.awaiting}))
            self._keep([analysis.ComparisonRecord(key, analysis.SUMMARY, a.manifest_hash,
                                                  b.manifest_hash, value, awaiting, True)],
                       refreshed={key} if refresh else set())
        return value

    def _manifests(self, sides: Sides) -> tuple[Manifest, Manifest]:
        a, b = sides
        assert a.manifest_hash is not None and b.manifest_hash is not None
        manifests = repository.manifest_entries(self.session, {a.manifest_hash,
                                                               b.manifest_hash})
        release(self.session)
        return manifests[a.manifest_hash], manifests[b.manifest_hash]

    def _parts_of(self, sides: Sides, bounds: Sequence[Bounds],
                  manifests: tuple[Manifest, Manifest] | None = None) -> bool:
        """Whether every part of ``bounds`` is read or computed into ``_parts``: those
        kept are read, the others computed within the budget and kept."""
        wanted = [(bound, part_key) for bound in bounds
                  if (part_key := self._key(analysis.ROWS, sides, bound)) not in self._parts]
        if not wanted:
            return True
        kept, stale = usable_comparisons(self.session, {part_key for _b, part_key in wanted})
        release(self.session)
        self._parts.update((part_key, analysis.PartComparison.from_dict(value))
                           for part_key, value in kept.items())
        records: list[analysis.ComparisonRecord] = []
        done = True
        for bound, part_key in wanted:
            if part_key in self._parts:
                continue
            manifests = manifests or self._manifests(sides)
            try:
                part = self.budget.run(part_key, partial(self._compare, sides, manifests,
                                                         bound))
            except Postponed:
                done = False
                break
            self._parts[part_key] = part
            if part.complete:
                a, b = sides
                assert a.manifest_hash is not None and b.manifest_hash is not None
                records.append(analysis.ComparisonRecord(
                    part_key, analysis.ROWS, a.manifest_hash, b.manifest_hash,
                    part.to_dict(), part.awaiting, True))
        self._keep(records, refreshed=stale)
        return done

    def _compare(self, sides: Sides, manifests: tuple[Manifest, Manifest],
                 bounds: Bounds) -> analysis.PartComparison:
        a, b = sides
        workload = a.workload
        part = analysis.compare_part(
            *manifests, bounds, partial(load_fingerprints, self.session),
            tolerance_for=lambda dtype: self.policy.tolerance(workload, dtype),
            # Two results of one CUDA device are judged in CUDA's isclose arithmetic.
            semantics=_semantics(a, b))
        release(self.session)
        return part

    def rows_of_page(self, summaries: dict[ResultKey, dict[str, Any] | None], *,
                     limit: int, offset: int) -> dict[ResultKey, list[dict[str, Any]]]:
        """The rows of the page, by pair: only the kept parts holding them are read (one
        a retention pass dropped is computed again, within the budget)."""
        wanted: dict[ResultKey, tuple[int, int, list[Bounds]]] = {}
        start = 0
        for key, summary in summaries.items():
            if summary is None:
                continue
            total = summary["tensors_total"]
            low, high = max(offset - start, 0), min(offset + limit - start, total)
            if low < high:
                wanted[key] = (low, high, [(first, stop) for first, stop in summary["parts"]
                                           if first < high and stop > low])
            start += total
        needed = {part_key for key, (_low, _high, bounds) in wanted.items() for bound in bounds
                  if (part_key := self._key(analysis.ROWS, self._sides[key], bound))
                  not in self._parts}
        if needed:
            self._parts.update(
                (part_key, analysis.PartComparison.from_dict(found.value))
                for part_key, found in kept_comparisons(self.session, needed).items())
        page: dict[ResultKey, list[dict[str, Any]]] = {}
        for key, (low, high, bounds) in wanted.items():
            if not self._parts_of(self._sides[key], bounds):
                self.pending += 1
                self.rows_pending.add(key)
                continue
            rows = [row for bound in bounds
                    for row in self._parts[self._key(analysis.ROWS, self._sides[key],
                                                     bound)].rows]
            page[key] = rows[low - bounds[0][0]:high - bounds[0][0]]
        return page

    def origins(self, pairs: dict[ResultKey, Sides]) -> dict[ResultKey, _Origin]:
        """Each traced pair's origin ops (kept, or computed within the budget)."""
        traced = {key: sides for key, sides in pairs.items()
                  if sides[0].trace_hash is not None and sides[1].trace_hash is not None}
        keys = {key: self._origin_key(sides) for key, sides in traced.items()}
        found, stale = usable_comparisons(self.session, set(keys.values()))
        release(self.session)
        records = []
        answers: dict[ResultKey, _Origin] = {}
        for key, sides in traced.items():
            if keys[key] in found:
                answers[key] = _Origin(found[keys[key]])
                continue
            try:
                record = self.budget.run(keys[key], partial(self._align, keys[key], sides))
            except Postponed:
                self.pending += 1
                answers[key] = _Origin(None, PENDING)
                continue
            if record is None:
                answers[key] = _Origin(None, "the op trace of a result is no longer stored")
                continue
            found[keys[key]] = record.value
            answers[key] = _Origin(record.value)
            if record.complete:
                records.append(record)
        self._keep(records, refreshed=stale)
        return answers

    def _origin_key(self, sides: Sides) -> str:
        a, b = sides
        assert a.trace_hash and b.trace_hash and a.manifest_hash and b.manifest_hash
        return analysis.origin_key_of(a.trace_hash, b.trace_hash, a.manifest_hash,
                                      b.manifest_hash, workload=a.workload,
                                      policy_version=self.policy.version)

    def _align(self, key: str, sides: Sides) -> analysis.ComparisonRecord | None:
        a, b = sides
        assert a.trace_hash and b.trace_hash and a.manifest_hash and b.manifest_hash
        traces = load_traces(self.session, {a.trace_hash, b.trace_hash})
        manifests = repository.manifest_entries(self.session, {a.manifest_hash,
                                                               b.manifest_hash})
        release(self.session)  # aligning holds no connection
        if a.trace_hash not in traces or b.trace_hash not in traces:
            return None
        fingerprints = FingerprintsOnDemand(self.session)
        workload = a.workload
        found = analysis.origin_ops(
            traces[a.trace_hash], traces[b.trace_hash], manifest_a=manifests[a.manifest_hash],
            manifest_b=manifests[b.manifest_hash], fingerprints=fingerprints,
            tolerance_for=lambda dtype: self.policy.tolerance(workload, dtype))
        release(self.session)
        return analysis.ComparisonRecord(
            key, analysis.ORIGIN, a.trace_hash, b.trace_hash, analysis.json_safe(
                found.to_dict()), fingerprints.awaiting(), fingerprints.complete())

    def _keep(self, records: list[analysis.ComparisonRecord], *, refreshed: set[str]) -> None:
        if not records:
            return
        try:
            with writing(self.session, changes_answers=False):
                keep_comparisons(self.session, records, refreshed=refreshed)
        except OperationalError as exc:
            # As /divergence: the next request computes them again.
            log.warning("compare: %d comparisons not kept: %s", len(records), exc)


@dataclass(frozen=True)
class _Origin:
    value: dict[str, Any] | None
    note: str | None = None


def _on_device(results: Sequence[ResultRow], device: str | None, run_id: str, *,
               key_device: str | None = None) -> dict[ResultKey, ResultRow]:
    """A run's results by key; with ``device``, those on it only (404 naming the devices
    the run has when none is), keyed as on ``key_device`` when given."""
    if device is None:
        return {r.key: r for r in results}
    chosen = {r.key[:3] + ((key_device or device),): r for r in results if r.device == device}
    if not chosen and results:
        devices = ", ".join(sorted({r.device for r in results}))
        raise NotFound(f"run {run_id!r} has no result on device {device!r}; its devices: "
                       f"{devices}")
    return chosen


def _has_tensors(result: ResultRow) -> bool:
    return result.status == "ok" and result.manifest_hash is not None


def _nothing_in_common(a: RunRow, b: RunRow, results_a: dict[ResultKey, ResultRow],
                       results_b: dict[ResultKey, ResultRow], workload: str | None,
                       variant: str | None) -> str:
    wanted = " and ".join(f"{name} {value!r}" for name, value in
                          (("workload", workload), ("variant", variant)) if value is not None)
    lacking = [run.run_id for run, results in ((a, results_a), (b, results_b)) if not results]
    if len(lacking) == 2 and a.run_id != b.run_id:
        return f"neither run {a.run_id!r} nor run {b.run_id!r} has a result of {wanted}"
    if lacking:
        return f"run {lacking[0]!r} has no result of {wanted}"
    return (f"no result of {wanted} is in both runs: run {a.run_id!r} has "
            f"{_describe(results_a)}, run {b.run_id!r} has {_describe(results_b)}")


def _describe(results: Iterable[ResultKey]) -> str:
    return ", ".join("/".join(part for part in key if part) for key in results)


def _run_info(run: RunRow) -> RunInfo:
    return RunInfo(run_id=run.run_id, node=run.node, env_key=run.env_key,
                   agent_version=run.agent_version, started_at=run.started_at, drill=run.drill)


def _key(key: ResultKey) -> ResultKeyOut:
    suite, workload, variant, device = key
    return ResultKeyOut(suite=suite, workload=workload, variant=variant, device=device)


def _environment_differences(a: RunRow, b: RunRow) -> list[EnvironmentDifference]:
    if a.env_key == b.env_key:
        return []
    differences = analysis.environment_diff(analysis.flatten_environment(a.environment),
                                            analysis.flatten_environment(b.environment))
    return [EnvironmentDifference(
                attribute=difference["attribute"], a=_cut(difference["a"]),
                b=_cut(difference["b"]), **dict(zip(
                    ("a_short", "b_short"),
                    analysis.short_difference(difference["a"], difference["b"]), strict=True)))
            for difference in differences]


def _cut(value: str) -> str:
    return value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS] + "…"


def _side(result: ResultRow) -> ResultSide:
    return ResultSide(status=result.status, workload_version=result.workload_version,
                      reason=result.reason, error=result.error,
                      manifest_hash=result.manifest_hash, repeats_agree=result.repeats_agree)


def _equal(x: str | None, y: str | None) -> bool | None:
    return None if x is None or y is None else x == y


def _inputs(a: ResultRow, b: ResultRow) -> tuple[Inputs, list[str]]:
    input_equal = _equal(a.input_hash, b.input_hash)
    param_equal = _equal(a.param_hash, b.param_hash)
    differ = [name for name, equal in (("input_hash", input_equal), ("param_hash", param_equal))
              if equal is False]
    notes = []
    if differ:
        notes.append(f"{' and '.join(differ)} differ: broken inputs, not a divergence")
    if a.workload_version != b.workload_version:
        notes.append(f"workload version {a.workload_version} in run a, "
                     f"{b.workload_version} in run b: the workload itself changed")
    inputs = Inputs(input_hash_equal=input_equal, param_hash_equal=param_equal,
                    broken=bool(differ))
    return inputs, notes


def _pair(a: ResultRow, b: ResultRow, ok: bool, stored: bool,
          summary: dict[str, Any] | None, rows: list[dict[str, Any]],
          origin: _Origin | None, policy: Policy) -> ResultPair:
    inputs, notes = _inputs(a, b)
    pair: dict[str, Any] = {
        "suite": a.suite, "workload": a.workload, "variant": a.variant, "device": a.device,
        "a": _side(a), "b": _side(b), "inputs": inputs, "notes": notes, "compared": False,
    }
    if not ok:
        return ResultPair.model_validate(pair)
    if not stored:
        notes.append("the tensors of a result are no longer stored")
        return ResultPair.model_validate(pair)
    if summary is None:
        notes.append(PENDING)
        pair["pending"] = True
        return ResultPair.model_validate(pair)
    pair.update(compared=True, **{name: value for name, value in summary.items()
                                  if name != "parts"}, tensors=rows)
    without = [f"run {side}'s result" for side, row in (("a", a), ("b", b))
               if row.trace_hash is None]
    if without:
        pair["origin_note"] = analysis.no_trace_note(without)
    elif origin is not None:
        pair["origin"], pair["origin_note"] = origin.value, origin.note
        pair["pending"] = origin.note == PENDING
    return ResultPair.model_validate(pair)


def _nondeterminism(pair: ResultPair, a: ResultRow, b: ResultRow, *,
                    same_environment: bool, nodes: tuple[str, str]) -> None:
    """Mark a pair whose difference is nondeterminism (design §3.3.16): a side's repeats
    disagree, or one environment gave two answers (two runs of a node that did not
    change); name the ops the agents' studies found, else the origin op, which on one
    environment is an op that gave other bits on the same inputs."""
    disagree = [side for side, row in (("a", a), ("b", b)) if row.repeats_agree is False]
    differ = (a.manifest_hash is not None and b.manifest_hash is not None
              and a.manifest_hash != b.manifest_hash)
    if not disagree and not (same_environment and differ):
        return
    named: dict[tuple[str, str, str], NondeterministicOpOut] = {}
    for row, node in ((a, nodes[0]), (b, nodes[1])):
        for op in (row.nondeterminism or {}).get("ops") or []:
            key = (op["op"], op.get("module", ""), op.get("phase", "forward"))
            no_recipe = op.get("no_recipe")
            # The node's words: marked when they read like a command (as the audit does).
            named.setdefault(key, NondeterministicOpOut(
                op=key[0], module=key[1], phase=key[2], recipe=op.get("recipe"),
                no_recipe=marked(no_recipe, [node]) if no_recipe else no_recipe))
    if not named and same_environment and pair.origin is not None:
        for op in pair.origin.ops[:5]:
            named.setdefault((op.op, op.module, op.phase), NondeterministicOpOut(
                op=op.op, module=op.module, phase=op.phase))
    why = (f"run {' and run '.join(disagree)}'s repeats disagree" if disagree
           else "the same environment gave both answers")
    if named:
        first = next(iter(named.values()))
        where = f" in {first.module}" if first.module else ""
        text = f"{why}: nondeterministic, first at {first.op}{where} ({first.phase})"
    else:
        text = (f"{why}: nondeterministic, not an environment difference; run the agent "
                "with --trace-ops and --repeats 2 or more to name the op")
    pair.nondeterministic = True
    pair.nondeterministic_ops = list(named.values())
    pair.nondeterminism_note = text
