"""Run one workload under the current variant, `repeats` times, into a result entry."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from numparity_agent import _compile
from numparity_agent._determinism import (
    HINT,
    MODES,
    OMP_DYNAMIC_CAUSE,
    all_deterministic,
    nondeterministic_ops,
    omp_dynamic,
    recipe,
    scopes,
    selective,
)
from numparity_agent._drill_spec import TENSOR_DRILL, OpDrillSpec, parse_drill
from numparity_agent._fingerprint import (
    bit_copy,
    combined_hash,
    fingerprints,
    same_bits,
    tensor_hashes,
)
from numparity_agent._inject import Call, Injection, OpDrill, injecting, resolve
from numparity_agent._knobs import read_knobs
from numparity_agent._timeline import PhaseClock
from numparity_agent._variants import Variant
from numparity_agent._workloads import SUITE
from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    layer_tensors,
    replace_layer_tensor,
)

# The fault drill flips the third-highest mantissa bit (bit 20 of a float32): the value
# moves by 1/16 to 1/8 of its magnitude, keeps its sign and stays finite.
DRILL_BITS_BELOW_TOP = 3
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# oneDNN's error when it has no kernel for an operation in the requested data types
# (ideep raises it as a RuntimeError: "could not create a primitive descriptor for the
# LSTM forward propagation primitive. ...", older releases "... descriptor iterator").
_ONEDNN_UNSUPPORTED = re.compile(r"could not create a primitive descriptor\b")
_HALF_DTYPES = ("float16", "bfloat16")
# Rounds of each mode of a cost study (design §2.13), at least: a warm-up and two timed,
# so each mode has a spread.
STUDY_ROUNDS = 3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def result_head(
    workload: str, version: int | None, variant: str, device: str, suite: str = SUITE
) -> dict[str, Any]:
    return {
        "suite": suite,
        "workload": workload,
        "workload_version": version,
        "variant": variant,
        "device": device,
    }


def run_workload(
    workload: Workload,
    *,
    variant: Variant,
    device: torch.device,
    repeats: int,
    slot: str | None = None,
    fault_drill: bool | str = False,
    keep_values: Callable[[str, np.ndarray], None] | None = None,
    trace: bool = False,
    trace_jobs: list[TraceJob] | None = None,
    study_budget_s: float | None = None,
) -> dict[str, Any]:
    """Build and run `workload` `repeats` times on `device`; fingerprint every tensor of
    the first (handing large tensors' values to `keep_values`, see
    `_fingerprint.fingerprint`). The result names `slot`, the device of the run
    document (default `str(device)`).

    Each repeat rebuilds the model and inputs (a workload that trains mutates them), so
    repeats also check that building is deterministic. `repeats_agree` compares the
    input/param hashes and every tensor hash of all repeats; `wall_s` and
    `wall_s_spread` time one run (building and fingerprinting excluded; `wall_time`).

    With `fault_drill` True (or "tensor"), every repeat has the same bit of the same
    layer flipped (see FaultDrill) and the result says which in its "drill" field; a
    workload that records no layers (probes) runs untouched and has no such field. With
    an `op:SPEC` text (`_drill_spec`), every repeat has the same op output corrupted as
    it is computed (`_inject.OpDrill`) and the result's "drill" says which op, element
    and bits (`kind: "op"`), or that no op of the class ran (`calls: 0`).

    With `trace` (design §2.10) one more run records every op (`trace_ops`): the result's
    "trace" is the trace body, or "trace_error" says why it has none. A trace that
    cannot be made never fails the result. With `trace_jobs` that run is not made here
    but appended to the list, for `run_traces` to make later with the others (the
    child: one kernel session for a variant's traced passes, after its timed runs).

    The result's `timeline` (`_timeline`) says where its time went: `build`, `run`,
    `fingerprint` (the first repeat's input, parameter and tensor hashes and
    fingerprints; each later repeat checked against it bit for bit, `same_bits`),
    `trace`.

    A result whose repeats disagree, traced, is studied (`study_nondeterminism`, its cost
    study within `study_budget_s`, default `_cost.BUDGET_S`).
    """
    head = result_head(workload.name, workload.version, variant.name, slot or str(device),
                       workload.suite)
    dtype = variant.dtype()
    tensors: list[dict[str, Any]] = []
    times: list[float] = []
    input_hash = param_hash = None
    fields: dict[str, Any] = {}
    drill_target: int | None = None
    drill_field: dict[str, Any] | None = None
    drill = parse_drill(fault_drill)
    op_spec = drill if isinstance(drill, OpDrillSpec) else None
    injection: Injection | None = None
    clean: list[tuple[str, str]] = []
    job: TraceJob | None = None
    clock = PhaseClock()
    # The first repeat's built inputs and parameters and recorded tensors, kept on the
    # device: each later repeat is checked against them bit for bit (`same_bits`), and
    # only the first is hashed (the hash of equal bits is equal).
    first_built: list[tuple[str, torch.Tensor]] = []
    first_recorded: list[tuple[str, torch.Tensor]] = []
    differing: set[str] = set()
    compile_passes: list[dict[str, Any]] = []
    try:
        if drill == TENSOR_DRILL:
            drill_target = _drill_target(workload, variant=variant, dtype=dtype, device=device)
        elif op_spec is not None:
            calls, clean = op_census(workload, op_spec, variant=variant, dtype=dtype,
                                     device=device)
            injection = resolve(op_spec, calls)
            if injection is None:
                drill_field = {"kind": "op", "spec": op_spec.text(), "class": op_spec.op_class,
                               "calls": 0}
        if workload.warmup and not variant.compiles:
            # One evaluation first, unrecorded and out of `wall_s` and the result's
            # timeline (the child's counts it in `other`; `Workload.warmup`): the first
            # in a process can differ in the last bits from every later one.
            warm = workload.build(dtype=dtype, device=device)
            with variant.run_context(device):
                workload.run(warm, Recorder())
            _sync(device)
            del warm
        for repeat in range(repeats):
            if variant.compiles:
                # Each repeat compiles afresh (dynamo's frames forgotten): the first as the
                # node's caches are (cold on a new node or torch), the later ones warm.
                compile_passes.append(compile_pass(workload, variant=variant, dtype=dtype,
                                                   device=device))
            with clock.phase("build"):
                built = workload.build(dtype=dtype, device=device)
                if variant.compiles:
                    _compile.compile_in_place(built.model)
                _sync(device)
            with clock.phase("fingerprint"):
                if repeat == 0:
                    input_hash, param_hash = built_hashes(built)
                    first_built = _built_tensors(built, copy=True)
                else:
                    differing.update(_differing(first_built, _built_tensors(built)))
            layer_drill = FaultDrill(drill_target) if drill_target is not None else None
            op_drill = OpDrill(injection.spec, injection) if injection is not None else None
            recorder = Recorder(layer_fault=layer_drill)
            _sync(device)
            start = time.perf_counter()
            with variant.run_context(device), injecting(op_drill):
                workload.run(built, recorder)
            _sync(device)
            times.append(time.perf_counter() - start)
            clock.add("run", times[-1])
            with clock.phase("fingerprint"):
                recorded = [(name, value) for name, _, value in recorder.tensors]
                if repeat == 0:
                    fields = recorder.fields
                    if layer_drill is not None:
                        drill_field = layer_drill.flipped
                    elif op_drill is not None:
                        drill_field = op_drill.flipped or {
                            "kind": "op", "spec": injection.spec.text(),  # type: ignore[union-attr]
                            "class": op_spec.op_class,  # type: ignore[union-attr]
                            "calls": len(op_drill.calls),
                            "note": "the chosen call did not come in this run"}
                    prints = fingerprints([value for _, value in recorded], keep_values)
                    for order, ((name, kind, _value), entry) in enumerate(
                            zip(recorder.tensors, prints, strict=True)):
                        tensors.append({"name": name, "kind": kind, "order": order, **entry})
                    if op_drill is not None and drill_field is not None:
                        drill_field.update(masking(clean, [(t["name"], t["hash"])
                                                           for t in tensors]))
                    first_recorded = recorded
                else:
                    differing.update(_differing(first_recorded, recorded, "<tensor list>"))
            del built, recorder, recorded
        first_built = first_recorded = []
        if trace and workload.traceable and not variant.compiles:
            job = TraceJob(workload, variant, dtype, device,
                           [(t["name"], t["hash"]) for t in tensors], drill_target, {},
                           injection)
    except Exception as exc:  # noqa: BLE001 - one workload's failure must not stop others
        if variant.compiles and _compile.is_compiler_error(exc):
            # A workload torch cannot compile is skipped with torch's reason (§2.3).
            return {**head, "status": "skipped",
                    "reason": _compile.skip_reason(exc, head["workload"])}
        # oneDNN without a half-precision kernel here: the variant cannot run it (§2.3).
        reason = unsupported_half_reason(
            exc, workload=head["workload"], variant=variant, device=device
        )
        if reason is not None:
            return {**head, "status": "skipped", "reason": reason}
        return {**head, "status": "failed", "error": _error_text(exc),
                "timeline": clock.seconds()}
    result: dict[str, Any] = {
        **head,
        "status": "ok",
        "dtype": str(dtype).removeprefix("torch."),
        "input_hash": input_hash,
        "param_hash": param_hash,
        "repeats": repeats,
        "repeats_agree": not differing,
        **wall_time(times),
        "wall_s_repeats": [round(t, 6) for t in times],
        "knobs": {**read_knobs(), **variant.knobs(device)},
        "tensors": tensors,
        "timeline": clock.seconds(),
    }
    # Workload-specific fields ("train", "probes"); they never replace a contract field.
    result.update({k: v for k, v in fields.items() if k not in result})
    if variant.compiles:
        result["compile"] = compile_summary(compile_passes)
        if trace:
            result["trace_error"] = ("a compiled run's ops are Inductor's kernels, not the "
                                     "aten ops a trace records: not traced")
        result["localisation"] = against_eager(workload, dtype=dtype, device=device,
                                               tensors=tensors)
    if differing:
        result["repeats_differ"] = sorted(differing)
        # Design §2.13: traced, the ops that differ on the same inputs and what making
        # only them deterministic costs; untraced, the hint to trace it.
        if trace and workload.traceable and not variant.compiles:
            with clock.phase("trace"):
                result["nondeterminism"] = study_nondeterminism(
                    workload, variant=variant, dtype=dtype, device=device,
                    rounds=max(repeats, STUDY_ROUNDS), budget_s=study_budget_s)
        else:
            result["nondeterminism"] = {"traced": False, "hint": HINT}
        result["timeline"] = clock.seconds()
    if drill_field is not None:
        result["drill"] = drill_field
    if job is not None:
        job.result = result
        if trace_jobs is not None:
            trace_jobs.append(job)
        else:
            run_traces([job])
    return result


def compile_pass(workload: Workload, *, variant: Variant, dtype: torch.dtype,
                 device: torch.device) -> dict[str, Any]:
    """One compile of `workload` (design §2.14): dynamo's frames forgotten, the workload
    built and compiled in place and run once unrecorded (what compiles it: every graph
    the run meets, the backward's too). `seconds` is that run, the compile and one run;
    the counts are Inductor's FX graph cache hits and misses and the graphs dynamo made.
    A throwaway build: a workload that trains changes its model as it runs."""
    _compile.reset()
    before = _compile.cache_counters()
    built = workload.build(dtype=dtype, device=device)
    _compile.compile_in_place(built.model)
    start = time.perf_counter()
    with variant.run_context(device):
        workload.run(built, Recorder())
    _sync(device)
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 6), **_compile.counted(before)}


def compile_summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """A compiled result's `compile`: each repeat's compile pass, and the seconds of the
    first cold one (it missed Inductor's cache) and of the first warm one (every graph
    from the cache)."""
    cold = next((p for p in passes if p["cache_misses"]), None)
    warm = next((p for p in passes if p["cache_hits"] and not p["cache_misses"]), None)
    return {"backend": "inductor", "mode": "default",
            "cache_dir": os.environ.get(_compile.CACHE_DIR_VARIABLE),
            "passes": passes,
            "cold_s": cold["seconds"] if cold else None,
            "warm_s": warm["seconds"] if warm else None}


def against_eager(workload: Workload, *, dtype: torch.dtype, device: torch.device,
                  tensors: list[dict[str, Any]]) -> dict[str, Any]:
    """The compiled result against one eager run of the workload in this child, bit for
    bit (`eager_identical`, `first_differing`: the first recorded tensor that differs,
    `differing`: how many); where they differ, `_compile.localise` from there. The
    verdict under the lab's tolerances is the server's (design §3.3.18). Never raises:
    the result stands without it (`error`)."""
    try:
        built = workload.build(dtype=dtype, device=device)
        recorder = Recorder()
        workload.run(built, recorder)
        _sync(device)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"the eager run failed: {_error_text(exc, limit=1000)}"}
    eager = dict(zip([name for name, _, _ in recorder.tensors],
                     tensor_hashes([value for _, _, value in recorder.tensors]), strict=True))
    del built, recorder
    differing = [t["name"] for t in tensors if eager.get(t["name"]) != t["hash"]]
    found: dict[str, Any] = {"eager_identical": not differing,
                             "first_differing": differing[0] if differing else None,
                             "differing": len(differing)}
    if differing:
        layer = next((t["name"] for t in tensors
                      if t["name"] in differing and t["kind"] == "layer"), None)
        if layer is None:
            # Localisation compiles forward leaves on their eager inputs: where every
            # recorded layer agrees (train's gradients differ, its forward does not), a
            # leaf that differs alone would be a false lead.
            found.update({"module": None, "note": (
                f"every recorded layer gives eager's bits; the first difference is "
                f"{differing[0]}: not localised (leaf modules are compiled forward only)")})
        else:
            found.update(_compile.localise(workload, dtype=dtype, device=device,
                                           first_differing=layer))
    return found


@dataclass
class TraceJob:
    """A traced pass still to run for a result (`run_workload` with `trace_jobs`): the
    workload as it was fingerprinted, and the result its trace or `trace_error` goes
    into."""

    workload: Workload
    variant: Variant
    dtype: torch.dtype
    device: torch.device
    expected: list[tuple[str, str]]
    drill_target: int | None
    result: dict[str, Any]
    injection: Injection | None = None


def run_traces(jobs: list[TraceJob]) -> None:
    """Each job's traced pass (`trace_ops`), all inside one kernel session (`_trace.
    KernelSession`: on CUDA one profiler session for all of them, opened after the
    variant's timed runs), then each result's `trace` or `trace_error`."""
    from numparity_agent._trace import KernelSession

    if not jobs:
        return
    session = KernelSession()
    done = []
    with session.record(jobs[0].device):
        for index, job in enumerate(jobs):
            start = time.perf_counter()
            tracer, error = trace_ops(job.workload, variant=job.variant, dtype=job.dtype,
                                      device=job.device, expected=job.expected,
                                      drill_target=job.drill_target, kernels=session,
                                      injection=job.injection,
                                      name=str(index))
            done.append((job, tracer, error, time.perf_counter() - start))
    for index, (job, tracer, error, seconds) in enumerate(done):
        start = time.perf_counter()
        if tracer is not None:
            session.annotate(str(index), tracer.ops)
            job.result["trace"] = tracer.body()
        else:
            job.result["trace_error"] = error
        timeline = job.result.setdefault("timeline", {})
        timeline["trace_s"] = round(seconds + time.perf_counter() - start, 6)


def study_nondeterminism(workload: Workload, *, variant: Variant, dtype: torch.dtype,
                         device: torch.device, rounds: int,
                         budget_s: float | None = None) -> dict[str, Any]:
    """A nondeterministic result's `nondeterminism` (design §2.13): two located traced
    passes; the ops whose inputs are the same bits in both and whose outputs are not
    (`_determinism.nondeterministic_ops`) with a recipe each, and the cost study
    (`cost_study`, at least `rounds` rounds, within `budget_s`); where a difference
    enters from outside the traced ops (`_sources.difference_sources`: host data, a
    generator, a DataLoader batch) with its recipe. Never fails the result: an
    exception becomes `error`."""
    from numparity_agent._sources import difference_sources

    environ = dict(os.environ)
    found: dict[str, Any] = {"traced": True}
    try:
        passes, known = [], []
        for _ in range(2):
            body, names = _located_pass(workload, variant=variant, dtype=dtype,
                                        device=device)
            passes.append(body)
            known.append(names)
        ops, parts_at = nondeterministic_ops(passes[0], passes[1])
        for op in ops:
            op.update(recipe(op, device_type=device.type, environ=environ))
        sources, equal = difference_sources(passes[0], passes[1],
                                            known=(known[0], known[1]), environ=environ)
        found["ops"] = ops
        if sources:
            found["sources"] = sources
        if parts_at is not None:
            found["passes_part_at"] = parts_at
        if device.type == "cpu" and omp_dynamic(environ):
            found["cause"] = OMP_DYNAMIC_CAUSE
        if not ops:
            found["note"] = _no_op_note(sources, equal=equal, parts_at=parts_at)
            return found
        found["cost"] = cost_study(workload, variant=variant, dtype=dtype, device=device,
                                   ops=ops, rounds=rounds, budget_s=budget_s)
    except Exception as exc:  # noqa: BLE001 - the result stands without its study
        found["error"] = _error_text(exc, limit=1000)
    return found


def _no_op_note(sources: list[dict[str, Any]], *, equal: bool, parts_at: int | None
                ) -> str:
    """What the study says when no op gives other bits on the same inputs."""
    if sources:
        first = sources[0]
        where = f" in {first['module']}" if first["module"] else ""
        at = f" (called at {first['at']})" if first.get("at") else ""
        return (f"no op gives other bits on the same inputs: the difference enters from "
                f"outside torch's ops at {first['op']}{where}{at}, reading "
                f"{first['what']}; {first['advice']}")
    if equal:
        return ("the two traced passes computed the same bits (every op's outputs "
                "compared): the nondeterminism did not show again; run more repeats")
    if parts_at is not None:
        return (f"the two traced passes ran other ops from op {parts_at} on: the workload "
                "chooses its ops by values that differ, before any op could be named")
    return ("the two traced passes differ, but no op gives other bits on the same inputs "
            "and no input from outside the traced ops was found")


def _located_pass(workload: Workload, *, variant: Variant, dtype: torch.dtype,
                  device: torch.device) -> tuple[dict[str, Any], dict[str, str]]:
    """(the body of one located traced pass, the references of the workload's built
    inputs and parameters with their names) for `study_nondeterminism`."""
    from numparity_agent._trace import reference, tracing

    built = workload.build(dtype=dtype, device=device)
    named = [(f"input {name}", t) for name, t in built.inputs.items()]
    named += [(f"parameter {name}", t) for name, t in built.model.state_dict().items()]
    known = {reference(digest): name for (name, _), digest in
             zip(named, tensor_hashes([t for _, t in named]), strict=True)}
    recorder = Recorder()
    with tracing(built.model, locate=True) as tracer, variant.run_context(device):
        recorder.tracer = tracer
        workload.run(built, recorder)
    _sync(device)
    return tracer.body(), known


def cost_study(workload: Workload, *, variant: Variant, dtype: torch.dtype,
               device: torch.device, ops: list[dict[str, Any]], rounds: int,
               budget_s: float | None = None) -> dict[str, Any]:
    """What `strict` (every determinism flag on) and `selective` (only the ops' scopes:
    `_determinism.selective`) cost against `default` (the variant as it is), and
    whether each mode's rounds computed the same bits (`repeatable`); `_cost` says how.

    Each round runs every mode once, in an order that rotates; the first round is a
    warm-up. At least `rounds` rounds and MIN_TIMED timed ones run, then more until
    every mode's interval is narrow (`_cost.narrow`), the time budget (`budget_s`,
    default `_cost.BUDGET_S`) is spent or MAX_ROUNDS ran. Each of strict and selective
    gets `ratio` (the median of its paired ratios to default), its interval
    (`ratio_low`, `ratio_high`) and the `verdict`; the study, the node's `load` at the
    end. Without a scope (no op has an in-process recipe) there is no selective mode."""
    from numparity_agent import _cost

    chosen = scopes(ops)
    modes = [mode for mode in MODES if mode != "selective" or chosen]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    first: dict[str, list[tuple[str, torch.Tensor]]] = {}
    differ: dict[str, set[str]] = {mode: set() for mode in modes}
    budget = _cost.BUDGET_S if budget_s is None else budget_s
    least = max(rounds, _cost.MIN_TIMED + 1)
    start_study = time.perf_counter()
    ratios: dict[str, dict[str, float]] = {}
    done = 0
    while done < _cost.MAX_ROUNDS:
        order = modes[done % len(modes):] + modes[:done % len(modes)]
        for mode in order:
            times[mode].append(_timed_mode(workload, mode, variant=variant, dtype=dtype,
                                           device=device, chosen=chosen, first=first,
                                           differ=differ))
        done += 1
        timed = done - 1
        ratios = {mode: _cost.paired_ratio(times["default"][1:], times[mode][1:])
                  for mode in modes if mode != "default"} if timed else {}
        if done < least:
            continue
        if all(_cost.narrow(found, timed) for found in ratios.values()):
            break
        if time.perf_counter() - start_study >= budget:
            break
    load = _cost.load_now()
    found: dict[str, Any] = {"rounds": done, "scopes": chosen,
                             "seconds": round(time.perf_counter() - start_study, 3),
                             "confidence": _cost.CONFIDENCE, "load": load}
    for mode in modes:
        found[mode] = {**wall_time(times[mode]), "repeatable": not differ[mode],
                       "wall_s_rounds": [round(t, 6) for t in times[mode]]}
        if mode in ratios and ratios[mode]:
            paired = {key: round(value, 6) for key, value in ratios[mode].items()}
            found[mode].update(paired)
            found[mode]["verdict"] = _cost.verdict(paired["ratio"],
                                                   _cost.half_width(paired))
            found[mode]["cost"] = _cost.words(paired, load=load)
        if differ[mode]:
            found[mode]["differ"] = sorted(differ[mode])[:8]
    return found


def _timed_mode(workload: Workload, mode: str, *, variant: Variant, dtype: torch.dtype,
                device: torch.device, chosen: list[dict[str, Any]],
                first: dict[str, list[tuple[str, torch.Tensor]]],
                differ: dict[str, set[str]]) -> float:
    """One run of the workload in `mode` for `cost_study`: its wall time; what it
    recorded is checked against the mode's first run (`differ`)."""
    built = workload.build(dtype=dtype, device=device)
    recorder = Recorder()
    with contextlib.ExitStack() as stack:
        if mode == "strict":
            stack.enter_context(all_deterministic())
        elif mode == "selective":
            recorder.phase_scopes = stack.enter_context(selective(built.model, chosen))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        _sync(device)
        start = time.perf_counter()
        with variant.run_context(device):
            workload.run(built, recorder)
        _sync(device)
        seconds = time.perf_counter() - start
    recorded = [(name, value) for name, _, value in recorder.tensors]
    if mode not in first:
        first[mode] = recorded
    else:
        differ[mode].update(_differing(first[mode], recorded, "<tensor list>"))
    del built, recorder
    return seconds


def trace_ops(
    workload: Workload, *, variant: Variant, dtype: torch.dtype, device: torch.device,
    expected: list[tuple[str, str]] | None, drill_target: int | None = None,
    kernels: Any = None, name: str = "", injection: Injection | None = None,
) -> tuple[Any, str | None]:
    """(the pass's `_trace.OpTracer`, None), or (None, why there is none): one more run
    of `workload` with every op recorded (`_trace`), kept only when it recorded the
    `expected` (name, hash) list, the fingerprinted run's, bit for bit (with the same
    fault drill when there is one; None: any pass is kept, `study_nondeterminism`).
    `kernels`: the session whose annotations name the ops' CUDA kernels (under the trace
    name `name`); the tracer's `body()` is the trace once that session has annotated
    it."""
    from numparity_agent._trace import tracing

    try:
        built = workload.build(dtype=dtype, device=device)
        drill = FaultDrill(drill_target) if drill_target is not None else None
        recorder = Recorder(layer_fault=drill)
        op_drill = OpDrill(injection.spec, injection) if injection is not None else None
        # The drill's mode innermost: the tracer's own arithmetic is never counted.
        with tracing(built.model, kernels, name) as tracer, variant.run_context(device), \
                injecting(op_drill):
            recorder.tracer = tracer
            workload.run(built, recorder)
        _sync(device)
        tracer.resolve()
        got = list(zip([name for name, _, _ in recorder.tensors],
                       tensor_hashes([value for _, _, value in recorder.tensors]),
                       strict=True))
    except Exception as exc:  # noqa: BLE001 - the result stands without its trace
        return None, f"tracing failed: {_error_text(exc, limit=1000)}"
    if expected is not None and got != expected:
        differing = [name for (name, digest), (_n, other) in zip(got, expected, strict=False)
                     if digest != other] or ["the list of tensors"]
        return None, ("the traced run computed other bits than the fingerprinted one ("
                      f"{', '.join(differing[:5])}): no trace, rather than one of "
                      "another computation")
    return tracer, None


class FaultDrill:
    """`run --fault-drill` (design §2.6): one flipped bit, as a corrupting GPU makes.

    A Recorder's `layer_fault`. It counts the calls of the layer hooks in execution
    order and, at call `target`, flips the third-highest mantissa bit (bit 20 of a
    float32, 7 of a float16, 4 of a bfloat16, 49 of a float64) of the largest finite
    element (the first of them on ties) of the call's first corruptible tensor
    (floating, with a finite value: a recurrent layer's output sequence, not its
    state). The largest element of an activation is positive in practice, so the flip
    survives a following ReLU or max-pool and reaches every later layer that reads it,
    and the output. The model goes on with the corrupted tensor and the recorded copy
    is corrupted alike, before anything is fingerprinted. Only the calls the layer
    hooks see count: `train` hooks (and so corrupts) its first forward only, and its
    later steps compute from what that corrupted forward taught the weights.

    With `target` None it changes nothing and lists, in `eligible`, the calls whose
    output it could corrupt (the planning pass of `_drill_target`).
    """

    def __init__(self, target: int | None = None) -> None:
        self.target = target
        self.calls = 0
        self.eligible: list[int] = []
        # The result's "drill" field once the bit is flipped.
        self.flipped: dict[str, Any] | None = None

    def __call__(self, recorder: Recorder, first: int, output: Any) -> Any:
        call = self.calls
        self.calls += 1
        if self.target is not None and call != self.target:
            return None
        recorded = [value for _, _, value in recorder.tensors[first:]]
        position = next((i for i, value in enumerate(recorded) if _corruptible(value)), None)
        if position is None:
            return None
        if self.target is None:
            self.eligible.append(call)
            return None
        name, _kind, copy = recorder.tensors[first + position]
        live = layer_tensors(output)[position]
        index, bit, element, flipped = _flip_bit(copy)
        coords = tuple(int(c) for c in np.unravel_index(index, tuple(copy.shape)))
        # A copy of the live tensor keeps its layout and, in a training step, its
        # autograd graph; the flipped bit is a fault autograd never hears of.
        corrupted = live.clone()
        with torch.no_grad():
            corrupted[coords] = flipped.to(corrupted.device)
            copy[coords] = flipped.to(copy.device)
        self.flipped = {
            "layer": name,
            "index": index,
            "bit": bit,
            "before": float(element.item()),
            "after": float(flipped.item()),
        }
        return replace_layer_tensor(output, position, corrupted)


def _corruptible(value: torch.Tensor) -> bool:
    return (
        value.is_floating_point()
        and value.element_size() in _INT_OF_SIZE
        and bool(torch.isfinite(value).any())
    )


def _flip_bit(value: torch.Tensor) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(flat index of the largest finite element, bit, that element, it with the bit
    flipped), the elements as 0-dim CPU tensors of `value`'s dtype."""
    flat = value.detach().reshape(-1).to("cpu")
    finite = torch.where(torch.isfinite(flat), flat.double(), -float("inf"))
    index = int(torch.argmax(finite))  # the first largest, on ties
    mantissa_bits = round(-np.log2(torch.finfo(value.dtype).eps))
    bit = max(mantissa_bits - DRILL_BITS_BELOW_TOP, 0)
    element = flat[index].clone()
    as_int = element.view(_INT_OF_SIZE[element.element_size()])
    flipped = (as_int ^ (1 << bit)).view(value.dtype)
    return index, bit, element, flipped


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """Restore torch's generators afterwards, so a planning pass leaves no trace."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        yield


def _drill_target(
    workload: Workload, *, variant: Variant, dtype: torch.dtype, device: torch.device
) -> int | None:
    """The layer-hook call the drill corrupts: the middle one (index len // 2), in
    execution order, of the calls that output a corruptible tensor; None when the
    workload records no layers. Found by one clean, unrecorded run of the workload."""
    planner = FaultDrill()
    built = workload.build(dtype=dtype, device=device)
    with _rng_kept(device), variant.run_context(device):
        workload.run(built, Recorder(layer_fault=planner))
    if not planner.eligible:
        return None
    return planner.eligible[len(planner.eligible) // 2]


def op_census(workload: Workload, spec: OpDrillSpec, *, variant: Variant,
              dtype: torch.dtype, device: torch.device
              ) -> tuple[list[Call], list[tuple[str, str]]]:
    """(the calls of an op of `spec`'s class, the recorded tensors' (name, hash)) of one
    clean run of `workload` (the op drill's planning pass, as `_drill_target` is the
    tensor drill's): the clean answer the drilled run is told apart from."""
    census = OpDrill(spec)
    built = workload.build(dtype=dtype, device=device)
    recorder = Recorder()
    with _rng_kept(device), variant.run_context(device), injecting(census):
        workload.run(built, recorder)
    names = [name for name, _, _ in recorder.tensors]
    return census.calls, list(zip(names, tensor_hashes([t for _, _, t in recorder.tensors]),
                                  strict=True))


def masking(clean: list[tuple[str, str]], drilled: list[tuple[str, str]]) -> dict[str, Any]:
    """What an op drill did to the recorded tensors: `outcome` "seen" (a recorded bit
    changed; `first_changed` names the first tensor, in execution order, and `changed`
    counts them) or "masked" (every recorded tensor has its clean bits: no test of the
    outputs can see this fault, whatever it compares)."""
    before = dict(clean)
    changed = [name for name, digest in drilled if before.get(name) != digest]
    if [name for name, _ in clean] != [name for name, _ in drilled]:
        changed = changed or ["<tensor list>"]
    if not changed:
        return {"outcome": "masked"}
    return {"outcome": "seen", "first_changed": changed[0], "changed": len(changed)}


def wall_time(times: list[float]) -> dict[str, float]:
    """`wall_s`: the median of the timed repeats, the first being the warm-up (caches,
    lazy kernel loading, allocator growth) whenever there is another; `wall_s_spread`:
    half their range, when at least two are timed. The server judges a cost of
    determinism against that spread rather than trust one noisy run (design §3.3)."""
    timed = times[1:] if len(times) > 1 else times
    found = {"wall_s": round(statistics.median(timed), 6)}
    if len(timed) > 1:
        found["wall_s_spread"] = round((max(timed) - min(timed)) / 2, 6)
    return found


def built_hashes(built: Built) -> tuple[str, str]:
    """(input_hash, param_hash) of a built workload, before it runs (design §2.1)."""
    return (
        combined_hash(list(built.inputs.items())),
        combined_hash(list(built.model.state_dict().items())),
    )


def _built_tensors(built: Built, *, copy: bool = False) -> list[tuple[str, torch.Tensor]]:
    """The inputs and parameters of a built workload, named as their hashes are
    (`<inputs>`, `<params>`); `copy` keeps them as they are before the run changes them
    (a training workload steps its parameters in place)."""
    found = [("<inputs>", t) for t in built.inputs.values()]
    found += [("<params>", t) for t in built.model.state_dict().values()]
    return [(name, bit_copy(t) if copy else t) for name, t in found]


def _differing(first: list[tuple[str, torch.Tensor]], later: list[tuple[str, torch.Tensor]],
               changed_list: str | None = None) -> set[str]:
    """The names of `later` whose bits are not those of `first`'s tensor of that name,
    position by position; with `changed_list`, a list of other names adds that name and
    the tensors are matched by name (recorded names are unique)."""
    if [name for name, _ in first] == [name for name, _ in later]:
        return {name for (name, a), (_n, b) in zip(first, later, strict=True)
                if not same_bits(a, b)}
    if changed_list is None:
        return {name for name, _ in first} | {name for name, _ in later}
    by_name = dict(first)
    return {changed_list} | {name for name, t in later
                             if name not in by_name or not same_bits(by_name[name], t)}


def half_dtype(variant: Variant, device: torch.device) -> str | None:
    """The half-precision dtype ("float16", "bfloat16") `variant` computes in on
    `device`, by autocast or by building the workload in it; None for float32/64."""
    autocast = variant.knobs(device).get("autocast")
    if autocast in _HALF_DTYPES:
        return str(autocast)
    dtype = str(variant.dtype()).removeprefix("torch.")
    return dtype if dtype in _HALF_DTYPES else None


def unsupported_half_reason(
    exc: BaseException, *, workload: str, variant: Variant, device: torch.device
) -> str | None:
    """Why a workload is skipped rather than failed (design §2.3: a variant that cannot
    run on a device is skipped with the reason): oneDNN has no kernel for one of its
    operations in the variant's half-precision dtype on this CPU (the float16 LSTM on
    an AMD EPYC without AVX512-FP16 or AMX, say). Only that error (its message, not
    any RuntimeError), only on the CPU, only in float16/bfloat16 (autocast or cast);
    anything else (None) is a failure."""
    if device.type != "cpu" or not isinstance(exc, RuntimeError):
        return None
    dtype = half_dtype(variant, device)
    lines = str(exc).strip().splitlines()
    if dtype is None or not lines or not _ONEDNN_UNSUPPORTED.match(lines[0]):
        return None
    # The first sentence: the rest is oneDNN's advice to set ONEDNN_VERBOSE.
    message = lines[0].split(". ", 1)[0].rstrip(".")
    return f"oneDNN on this CPU has no {dtype} kernel for {workload}: {message}"


def _error_text(exc: BaseException, limit: int = 4000) -> str:
    """The exception's own last line first (what logs and dashboards show), then the
    end of the traceback."""
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{summary[-1] if summary else type(exc).__name__}\n\n{text[-limit:]}"
