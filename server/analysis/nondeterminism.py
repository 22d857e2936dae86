"""Nondeterministic ops and the selective cost of determinism, per environment and device
model (design §3.3.12, "Nondeterministic ops"; the agent's study is §2.13).

Input: every latest result of an (environment, device model) that ran with two or more
repeats (``Repeated``, counted), and the studies of those whose repeats disagree
(``Study``: the agent's ``nondeterminism``). Output: one ``Determinism`` per
(environment, device model): ``deterministic`` when every repeated result agreed; else
the ops named (op, module, phase, how many results named it), each with its recipe and
the measured cost of making only its scopes deterministic next to the cost of every
flag (``strict``); where a difference enters from outside the traced ops (``sources``:
host data, a generator, a DataLoader batch, with the recipe that applies); and the
results that were not traced (the hint to trace them). A study that says why
(``cause``: OMP_DYNAMIC on a CPU) is said once for the row.

A study is a node's claim, not the server's finding: each op, source and cause carries
``claimed_by`` (the nodes whose studies say it, first ``NAMED_CLAIMANTS`` by name), the
summary says who claims it, and the free text a study carries (cause, notes, advice,
what an op read, why it has no recipe) is shown marked when it reads like a command
(``marked``): the server never checked it, and nobody should paste it into a shell.

A cost (``combined_cost``): each study gives a mode's ratio to default (the median of
its paired rounds) and that median's 95 % interval; the nodes' studies of one op in one
(environment, device model) are combined weighted by their precision (the inverse of
the squared half-width of their interval), and the combined interval is 1.96 combined
standard errors. A figure is stated only when it means something (``verdict``, the
agent's rule in ``numparity_agent._cost``): ``measured`` when the interval is narrower
than the effect, ``negligible`` within ± NEGLIGIBLE of no cost, otherwise "not
measurable" with the nodes' load. A study from an agent before paired rounds (no
``ratio``) gives its ratio of medians and the propagated spread instead.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .determinism_cost import Measured, ratio

MAX_OPS = 50  # ops per row; the rest are counted (`ops_total`)
# What made `train` nondeterministic on a loaded CPU (design §2.13): said from the
# environment's `env_vars.OMP_DYNAMIC`, so it is said even where no agent traced.
OMP_DYNAMIC_CAUSE = (
    "likely OMP_DYNAMIC=true (set in this environment): libgomp sizes each parallel "
    "region's thread team by the load average, so on a loaded node a reduction splits "
    "into another number of parts and rounds differently; unset it or set "
    "OMP_DYNAMIC=false")
MAX_UNTRACED = 20
NAMED_CLAIMANTS = 5  # the nodes named as claiming an op, a source or a cause
# What makes a study's free text read like a command to run: shell syntax (substitution,
# pipes, redirection, chains), a download or privilege tool, Python that runs programs.
# The agent's own words (code in backticks, `torch.manual_seed(s)`, `export
# PYTHONHASHSEED=0`) are none of these.
COMMAND_LIKE = re.compile(
    r"\$\(|\$\{|\|\s*\w|&&|>\s*/|\b(?:curl|wget|sudo|bash|zsh|sh\s+-c|rm\s+-|chmod|"
    r"chown|nc|ncat|eval|exec|os\.system|subprocess|popen|__import__|pip\s+install)\b",
    re.IGNORECASE)
UNVERIFIED = ("[unverified text of {who}'s study that reads like a command: numparity "
              "neither checked nor ran it; do not run it]")


def marked(text: str, nodes: Iterable[str]) -> str:
    """``text`` of a node's study as the audit shows it: marked, naming the nodes, when it
    reads like a command (``COMMAND_LIKE``); else as sent."""
    if not COMMAND_LIKE.search(text) or UNVERIFIED.split("{")[0] in text:
        return text
    who = ", ".join(sorted(set(nodes))[:NAMED_CLAIMANTS]) or "a node"
    return f"{UNVERIFIED.format(who=who)} {text}"


def _claimants(entries: Iterable[tuple[Study, Any]]) -> list[str]:
    return sorted({study.node for study, _ in entries})[:NAMED_CLAIMANTS]
# The agent's rule (numparity_agent._cost): within this of no cost, an interval wider
# than its effect still says "no cost above ± h %".
NEGLIGIBLE = 0.05
Z95 = 1.959964  # a 95 % interval's half-width in standard errors
# A half-width below this is taken as this: one study with identical rounds is not
# infinitely precise.
LEAST_HALF = 1e-4


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
    """selective or strict against default, combined over the studies: the ratio, the
    half-width of its 95 % interval (``uncertainty``) and the interval, the verdict and
    the words, whether the mode made every round repeatable."""

    ratio: float | None
    uncertainty: float | None
    repeatable: bool | None
    shown: bool  # verdict == "measured"
    low: float | None = None
    high: float | None = None
    verdict: str = "noisy"  # measured, negligible or noisy
    words: str = "not measured"
    studies: int = 0


@dataclass
class DifferenceSource:
    """Where a difference enters from outside the traced ops (the agent's ``sources``),
    over the results that named it."""

    op: str
    module: str
    phase: str
    source: str  # host_data, dataloader, order, argument, generator, input
    what: str
    recipe: str
    advice: str
    at: str | None
    results: int
    workloads: list[str]
    variants: list[str]
    claimed_by: list[str] = field(default_factory=list)


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
    claimed_by: list[str] = field(default_factory=list)  # the nodes whose studies name it


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
    sources: list[DifferenceSource] = field(default_factory=list)
    # The nodes whose studies say ``cause`` (empty: the environment's own settings say it).
    cause_claimed_by: list[str] = field(default_factory=list)


def environment_cause(flattened: dict[str, str], model: str) -> str | None:
    """A setting of the environment that makes a CPU's results nondeterministic, in
    words, or None: OMP_DYNAMIC true (libgomp; the variable is among the environment's
    `env_vars`, design §2.5)."""
    value = flattened.get("env_vars.OMP_DYNAMIC", "").strip().lower()
    if model == "cpu" and value in ("true", "1", "yes", "on"):
        return OMP_DYNAMIC_CAUSE
    return None


def verdict(value: float | None, half: float | None) -> str:
    """``measured``, ``negligible`` or ``noisy`` (the module's rule)."""
    if value is None or half is None or not math.isfinite(half):
        return "noisy"
    if half < abs(value - 1):
        return "measured"
    if half <= NEGLIGIBLE:
        return "negligible"
    return "noisy"


def cost_words(cost: Cost | None) -> str:
    """A mode's cost in words, as the agent says it (``numparity_agent._cost.words``):
    "+12.0 % [+10.1, +14.2]", "no cost above ± 3.0 %", or "not measurable ..."."""
    if cost is None or cost.ratio is None:
        return "not measured"
    if cost.verdict == "measured" and cost.low is not None and cost.high is not None:
        return (f"{(cost.ratio - 1) * 100:+.1f} % [{(cost.low - 1) * 100:+.1f}, "
                f"{(cost.high - 1) * 100:+.1f}]")
    if cost.verdict == "negligible":
        return f"no cost above ± {max(cost.uncertainty or 0.0, 0.001) * 100:.1f} %"
    return "not measurable"


@dataclass(frozen=True)
class StudyCost:
    """One study's figure for one mode: ratio, interval, repeatable, the node's load."""

    ratio: float
    low: float | None
    high: float | None
    repeatable: bool
    load: float | None = None
    cpus: int | None = None


def combined_cost(studies: list[StudyCost]) -> Cost | None:
    """The studies of one op's mode combined, weighted by precision (the module)."""
    if not studies:
        return None
    repeatable = all(s.repeatable for s in studies)
    weighted = [(s, max(s.ratio - s.low, s.high - s.ratio, LEAST_HALF)) for s in studies
                if s.low is not None and s.high is not None]
    if weighted:
        weights = [(s.ratio, (Z95 / half) ** 2) for s, half in weighted]
        total = sum(w for _, w in weights)
        value = sum(r * w for r, w in weights) / total
        half = Z95 / math.sqrt(total)
    else:
        value, half = studies[0].ratio, None
    found = verdict(value, half)
    low = None if half is None else value - half
    high = None if half is None else value + half
    if len(weighted) == 1 and len(studies) == 1:
        # One study keeps its own (bootstrap, perhaps lopsided) interval: the audit says
        # what `doctor --recipe` says of that run.
        low, high = weighted[0][0].low, weighted[0][0].high
    cost = Cost(value, half, repeatable, found == "measured", low, high, found, "",
                len(studies))
    words = cost_words(cost)
    if found == "noisy":
        why = [f"± {half * 100:.0f} %" if half is not None else "no interval"]
        loads = [s.load for s in studies if s.load is not None]
        if loads:
            cpus = max((s.cpus or 0) for s in studies) or None
            why.insert(0, f"load {max(loads)} on {cpus} CPUs" if cpus else
                       f"load {max(loads)}")
        where = "this node" if len(studies) == 1 else f"these {len(studies)} nodes"
        words = f"not measurable on {where} now ({', '.join(why)})"
    return Cost(cost.ratio, cost.uncertainty, cost.repeatable, cost.shown, cost.low,
                cost.high, cost.verdict, words, cost.studies)


def cost_in_words(op_recipe: str | None, no_recipe: str | None, selective: Cost | None,
                  strict: Cost | None) -> str:
    strict_text = ("not measured" if strict is None else strict.words + (
        "" if strict.repeatable else ", and strict did not make it repeatable either"))
    if op_recipe is None:
        return f"no selective recipe: {no_recipe or 'unknown op'}; strict: {strict_text}"
    if selective is None:
        return f"selective not measured; strict: {strict_text}"
    if not selective.repeatable:
        return ("the selective recipe did not make it repeatable (the op does not honour "
                f"{op_recipe}); strict: {strict_text}")
    return f"selective: {selective.words}; strict: {strict_text}"


def _study_cost(study: dict[str, Any], mode: str) -> StudyCost | None:
    """One study's figure for ``mode``: the agent's paired ratio and interval, or (an
    agent before paired rounds) the ratio of the medians with the propagated spread."""
    cost = study.get("cost") or {}
    found, default = cost.get(mode), cost.get("default")
    if not found or not default:
        return None
    load = cost.get("load") or {}
    if found.get("ratio") is not None:
        return StudyCost(float(found["ratio"]), found.get("ratio_low"),
                         found.get("ratio_high"), bool(found.get("repeatable")),
                         load.get("load"), load.get("cpus"))
    old = ratio(Measured(float(found["wall_s"]), found.get("wall_s_spread")),
                Measured(float(default["wall_s"]), default.get("wall_s_spread")))
    if old.value is None:
        return None
    half = old.uncertainty
    return StudyCost(old.value, None if half is None else old.value - half,
                     None if half is None else old.value + half,
                     bool(found.get("repeatable")))


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
    entered: dict[tuple[int, str],
                  dict[tuple[str, str, str, str], list[tuple[Study, dict[str, Any]]]]]
    entered = defaultdict(lambda: defaultdict(list))
    for study in studies:
        row = rows.setdefault((study.environment, study.model),
                              Determinism(study.environment, study.model, False, 0, 0))
        row.deterministic = False
        body = study.study or {}
        if body.get("cause") and row.cause is None:
            row.cause = str(body["cause"])
        if body.get("cause") and str(body["cause"]) == row.cause and \
                study.node not in row.cause_claimed_by:
            row.cause_claimed_by.append(study.node)
        ops = body.get("ops") or []
        for source in body.get("sources") or []:
            entered[(study.environment, study.model)][
                (source["op"], source.get("module", ""), source.get("phase", "forward"),
                 source.get("source", ""))].append((study, source))
        if not body.get("traced") or not ops:
            if body.get("sources"):
                continue
            why = body.get("note") or body.get("error") or body.get("hint") or (
                "the repeats disagree: run it with --trace-ops and --repeats 2 or more to "
                "name the op")
            text = f"{study.workload}/{study.variant} on {study.node}: " + marked(
                str(why), [study.node])
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
    for key, sources in entered.items():
        rows[key].sources = sorted(
            (_source(entries) for entries in sources.values()),
            key=lambda found: (-found.results, found.op, found.module))[:MAX_OPS]
    for row in rows.values():
        if not row.deterministic and row.cause is None:
            row.cause = (causes or {}).get((row.environment, row.model))
        row.cause_claimed_by = sorted(row.cause_claimed_by)[:NAMED_CLAIMANTS]
        if row.cause is not None and row.cause_claimed_by:
            row.cause = marked(row.cause, row.cause_claimed_by)
        row.summary = _summary(row)
    return sorted(rows.values(), key=lambda r: (r.deterministic, r.environment, r.model))


def _op(entries: list[tuple[Study, dict[str, Any]]]) -> NondeterministicOp:
    study, op = entries[0]
    costs: dict[str, Cost | None] = {}
    for mode in ("strict", "selective"):
        costs[mode] = combined_cost([found for s, _ in entries
                                     if (found := _study_cost(s.study or {}, mode))])
    selective, strict = costs["selective"], costs["strict"]
    claimed_by = _claimants(entries)
    no_recipe = op.get("no_recipe")
    no_recipe = marked(str(no_recipe), claimed_by) if no_recipe else no_recipe
    return NondeterministicOp(
        op=op["op"], module=op.get("module", ""), phase=op.get("phase", "forward"),
        results=len(entries),
        workloads=sorted({s.workload for s, _ in entries}),
        variants=sorted({s.variant for s, _ in entries}),
        shapes=op.get("shapes", []), dtypes=op.get("dtypes", []), kernel=op.get("kernel"),
        recipe=op.get("recipe"), no_recipe=no_recipe,
        first=any(entry is ((s.study or {}).get("ops") or [None])[0] for s, entry in entries),
        selective=selective, strict=strict,
        cost=cost_in_words(op.get("recipe"), no_recipe, selective, strict),
        claimed_by=claimed_by)


def _source(entries: list[tuple[Study, dict[str, Any]]]) -> DifferenceSource:
    _study, source = entries[0]
    claimed_by = _claimants(entries)
    at = source.get("at")
    return DifferenceSource(
        op=source["op"], module=source.get("module", ""),
        phase=source.get("phase", "forward"), source=source.get("source", ""),
        what=marked(source.get("what", ""), claimed_by), recipe=source.get("recipe", ""),
        advice=marked(source.get("advice", ""), claimed_by),
        at=marked(at, claimed_by) if at else at, results=len(entries),
        workloads=sorted({s.workload for s, _ in entries}),
        variants=sorted({s.variant for s, _ in entries}), claimed_by=claimed_by)


def _claimed(nodes: list[str]) -> str:
    return f" (claimed by {', '.join(nodes)})" if nodes else ""


def _summary(row: Determinism) -> str:
    if row.deterministic:
        return (f"deterministic: the repeats of all {row.repeated} repeated results "
                "computed the same bits")
    if row.ops:
        first = row.ops[0]
        where = f" in {first.module}" if first.module else ""
        return marked(f"nondeterministic: {first.op}{where} ({first.phase}) gives other bits "
                      f"on the same inputs; {first.cost}", first.claimed_by) \
            + _claimed(first.claimed_by)
    if row.sources:
        entry = row.sources[0]
        where = f" in {entry.module}" if entry.module else ""
        at = f", called at {entry.at}" if entry.at else ""
        return marked(f"nondeterministic: the difference enters from outside torch's ops at "
                      f"{entry.op}{where} ({entry.phase}{at}), which reads {entry.what}; "
                      f"{entry.advice}", entry.claimed_by) + _claimed(entry.claimed_by)
    cause = f"; {row.cause}" if row.cause else ""
    return (f"nondeterministic: {row.disagreeing or 'some'} results' repeats disagree, no op "
            f"named (run with --trace-ops and --repeats 2 or more){cause}")
