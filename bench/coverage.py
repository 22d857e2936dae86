"""Proof of catch, coverage (issue 44): what share of silent faults numparity sees.

Not run by CI. Seeded op drills (`--fault-drill op:SPEC`, `_inject`) across the standard
suite's workloads in `strict` — the variant in which identical peers must agree bit for
bit, and the one `check` runs first — in this process (and in the processes a workload
starts: `collectives`' ranks, `data`'s loader workers, `_inject.Site`), each against the
clean answer:

- a **fault** is an op class, a kind (`single`: one bit drawn over the whole word;
  `multi`: 2-3 bits; `stuck`: one bit of the same element of every later op of the
  class) and a seed; it is injected into every workload that runs an op of its class
  (the seed draws the call, the element and the bits there);
- an **injection** is seen **by the fingerprint** when a recorded tensor's bits differ
  from the clean answer (what the fleet's identical peers, or a pin, hold); **by the
  output alone** when the output's do (what a test of the final answer sees); **by the
  repeats** when a fault in one repeat only would make them disagree (the same bits
  changed: it needs no peer); **by a self-check** when a workload's own comparison
  (`decoder`, `invariance`; `collectives`' agreement of its ranks and repeats) turns from
  equal to unequal; **by the fp64 judge** when the
  output's RMSE against the float64 answer exceeds the judge's limit (design §3.3.8);
  **by a NaN/Inf check** when a recorded tensor has more NaN or Inf than the clean one.
  **Masked** when no recorded bit changed: no test of the outputs can see it;
- a fault is seen by the **suite** when any workload's injection is, by **check's plan**
  when any of the plan's workloads' is (a lasting fault of a unit shows wherever the
  unit is used); the time to detection is the strict wall time, in the plan's (the
  suite's) order, until the first workload that sees it has run.

The plan is the server's own choice (`analysis.goldens.choose_checks`) over this
machine's strict results with their measured wall times, for a 60 s budget.

Prints the tables (coverage by op class, by bit position, by kind, by workload; the share
masked, and by which op; NaN/Inf alone; the time to detection; which workloads add
coverage per second) and, with `--figures FILE`, writes the plan's figures for
`check --json` and the audit (`agent/proof_of_catch.json`, with the false-alarm figures
of `bench/false_alarms.py` kept).

    .venv/bin/python bench/coverage.py [--quick] [--faults 40] [--figures agent/proof_of_catch.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from numparity_agent._drill_spec import OP_CLASSES, OpDrillSpec
from numparity_agent._fingerprint import tensor_hashes
from numparity_agent._inject import (
    Call,
    Injection,
    OpDrill,
    bit_layout,
    field_of,
    injecting,
    resolve,
)
from numparity_agent._workloads._base import Recorder
from numparity_agent.testing import load_workload, variant
from numparity_server.analysis.goldens import CheckCandidate, choose_checks
from numparity_server.analysis.judge import JUDGE_TOL_PER_RTOL, judge
from numparity_server.analysis.tolerance import default_tolerance

CPU = torch.device("cpu")
# The standard suite's workloads the drill reaches: all of them, `collectives` in its rank
# processes and `data` in its loader's workers too (`_inject.Site`). One it did not
# reach would be listed here, reported, never counted as masked.
REACHED = ("mlp", "cnn", "transformer", "lstm", "train", "probes", "decoder", "invariance",
           "collectives", "data")
NOT_REACHED: dict[str, str] = {}
# `collectives`' own comparisons, counted as self-checks: its ranks' answers against each
# other, each rank's repeats, the all-gather against the inputs.
COLLECTIVE_CHECKS = ("repeats_agree", "ranks_agree", "all_gather_exact",
                     "reduce_scatter_matches_all_reduce")
CHECK_BUDGET_S = 60.0
# What a variant's child costs `check` before it computes (import, start): the server's
# `child_s`, measured by `check` as the environment child's time; a loaded 2-core value.
CHILD_S = 4.0
KINDS = ("single", "multi", "stuck")


@dataclass
class Answer:
    """One run's recorded tensors, as the comparison sees them."""

    names: list[str]
    hashes: list[str]
    nonfinite: int
    output: torch.Tensor | None
    checks: dict[str, bool]
    seconds: float
    layered: bool


def _checks(fields: Any, path: str = "") -> dict[str, bool]:
    """A workload's self-checks (`_workloads._checks`): every `equal` in its fields, and
    `collectives`' agreements (`COLLECTIVE_CHECKS`)."""
    found: dict[str, bool] = {}
    if isinstance(fields, dict):
        for key, value in fields.items():
            if key == "equal" and isinstance(value, bool):
                found[path] = value
            elif path == "/collectives" and key in COLLECTIVE_CHECKS and \
                    isinstance(value, bool):
                found[f"{path}/{key}"] = value
            else:
                found.update(_checks(value, f"{path}/{key}"))
    elif isinstance(fields, list):
        for i, value in enumerate(fields):
            found.update(_checks(value, f"{path}/{i}"))
    return found


def run_once(name: str, strict: Any, injection: Injection | None = None,
             census: OpDrill | None = None, dtype: torch.dtype = torch.float32,
             context: Any = None) -> Answer:
    workload = load_workload(name)
    built = workload.build(dtype=dtype, device=CPU)
    recorder = Recorder()
    drill = OpDrill(injection.spec, injection) if injection is not None else None
    started = time.perf_counter()
    with (context or strict).run_context(CPU), injecting(drill or census):
        workload.run(built, recorder)
    seconds = time.perf_counter() - started
    tensors = [t for _, _, t in recorder.tensors]
    nonfinite = sum(int((~torch.isfinite(t)).sum()) for t in tensors if t.is_floating_point())
    output = next((t for n, _, t in recorder.tensors if n == "output"), None)
    return Answer([n for n, _, _ in recorder.tensors], tensor_hashes(tensors), nonfinite,
                  output, _checks(recorder.fields), seconds,
                  any(kind == "layer" for _, kind, _ in recorder.tensors))


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean((a.double() - b.double()) ** 2)))


@dataclass
class Reference:
    clean: Answer
    calls: dict[str, list[Call]]
    fp64: torch.Tensor | None
    wall_s: float


def reference(name: str, strict: Any, fp64_variant: Any) -> Reference:
    # A drill with no injection lists every op of every class (in the processes the
    # workload starts too: `_inject.Site`).
    census = OpDrill(OpDrillSpec())
    clean = run_once(name, strict, census=census)
    walls = [clean.seconds] + [run_once(name, strict).seconds for _ in range(2)]
    fp64 = None
    if clean.output is not None:
        fp64 = run_once(name, strict, dtype=torch.float64, context=fp64_variant).output
    return Reference(clean, dict(census.census), fp64, statistics.median(walls))


@dataclass
class Outcome:
    workload: str
    op_class: str
    kind: str
    seed: int
    op: str
    bits: tuple[int, ...]
    field: str
    seen: bool
    output: bool
    self_check: bool
    judge: bool
    nan_inf: bool
    first_changed: str | None
    before: float
    after: float
    mantissa: int = 23
    rank: int | None = None  # the rank a collective's fault was in (`collectives`)
    rank_call: int | None = None  # its call among that rank's collectives


def _field(bits: tuple[int, ...], dtype: torch.dtype) -> str:
    fields = {field_of(dtype, b) for b in bits}
    return fields.pop() if len(fields) == 1 else "mixed"


def fault_spec(op_cls: str, kind: str, seed: int) -> OpDrillSpec:
    if kind == "multi":
        return OpDrillSpec(op_class=op_cls, seed=seed, bits=2 + seed % 2)
    return OpDrillSpec(op_class=op_cls, seed=seed, stuck=kind == "stuck")


def inject(name: str, ref: Reference, spec: OpDrillSpec, strict: Any) -> Outcome | None:
    injection = resolve(spec, ref.calls.get(spec.op_class, []))
    if injection is None:
        return None
    drill = OpDrill(injection.spec, injection)
    workload = load_workload(name)
    built = workload.build(dtype=torch.float32, device=CPU)
    recorder = Recorder()
    with strict.run_context(CPU), injecting(drill):
        workload.run(built, recorder)
    tensors = [t for _, _, t in recorder.tensors]
    names = [n for n, _, _ in recorder.tensors]
    hashes = tensor_hashes(tensors)
    clean = dict(zip(ref.clean.names, ref.clean.hashes, strict=True))
    changed = [n for n, h in zip(names, hashes, strict=True) if clean.get(n) != h]
    if names != ref.clean.names:
        changed = changed or ["<tensor list>"]
    output = next((t for n, _, t in recorder.tensors if n == "output"), None)
    nonfinite = sum(int((~torch.isfinite(t)).sum()) for t in tensors if t.is_floating_point())
    checks = _checks(recorder.fields)
    self_check = any(ref.clean.checks.get(k) is True and v is False for k, v in checks.items())
    judged = False
    if output is not None and ref.fp64 is not None and ref.clean.output is not None \
            and "output" in changed:
        scale = float(torch.sqrt(torch.mean(ref.fp64.double() ** 2)))
        tol = JUDGE_TOL_PER_RTOL * default_tolerance("float32").rtol * scale
        verdict = judge(rmse(output, ref.fp64), rmse(ref.clean.output, ref.fp64), "float32",
                        tol=tol)
        judged = verdict.acceptable is False
    flip = drill.flipped or {}
    call = ref.calls[spec.op_class][injection.call]
    kind = "stuck" if spec.stuck else "multi" if spec.bits > 1 else "single"
    return Outcome(name, spec.op_class, kind, spec.seed, flip.get("op", call.op),
                   injection.bits, _field(injection.bits, call.dtype), bool(changed),
                   "output" in changed, self_check, judged, nonfinite > ref.clean.nonfinite,
                   changed[0] if changed else None, float(flip.get("before", math.nan)),
                   float(flip.get("after", math.nan)), bit_layout(call.dtype)[1],
                   flip.get("rank"), flip.get("rank_call"))


# ---- the tables ---------------------------------------------------------------------


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "    —  "


def table(title: str, rows: list[tuple[str, list[Outcome]]]) -> None:
    print(f"\n{title}")
    print(f"  {'':24} {'n':>5} {'seen':>8} {'output':>8} {'masked':>8} {'NaN/Inf':>8} "
          f"{'judge':>8} {'self-chk':>8}")
    for label, group in rows:
        n = len(group)
        print(f"  {label:24} {n:5d} {pct(sum(o.seen for o in group), n):>8} "
              f"{pct(sum(o.output for o in group), n):>8} "
              f"{pct(sum(not o.seen for o in group), n):>8} "
              f"{pct(sum(o.nan_inf for o in group), n):>8} "
              f"{pct(sum(o.judge for o in group), n):>8} "
              f"{pct(sum(o.self_check for o in group), n):>8}")


def bit_band(o: Outcome) -> str:
    if o.field in ("sign", "exponent", "mixed"):
        return o.field
    # The upper and lower half of the mantissa (float32: bits 12-22 and 0-11).
    return "mantissa high half" if min(o.bits) >= (o.mantissa + 1) // 2 \
        else "mantissa low half"


@dataclass
class Campaign:
    outcomes: list[Outcome] = field(default_factory=list)
    refs: dict[str, Reference] = field(default_factory=dict)
    seconds: float = 0.0


def plan_of(refs: dict[str, Reference], coverage: dict[str, dict[str, float]]) -> list[str]:
    """The workloads the server's `choose_checks` gives `check` on this machine, ranked
    by the coverage this campaign measured (what the figures file then ships)."""
    candidates = [CheckCandidate(name, "strict", "fleet", ref.wall_s, False,
                                 ref.clean.layered) for name, ref in refs.items()]
    chosen = choose_checks(candidates, budget_s=CHECK_BUDGET_S - CHILD_S, child_s=CHILD_S,
                           coverage=coverage)
    return [c.workload for c in chosen]


def faults_seen(outcomes: list[Outcome], workloads: list[str], walls: dict[str, float]
                ) -> tuple[int, int, list[float]]:
    """(faults, seen by `workloads`, time to detection of each seen): a fault seen when
    any of its injections into `workloads` is, detected after the wall time of the
    workloads up to the first that sees it, in `workloads`' order."""
    by_fault: dict[tuple[str, str, int], dict[str, bool]] = defaultdict(dict)
    for o in outcomes:
        by_fault[(o.op_class, o.kind, o.seed)][o.workload] = o.seen
    seen, ttd = 0, []
    counted = 0
    for per_workload in by_fault.values():
        if not any(w in per_workload for w in workloads):
            continue
        counted += 1
        spent = 0.0
        for w in workloads:
            spent += walls[w]
            if per_workload.get(w):
                seen += 1
                ttd.append(spent)
                break
    return counted, seen, ttd


def greedy_plan(outcomes: list[Outcome], refs: dict[str, Reference]
                ) -> list[tuple[str, int, float]]:
    """Workloads in the order that adds the most newly seen faults per second: (name,
    faults it adds, its wall time)."""
    by_fault: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for o in outcomes:
        if o.seen:
            by_fault[(o.op_class, o.kind, o.seed)].add(o.workload)
    left = set(refs)
    covered: set[tuple[str, str, int]] = set()
    order = []
    while left:
        def gain(w: str) -> float:
            return len([f for f, ws in by_fault.items() if w in ws and f not in covered]) \
                / max(refs[w].wall_s, 1e-3)
        best = max(sorted(left), key=gain)
        added = [f for f, ws in by_fault.items() if best in ws and f not in covered]
        covered.update(added)
        order.append((best, len(added), refs[best].wall_s))
        left.remove(best)
    return order


def report(campaign: Campaign) -> dict[str, Any]:
    outcomes, refs = campaign.outcomes, campaign.refs
    walls = {name: ref.wall_s for name, ref in refs.items()}
    print(f"\n{len(outcomes)} injections in {campaign.seconds:.0f} s; not reached: "
          + ("; ".join(f"{k} ({v})" for k, v in NOT_REACHED.items()) or "none"))
    table("by op class (every kind)", [(c, [o for o in outcomes if o.op_class == c])
                                       for c in OP_CLASSES
                                       if any(o.op_class == c for o in outcomes)])
    single = [o for o in outcomes if o.kind == "single"]
    table("single-bit faults by op class", [(c, [o for o in single if o.op_class == c])
                                            for c in OP_CLASSES
                                            if any(o.op_class == c for o in single)])
    bands = ("sign", "exponent", "mantissa high half", "mantissa low half")
    table("single-bit faults by bit position", [(b, [o for o in single if bit_band(o) == b])
                                                for b in bands])
    table("by kind", [(k, [o for o in outcomes if o.kind == k]) for k in KINDS])
    table("by workload", [(w, [o for o in outcomes if o.workload == w]) for w in refs])
    seen_share = pct(sum(o.seen for o in outcomes), len(outcomes)).strip()
    print("\nrepeats: a fault in one repeat only changes what the fingerprint compares, so "
          f"the repeats alone (no peer, no pin) see the same {seen_share}; a lasting fault "
          "(every repeat alike) they cannot see")
    masked = [o for o in outcomes if not o.seen]
    print(f"\nmasked: {len(masked)} of {len(outcomes)} ({pct(len(masked), len(outcomes)).strip()})"
          "; by the op corrupted (then what masked it, from the values):")
    for (workload, op), count in Counter((o.workload, o.op) for o in masked).most_common(12):
        example = next(o for o in masked if (o.workload, o.op) == (workload, op))
        print(f"  {count:4d}  {workload}: {op} (e.g. bits {list(example.bits)}: "
              f"{example.before:.6g} -> {example.after:.6g}: {why_masked(example)})")
    per_workload = {}
    for name, ref in refs.items():
        mine = [o for o in single if o.workload == name]
        per_workload[name] = {
            "wall_s": round(ref.wall_s, 3),
            "single": [len(mine), sum(o.seen for o in mine)],
            "single_by_class": {c: [len(v), sum(o.seen for o in v)] for c in OP_CLASSES
                                if (v := [o for o in mine if o.op_class == c])},
            "output_alone": sum(o.output for o in mine)}
    plan = plan_of(refs, {name: {c: seen / n for c, (n, seen) in
                                 entry["single_by_class"].items()}
                          for name, entry in per_workload.items()})
    suite_order = list(refs)
    faults, suite_seen, suite_ttd = faults_seen(outcomes, suite_order, walls)
    _f, plan_seen, plan_ttd = faults_seen(outcomes, plan, walls)
    print(f"\ncheck's plan (the server's choice for {CHECK_BUDGET_S:.0f} s, child "
          f"{CHILD_S:.0f} s): {', '.join(plan)} — {sum(walls[w] for w in plan):.2f} s of "
          "strict compute")
    print(f"  faults (class, kind, seed) injected into every workload with the class: {faults}")
    print(f"  the suite sees {suite_seen} ({pct(suite_seen, faults).strip()}); the plan sees "
          f"{plan_seen} ({pct(plan_seen, suite_seen).strip()} of what the suite sees)")
    for label, ttd in (("suite", suite_ttd), ("plan", plan_ttd)):
        if ttd:
            ttd.sort()
            print(f"  time to detection ({label}, strict compute, its order): median "
                  f"{statistics.median(ttd):.2f} s, p95 {ttd[int(0.95 * (len(ttd) - 1))]:.2f} s, "
                  f"max {ttd[-1]:.2f} s")
    print("\nworkloads by coverage added per second (greedy):")
    for name, added, wall in greedy_plan(outcomes, refs):
        note = " (in the plan)" if name in plan else ""
        print(f"  {name:12} +{added:4d} faults  {wall:6.2f} s{note}")
    in_plan = [o for o in outcomes if o.workload in plan]
    plan_single = [o for o in in_plan if o.kind == "single"]
    by_class = {c: [o for o in plan_single if o.op_class == c] for c in OP_CLASSES}
    return {
        "workloads": per_workload,
        "not_reached": NOT_REACHED,
        "plan": plan,
        "injections": len(outcomes),
        "suite_single_bit_seen": round(sum(o.seen for o in single) / max(len(single), 1), 4),
        "plan_single_bit_seen": round(sum(o.seen for o in plan_single)
                                      / max(len(plan_single), 1), 4),
        "plan_single_bit_by_class": {c: {"injections": len(v), "seen": round(
            sum(o.seen for o in v) / len(v), 4)} for c, v in by_class.items() if v},
        "plan_share_of_suite": round(plan_seen / max(suite_seen, 1), 4),
        "masked": round(len(masked) / max(len(outcomes), 1), 4),
        "nan_inf_alone": round(sum(o.nan_inf for o in outcomes) / max(len(outcomes), 1), 4),
        "plan_seconds": round(sum(walls[w] for w in plan), 2),
        "ttd_median_s": round(statistics.median(plan_ttd), 2) if plan_ttd else None,
    }


def why_masked(o: Outcome) -> str:
    if math.isnan(o.before):
        return "not corrupted"
    # (`collectives` records every rank's answer of every repeat: what is masked there
    # is masked as anywhere else.)
    if o.before < 0 and o.after < 0 and "relu" not in o.op:
        return "negative before and after: a ReLU or a max that never picks it"
    if abs(o.after - o.before) <= 2 ** -20 * max(abs(o.before), 1e-30):
        return "below what the following ops round away"
    if o.workload == "data":
        # `_pipeline.record`: run 1 of a reproducible configuration, at 0 and 2 workers.
        return ("in batches that are not recorded (no_recipe's, the probes', 4 workers'), "
                "the checks' verdicts unchanged")
    return "not picked downstream (a max, a saturating function, or an unused output)"


def campaign(workloads: list[str], faults: int, multi: int, stuck: int) -> Campaign:
    strict, fp64_variant = variant("strict"), variant("fp64-reference")
    strict.apply(CPU, threads=torch.get_num_threads())
    found = Campaign()
    started = time.perf_counter()
    for name in workloads:
        found.refs[name] = reference(name, strict, fp64_variant)
        classes = [c for c in OP_CLASSES if found.refs[name].calls.get(c)]
        print(f"{name}: strict {found.refs[name].wall_s:.2f} s; ops by class "
              + ", ".join(f"{c} {len(found.refs[name].calls[c])}" for c in classes),
              flush=True)
        plan = [(kind, seed) for kind, count in (("single", faults), ("multi", multi),
                                                  ("stuck", stuck)) for seed in range(count)]
        for op_cls in classes:
            for kind, seed in plan:
                outcome = inject(name, found.refs[name], fault_spec(op_cls, kind, seed), strict)
                if outcome is not None:
                    found.outcomes.append(outcome)
    found.seconds = time.perf_counter() - started
    return found


def write_figures(path: Path, figures: dict[str, Any], args: argparse.Namespace,
                  seconds: float) -> None:
    current = json.loads(path.read_text()) if path.exists() else {}
    current["coverage"] = {
        **figures, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bench": "bench/coverage.py" + (" --quick" if args.quick else ""),
        "wall_s": round(seconds), "load": [round(x, 1) for x in os.getloadavg()],
        "torch": torch.__version__, "device": "cpu",
    }
    path.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    print(f"\nfigures written to {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="6 single-bit, 2 multi-bit and 2 stuck faults per class")
    parser.add_argument("--faults", type=int, default=40, help="single-bit faults per class")
    parser.add_argument("--workloads", nargs="+", default=list(REACHED))
    parser.add_argument("--figures", type=Path, help="write the plan's figures to this file")
    args = parser.parse_args()
    faults, multi, stuck = (6, 2, 2) if args.quick else (args.faults, args.faults // 4,
                                                         args.faults // 4)
    started = time.perf_counter()
    found = campaign(args.workloads, faults, multi, stuck)
    figures = report(found)
    print(f"\nwall {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    if args.figures:
        write_figures(args.figures, figures, args, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
