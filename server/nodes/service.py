"""The fleet's nodes: what each runs on now, and its timeline of runs (design §3.2)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.kit.errors import NotFound
from numparity_server.kit.pagination import Page
from numparity_server.nodes import repository
from numparity_server.nodes.schemas import (
    AttributeChange,
    DeviceItem,
    DeviceTelemetryItem,
    NodeItem,
    NodeTimeline,
    ResultChange,
    TimelineRun,
)
from numparity_server.reads import results as reads_results

ResultKey = tuple[str, str, str, str]  # suite, workload, variant, device


def list_nodes(*, session: Session, limit: int, offset: int) -> Page[NodeItem]:
    """Nodes by name, each with its run count and the environment of its newest run."""
    total = repository.count_nodes(session)
    nodes = repository.nodes_page(session, limit=limit, offset=offset)
    ids = [node.id for node in nodes]
    counts = repository.run_counts(session, ids)
    # The node row keeps its newest run's start and environment (kept on ingest).
    env_keys = repository.env_keys(session, [node.environment_id for node in nodes])
    items = []
    for node in nodes:
        items.append(NodeItem(
            name=node.name, labels=node.labels or {}, first_seen=node.first_seen,
            last_seen=node.last_seen, last_run_at=node.newest_started_at,
            env_key=env_keys.get(node.environment_id) if node.environment_id else None,
            runs=counts.get(node.id, 0),
        ))
    return Page[NodeItem](items=items, total=total, limit=limit, offset=offset)


def node_timeline(*, session: Session, name: str, limit: int, offset: int) -> NodeTimeline:
    """A node's runs, newest first; each compared with the run before it (by started_at):
    did the environment change, and which results' manifests changed."""
    node = repository.find_node(session, name)
    if node is None:
        raise NotFound(f"no node named {name!r}")
    total = repository.count_runs(session, node.id)
    # One run more than the page: the run before the page's oldest, to compare with.
    runs = repository.timeline_runs(session, node.id, limit=limit + 1, offset=offset)
    results: dict[int, dict[ResultKey, Any]] = defaultdict(dict)
    for row in reads_results.results_of_runs(session, [run.id for run in runs]):
        results[row.run_pk][(row.suite, row.workload, row.variant, row.device)] = row

    pairs = [(run, runs[i + 1] if i + 1 < len(runs) else None)
             for i, run in enumerate(runs[:limit])]
    changes = {run.id: _changes(results[run.id], results[previous.id])
               for run, previous in pairs if previous is not None}
    outputs = _outputs(session, [c for found in changes.values() for c in found])
    environment_changes = _environment_changes(
        session, [(run.env_key, previous.env_key) for run, previous in pairs
                  if previous is not None and run.env_key != previous.env_key])

    items = []
    for run, previous in pairs:
        changed = [
            ResultChange(
                suite=key[0], workload=key[1], variant=key[2], device=key[3],
                status=now.status, previous_status=before.status,
                manifest_hash=now.manifest_hash, previous_manifest_hash=before.manifest_hash,
                outputs_changed=(
                    outputs[now.manifest_hash] != outputs[before.manifest_hash]
                    if now.manifest_hash and before.manifest_hash else None
                ),
            )
            for key, now, before in changes.get(run.id, [])
        ]
        items.append(TimelineRun(
            run_id=run.run_id, started_at=run.started_at, received_at=run.received_at,
            agent_version=run.agent_version, drill=run.drill, env_key=run.env_key,
            previous_run_id=previous.run_id if previous else None,
            environment_changed=(run.env_key != previous.env_key) if previous else None,
            environment_changes=environment_changes.get(
                (run.env_key, previous.env_key), []) if previous else [],
            changed_results=changed,
        ))
    return NodeTimeline(
        name=node.name, labels=node.labels or {}, first_seen=node.first_seen,
        last_seen=node.last_seen,
        devices=[DeviceItem.model_validate(row, from_attributes=True)
                 for row in repository.devices(session, node.id)],
        telemetry=_telemetry(session, node.id),
        runs=Page[TimelineRun](items=items, total=total, limit=limit, offset=offset),
    )


def _telemetry(session: Session, node_id: int) -> list[DeviceTelemetryItem]:
    row = repository.newest_telemetry(session, node_id)
    if row is None or not isinstance(row.telemetry, dict):
        return []
    return [DeviceTelemetryItem(device=slot, uuid=found.get("uuid"), run_id=row.run_id,
                                started_at=row.started_at, start=found.get("start"),
                                end=found.get("end"))
            for slot, found in sorted(row.telemetry.items()) if isinstance(found, dict)]


def _environment_changes(session: Session, pairs: list[tuple[str, str]]
                         ) -> dict[tuple[str, str], list[AttributeChange]]:
    """(env_key now, env_key before) → the attributes that differ, by name."""
    documents = repository.environment_documents(session, [k for pair in pairs for k in pair])
    flat = {key: analysis.flatten_environment(doc) for key, doc in documents.items()}
    return {
        (now, before): [
            AttributeChange(attribute=d["attribute"], before=d["a"], after=d["b"])
            for d in analysis.environment_diff(flat.get(before, {}), flat.get(now, {}))
        ]
        for now, before in set(pairs)
    }


def _changes(now: dict[ResultKey, Any], before: dict[ResultKey, Any]
             ) -> list[tuple[ResultKey, Any, Any]]:
    """Keys present in both runs whose manifest or status differ, in key order."""
    return [(key, now[key], before[key]) for key in sorted(now.keys() & before.keys())
            if (now[key].manifest_hash, now[key].status)
            != (before[key].manifest_hash, before[key].status)]


def _outputs(session: Session, changes: list[tuple[ResultKey, Any, Any]]
             ) -> dict[str, frozenset[tuple[str, str]]]:
    """manifest hash → its output tensors as (name, hash)."""
    hashes = [h for _, now, before in changes
              for h in (now.manifest_hash, before.manifest_hash) if h]
    return {
        digest: frozenset((e["name"], e["hash"]) for e in entries if e.get("kind") == "output")
        for digest, entries in reads_results.manifest_entries(session, hashes).items()
    }
