"""What each dashboard page shows, built from the API's own services (same numbers as the
JSON routes) plus the fleet heatmap, which only the dashboard needs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import consensus
from numparity_server.analysis.policy import Policy
from numparity_server.audit import service as audit_service
from numparity_server.audit.schemas import SuspectRow
from numparity_server.catalog import service as catalog
from numparity_server.catalog.service import variant_sort_key
from numparity_server.compare.schemas import CompareOut, ResultPair
from numparity_server.compare.service import compare_runs
from numparity_server.dashboard import repository
from numparity_server.dashboard.heatmap import DeviceRow, HeatCell, node_rows, slot_order
from numparity_server.divergence.service import answer_accuracy, comparisons, divergence
from numparity_server.kit.compute import Budget
from numparity_server.kit.errors import NotFound
from numparity_server.reads import results as reads_results
from numparity_server.reads.voters import crowded_answers


def compare_url(run_a: str, run_b: str, workload: str | None = None,
                variant: str | None = None, device_a: str | None = None,
                device_b: str | None = None) -> str:
    """The comparison page of run b against run a; with devices, of run a's results on
    ``device_a`` against run b's on ``device_b`` (two GPUs of one run, say)."""
    params = {"run_a": run_a, "run_b": run_b}
    for name, value in (("workload", workload), ("variant", variant),
                        ("device_a", device_a), ("device_b", device_b)):
        if value:
            params[name] = value
    return "/compare?" + urlencode(params)


# ---- fleet overview ---------------------------------------------------------------------


@dataclass
class Overview:
    suite: str
    columns: list[tuple[str, str]]  # (workload, variant)
    # (node, cells in column order); a node with several devices shows in each column
    # the worst of its devices' cells (``heatmap.CELL_SEVERITY``).
    rows: list[tuple[str, list[HeatCell]]]
    # node → its devices, for the nodes on the page with more than one.
    devices: dict[str, list[DeviceRow]] = field(default_factory=dict)
    # Nodes whose devices do not all give the same answers: their device rows open.
    disagreeing: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)  # verdicts of the node rows
    # Usual answers the fp64 judge calls not acceptable: (workload, variant, device
    # model, what it says), so the usual answer is never taken for the right one.
    inaccurate: list[tuple[str, str, str, str]] = field(default_factory=list)
    nodes: int = 0  # in the fleet
    limit: int = 0
    offset: int = 0


@dataclass(frozen=True)
class _Answer:
    manifest_hash: str
    devices: int
    first_node: str  # the answer's representative
    voters: int = 0  # ``consensus.in_voters``


Column = tuple[str, str, str]  # workload, variant, device model


def overview(*, session: Session, policy: Policy, suite: str, limit: int,
             offset: int) -> Overview:
    """A page of the nodes x (workload, variant) heatmap, each node's devices under it.

    For each (workload, variant) and device model (a CPU is ``cpu``; GPUs of one name and
    compute capability are one model, in one node as across nodes), the baseline is the
    usual answer (their result's manifest; ``consensus.usual``, counted in voters:
    ``consensus.in_voters``, each device with a stable identity once, a node's others
    together once): its devices are identical to it, and every other answer is compared
    once, the result of its first node's first device holding it against the baseline's,
    tensor by tensor as GET /compare does; each cell links to the comparison of its own run with a
    run holding the baseline's answer at the same slot. The answers are counted over the
    whole fleet in one aggregate; only the page's nodes are read row by row.
    """
    answers: dict[Column, list[_Answer]] = defaultdict(list)
    for workload, variant, model, digest, count, first in repository.answer_counts(
            session, suite=suite):
        answers[(workload, variant, model)].append(_Answer(digest, count, first))
    crowded: dict[Column, list[tuple[str, str, int]]] = defaultdict(list)
    for workload, variant, model, digest, node, count in crowded_answers(session, suite=suite):
        crowded[(workload, variant, model)].append((digest, node, count))
    baselines: dict[Column, _Answer] = {}
    for key, held in answers.items():
        voted = consensus.in_voters(
            {a.manifest_hash: consensus.Support(a.devices, a.first_node) for a in held},
            crowded.get(key, ()))
        answers[key] = held = [_Answer(a.manifest_hash, a.devices, a.first_node,
                                       voted[a.manifest_hash].nodes) for a in held]
        chosen = consensus.usual(voted)
        assert chosen is not None
        baselines[key] = next(a for a in held if a.manifest_hash == chosen)
    inaccurate = _inaccurate_baselines(session, policy, suite, baselines)
    names, total = repository.node_names(session, suite=suite, limit=limit, offset=offset)
    cells = repository.latest_cells(session, suite=suite, nodes=names)

    # The results to compare: each baseline's first node's, and the first node's of every
    # other answer shown on this page; of a node's devices holding it, the first by slot.
    on_page = {(c.workload, c.variant, c.model, c.manifest_hash) for c in cells
               if c.status == "ok" and c.manifest_hash}
    wanted = {baselines[key[:3]].first_node for key in on_page if key[:3] in baselines}
    wanted |= {a.first_node for key in on_page for a in answers.get(key[:3], [])
               if a.manifest_hash == key[3]}
    held_cells = repository.latest_cells(session, suite=suite, nodes=wanted)
    representative: dict[tuple[str, Column, str | None], repository.Cell] = {}
    for cell in sorted(held_cells, key=lambda c: slot_order(c.slot)):
        representative.setdefault(
            (cell.node, (cell.workload, cell.variant, cell.model), cell.manifest_hash), cell)
    # The devices of each node, as far as the slots its results name tell (a result that
    # names no device, which only hand-made documents send, is the node's own).
    devices_of: dict[str, set[int]] = defaultdict(set)
    for cell in (*cells, *held_cells):
        if cell.slot:
            devices_of[cell.node].add(cell.device_id)

    def several(node: str) -> bool:
        return len(devices_of[node]) > 1

    def named(cell: repository.Cell) -> str:
        """A node, with the slot when it has several devices."""
        return f"{cell.node} / {cell.slot}" if several(cell.node) else cell.node


    # Every other answer on the page against its baseline, from their first nodes' first
    # devices: comparisons kept by content, as /divergence keeps its own.
    others: dict[Column, dict[str, repository.Cell]] = defaultdict(dict)
    for workload, variant, model, digest in on_page:
        column = (workload, variant, model)
        if digest and column in baselines and digest != baselines[column].manifest_hash:
            (first,) = [a.first_node for a in answers[column] if a.manifest_hash == digest]
            others[column][digest] = representative[(first, column, digest)]
    verdicts = _verdicts(session, policy, {
        column: (representative[(baselines[column].first_node, column,
                                 baselines[column].manifest_hash)], list(held.values()))
        for column, held in others.items()})
    found: dict[tuple[str, int, str, str], HeatCell] = {}
    for cell in cells:
        key = (cell.workload, cell.variant, cell.model)
        where = f"{cell.node} · {cell.workload}/{cell.variant}"
        place = (cell.node, cell.device_id, cell.workload, cell.variant)
        if cell.status != "ok" or not cell.manifest_hash or key not in baselines:
            detail = cell.reason or cell.error or ""
            on = f" on {cell.slot}" if several(cell.node) else ""
            found[place] = HeatCell(
                cell.status, f"{where}{on}: {cell.status}" + (f" ({detail})" if detail else ""),
                run_id=cell.run_id, detail=detail)
            continue
        baseline = baselines[key]
        base = representative[(baseline.first_node, key, baseline.manifest_hash)]
        if cell.manifest_hash == baseline.manifest_hash:
            counted = "nodes" if cell.model == "cpu" else "devices"
            voters = ("" if baseline.voters == baseline.devices
                      else f", {baseline.voters} voters")
            verdict, how = "identical", (f"the most common answer ({baseline.devices} "
                                         f"{counted}{voters})")
        else:
            verdict, how = verdicts[key + (cell.manifest_hash,)]
        is_baseline = (cell.node, cell.device_id) == (base.node, base.device_id)
        # The comparison of the cell's result with the baseline representative's, device
        # by device where a node has several (two GPUs of one run compare too).
        by_device = several(cell.node) or several(base.node) or cell.slot != base.slot
        href = f"/nodes/{quote(cell.node, safe='')}" if is_baseline else compare_url(
            base.run_id, cell.run_id, cell.workload, cell.variant,
            device_a=base.slot if by_device else None,
            device_b=cell.slot if by_device else None)
        wrong = (inaccurate.get(key, "")
                 if cell.manifest_hash == baseline.manifest_hash else "")
        found[place] = HeatCell(
            verdict, f"{where} on {cell.slot}: {verdict} — against {named(base)}, {how}"
                     + (f"; the usual answer, but {wrong}" if wrong else ""),
            href, baseline=is_baseline, run_id=cell.run_id, inaccurate=wrong)

    columns = sorted(repository.columns(session, suite=suite),
                     key=lambda wv: (wv[0], variant_sort_key(wv[1])))
    by_node: dict[str, dict[int, list[repository.Cell]]] = defaultdict(
        lambda: defaultdict(list))
    for cell in cells:
        by_node[cell.node][cell.device_id].append(cell)
    view = Overview(suite=suite, columns=columns, rows=[], nodes=total, limit=limit,
                    offset=offset, inaccurate=sorted(key + (text,) for key, text
                                                     in inaccurate.items()))
    counts: dict[str, int] = defaultdict(int)
    for node in names:
        row, devices, agree = node_rows(node, by_node[node], columns, found)
        if several(node):
            view.devices[node] = devices
            if not agree:
                view.disagreeing.add(node)
        for heat in row:
            counts[heat.verdict] += 1
        view.rows.append((node, row))
    view.counts = dict(counts)
    return view


def _inaccurate_baselines(session: Session, policy: Policy, suite: str,
                          baselines: dict[Column, _Answer]) -> dict[Column, str]:
    """Column → what the fp64 judge says of its usual answer, where it calls it not
    acceptable against the float64 answer (design §3.3.8): the TF32 answer of a fleet of
    stock GPUs is usual and wrong. Judged on the answer's output, kept like /divergence's
    judgements."""
    manifests = reads_results.manifest_entries(
        session, {answer.manifest_hash for answer in baselines.values()})
    usual: dict[tuple[str, ...], str | None] = {}
    found = {}
    for (workload, variant, model), answer in baselines.items():
        entries = manifests.get(answer.manifest_hash)
        if not entries:
            continue
        judged = answer_accuracy(
            session=session, policy=policy, suite=suite, workload=workload, variant=variant,
            tensors=[(e["name"], e["kind"], e["hash"]) for e in entries], usual=usual)
        if judged is not None and judged.acceptable is False:
            found[(workload, variant, model)] = (
                f"the fp64 judge calls it not acceptable: {judged.tensor}'s rmse against "
                f"float64 {_figure(judged.rmse)} > limit {_figure(judged.limit)}")
    return found


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2g}"


def _verdicts(session: Session, policy: Policy,
              columns: dict[Column, tuple[repository.Cell, list[repository.Cell]]]
              ) -> dict[tuple[str, str, str, str], tuple[str, str]]:
    """(workload, variant, model, manifest) → (verdict, how) of each other answer against
    its column's baseline, from the results of their first nodes' first devices (the two
    may be on other slots: cuda:3 against cuda:0, even in one run): broken inputs win,
    then the result verdict of /divergence's comparison of the two answers (the worst of
    the tensors', as GET /compare judges a pair), kept by content and read again."""
    how = "judged on the first device of each answer's first node"
    manifests = {digest: tuple((e["name"], e["kind"], e["hash"]) for e in entries)
                 for digest, entries in reads_results.manifest_entries(session, {
                     cell.manifest_hash for base, held in columns.values()
                     for cell in (base, *held) if cell.manifest_hash}).items()}

    def member(cell: repository.Cell) -> analysis.Member:
        return analysis.Member(node=cell.node, run_id=cell.run_id, env_key="",
                               environment={}, tensors=manifests[cell.manifest_hash or ""],
                               device=cell.slot, manifest=cell.manifest_hash)

    found: dict[tuple[str, str, str, str], tuple[str, str]] = {}
    for column, (base, held) in columns.items():
        judged = []
        for cell in held:
            assert cell.manifest_hash
            broken = analysis.broken_inputs((cell.input_hash, cell.param_hash),
                                            (base.input_hash, base.param_hash))
            if broken:
                found[column + (cell.manifest_hash,)] = (
                    "broken", f"{' and '.join(broken)} differ: broken inputs, not a divergence")
            elif base.manifest_hash not in manifests or cell.manifest_hash not in manifests:
                found[column + (cell.manifest_hash,)] = (
                    "missing", "the tensors of a result are no longer stored")
            else:
                judged.append(cell)
        if not judged:
            continue
        groups = [analysis.Group(id=number, hash=cell.manifest_hash or "",
                                 members=(member(cell),))
                  for number, cell in enumerate((base, *judged), start=1)]
        plan = analysis.plan_groups(groups, [], tensor=None, workload=column[0],
                                    policy_version=policy.version, traced=False)
        kept, _pending = comparisons(
            session, plan, lambda dtype, workload=column[0]: policy.tolerance(workload, dtype))
        for pair in plan.pairs:
            found[column + (pair.b.hash,)] = (kept[pair.key]["verdict"], how)
    return found


# ---- per-workload page ------------------------------------------------------------------


@dataclass
class VariantView:
    variant: str
    report: dict[str, Any] | None
    problem: str | None = None
    runs: dict[int, str] = field(default_factory=dict)  # group id -> representative run


def workload_page(*, session: Session, policy: Policy, suite: str, workload: str,
                  tensor: str | None, members_limit: int = 50,
                  budget: Budget | None = None) -> dict[str, Any]:
    """Every variant's /divergence of ``tensor`` (each group against the baseline, its
    first ``members_limit`` nodes listed): the comparisons are kept, so a view after the
    first reads them."""
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
                                variant=variant, tensor=chosen, policy=policy,
                                members_limit=members_limit, budget=budget)
        except NotFound as exc:
            views.append(VariantView(variant, None, str(exc.detail)))
            continue
        views.append(VariantView(variant, report.model_dump(mode="json"), runs={
            group.id: group.representative.run_id for group in report.groups}))
    fp64_reference = any(v.variant == "fp64-reference" and v.report for v in views)
    return {"suite": suite, "workload": workload, "tensor": chosen, "tensor_reason": why,
            "tensors": tensors, "variants": views, "fp64_reference": fp64_reference,
            "pending": sum((view.report or {}).get("pending", 0) for view in views)}


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


def device_findings(*, session: Session, policy: Policy, node: str) -> dict[str, SuspectRow]:
    """slot → the audit's suspect or watch entry of the device sitting there on ``node``
    (the entry names the node a device sits on now, as the node page lists them)."""
    report = audit_service.audit(session=session, policy=policy)
    return {row.device: row for row in report.suspects if row.node == node}



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
               workload: str | None, variant: str | None, device_a: str | None = None,
               device_b: str | None = None, limit: int = 500, offset: int = 0,
               budget: Budget | None = None) -> tuple[CompareOut, list[Any]]:
    compared = compare_runs(session=session, policy=policy, run_a=run_a, run_b=run_b,
                            workload=workload, variant=variant, device_a=device_a,
                            device_b=device_b, limit=limit, offset=offset, budget=budget)
    charts = [layer_chart(pair) if pair.compared else None for pair in compared.pairs]
    return compared, charts
