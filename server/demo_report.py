"""The demo's report: every cell of the fleet page that is not identical, grouped by cause.

It reads the services the pages read (``dashboard.service.overview`` for the cells,
``divergence`` for groups, verdicts, attribution and the fp64 judge, ``audit``), so the
terminal and the dashboard cannot disagree. The one thing the server does not keep is a
drill's flipped bit (the result's ``drill`` field, design §2.6): the demo reads it from
the agent's own run document and passes it in, keyed by run. Where the nodes traced
their ops (``run --trace-ops``), each split names the op where it parts from the usual
answer (``/divergence``'s origin ops, design §3.3.14).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from numparity_server.analysis.numerics import LABELS
from numparity_server.analysis.policy import Policy
from numparity_server.audit.schemas import AuditOut, DataPipelineRow, NumericsRow
from numparity_server.audit.service import audit
from numparity_server.dashboard.service import HeatCell, overview
from numparity_server.divergence.service import FP64_VARIANT, divergence
from numparity_server.kit.errors import NotFound

# Verdicts of a compared answer (the rest of a cell's verdicts are statuses).
COMPARED = ("equivalent", "divergent", "nonfinite")


@dataclass(frozen=True)
class DrillFlip:
    """The bit `run --fault-drill` flipped in one result (the result's ``drill`` field)."""

    layer: str
    index: int
    bit: int
    before: float
    after: float

    def describe(self) -> str:
        return (f"bit {self.bit} of {self.layer}[{self.index}] flipped, "
                f"{self.before:.9g} → {self.after:.9g}")


# (run_id, workload, variant) → the flip of that result.
Drills = Mapping[tuple[str, str, str], DrillFlip]


@dataclass(frozen=True)
class Fp64Judgement:
    tensor: str
    acceptable: bool | None
    rmse: float | None
    limit: float | None


@dataclass(frozen=True)
class Finding:
    """One answer of one (workload, variant) that is not the fleet's usual one, and the
    nodes that give it (a line of the report)."""

    workload: str
    variant: str
    verdict: str  # the fleet page's cell verdict
    nodes: tuple[str, ...]
    against: str  # the node the page compares with (★)
    decided_by: str | None = None  # the tensor that decides the result verdict
    measured: str = ""  # errors, or what the verdict rests on
    first_divergent_layer: str | None = None
    fp64: Fp64Judgement | None = None
    detail: str = ""  # a status's reason or error
    origin: str | None = None  # the op where it parts from the usual answer (op traces)
    # What `explain` found between these nodes and the usual answer's, a line each.
    explained: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cause:
    kind: str  # "environment", "drill", "nondeterministic", "unexplained", "no result"
    text: str
    findings: tuple[Finding, ...]


@dataclass(frozen=True)
class CostLine:
    env_key: str | None
    nodes: tuple[str, ...]
    ratio: float | None  # the audit's strict over default, when it shows it
    spread: tuple[float, float] | None  # the nodes' own ratios, lowest and highest
    note: str  # the audit's words for it: "1.42× ± 0.05", or why it is not shown


@dataclass
class FleetReport:
    suite: str
    nodes: int
    columns: list[tuple[str, str]]
    counts: dict[str, int]
    causes: list[Cause]
    audit: AuditOut
    costs: list[CostLine] = field(default_factory=list)
    # Usual answers the fp64 judge calls not acceptable: (workload, variant, model, why).
    inaccurate: list[tuple[str, str, str, str]] = field(default_factory=list)


# ---- gathering ---------------------------------------------------------------------------


def build_report(*, session: Session, policy: Policy, suite: str, drills: Drills,
                 node_costs: Mapping[str, tuple[str | None, float | None]],
                 max_nodes: int = 500) -> FleetReport:
    """The fleet page's cells (its first ``max_nodes`` nodes) explained, and the audit.

    ``node_costs`` maps a node to (its env_key, its own strict/default wall-time ratio):
    the spread the audit's per-environment figure is shown with."""
    view = overview(session=session, policy=policy, suite=suite, limit=max_nodes, offset=0)
    by_cause: dict[tuple[str, str], list[Finding]] = {}
    for index, (workload, variant) in enumerate(view.columns):
        column = [(node, cells[index]) for node, cells in view.rows]
        for kind, text, finding in _column_findings(session, policy, suite, workload,
                                                    variant, column, drills):
            by_cause.setdefault((kind, text), []).append(finding)
    order = {"drill": 0, "environment": 1, "nondeterministic": 2, "unexplained": 3,
             "no result": 4}
    causes = [Cause(kind, text, tuple(findings))
              for (kind, text), findings in sorted(by_cause.items(),
                                                   key=lambda item: order[item[0][0]])]
    report = audit(session=session, policy=policy)
    return FleetReport(suite=suite, nodes=view.nodes, columns=view.columns,
                       counts=view.counts, causes=causes, audit=report,
                       costs=_costs(report, node_costs), inaccurate=view.inaccurate)


def _column_findings(session: Session, policy: Policy, suite: str, workload: str,
                     variant: str, column: Sequence[tuple[str, HeatCell]], drills: Drills
                     ) -> list[tuple[str, str, Finding]]:
    baseline = next((node for node, cell in column if cell.baseline), "")
    found: list[tuple[str, str, Finding]] = []
    # Cells without a compared answer, by status and reason.
    statuses: dict[tuple[str, str], list[str]] = {}  # (status, detail) → nodes
    for node, cell in column:
        if cell.verdict not in COMPARED and cell.verdict != "identical":
            statuses.setdefault((cell.verdict, cell.detail), []).append(node)
    for (status, detail), names in statuses.items():
        text = _no_result_text(variant, status)
        found.append(("no result", text, Finding(workload, variant, status, tuple(names),
                                                 baseline, detail=detail)))
    differing = [(node, cell) for node, cell in column if cell.verdict in COMPARED]
    if not differing:
        return found
    # Every member listed: each node of the fleet page is placed in its group.
    report = divergence(session=session, suite=suite, workload=workload, variant=variant,
                        policy=policy, members_limit=None)
    group_of = {node: group.id for group in report.groups for node in group.nodes}
    if group_of.get(baseline, report.baseline) != report.baseline:
        # The fleet page's baseline (the usual answer among devices of its model) is not
        # /divergence's (among every device): its pairs are in the full matrix.
        report = divergence(session=session, suite=suite, workload=workload, variant=variant,
                            policy=policy, members_limit=None, pairs="all", pairs_limit=None,
                            pairs_origin=True)
    pairs = [pair.model_dump(mode="json") for pair in report.pairs]
    left_out = {item.node: item.reason for item in report.excluded}
    answers: dict[int, list[tuple[str, HeatCell]]] = {}
    for node, cell in differing:
        if node in group_of:
            answers.setdefault(group_of[node], []).append((node, cell))
        else:  # another workload version, say: /divergence says why it is not compared
            found.append(("unexplained", left_out.get(node, "not in /divergence's groups"),
                          Finding(workload, variant, cell.verdict, (node,), baseline)))
    for group_id, members in answers.items():
        nodes = tuple(node for node, _ in members)
        verdict = members[0][1].verdict
        pair, flipped = _pair(pairs, group_of.get(baseline), group_id)
        decided_by = pair.get("decided_by") if pair else None
        layer = (pair or {}).get("first_divergent_layer") or {}
        finding = Finding(
            workload, variant, verdict, nodes, baseline, decided_by=decided_by,
            measured=_measured(pair) if pair else "",
            first_divergent_layer=layer.get("name"),
            fp64=_fp64(session, policy, suite, workload, variant, decided_by, nodes[0]),
            origin=_origin((pair or {}).get("origin"), flipped),
            explained=tuple(_explained(e) for e in (pair or {}).get("explanations") or ()))
        flips = {(node, drills[(cell.run_id, workload, variant)]) for node, cell in members
                 if cell.run_id and (cell.run_id, workload, variant) in drills}
        if flips:
            text = "; ".join(f"{node}: {flip.describe()}" for node, flip in sorted(flips,
                             key=lambda item: item[0]))
            found.append(("drill", text, finding))
        elif pair and pair.get("nondeterministic"):
            found.append(("nondeterministic", str(pair.get("attribution_note")), finding))
        elif pair and pair.get("attribution"):
            found.append(("environment", _attribution(pair, flipped), finding))
        else:
            found.append(("unexplained", "no recorded environment attribute separates them "
                          "from the usual answer's nodes", finding))
    return found


def _no_result_text(variant: str, status: str) -> str:
    if status == "missing" and variant == FP64_VARIANT:
        return (f"{FP64_VARIANT} not run: one node's float64 answer is what the fp64 "
                f"judge needs, the others need not run it")
    if status == "missing":
        return "no result: the node did not run this workload and variant"
    return f"{status}: the node ran it without an answer to compare"


def _pair(pairs: Sequence[dict[str, Any]], base: int | None, other: int
          ) -> tuple[dict[str, Any] | None, bool]:
    """The pair of the baseline's group and ``other``, and whether it is the wrong way
    round (``other`` as ``a``)."""
    for pair in pairs:
        if (pair["a"], pair["b"]) == (base, other):
            return pair, False
        if (pair["a"], pair["b"]) == (other, base):
            return pair, True
    return None, False


def _measured(pair: Mapping[str, Any]) -> str:
    if pair.get("evidence"):  # not measured over whole tensors: say what was seen
        return f"{pair['evidence']}; from {pair['basis']}"
    metrics = pair.get("metrics") or {}
    return (f"max abs {_number(metrics.get('max_abs'))}, "
            f"max rel {_number(metrics.get('max_rel'))}, "
            f"max ULP {_number(metrics.get('max_ulp'), whole=True)}; from {pair['basis']}")


def _explained(found: Mapping[str, Any]) -> str:
    """One finding of `explain` in a line (design §2.11)."""
    node, against = found["node"], found["against_node"]
    stale = " (stale: the node has changed since)" if found.get("stale") else ""
    if found["status"] == "reproduced":
        return f"explain: {node} gives {against}'s bits with {found['label']}{stale}"
    if found["status"] == "already":
        return f"explain: {node} already gives {against}'s bits{stale}"
    if found["status"] == "not_reproduced":
        closest = found.get("closest")
        near = (f"; closest {closest['label']} ({closest['matching']} of "
                f"{closest['tensors']} tensors)" if closest else "")
        return (f"explain: no single setting or pair gives {node} {against}'s bits "
                f"({found['tried']} tried){near}{stale}")
    return f"explain: {node} could not tell: {found.get('detail')}"


def _origin(origin: Mapping[str, Any] | None, flipped: bool) -> str | None:
    """The op where the answer parts from the usual one, in a line: its first origin op
    (layer, phase, its output's error, the two kernels when they differ), else where the
    op sequences part. None without traces (``/divergence`` says why there). The usual
    answer's side comes first, as in the attribution."""
    if origin is None:
        return None
    usual, other = ("b", "a") if flipped else ("a", "b")
    if origin["ops"]:
        first = origin["ops"][0]
        where = f" in {first['layer']}" if first["layer"] else ""
        text = (f"origin op {first['op']}{where} ({first['phase']}, op {first[f'seq_{other}']}"
                f"; {origin['count']} in all)")
        output = first.get("output")
        if output:
            error = (output["metrics"] or {}).get("rel_l2")
            measured = f", rel L2 {_number(error)}" if error is not None else ""
            text += f": its output {output['verdict']}{measured}"
        kernels = (first[f"kernel_{usual}"], first[f"kernel_{other}"])
        if kernels[0] != kernels[1]:
            text += f"; kernels {kernels[0] or 'not recorded'} vs {kernels[1] or 'not recorded'}"
        if origin["parting"]:
            text += "; " + _parting(origin["parting"], usual, other)
        return text
    if origin["parting"]:
        return "no origin op; " + _parting(origin["parting"], usual, other)
    return ("no traced op gave other outputs from the same inputs: the bits changed "
            "between ops (a flipped bit in memory, a drill's, or work the trace does not see)")


def _parting(parting: Mapping[str, Any], usual: str, other: str) -> str:
    names = [parting[side] or "the end of its trace" for side in (usual, other)]
    return f"the op sequences part at op {parting[f'seq_{usual}']}: {names[0]} vs {names[1]}"


def _attribution(pair: Mapping[str, Any], flipped: bool) -> str:
    """"env_vars.MKL_CBWR (unset vs COMPATIBLE)", the usual answer's side first."""
    parts = []
    for item in pair["attribution"]:
        usual, other = ("b", "a") if flipped else ("a", "b")
        if item.get(f"{usual}_short") is not None:
            sides = [item[f"{usual}_short"], item[f"{other}_short"]]
        else:
            sides = ["/".join(item[usual]), "/".join(item[other])]
        if any("\n" in side or len(side) > 60 for side in sides):
            parts.append(f"{item['attribute']} (differs)")
        else:
            parts.append(f"{item['attribute']} ({sides[0]} vs {sides[1]})")
    text = "; ".join(parts)
    if pair.get("indistinguishable"):
        text += " — these go together in this fleet, which cannot tell them apart"
    return text


def _fp64(session: Session, policy: Policy, suite: str, workload: str, variant: str,
          decided_by: str | None, node: str) -> Fp64Judgement | None:
    """What the fp64 judge says of ``node``'s answer: of its ``output`` (what a model
    answers; the float64 run keeps the values of small tensors, not of every layer),
    else of the tensor that decides the verdict. None: there is nothing to judge with."""
    if variant == FP64_VARIANT:
        return None
    for tensor in dict.fromkeys(t for t in ("output", decided_by) if t):
        try:
            report = divergence(session=session, suite=suite, workload=workload,
                                variant=variant, tensor=tensor, policy=policy,
                                members_limit=None)
        except NotFound:
            continue
        for group in report.groups:
            judged = group.fp64
            if node in group.nodes and judged:
                return Fp64Judgement(tensor, judged.acceptable, judged.rmse, judged.limit)
    return None


def _costs(report: AuditOut, node_costs: Mapping[str, tuple[str | None, float | None]]
           ) -> list[CostLine]:
    lines = []
    for cost in report.determinism_cost:
        nodes = tuple(sorted(node for node, (env_key, _) in node_costs.items()
                             if env_key == cost.env_key))
        ratios = [ratio for node, (env_key, ratio) in node_costs.items()
                  if env_key == cost.env_key and ratio is not None]
        spread = (min(ratios), max(ratios)) if len(ratios) > 1 else None
        lines.append(CostLine(cost.env_key, nodes, cost.ratio, spread, cost.note))
    return lines


# ---- text --------------------------------------------------------------------------------


def _number(value: Any, *, whole: bool = False) -> str:
    if value is None:
        return "n/a"
    if whole:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _fp64_text(judged: Fp64Judgement) -> str:
    rmse, limit = _number(judged.rmse), _number(judged.limit)
    if judged.acceptable is None:
        why = ("its error against float64 cannot be measured from what was uploaded"
               if judged.rmse is None else "no strict answer to set the limit")
        return f"fp64 judge on {judged.tensor}: no judgement ({why})"
    word = "acceptable" if judged.acceptable else "not acceptable"
    sign = "≤" if judged.acceptable else ">"
    return f"fp64 judge on {judged.tensor}: {word} (rmse {rmse} {sign} limit {limit})"


def format_findings(report: FleetReport, *, dashboard: str = "") -> str:
    counts = ", ".join(f"{report.counts[v]} {v}" for v in sorted(
        report.counts, key=lambda v: (v != "identical", v)))
    cells = sum(report.counts.values())
    where = f" ({dashboard})" if dashboard else ""
    lines = [f"== fleet page{where}: {report.nodes} nodes × {len(report.columns)} workload "
             f"variants, {cells} cells: {counts}"]
    for workload, variant, model, text in report.inaccurate:
        # Identical to the usual answer, and the usual answer is wrong (issue 28).
        lines.append(f"  the usual answer of {workload}/{variant} on {model} is not the right "
                     f"one: {text}")
    if not report.causes:
        lines.append("  every cell is identical: the fleet agrees bit for bit")
    else:
        lines.append("  each cell against the usual answer of its column; every cell that is "
                     "not identical, by cause:")
    labels = {"drill": "a fault drill (run --fault-drill: a bit flipped on purpose)",
              "environment": "explained by", "unexplained": "unexplained",
              "nondeterministic": "nondeterministic, not an environment difference",
              "no result": "no answer"}
    for cause in report.causes:
        lines.append("")
        lines.append(f"  {labels[cause.kind]}: {cause.text}")
        for finding in cause.findings:
            lines.extend(_finding_lines(finding))
    return "\n".join(lines)


def _finding_lines(finding: Finding) -> list[str]:
    key = f"{finding.workload}/{finding.variant}"
    nodes = ", ".join(finding.nodes)
    if finding.verdict not in COMPARED:
        detail = f" ({finding.detail})" if finding.detail else ""
        return [f"    {key:<22} {finding.verdict:<10} {nodes}{detail}"]
    decided = f", decided by {finding.decided_by}" if finding.decided_by else ""
    lines = [f"    {key:<22} {finding.verdict:<10} {nodes} against {finding.against}{decided}"]
    if finding.measured:
        lines.append(f"      {finding.measured}")
    if finding.first_divergent_layer:
        lines.append(f"      first divergent layer: {finding.first_divergent_layer}")
    if finding.origin:
        lines.append(f"      {finding.origin}")
    lines.extend(f"      {line}" for line in finding.explained)
    if finding.fp64 is not None:
        lines.append(f"      {_fp64_text(finding.fp64)}")
    return lines


def format_audit(report: FleetReport) -> str:
    """The audit's summary and findings, a line each, then the cost of determinism with
    its spread (one run of one node is no measurement)."""
    payload = report.audit
    summary = payload.summary
    counts = ", ".join(f"{getattr(summary, name)} {name}" for name in
                       ("ok", "suspect", "watch", "nondeterministic", "stale")
                       if getattr(summary, name))
    lines = [f"== audit: {summary.nodes} nodes on {summary.environments} environments "
             f"({counts})"]
    for entry in payload.suspects:
        drill = (f", {entry.drill_runs} of them drills (run --fault-drill)" if entry.drill
                 else "")
        workloads = ", ".join(sorted({key.workload for key in entry.keys}))
        where = entry.node if entry.device == "cpu" else entry.detail.partition(
            " disagrees")[0]
        lines.append(
            f"  {entry.status}: {where} — strict answers of {workloads} differ "
            f"from its {entry.peers} same-environment peers in "
            f"{entry.disagreeing_runs} run(s){drill}")
    for row in payload.nondeterministic:
        lines.append(f"  nondeterministic: {row.node} — {row.detail}")
    for stale in payload.stale:
        lines.append(f"  stale: {stale.node} — no upload for {stale.hours_since} h")
    for rule in payload.policy:
        lines.append(f"  policy: {rule.node} — {rule.attribute} is {rule.value}")
    for broken in payload.broken_inputs:
        lines.append(f"  broken inputs: {broken.node} — {broken.workload}")
    if len(lines) == 1:
        lines.append("  nothing to report")
    lines.extend(_cost_lines(report.costs))
    lines.extend(_numerics_lines([row for row in payload.numerics
                                  if row.suite == report.suite]))
    lines.extend(_data_pipeline_lines([row for row in payload.data_pipeline
                                       if row.suite == report.suite]))
    return "\n".join(lines)


def _cost_lines(costs: Sequence[CostLine]) -> list[str]:
    """A line per environment whose ratio the audit shows (± its uncertainty, with the
    nodes' own ratios), then how many it does not show and why."""
    if not costs:
        return []
    lines = ["  cost of determinism (strict against default wall time ± its uncertainty; "
             "the demo's workloads take milliseconds):"]
    for cost in costs:
        if cost.ratio is None:
            continue
        spread = (f"; node to node {cost.spread[0]:.2f}×–{cost.spread[1]:.2f}×"
                  if cost.spread else "")
        lines.append(f"    {cost.note} on {str(cost.env_key)[:12]} over "
                     f"{len(cost.nodes)} nodes ({', '.join(cost.nodes)}){spread}")
    hidden = [c for c in costs if c.ratio is None]
    lone = [c for c in hidden if len(c.nodes) <= 1]
    if lone:
        lines.append(f"    {len(lone)} environment(s) of one node each: one timed run apiece, "
                     "not shown (noise rather than a measurement)")
    for cost in hidden:
        if len(cost.nodes) > 1:
            lines.append(f"    {str(cost.env_key)[:12]} over {len(cost.nodes)} nodes: "
                         f"{cost.note}")
    return lines


def _numerics_lines(rows: Sequence[NumericsRow]) -> list[str]:
    """What the decoder and invariance checks say, one line per distinct answer of an
    environment under ``default`` (the variant a job runs without settings)."""
    answers: dict[str, list[str]] = {}
    for row in rows:
        if row.variant != "default":
            continue
        cells = []
        for name, label in LABELS.items():
            holds, op = getattr(row, name), getattr(row, f"{name}_op")
            if holds is not None:
                cells.append(f"{label} {'yes' if holds else 'no'}"
                             + (f" (at {op})" if op else ""))
        answers.setdefault("; ".join(cells), []).append(str(row.env_key)[:12])
    if not answers:
        return []
    lines = ["  numerics under default (the decoder and invariance workloads' checks):"]
    lines.extend(f"    {text} — on {len(envs)} environment(s)"
                 for text, envs in answers.items())
    return lines


def _data_pipeline_lines(rows: Sequence[DataPipelineRow]) -> list[str]:
    """What the data workload measured, one line per distinct answer of an environment."""
    answers: dict[str, list[str]] = {}
    for row in rows:
        if row.recipe_holds is None:
            continue
        text = ("recipe holds" if row.recipe_holds else
                f"recipe breaks ({'; '.join(row.recipe_broken)})")
        text += (f"; without it: {'; '.join(row.without_broken)}" if row.without_broken
                 else "; without it nothing breaks")
        if row.workers_agree is False:
            text += "; batches differ between num_workers"
        answers.setdefault(f"{row.workload}: {text}", []).append(str(row.env_key)[:12])
    if not answers:
        return []
    lines = ["  data pipeline (real DataLoader workers, with and without the seeds' recipe):"]
    lines.extend(f"    {text} — on {len(envs)} environment(s)"
                 for text, envs in answers.items())
    return lines
