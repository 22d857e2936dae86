"""Nondeterministic ops and the selective cost of determinism, per environment and device
model (design §3.3.12, "Nondeterministic ops"; the agent's study is §2.13).

Input: every latest result of an (environment, device model) that ran with two or more
repeats (``Repeated``, counted), and the studies of those whose repeats disagree
(``Study``: the agent's ``nondeterminism``). Output: one ``Determinism`` per
(environment, device model): ``deterministic`` when every repeated result agreed; else
the ops named (op, module, phase, how many results named it), each with its recipe and
the measured cost of making only its scopes deterministic next to the cost of every
flag (``strict``), with uncertainty (``determinism_cost.ratio``), and the results that
were not traced (the hint to trace them). A study that says why (``cause``: OMP_DYNAMIC
on a CPU) is said once for the row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .determinism_cost import Measured, Ratio, measured, ratio

MAX_OPS = 50  # ops per row; the rest are counted (`ops_total`)
# What made `train` nondeterministic on a loaded CPU (design §2.13): said from the
# environment's `env_vars.OMP_DYNAMIC`, so it is said even where no agent traced.
OMP_DYNAMIC_CAUSE = (
    "likely OMP_DYNAMIC=true (set in this environment): libgomp sizes each parallel "
    "region's thread team by the load average, so on a loaded node a reduction splits "
    "into another number of parts and rounds differently; unset it or set "
    "OMP_DYNAMIC=false")
MAX_UNTRACED = 20


@dataclass(frozen=True)
class Repeated:
    """``results`` latest results of one outcome (``workload``/``variant``) that ran with
    ``repeats`` ≥ 2, of which all agree or all disagree (``agree``)."""

    environment: int
    model: str
    workload: str
    variant: str
    results: int
    agree: bool


@dataclass(frozen=True)
class Study:
    """A disagreeing latest result's ``nondeterminism`` (None: the agent sent none)."""

    environment: int
    model: str
    node: str
    workload: str
    variant: str
    study: dict[str, Any] | None


@dataclass(frozen=True)
class Cost:
    """selective or strict against default: the ratio, its uncertainty, whether the mode
    made every round repeatable."""

    ratio: float | None
    uncertainty: float | None
    repeatable: bool | None
    shown: bool


@dataclass
class NondeterministicOp:
    op: str
    module: str
    phase: str
    results: int  # how often: the disagreeing results that named it
    workloads: list[str]
    variants: list[str]
    shapes: list[Any]
    dtypes: list[Any]
    kernel: str | None
    recipe: str | None
    no_recipe: str | None
    first: bool  # the first op of some result (where its passes part)
    selective: Cost | None
    strict: Cost | None
    cost: str  # in words: "deterministic for +x % ± e instead of +y % ± e", or why not


@dataclass
class Determinism:
    environment: int
    model: str
    deterministic: bool
    repeated: int  # latest results with two or more repeats
    disagreeing: int
    ops: list[NondeterministicOp] = field(default_factory=list)
    ops_total: int = 0
    untraced: list[str] = field(default_factory=list)  # "workload/variant: hint"
    cause: str | None = None
    summary: str = ""


def environment_cause(flattened: dict[str, str], model: str) -> str | None:
    """A setting of the environment that makes a CPU's results nondeterministic, in
    words, or None: OMP_DYNAMIC true (libgomp; the variable is among the environment's
    `env_vars`, design §2.5)."""
    value = flattened.get("env_vars.OMP_DYNAMIC", "").strip().lower()
    if model == "cpu" and value in ("true", "1", "yes", "on"):
        return OMP_DYNAMIC_CAUSE
    return None


def percent(found: Ratio) -> str:
    """+x % ± e of a ratio against default (the uncertainty when known)."""
    if found.value is None:
        return "unknown (default took no time)"
    text = f"{(found.value - 1) * 100:+.0f} %"
    if found.uncertainty is None:
        return f"{text} (one timed round: no uncertainty)"
    return f"{text} ± {found.uncertainty * 100:.0f}"


def cost_in_words(op_recipe: str | None, no_recipe: str | None, selective: Ratio | None,
                  selective_repeatable: bool | None, strict: Ratio | None,
                  strict_repeatable: bool | None) -> str:
    strict_text = (f"{percent(strict)}" + ("" if strict_repeatable else
                                          ", and strict did not make it repeatable either")
                   if strict is not None else "not measured")
    if op_recipe is None:
        return f"no selective recipe: {no_recipe or 'unknown op'}; strict: {strict_text}"
    if selective is None:
        return f"not measured; strict: {strict_text}"
    if not selective_repeatable:
        return ("the selective recipe did not make it repeatable (the op does not honour "
                f"{op_recipe}); strict: {strict_text}")
    return f"deterministic for {percent(selective)} instead of {strict_text}"


def _mode(study: dict[str, Any], mode: str) -> tuple[Measured, bool] | None:
    found = (study.get("cost") or {}).get(mode)
    if not found:
        return None
    return Measured(float(found["wall_s"]), found.get("wall_s_spread")), bool(
        found.get("repeatable"))


def determinism(repeated: Iterable[Repeated], studies: Iterable[Study],
                causes: dict[tuple[int, str], str] | None = None) -> list[Determinism]:
    """One row per (environment, device model) with repeated results: see the module.
    ``causes``: what the environment says of a nondeterministic row
    (``environment_cause``), where no study said it."""
    rows: dict[tuple[int, str], Determinism] = {}
    for entry in repeated:
        row = rows.setdefault((entry.environment, entry.model),
                              Determinism(entry.environment, entry.model, True, 0, 0))
        row.repeated += entry.results
        if not entry.agree:
            row.disagreeing += entry.results
            row.deterministic = False
    # (env, model, op, module, phase) -> the studies naming it, with the op entry
    named: dict[tuple[int, str], dict[tuple[str, str, str], list[tuple[Study, dict[str, Any]]]]]
    named = defaultdict(lambda: defaultdict(list))
    for study in studies:
        row = rows.setdefault((study.environment, study.model),
                              Determinism(study.environment, study.model, False, 0, 0))
        row.deterministic = False
        body = study.study or {}
        if body.get("cause") and row.cause is None:
            row.cause = str(body["cause"])
        ops = body.get("ops") or []
        if not body.get("traced") or not ops:
            why = body.get("note") or body.get("error") or body.get("hint") or (
                "the repeats disagree: run it with --trace-ops and --repeats 2 or more to "
                "name the op")
            text = f"{study.workload}/{study.variant} on {study.node}: {why}"
            if len(row.untraced) < MAX_UNTRACED and text not in row.untraced:
                row.untraced.append(text)
            continue
        for op in ops:
            named[(study.environment, study.model)][
                (op["op"], op.get("module", ""), op.get("phase", "forward"))].append(
                    (study, op))
    for key, ops_named in named.items():
        row = rows[key]
        made = [_op(entries) for entries in ops_named.values()]
        made.sort(key=lambda op: (not op.first, -op.results, op.op, op.module))
        row.ops_total = len(made)
        row.ops = made[:MAX_OPS]
    for row in rows.values():
        if not row.deterministic and row.cause is None:
            row.cause = (causes or {}).get((row.environment, row.model))
        row.summary = _summary(row)
    return sorted(rows.values(), key=lambda r: (r.deterministic, r.environment, r.model))


def _op(entries: list[tuple[Study, dict[str, Any]]]) -> NondeterministicOp:
    study, op = entries[0]
    modes: dict[str, list[tuple[Measured, bool]]] = defaultdict(list)
    for found_study, _op_entry in entries:
        for mode in ("default", "strict", "selective"):
            got = _mode(found_study.study or {}, mode)
            if got is not None:
                modes[mode].append(got)
    costs: dict[str, tuple[Ratio, bool] | None] = {}
    default = measured([m for m, _ in modes["default"]]) if modes["default"] else None
    for mode in ("strict", "selective"):
        if default is None or not modes[mode]:
            costs[mode] = None
            continue
        costs[mode] = (ratio(measured([m for m, _ in modes[mode]]), default),
                       all(ok for _, ok in modes[mode]))
    selective, strict = costs["selective"], costs["strict"]
    return NondeterministicOp(
        op=op["op"], module=op.get("module", ""), phase=op.get("phase", "forward"),
        results=len(entries),
        workloads=sorted({s.workload for s, _ in entries}),
        variants=sorted({s.variant for s, _ in entries}),
        shapes=op.get("shapes", []), dtypes=op.get("dtypes", []), kernel=op.get("kernel"),
        recipe=op.get("recipe"), no_recipe=op.get("no_recipe"),
        first=any(entry is ((s.study or {}).get("ops") or [None])[0] for s, entry in entries),
        selective=_cost(selective), strict=_cost(strict),
        cost=cost_in_words(op.get("recipe"), op.get("no_recipe"),
                           selective[0] if selective else None,
                           selective[1] if selective else None,
                           strict[0] if strict else None, strict[1] if strict else None))


def _cost(found: tuple[Ratio, bool] | None) -> Cost | None:
    if found is None:
        return None
    value, repeatable = found
    return Cost(value.value, value.uncertainty, repeatable, value.shown)


def _summary(row: Determinism) -> str:
    if row.deterministic:
        return (f"deterministic: the repeats of all {row.repeated} repeated results "
                "computed the same bits")
    if row.ops:
        first = row.ops[0]
        where = f" in {first.module}" if first.module else ""
        return (f"nondeterministic: {first.op}{where} ({first.phase}) gives other bits on "
                f"the same inputs; {first.cost}")
    cause = f"; {row.cause}" if row.cause else ""
    return (f"nondeterministic: {row.disagreeing or 'some'} results' repeats disagree, no op "
            f"named (run with --trace-ops and --repeats 2 or more){cause}")
