"""GET /compare: two runs side by side, result by result and tensor by tensor.

Run a is the reference ("expected") and run b the candidate, as in ``analysis.compare``.
Results are matched by (suite, workload, variant, device). Everything is read in a fixed
number of queries (runs, results, manifests, fingerprints), whatever the runs' size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis.policy import Policy
from numparity_server.compare import repository
from numparity_server.compare.repository import ResultKey, ResultRow, RunRow
from numparity_server.compare.schemas import (
    CompareOut,
    EnvironmentDifference,
    Inputs,
    ResultPair,
    ResultSide,
    RunInfo,
)
from numparity_server.compare.schemas import ResultKey as ResultKeyOut
from numparity_server.kit.errors import NotFound
from numparity_server.reads.explanations import explanations_among
from numparity_server.reads.fingerprints import load_fingerprints
from numparity_server.reads.traces import load_traces


def compare_runs(
    *, session: Session, policy: Policy, run_a: str, run_b: str,
    workload: str | None = None, variant: str | None = None,
    device_a: str | None = None, device_b: str | None = None,
) -> CompareOut:
    """With ``device_a`` (``device_b``) only run a's (b's) results on that device count,
    and run a's are matched with run b's of the same suite, workload and variant on
    ``device_b``: two GPUs of one node's run compare like two runs."""
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
    manifests = repository.manifest_entries(
        session, {digest for key in ok for side in (results_a, results_b)
                  if (digest := side[key].manifest_hash) is not None})
    fingerprints = load_fingerprints(
        session, {digest for entries in manifests.values() for _n, _k, digest in entries})
    traces = load_traces(session, {digest for key in ok for side in (results_a, results_b)
                                   if (digest := side[key].trace_hash) is not None})

    pairs = [
        _pair(results_a[key], results_b[key], manifests, fingerprints, traces, policy)
        for key in common
    ]
    # What explain found between the two nodes, beside each result's split (one query).
    found = explanations_among(session=session, nodes={a.node, b.node},
                               keys={key[:3] for key in common})
    for pair in pairs:
        pair.explanations = [e for e in found.get((pair.suite, pair.workload, pair.variant), [])
                             if {e.node, e.against_node} <= {a.node, b.node}]
    return CompareOut(
        run_a=_run_info(a), run_b=_run_info(b), workload=workload, variant=variant,
        environment=_environment_differences(a, b),
        pairs=pairs,
        only_in_a=[_key(key) for key in results_a if key not in results_b],
        only_in_b=[_key(key) for key in results_b if key not in results_a],
    )


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
    return [EnvironmentDifference(**difference, **dict(zip(
                ("a_short", "b_short"),
                analysis.short_difference(difference["a"], difference["b"]), strict=True)))
            for difference in differences]


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


def _pair(a: ResultRow, b: ResultRow, manifests: dict[str, list[tuple[str, str, str]]],
          fingerprints: dict[str, analysis.Fingerprint], traces: dict[str, analysis.Trace],
          policy: Policy) -> ResultPair:
    inputs, notes = _inputs(a, b)
    pair: dict[str, Any] = {
        "suite": a.suite, "workload": a.workload, "variant": a.variant, "device": a.device,
        "a": _side(a), "b": _side(b), "inputs": inputs, "notes": notes, "compared": False,
    }
    manifest_a = manifests.get(a.manifest_hash or "")
    manifest_b = manifests.get(b.manifest_hash or "")
    if not (_has_tensors(a) and _has_tensors(b)):
        return ResultPair.model_validate(pair)
    if manifest_a is None or manifest_b is None:
        notes.append("the tensors of a result are no longer stored")
        return ResultPair.model_validate(pair)

    workload = a.workload
    # Two results of CUDA devices are judged in CUDA's isclose arithmetic (closeness).
    semantics = analysis.semantics_of(a.device, b.device)
    rows = analysis.compare_manifests(
        manifest_b, manifest_a, fingerprints,
        tolerance_for=lambda dtype: policy.tolerance(workload, dtype), semantics=semantics)
    layers = [row for row in rows if row["kind"] == "layer"]
    names_a = {name for name, _kind, _hash in manifest_a}
    names_b = {name for name, _kind, _hash in manifest_b}
    dtypes = sorted({row["dtype"] for row in rows if row["dtype"] is not None})
    pair.update(
        compared=True,
        semantics=semantics,
        summary=_summary(rows),
        first_divergent_layer=_with_bit_flip(analysis.first_divergent_layer(layers),
                                             manifest_a, manifest_b, fingerprints),
        largest_jump=analysis.json_safe(analysis.largest_jump(layers)),
        first_nonfinite=analysis.first_nonfinite(manifest_b, manifest_a, fingerprints),
        tolerances={dtype: asdict(policy.tolerance(workload, dtype)) for dtype in dtypes},
        tensors_only_in_a=[name for name, _k, _h in manifest_a if name not in names_b],
        tensors_only_in_b=[name for name, _k, _h in manifest_b if name not in names_a],
        tensors=rows,
    )
    pair["origin"], pair["origin_note"] = _origin(
        a, b, manifest_a, manifest_b, fingerprints, traces,
        tolerance_for=lambda dtype: policy.tolerance(workload, dtype))
    return ResultPair.model_validate(pair)


def _origin(a: ResultRow, b: ResultRow, manifest_a: list[tuple[str, str, str]],
            manifest_b: list[tuple[str, str, str]],
            fingerprints: dict[str, analysis.Fingerprint], traces: dict[str, analysis.Trace],
            tolerance_for: Callable[[str], analysis.Tolerance]
            ) -> tuple[dict[str, Any] | None, str | None]:
    """The origin ops of b's result against a's from their op traces, or why there are
    none (design §3.3.14)."""
    without = [f"run {side}'s result" for side, row in (("a", a), ("b", b))
               if row.trace_hash is None]
    if without:
        return None, analysis.no_trace_note(without)
    assert a.trace_hash is not None and b.trace_hash is not None
    if a.trace_hash not in traces or b.trace_hash not in traces:
        return None, "the op trace of a result is no longer stored"
    found = analysis.origin_ops(traces[a.trace_hash], traces[b.trace_hash],
                                manifest_a=manifest_a, manifest_b=manifest_b,
                                fingerprints=fingerprints, tolerance_for=tolerance_for)
    return found.to_dict(), None


def _with_bit_flip(first: dict[str, Any] | None, manifest_a: list[tuple[str, str, str]],
                   manifest_b: list[tuple[str, str, str]],
                   fingerprints: dict[str, analysis.Fingerprint]) -> dict[str, Any] | None:
    """The first divergent layer, with the one flipped bit when that is all that differs."""
    if first is None:
        return None
    hash_a = next((h for name, _k, h in manifest_a if name == first["name"]), None)
    hash_b = next((h for name, _k, h in manifest_b if name == first["name"]), None)
    if hash_a in fingerprints and hash_b in fingerprints:
        first["bit_flip"] = analysis.single_bit_flip(fingerprints[hash_b],
                                                     fingerprints[hash_a])
    return first


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(row["verdict"] for row in rows)
    outputs = [{"name": row["name"], "verdict": row["verdict"]}
               for row in rows if row["kind"] == "output"]
    decided = analysis.result_verdict(rows)
    return {"tensors": len(rows),
            "verdicts": {verdict: counts[verdict] for verdict in analysis.VERDICTS},
            "result_verdict": decided.to_dict() if decided is not None else None,
            "outputs": outputs,
            "output_verdict": analysis.worst_verdict(o["verdict"] for o in outputs)}
