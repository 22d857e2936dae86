"""The fleet heatmap's rows: how a node's devices' cells make its row and its device
rows, on plain values (``service.overview`` reads and judges the cells)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from numparity_server.dashboard.repository import Cell

# What a node row shows of its devices' cells: the worst, in this order. The result
# verdicts keep the analysis's order (``analysis.SEVERITY``); a result without an answer
# (ok without tensors, skipped, missing) ranks below any difference, and a crash or
# other input bytes above them all: each is a fault of the node, not of the numbers.
CELL_SEVERITY = {verdict: rank for rank, verdict in enumerate((
    "identical", "ok", "skipped", "missing", "equivalent", "divergent", "nonfinite",
    "failed", "broken"))}


@dataclass
class HeatCell:
    verdict: str  # identical .. nonfinite, broken, failed, skipped, missing
    title: str
    href: str | None = None
    baseline: bool = False
    run_id: str | None = None  # the run of the node's newest result (None: missing)
    detail: str = ""  # a skipped result's reason, a failed one's error
    # The cell holds its column's usual answer and the fp64 judge calls that answer not
    # acceptable against float64: what it says (the usual answer is not the right one).
    inaccurate: str = ""


@dataclass
class DeviceRow:
    """A device of a node that has several, shown under the node's row."""

    slot: str  # cuda:3, cpu
    name: str  # the device's name (a CPU's model), else its model
    uuid: str | None  # GPU or MIG UUID
    cells: list[HeatCell]  # in column order


def node_rows(node: str, held_by: Mapping[int, Sequence[Cell]],
              columns: Sequence[tuple[str, str]],
              found: Mapping[tuple[str, int, str, str], HeatCell]
              ) -> tuple[list[HeatCell], list[DeviceRow], bool]:
    """A node's row (in each column the worst of its devices' cells: with one device,
    that device's), its devices' rows in slot order, and whether its devices agree.

    In a column, the devices taking part are those whose model has a result there (a GPU
    node's CPU runs only fp64-reference): a device of such a model without one is
    ``missing``. They agree when they all have the same verdict and devices of one model
    the same answer (manifest, or status and reason)."""
    newest = {device_id: max(held, key=lambda c: c.started_at)
              for device_id, held in held_by.items()}
    order = sorted(newest, key=lambda d: slot_order(newest[d].slot))
    rows = [DeviceRow(slot=newest[d].slot or "(no device named)",
                      name=newest[d].device_name or newest[d].model,
                      uuid=newest[d].device_uuid, cells=[]) for d in order]
    node_cells: list[HeatCell] = []
    agree = True
    for workload, variant in columns:
        results = {c.device_id: c for held in held_by.values() for c in held
                   if (c.workload, c.variant) == (workload, variant)}
        models = {c.model for c in results.values()}
        taking_part: list[tuple[str, HeatCell, str]] = []  # (model, cell, answer)
        for device_id, row in zip(order, rows, strict=True):
            result = results.get(device_id)
            if result is not None:
                heat = found[(node, device_id, workload, variant)]
                answer = result.manifest_hash or f"{result.status}:{heat.detail}"
                taking_part.append((result.model, heat, answer))
            elif newest[device_id].model in models:
                heat = HeatCell("missing", f"{node} / {row.slot} has no result of "
                                           f"{workload}/{variant} (other devices of its "
                                           "model on the node have one)")
                taking_part.append((newest[device_id].model, heat, "missing"))
            elif models:
                heat = HeatCell("missing", f"{node} / {row.slot} does not run "
                                           f"{workload}/{variant} (other devices of the node "
                                           "do)")
            else:
                heat = HeatCell("missing", f"{node} has no result of {workload}/{variant}")
            row.cells.append(heat)
        if not taking_part:
            node_cells.append(HeatCell("missing", f"{node} has no result of {workload}/{variant}"))
            continue
        worst = max(taking_part, key=lambda part: CELL_SEVERITY.get(part[1].verdict, 0))[1]
        node_cells.append(worst if len(taking_part) == 1 else replace(
            worst, title=f"{worst.title} (the worst of the node's {len(taking_part)} devices)"))
        by_model: dict[str, set[str]] = defaultdict(set)
        for model, _heat, answer in taking_part:
            by_model[model].add(answer)
        if len({heat.verdict for _m, heat, _a in taking_part}) > 1 or any(
                len(held) > 1 for held in by_model.values()):
            agree = False
    return node_cells, rows, agree


def slot_order(slot: str) -> tuple[str, int, str]:
    """cpu, cuda:0, cuda:1 … cuda:10 (not cuda:10 before cuda:2)."""
    kind, _, index = slot.partition(":")
    return kind, int(index) if index.isdigit() else -1, slot
