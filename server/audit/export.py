"""The audit as text: its findings, a line per node and finding, and its tables as CSV
(``?format=csv&table=NAME`` and the dashboard's ``/audit.csv``).

Node names, label and environment values come from the agents, so a cell may hold what a
spreadsheet would run as a formula (``=HYPERLINK(...)``): every text cell that starts
with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a leading ``'`` (OWASP's
rule against CSV injection). Numbers the server computed (hours, seconds, ratios, counts)
are written as numbers and never escaped: a number cannot hold a formula. A text that
only looks like a number (``-1`` sent by an agent) is text, and escaped.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from pydantic import BaseModel

from numparity_server.audit.schemas import AuditOut
from numparity_server.kit.errors import BadRequest

# The tables of ?format=csv besides findings and inventory: the report's list → its columns.
CSV_TABLES: dict[str, tuple[str, ...]] = {
    "stale": ("node", "last_seen", "hours_since", "last_run_id"),
    "policy": ("node", "env_key", "attribute", "value", "rule", "expected"),
    "suspects": ("node", "device", "device_uuid", "device_serial", "device_pci_bus_id",
                 "device_name", "status", "env_key", "peers", "majority_nodes", "majority_from",
                 "disagreeing_runs", "drill", "drill_runs", "currently_disagrees"),
    "nondeterministic": ("node", "reason", "suite", "workload", "workload_version", "variant",
                         "device", "run_id", "detail"),
    "broken_inputs": ("node", "run_id", "suite", "workload", "workload_version", "variant",
                      "differs", "input_hash", "fleet_input_hash", "param_hash",
                      "fleet_param_hash"),
    "drift": ("node", "run_id", "previous_run_id", "started_at", "attributes",
              "outputs_changed"),
    "determinism_cost": ("env_key", "nodes", "default_s", "strict_s", "ratio",
                         "ratio_estimate", "ratio_uncertainty", "note"),
    "nondeterministic_ops": ("env_key", "device_model", "deterministic", "op", "module",
                             "phase", "results", "recipe", "selective_ratio",
                             "selective_low", "selective_high", "selective_verdict",
                             "selective_words", "strict_ratio", "strict_low", "strict_high",
                             "strict_verdict", "strict_words", "cost", "source", "at",
                             "advice", "claimed_by", "summary"),
    "numerics": ("env_key", "device_model", "suite", "variant", "devices", "batch_invariant",
                 "batch_invariant_op", "decode_equals_prefill", "decode_equals_prefill_op",
                 "attention_backends_agree", "attention_backends_agree_op"),
    "data_pipeline": ("env_key", "suite", "workload", "variant", "devices", "recipe_holds",
                      "without", "without_holds", "needs_recipe", "workers_agree",
                      "recipe_broken", "without_broken"),
    "pinned": ("pin_id", "pin_version", "model", "scope", "suite", "workload",
               "workload_version", "variant", "env_key", "devices", "environment_devices",
               "first_node", "peers_agree", "verdict", "decided_by", "first_divergent_layer",
               "pinned_manifest", "answer_manifest"),
}
TABLES = ("findings", "inventory", *CSV_TABLES)


def findings(report: AuditOut) -> list[dict[str, str]]:
    """One row per node and finding, across the tables: what needs someone's attention."""
    rows = []
    for suspect in report.suspects:
        drill = " (drill)" if suspect.drill else ""
        rows.append({"node": suspect.node, "finding": suspect.status + drill,
                     "detail": f"{suspect.detail} (strict answers; {suspect.majority_nodes} "
                               f"of the {suspect.peers} peers agree)"})
    for entry in report.nondeterministic:
        rows.append({"node": entry.node, "finding": "nondeterministic", "detail": entry.detail})
    for stale in report.stale:
        rows.append({"node": stale.node, "finding": "stale",
                     "detail": f"no upload for {stale.hours_since} h"})
    for violation in report.policy:
        rows.append({"node": violation.node, "finding": "policy",
                     "detail": f"{violation.attribute} is {violation.value}, "
                               f"{violation.rule}: {', '.join(violation.expected)}"})
    for broken in report.broken_inputs:
        rows.append({"node": broken.node, "finding": "broken_inputs",
                     "detail": f"{' and '.join(broken.differs)} of {broken.workload} "
                               f"({broken.variant}) differ from the fleet's"})
    for moved in report.pinned:
        rows.append({"node": moved.first_node, "finding": "off pin",
                     "detail": f"{moved.workload}/{moved.variant} on {moved.devices} of "
                               f"{moved.environment_devices} {moved.model} device(s) of "
                               f"environment {moved.env_key[:12]} differs from pin "
                               f"{moved.pin_id} v{moved.pin_version} ({moved.scope})"
                               + (": the whole environment moved" if moved.peers_agree
                                  else "")})
    for drift in report.drift:
        if drift.outputs_changed:
            names = ", ".join(change.attribute for change in drift.attributes[:5])
            rows.append({"node": drift.node, "finding": "drift",
                         "detail": f"{len(drift.outputs_changed)} result(s) changed with "
                                   f"{names}"})
    return rows


# The first characters that make a spreadsheet read a cell as a formula (OWASP).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralised(cell: Any) -> Any:
    """``cell`` as a spreadsheet may open it: a text that would start a formula gets a
    leading ``'``; numbers (and booleans) pass as they are."""
    if isinstance(cell, str) and cell.startswith(FORMULA_STARTS):
        return "'" + cell
    return cell


def _cell(value: Any) -> Any:
    """A CSV cell: lists joined by "; ", an attribute change as ``name: before -> after``,
    another row as its values joined by "/"."""
    if isinstance(value, list):
        return "; ".join(_cell(item) for item in value)
    if isinstance(value, dict):
        if "attribute" in value:
            return f"{value['attribute']}: {value.get('before')} -> {value.get('after')}"
        return "/".join(str(v) for v in value.values() if v is not None)
    return "" if value is None else value


def check_table(table: str) -> None:
    """BadRequest naming the tables there are, before any audit is computed."""
    if table not in TABLES:
        raise BadRequest(f"unknown table {table!r}; tables: {', '.join(TABLES)}")


def nondeterministic_op_rows(report: AuditOut) -> list[dict[str, Any]]:
    """A row per nondeterministic op, or per environment and device model without one."""
    rows: list[dict[str, Any]] = []
    for row in report.nondeterministic_ops:
        head = {"env_key": row.env_key, "device_model": row.device_model,
                "deterministic": row.deterministic, "summary": row.summary}
        if not row.ops and not row.sources:
            rows.append(head)
        for op in row.ops:
            rows.append({**head, "op": op.op, "module": op.module, "phase": op.phase,
                         "results": op.results, "recipe": op.recipe, "cost": op.cost,
                         "claimed_by": " ".join(op.claimed_by),
                         **{f"{mode}_{part}": getattr(getattr(op, mode), part, None)
                            for mode in ("selective", "strict")
                            for part in ("ratio", "low", "high", "verdict", "words")}})
        for source in row.sources:
            rows.append({**head, "op": source.op, "module": source.module,
                         "phase": source.phase, "results": source.results,
                         "recipe": source.recipe, "source": source.source,
                         "at": source.at, "advice": source.advice,
                         "claimed_by": " ".join(source.claimed_by)})
    return rows


def to_csv(report: AuditOut, table: str) -> str:
    """One table of the report as CSV (``findings``: every finding, a row each)."""
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    if table == "findings":
        rows, columns = list(findings(report)), ("node", "finding", "detail")
    elif table == "inventory":
        rows = [{"attribute": attribute, "value": entry.value, "nodes": entry.nodes}
                for attribute, entries in report.inventory.items() for entry in entries]
        columns = ("attribute", "value", "nodes")
    elif table == "nondeterministic_ops":
        rows, columns = nondeterministic_op_rows(report), CSV_TABLES[table]
    else:
        columns = CSV_TABLES[table]
        table_rows: list[BaseModel] = getattr(report, table)
        rows = [row.model_dump(mode="json") for row in table_rows]
    out = io.StringIO()
    # RFC 4180's CRLF: the writer quotes a cell that holds any character of the line
    # terminator, so a name with a bare CR (or LF) in it cannot start a row of its own.
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([neutralised(_cell(row.get(column))) for column in columns])
    return out.getvalue()
