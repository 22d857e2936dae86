"""Compiled against eager, per result, on the node (design §3.3.18).

A node's `compiled` result (torch.compile, Inductor) is judged against the same run's
`default` result on the same device — the eager answer the workload computes in the
same dtype — as /compare judges two results (``compare.service.compare_pairs``: the same
kept comparisons, the policy's tolerances), and each of the two against the float64
answer by the fp64 judge (``divergence.service.answer_accuracy``), so a lab can tell "the
compiler is more accurate" from "the compiler is wrong". One rule each, used here.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.orm import Session

from numparity_server.analysis.policy import Policy
from numparity_server.compare import repository
from numparity_server.compare.repository import ResultRow
from numparity_server.compare.service import PairComparison, compare_pairs
from numparity_server.compiled.schemas import (
    CompiledOut,
    CompiledVerdict,
    CompilePass,
    CompileRecord,
    Fp64Closeness,
    Localisation,
)
from numparity_server.divergence.service import answer_accuracy
from numparity_server.kit.compute import Budget
from numparity_server.kit.db import release
from numparity_server.kit.errors import NotFound
from numparity_server.reads.explanations import eager_findings

COMPILED_VARIANT = "compiled"
# The eager answer a compiled result is judged against: the node's framework defaults,
# in the same dtype (the compiled variant changes nothing else).
EAGER_VARIANT = "default"
_PENDING = "pending: the request's computing time ran out; ask again"


def compiled_against_eager(*, session: Session, policy: Policy, run_id: str,
                           budget: Budget | None = None) -> CompiledOut:
    """Every compiled result of the run, each with its verdict against eager; 404 for a
    run that does not exist."""
    runs = repository.runs_by_id(session, {run_id})
    if run_id not in runs:
        raise NotFound(f"no run with run_id {run_id!r}")
    run = runs[run_id]
    results = repository.results_of_runs(session, {run.pk})
    eager = {(r.suite, r.workload, r.device): r for r in results
             if r.variant == EAGER_VARIANT}
    compiled = [r for r in results if r.variant == COMPILED_VARIANT]
    pairs = {key: (eager[key[:3]], result) for result in compiled
             if (key := (result.suite, result.workload, result.device, result.variant))
             and key[:3] in eager and _comparable(eager[key[:3]]) and _comparable(result)}
    stored = repository.stored_manifests(
        session, {side.manifest_hash for sides in pairs.values() for side in sides
                  if side.manifest_hash is not None})
    pairs = {key: sides for key, sides in pairs.items()
             if all(side.manifest_hash in stored for side in sides)}
    compared, pending = compare_pairs(session=session, policy=policy, pairs=pairs,
                                      budget=budget)
    manifests = repository.manifest_entries(
        session, {side.manifest_hash for sides in pairs.values() for side in sides
                  if side.manifest_hash is not None})
    explained = eager_findings(session=session, run_pk=run.pk) if compiled else {}
    release(session)
    usual: dict[tuple[str, ...], str | None] = {}
    items = []
    for result in compiled:
        key = (result.suite, result.workload, result.device, result.variant)
        found = compared.get(key)
        items.append(_verdict(result, eager.get(key[:3]), found))
        items[-1].restores_eager = explained.get(key[:3])
        if found is not None and found.summary is not None:
            items[-1].fp64 = _closer(session, policy, pairs[key], manifests, usual)
    return CompiledOut(run_id=run.run_id, node=run.node, env_key=run.env_key, items=items,
                       pending=pending)


def _comparable(result: ResultRow) -> bool:
    return result.status == "ok" and result.manifest_hash is not None


def _verdict(result: ResultRow, eager: ResultRow | None,
             found: PairComparison | None) -> CompiledVerdict:
    item = CompiledVerdict(
        suite=result.suite, workload=result.workload,
        workload_version=result.workload_version, device=result.device,
        status=result.status, reason=result.reason or result.error,
        eager_variant=EAGER_VARIANT, eager_status=eager.status if eager else None,
        verdict=None, decided_by=None, **_record(result.compiled))
    if result.status != "ok":
        return item
    if eager is None or eager.status != "ok":
        item.note = (f"the run has no ok {EAGER_VARIANT} result of {result.workload} on "
                     f"{result.device} to compare with: run the agent with --variants "
                     f"{EAGER_VARIANT} {COMPILED_VARIANT}")
        return item
    if found is None:
        item.note = "a side's tensors are not stored"
        return item
    if found.summary is None:
        item.pending = True
        item.note = _PENDING
        return item
    summary = found.summary["summary"]
    decided = summary.get("result_verdict") or {}
    item.verdict = decided.get("verdict")
    item.decided_by = decided.get("tensor")
    item.output_verdict = summary.get("output_verdict")
    item.verdicts = {k: v for k, v in (summary.get("verdicts") or {}).items() if v}
    first = found.summary.get("first_divergent_layer")
    item.first_divergent_layer = first.get("name") if first else None
    for metric in ("max_abs", "max_rel", "max_ulp"):
        values = [row["metrics"].get(metric) for row in found.rows
                  if row.get("metrics") and row["metrics"].get(metric) is not None]
        setattr(item, metric, max(values) if values else None)
    if result.input_hash != eager.input_hash or result.param_hash != eager.param_hash:
        item.note = ("other input or parameter bytes than the eager run's: broken inputs, "
                     "not the compiler")
    return item


# The agent's note where every leaf gives eager's bits alone (`_compile.localise`).
_FUSION = "fuses across modules"


def _record(compiled: dict[str, Any] | None) -> dict[str, Any]:
    """The stored compile record and localisation as the response models, read
    leniently: a stored record is the node's, validated at ingest."""
    found: dict[str, Any] = {}
    if not compiled:
        return found
    record = compiled.get("compile")
    if isinstance(record, dict):
        passes = record.get("passes") or []
        found["compile"] = CompileRecord(
            backend=record.get("backend"), mode=record.get("mode"),
            passes=[CompilePass(**p) for p in passes],
            pass_count=record.get("pass_count", len(passes)),
            cold_s=record.get("cold_s"), warm_s=record.get("warm_s"))
    located = compiled.get("localisation")
    if isinstance(located, dict):
        if located.get("eager_identical"):
            where = "identical"
        elif located.get("module"):
            where = "module"
        elif _FUSION in (located.get("note") or "") and not located.get("error"):
            where = "fusion across modules"
        else:
            where = "not localised"
        found["localisation"] = Localisation(
            where=where, **{key: located.get(key) for key in (
                "module", "first_differing", "differing", "leaves_tried", "seconds",
                "note", "error")}, kernels=located.get("kernels") or [])
    return found


def _closer(session: Session, policy: Policy, sides: tuple[ResultRow, ResultRow],
            manifests: dict[str, list[tuple[str, str, str]]],
            usual: dict[tuple[str, ...], str | None]) -> Fp64Closeness | None:
    """The fp64 judge of both answers' output, and which is the closer to float64."""
    eager, compiled = sides
    assert eager.manifest_hash is not None and compiled.manifest_hash is not None
    judged: dict[str, Any] = {}
    for name, side in (("eager", eager), ("compiled", compiled)):
        judged[name] = answer_accuracy(
            session=session, policy=policy, suite=side.suite, workload=side.workload,
            variant=side.variant, tensors=manifests.get(side.manifest_hash or "", []),
            usual=usual)
    if judged["eager"] is None or judged["compiled"] is None:
        return None
    a, b = judged["compiled"].rmse, judged["eager"].rmse
    closer = None
    if a is not None and b is not None and math.isfinite(a) and math.isfinite(b):
        closer = "equal" if a == b else ("compiled" if a < b else "eager")
    return Fp64Closeness(tensor=judged["compiled"].tensor, compiled_rmse=a, eager_rmse=b,
                         compiled_acceptable=judged["compiled"].acceptable,
                         eager_acceptable=judged["eager"].acceptable, closer=closer)
