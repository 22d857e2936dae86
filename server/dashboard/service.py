"""What each dashboard page shows, built from the API's own services (same numbers as the
JSON routes) plus the fleet heatmap, which only the dashboard needs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy.orm import Session

from numparity_server.analysis import consensus
from numparity_server.analysis.policy import Policy
from numparity_server.catalog import service as catalog
from numparity_server.catalog.service import variant_sort_key
from numparity_server.compare.schemas import CompareOut, ResultPair
from numparity_server.compare.service import compare_runs
from numparity_server.dashboard import repository
from numparity_server.divergence.service import divergence
from numparity_server.kit.errors import NotFound


def compare_url(run_a: str, run_b: str, workload: str | None = None,
                variant: str | None = None) -> str:
    params = {"run_a": run_a, "run_b": run_b}
    if workload:
        params["workload"] = workload
    if variant:
        params["variant"] = variant
    return "/compare?" + urlencode(params)


def pair_verdict(pair: ResultPair) -> str:
    """What a heatmap cell shows for a compared pair: the result verdict (the worst of all
    its tensors, as /compare and /divergence judge a whole result); broken inputs win,
    as they make any comparison meaningless."""
    if pair.inputs.broken:
        return "broken"
    if not pair.compared or pair.summary is None:
        return pair.b.status
    decided = pair.summary.result_verdict
    return decided.verdict if decided is not None else "identical"


# ---- fleet overview ---------------------------------------------------------------------


@dataclass
class HeatCell:
    verdict: str  # identical .. nonfinite, broken, failed, skipped, missing
    title: str
    href: str | None = None
    baseline: bool = False
    run_id: str | None = None  # the run of the node's newest result (None: missing)
    detail: str = ""  # a skipped result's reason, a failed one's error


@dataclass
class Overview:
    suite: str
    columns: list[tuple[str, str]]  # (workload, variant)
    rows: list[tuple[str, list[HeatCell]]]  # (node, cells in column order)
    counts: dict[str, int] = field(default_factory=dict)  # verdicts on this page
    nodes: int = 0  # in the fleet
    limit: int = 0
    offset: int = 0


@dataclass(frozen=True)
class _Answer:
    manifest_hash: str
    nodes: int
    first_node: str  # the answer's representative


def overview(*, session: Session, policy: Policy, suite: str, limit: int,
             offset: int) -> Overview:
    """A page of the nodes x (workload, variant) heatmap.

    For each (workload, variant) and device type, the baseline is the usual answer
    (their result's manifest; ``consensus.usual``): its nodes are
    identical to it, and every other answer is compared once, its first node's run
    against the baseline's first node's, the way GET /compare does; each cell links to
    the comparison of its own run with the baseline's. The answers are counted over the
    whole fleet in one aggregate; only the page's nodes are read row by row.
    """
    answers: dict[tuple[str, str, str], list[_Answer]] = defaultdict(list)
    for workload, variant, device, digest, count, first in repository.answer_counts(
            session, suite=suite):
        answers[(workload, variant, device)].append(_Answer(digest, count, first))
    baselines: dict[tuple[str, str, str], _Answer] = {}
    for key, held in answers.items():
        by_manifest = {a.manifest_hash: a for a in held}
        chosen = consensus.usual({a.manifest_hash: consensus.Support(a.nodes, a.first_node)
                                  for a in held})
        assert chosen is not None
        baselines[key] = by_manifest[chosen]
    names, total = repository.node_names(session, suite=suite, limit=limit, offset=offset)
    cells = repository.latest_cells(session, suite=suite, nodes=names)

    # The runs to compare: each baseline's first node's, and the first node's of every
    # other answer shown on this page.
    on_page = {(c.workload, c.variant, c.device, c.manifest_hash) for c in cells
               if c.status == "ok" and c.manifest_hash}
    wanted = {baselines[key[:3]].first_node for key in on_page if key[:3] in baselines}
    wanted |= {a.first_node for key in on_page for a in answers.get(key[:3], [])
               if a.manifest_hash == key[3]}
    first_runs = {(c.node, c.workload, c.variant, c.device): c.run_id
                  for c in repository.latest_cells(session, suite=suite, nodes=wanted)}

    verdicts: dict[tuple[str, str, str, str], tuple[str, str]] = {}
    found: dict[tuple[str, str, str], HeatCell] = {}
    for cell in cells:
        key = (cell.workload, cell.variant, cell.device)
        where = f"{cell.node} · {cell.workload}/{cell.variant}"
        if cell.status != "ok" or not cell.manifest_hash or key not in baselines:
            detail = cell.reason or cell.error or ""
            found[key[:2] + (cell.node,)] = HeatCell(
                cell.status, f"{where}: {cell.status}" + (f" ({detail})" if detail else ""),
                run_id=cell.run_id, detail=detail)
            continue
        baseline = baselines[key]
        baseline_run = first_runs[(baseline.first_node,) + key]
        if cell.manifest_hash == baseline.manifest_hash:
            verdict, how = "identical", f"the most common answer ({baseline.nodes} nodes)"
        else:
            answer = (*key, cell.manifest_hash)
            if answer not in verdicts:
                (first,) = [a.first_node for a in answers[key]
                            if a.manifest_hash == cell.manifest_hash]
                verdicts[answer] = _versus(session, policy, key, baseline_run,
                                           first_runs[(first,) + key])
            verdict, how = verdicts[answer]
        is_baseline = cell.node == baseline.first_node
        found[key[:2] + (cell.node,)] = HeatCell(
            verdict,
            f"{where} on {cell.device}: {verdict} — against {baseline.first_node}, {how}",
            f"/nodes/{quote(cell.node, safe='')}" if is_baseline
            else compare_url(baseline_run, cell.run_id, cell.workload, cell.variant),
            baseline=is_baseline, run_id=cell.run_id)

    columns = sorted(repository.columns(session, suite=suite),
                     key=lambda wv: (wv[0], variant_sort_key(wv[1])))
    rows = []
    counts: dict[str, int] = defaultdict(int)
    for node in names:
        row = []
        for workload, variant in columns:
            heat = found.get((workload, variant, node)) or HeatCell(
                "missing", f"{node} has no result of {workload}/{variant}")
            counts[heat.verdict] += 1
            row.append(heat)
        rows.append((node, row))
    return Overview(suite=suite, columns=columns, rows=rows, counts=dict(counts),
                    nodes=total, limit=limit, offset=offset)


def _versus(session: Session, policy: Policy, key: tuple[str, str, str], baseline_run: str,
            other_run: str) -> tuple[str, str]:
    """The verdict of one answer against the baseline, from their first nodes' runs."""
    workload, variant, device = key
    compared = compare_runs(session=session, policy=policy, run_a=baseline_run,
                            run_b=other_run, workload=workload, variant=variant)
    for pair in compared.pairs:
        if pair.device == device:
            return pair_verdict(pair), "judged on the first node of each answer"
    return "missing", "no result of the same device to compare"


# ---- per-workload page ------------------------------------------------------------------


@dataclass
class VariantView:
    variant: str
    report: dict[str, Any] | None
    problem: str | None = None
    runs: dict[int, str] = field(default_factory=dict)  # group id -> representative run


def workload_page(*, session: Session, policy: Policy, suite: str, workload: str,
                  tensor: str | None) -> dict[str, Any]:
    variants = sorted(repository.workload_variants(session, suite=suite, workload=workload),
                      key=variant_sort_key)
    if not variants:
        raise NotFound(f"no node has results of workload {workload!r} in suite {suite!r}")
    tensors = [(t.name, t.kind) for t in catalog.tensors(session=session, suite=suite,
                                                           workload=workload)]
    names = [name for name, _kind in tensors]
    if tensor is not None and tensor not in names:
        raise NotFound(f"workload {workload!r} (suite {suite!r}) has no tensor {tensor!r}; "
                       f"its tensors: {', '.join(names) or 'none (no ok result)'}")
    chosen, why = (tensor, "as asked") if tensor is not None else _default_tensor(
        workload, tensors)
    views = []
    for variant in variants:
        try:
            report = divergence(session=session, suite=suite, workload=workload,
                                variant=variant, tensor=chosen, policy=policy)
        except NotFound as exc:
            views.append(VariantView(variant, None, str(exc.detail)))
            continue
        views.append(VariantView(variant, report.model_dump(mode="json"), runs={
            group["id"]: group["representative"]["run_id"] for group in report.groups}))
    fp64_reference = any(v.variant == "fp64-reference" and v.report for v in views)
    return {"suite": suite, "workload": workload, "tensor": chosen, "tensor_reason": why,
            "tensors": tensors, "variants": views, "fp64_reference": fp64_reference}


def _default_tensor(workload: str, tensors: Sequence[tuple[str, str]]
                    ) -> tuple[str | None, str]:
    """``output`` when the workload has it, else its first output, else its first tensor;
    and why, in words (the page says it beside the picker)."""
    names = [name for name, _kind in tensors]
    if not names:
        return None, "no ok result has tensors to pick from"
    if "output" in names:
        return "output", "the workload's output tensor, chosen by default"
    outputs = [name for name, kind in tensors if kind == "output"]
    if outputs:
        return outputs[0], (f"{workload} has no tensor named output, so its first tensor of "
                            "kind output, chosen by default")
    return names[0], (f"{workload} has no tensor named output nor any of kind output, so "
                      "its first tensor, chosen by default")


# ---- node page --------------------------------------------------------------------------


def timeline_points(runs: Sequence[Any]) -> dict[str, Any]:
    """The node chart's data: every run, environment changes and output changes on one
    time axis (seconds since the epoch, oldest first)."""
    points: dict[str, list[Any]] = {"t": [], "run": [], "environment": [], "outputs": [],
                                    "labels": []}
    for run in sorted(runs, key=lambda r: r.started_at):
        outputs = [f"{c.workload}/{c.variant}" for c in run.changed_results
                   if c.outputs_changed or c.status != c.previous_status]
        points["t"].append(run.started_at.timestamp())
        points["run"].append(0)
        points["environment"].append(1 if run.environment_changed else None)
        points["outputs"].append(2 if outputs else None)
        changes = ", ".join(f"{c.attribute}: {c.before} → {c.after}"
                            for c in run.environment_changes)
        points["labels"].append({
            "run_id": run.run_id, "drill": run.drill,
            "environment": changes or ("changed" if run.environment_changed else ""),
            "outputs": ", ".join(outputs),
        })
    return points


# ---- comparison page --------------------------------------------------------------------


def layer_chart(pair: ResultPair) -> dict[str, Any]:
    """The per-layer error of one compared pair: relative L2 error of b against a for
    every tensor of kind layer, in execution order (exact from values, else the sketch's
    estimate); identical layers have no error to put on a log axis and are listed apart."""
    names: list[str] = []
    errors: list[float | None] = []
    identical: list[str] = []
    for tensor in sorted((t for t in pair.tensors if t.kind == "layer"), key=lambda t: t.order):
        value = _rel_error(tensor.metrics)
        names.append(tensor.name)
        if tensor.verdict == "identical" or value == 0.0:
            errors.append(None)
            identical.append(tensor.name)
        else:
            errors.append(value)
    first = pair.first_divergent_layer
    return {
        "names": names, "errors": errors, "identical": identical,
        "first_divergent": first.name if first else None,
        "first_index": names.index(first.name) if first and first.name in names else None,
    }


def _rel_error(metrics: dict[str, float | None]) -> float | None:
    for name in ("rel_l2", "rel_l2_est"):
        value = metrics.get(name)
        if value is not None:
            return float(value)
    return None


def comparison(*, session: Session, policy: Policy, run_a: str, run_b: str,
               workload: str | None, variant: str | None) -> tuple[CompareOut, list[Any]]:
    compared = compare_runs(session=session, policy=policy, run_a=run_a, run_b=run_b,
                            workload=workload, variant=variant)
    charts = [layer_chart(pair) if pair.compared else None for pair in compared.pairs]
    return compared, charts
