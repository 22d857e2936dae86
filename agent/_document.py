"""The run document `numparity.run/v1` (design §2.7)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from numparity_agent import __version__

SCHEMA = "numparity.run/v1"


def utc_now() -> str:
    """ISO 8601 UTC with a Z suffix, to the second."""
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def build_document(
    *,
    node: str,
    labels: dict[str, str],
    environment: dict[str, Any],
    results: list[dict[str, Any]],
    started_at: str,
    finished_at: str,
    drill: bool = False,
    drill_device: str | None = None,
    drill_spec: str | None = None,
    devices: list[dict[str, Any]] | None = None,
    run_id: str | None = None,
    results_order: list[str] | None = None,
    timeline: list[dict[str, Any]] | None = None,
    node_gpus: list[str] | None = None,
) -> dict[str, Any]:
    """The document; `drill_device` (the slot a drill corrupted) and `drill_spec` (an
    op drill's, `_drill_spec`) only with `drill`,
    `devices` (the entries of §2.7, with `wall_s` and `status`) and `timeline` (one
    entry per child process, `_timeline`) and `node_gpus` (NVML's UUIDs of the node's
    GPUs, `_devices.node_gpus`) when given. `results_order`: the variants in
    the order the run asked for them, each device's results sorted so (variants that
    share a child run in its order)."""
    if results_order is not None:
        rank = {name: i for i, name in enumerate(results_order)}
        slots = list(dict.fromkeys(r.get("device") for r in results))
        results = sorted(results, key=lambda r: (slots.index(r.get("device")),
                                                 rank.get(str(r.get("variant")), len(rank))))
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "run_id": run_id or str(uuid.uuid4()),
        "node": {"name": node, "labels": dict(labels)},
        "agent_version": __version__,
        "started_at": started_at,
        "finished_at": finished_at,
        "drill": drill,
    }
    if drill and drill_device is not None:
        document["drill_device"] = drill_device
    # An op drill's spec (`_drill_spec`): the tensor drill's is the document's default.
    if drill and drill_spec is not None and drill_spec != "tensor":
        document["drill_spec"] = drill_spec
    if devices is not None:
        document["devices"] = devices
    if node_gpus is not None:
        document["node_gpus"] = node_gpus
    if timeline:
        document["timeline"] = timeline
    document["environment"] = environment
    document["results"], traces = hoist_traces(results)
    if traces:
        document["traces"] = traces
    return document


def hoist_traces(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                          list[dict[str, Any]]]:
    """The results with each trace body (`run_workload`'s "trace") replaced by its hash,
    and the bodies, each once, for the document's `traces` (design §2.7)."""
    bodies: dict[str, dict[str, Any]] = {}
    hoisted = []
    for result in results:
        body = result.get("trace")
        if isinstance(body, dict):
            bodies.setdefault(body["hash"], body)
            result = {**result, "trace": body["hash"]}
        hoisted.append(result)
    return hoisted, list(bodies.values())
