"""Ingest of run documents: validated, content-addressed, one transaction (design §3.1/3.2)."""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server.analysis.environment import derived_env_key, legacy_env_key
from numparity_server.kit.canonical import content_hash
from numparity_server.kit.db import writing
from numparity_server.kit.errors import Conflict, InvalidDocument, NotFound, UnsupportedSchema
from numparity_server.kit.pagination import Page
from numparity_server.models import STAT_FIELDS, Run, utcnow
from numparity_server.runs import counts, repository, traces
from numparity_server.runs.devices import seen_devices, serials_unique, visible_uuids
from numparity_server.runs.schemas import (
    MAX_STORED_COMPILE_PASSES,
    SUPPORTED_SCHEMAS,
    VALUES_ALWAYS_MAX,
    MissingIn,
    MissingOut,
    ResultDoc,
    ResultSummary,
    RunCreated,
    RunDocument,
    RunListItem,
    RunSummary,
    TensorEntry,
)

ModelT = TypeVar("ModelT", bound=BaseModel)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ingested:
    run: RunCreated
    created: bool  # False: the identical document was already stored


def document_sha256(document: dict[str, Any], tensor_manifests: Sequence[str | None]) -> str:
    """sha256 of the canonical JSON of the document with every result's tensor list
    replaced by its manifest hash (``tensor_manifests``, one per result, None for a
    result without tensors), and without the trace bodies (``traces``).

    Everything in a fingerprint but its name, kind and order is a function of its hash,
    and the manifest hash covers those, so a run is the same run whether its tensors
    travelled as full fingerprints, as bare references or as a manifest reference: the
    agent sends less for what the server has, and its retry after a lost answer may send
    another form. Hashing the reduced document also keeps megabytes of base64 out of it.
    Likewise a result's ``trace`` hash covers its trace's body, and an upload carries
    only the bodies the server lacks: the same run comes with or without them.
    """
    reduced = {key: value for key, value in document.items() if key != "traces"}
    if "results" in document:
        reduced["results"] = [
            result if digest is None
            else {**{k: v for k, v in result.items() if k != "tensors"}, "manifest": digest}
            for result, digest in zip(document["results"], tensor_manifests, strict=True)
        ]
    return content_hash(reduced)


def tensor_manifests(run: RunDocument) -> list[str | None]:
    """The manifest hash of each result's tensors, in the run's order; None without any."""
    return [manifest_hash([(t.name, t.kind, t.hash) for t in _ordered(result.tensors)])
            if result.tensors else None
            for result in run.results]


def manifest_hash(entries: list[tuple[str, str, str]]) -> str:
    """sha256 of the ordered (name, kind, hash) triples as canonical JSON.

    The agent computes the same hash to refer to a manifest the server has (wire field
    ``manifest`` of a result), so this form is part of the contract.
    """
    canonical = json.dumps([list(entry) for entry in entries], separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate_document(document: dict[str, Any]) -> RunDocument:
    schema = document.get("schema")
    if schema is None:
        raise InvalidDocument.at(["body", "schema"], "Field required")
    if schema not in SUPPORTED_SCHEMAS:
        raise UnsupportedSchema(
            f"unsupported schema {schema!r}; supported: {', '.join(SUPPORTED_SCHEMAS)}"
        )
    return _validated(RunDocument, document)


def node_name(document: dict[str, Any]) -> str:
    """The run's node name as sent, read before validation for the token's node binding.
    Validation takes only a string there, unchanged, so this is the name that would be
    stored; anything else reads as "", a name no binding lists (validation refuses it)."""
    node = document.get("node")
    name = node.get("name") if isinstance(node, dict) else None
    return name if isinstance(name, str) else ""


def validate_missing(document: dict[str, Any]) -> MissingIn:
    return _validated(MissingIn, document)


def _validated(model: type[ModelT], document: dict[str, Any]) -> ModelT:
    """``document`` as ``model``; a 422 naming each wrong field under ``body``."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise InvalidDocument(
            [{"loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()]
        ) from None


def check_times(run: RunDocument, *, now: datetime, max_clock_skew_s: float) -> None:
    """422 for a time further ahead of the server's clock than ``max_clock_skew_s``, or a
    run that finished before it started: the agent's clock is trusted that far only."""
    horizon = now + timedelta(seconds=max_clock_skew_s)
    problems = []
    for field in ("started_at", "finished_at"):
        value = getattr(run, field)
        if value is not None and as_utc(value) > horizon:
            problems.append({"loc": ["body", field], "msg": (
                f"{value.isoformat()} is more than {max_clock_skew_s:g} s ahead of the "
                f"server's clock ({now.isoformat(timespec='seconds')}; setting "
                "NUMPARITY_MAX_CLOCK_SKEW_S)")})
    if run.finished_at is not None and as_utc(run.finished_at) < as_utc(run.started_at):
        problems.append({"loc": ["body", "finished_at"],
                         "msg": "finished_at is before started_at"})
    if problems:
        raise InvalidDocument(problems)


def check_env_key(run: RunDocument, document: dict[str, Any]) -> None:
    """422 when the declared ``environment.env_key`` is not the key of the environment
    document beside it: the first document stored under a key is what every later run of
    that key shows, so a node could otherwise file its own environment under another
    node's key (design §3.1, §8)."""
    derived = derived_env_key(document["environment"])
    if run.environment.env_key not in (derived, legacy_env_key(document["environment"])):
        raise InvalidDocument.at(["body", "environment", "env_key"], (
            f"env_key {run.environment.env_key} is not the key of this environment "
            f"document ({derived}: sha256 of its canonical JSON without host name, GPU "
            "UUIDs and serials, and unknown; design §2.5)"))


def as_utc(moment: datetime) -> datetime:
    """A time without a zone is read as UTC (as it is stored)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def _compiled_record(result: ResultDoc) -> dict[str, Any] | None:
    """A compiled result's `compile` and `localisation` (`results.compiled`), or None.
    Bounded: the first MAX_STORED_COMPILE_PASSES passes and their count (a run of a
    thousand repeats stores no more than one of sixteen)."""
    record: dict[str, Any] = {}
    if result.compile is not None:
        # Not cache_dir: a path on the node, which no reader needs.
        compiled = result.compile.model_dump(mode="json", exclude_none=True,
                                             exclude={"cache_dir"})
        compiled["passes"] = compiled["passes"][:MAX_STORED_COMPILE_PASSES]
        compiled["pass_count"] = len(result.compile.passes)
        record["compile"] = compiled
    if result.localisation is not None:
        record["localisation"] = result.localisation.model_dump(mode="json",
                                                                exclude_none=True)
    return record or None


def _telemetry(run: RunDocument) -> dict[str, Any] | None:
    """The GPUs' NVML readings by slot (`runs.telemetry`), or None when none had any."""
    found = {device.device: {"uuid": device.uuid,
                             **device.telemetry.model_dump(mode="json", exclude_none=True)}
             for device in run.devices or [] if device.telemetry is not None}
    return found or None


def ingest_run(*, session: Session, document: dict[str, Any],
               max_clock_skew_s: float = 86_400.0) -> Ingested:
    run = validate_document(document)
    check_env_key(run, document)
    check_times(run, now=utcnow(), max_clock_skew_s=max_clock_skew_s)
    bodies = traces.check_traces(run, document)
    digests = tensor_manifests(run)
    sha256 = document_sha256(document, digests)
    try:
        with writing(session):
            created = _store(session, run, sha256, digests, bodies)
    except IntegrityError:
        # The run_id is stored already (a retry, or a concurrent upload of the same run):
        # the unique key says so, so the common case, a new run, needs no look-up first.
        existing = repository.find_run(session, run.run_id)
        if existing is None:
            _raise_vanished_references(session, run)
            raise
        return _replay(session, existing, sha256)
    return Ingested(run=created, created=True)


def _raise_vanished_references(session: Session, run: RunDocument) -> None:
    """A manifest (or trace) this run referred to was there when checked and gone at the
    insert: on PostgreSQL, retention may delete it in between. Name it (422) so the agent
    resends the result's tensors (the trace's body), instead of a 500."""
    referenced = {result.manifest: ["body", "results", i, "manifest"]
                  for i, result in enumerate(run.results)
                  if result.status == "ok" and not result.tensors and result.manifest}
    known = repository.existing_manifests(session, referenced)
    vanished = [{"loc": loc, "msg": f"unknown manifest {digest}: the server no longer has it, "
                                    "send the result's tensors"}
                for digest, loc in referenced.items() if digest not in known]
    vanished.extend(traces.vanished_traces(session, run))
    if vanished:
        raise InvalidDocument(vanished)


def _replay(session: Session, existing: Run, sha256: str) -> Ingested:
    if existing.document_sha256 != sha256:
        raise Conflict(
            f"run {existing.run_id!r} was already uploaded with different content; "
            "a run_id identifies one document"
        )
    count = repository.count_results(session, existing.id)
    return Ingested(RunCreated(id=existing.id, run_id=existing.run_id, results=count),
                         created=False)


def _store(session: Session, run: RunDocument, sha256: str,
           digests: Sequence[str | None], bodies: Mapping[str, traces.NewTrace]) -> RunCreated:
    """Write the run with a fixed, small number of statements, whatever its size.

    Core inserts (no ORM unit of work): rows that are content-addressed (environments,
    manifests, fingerprints) are looked up first and only the new ones are built and
    sent, so a run on a known environment writes its run row, its result rows and the
    `latest` pointers, and little else.
    """
    now = utcnow()
    # Where this run stands among the node's runs: its start, but never later than its
    # receipt. A clock ahead (or a forged start within the allowed skew) then cannot keep
    # a later honest run from becoming the node's latest; a spooled run that arrives late
    # still does not hide a newer one (design §3.1).
    ordered_at = min(as_utc(run.started_at), now)
    environment_id = repository.find_environment(session, run.environment.env_key)
    if environment_id is None:
        environment = run.environment.model_dump(mode="json")
        environment_id = repository.ensure_environment(
            session, row={"env_key": run.environment.env_key, "document": environment,
                          "first_seen": now, **promoted_columns(environment)},
        )
    node_id = repository.upsert_node(session, name=run.node.name, labels=run.node.labels,
                                     seen_at=now, environment_id=environment_id,
                                     started_at=ordered_at)
    # First, so a run_id already stored fails here (IntegrityError) before any other work.
    run_pk = repository.insert_run(session, {
        "run_id": run.run_id, "node_id": node_id, "environment_id": environment_id,
        "started_at": run.started_at, "finished_at": run.finished_at,
        "agent_version": run.agent_version, "document_sha256": sha256, "drill": run.drill,
        "received_at": now, "telemetry": _telemetry(run),
    })
    # The node's row is locked now (its upsert): its latest rows move only here.
    held_before = counts.node_rows(session, node_id)
    device_ids, models, gone, claimed = _devices(session, run, node_id=node_id,
                                                 started_at=ordered_at, now=now)
    _store_fingerprints(session, run, now=now)
    result_manifest = _manifests(session, run, digests, now=now)
    traces.store_traces(session, run, bodies, now=now)
    outcomes = [_outcome_row(result, digest)
                for result, digest in zip(run.results, result_manifest, strict=True)]
    outcome_ids = repository.ensure_outcomes(session, outcomes)
    result_ids = repository.insert_results(session, [
        {"run_pk": run_pk, "outcome_id": outcome_ids[outcome["hash"]], "wall_s": result.wall_s,
         "wall_s_spread": result.wall_s_spread, "device_id": device_ids[result.device],
         "nondeterminism": (result.nondeterminism.model_dump(mode="json", exclude_none=True)
                            if result.nondeterminism is not None else None),
         "compiled": _compiled_record(result)}
        for outcome, result in zip(outcomes, run.results, strict=True)
    ])

    # Within one document the last result of a key wins (one per device at most; two
    # slots of one device, which only a forged document has, keep the last).
    latest: dict[tuple[int, str, str, str], dict[str, Any]] = {}
    for result, result_id, outcome in zip(run.results, result_ids, outcomes, strict=True):
        device_id = device_ids[result.device]
        latest[(device_id, result.suite, result.workload, result.variant)] = {
            "node_id": node_id, "device_id": device_id, "suite": result.suite,
            "workload": result.workload,
            "variant": result.variant, "result_id": result_id, "started_at": ordered_at,
            "outcome_id": outcome_ids[outcome["hash"]], "environment_id": environment_id,
            "model": models[result.device], "wall_s": result.wall_s,
            "wall_s_spread": result.wall_s_spread,
        }
    repository.upsert_latest(session, list(latest.values()))
    # Last: the counts are the rows concurrent uploads share, locked until the commit.
    counts.move(session, node=run.node.name, before=held_before,
                after=counts.after_upload(held_before, gone=gone, rows=latest.values()))
    if claimed:
        log.warning("node %r claims %s, which belong to other nodes: kept as its claim "
                    "until an admin runs `numparity-server device move`", run.node.name,
                    ", ".join(claimed))
    return RunCreated(id=run_pk, run_id=run.run_id, results=len(result_ids),
                      claimed_devices=claimed)


def _devices(session: Session, run: RunDocument, *, node_id: int, started_at: datetime,
             now: datetime) -> tuple[dict[str, int], dict[str, str], list[int], list[str]]:
    """slot → devices.id, and slot → model, of every slot the run's results name
    (runs.devices); a GPU of this node that the node's newest run no longer sees leaves
    the node (the third: those devices, whose latest rows went); the identities of
    devices that belong to other nodes, kept as this node's claims (the fourth)."""
    seen = seen_devices(run)
    unique = serials_unique(seen)
    ids, claimed = repository.resolve_devices(session, node_id=node_id, started_at=started_at,
                                     seen_at=now, rows=[{
        "identity": device.identity(node_id, serial_unique=unique[slot]),
        "type": device.type, "model": device.model, "uuid": device.uuid,
        "serial": device.serial, "pci_bus_id": device.pci_bus_id, "name": device.name,
        "compute_capability": device.compute_capability, "mig": device.mig, "slot": slot,
    } for slot, device in seen.items()])
    visible = visible_uuids(run)
    gone = [] if visible is None else repository.detach_devices(
        session, node_id=node_id, started_at=started_at, visible_uuids=visible)
    return ids, {slot: device.model for slot, device in seen.items()}, gone, claimed


def _manifests(session: Session, run: RunDocument, digests: Sequence[str | None], *,
               now: Any) -> list[str | None]:
    """Each ok result's manifest hash (None for the others), storing the new manifests;
    `digests` are the hashes of the results' tensors (tensor_manifests).

    A result carries its tensors (the manifest is built from them; a `manifest` sent
    beside them must match) or only the hash of a manifest the server already has.
    """
    manifests: dict[str, list[tuple[str, str, str]]] = {}
    referenced: dict[str, list[str | int]] = {}
    result_manifest: list[str | None] = []
    mismatched = []
    for i, (result, tensors_digest) in enumerate(zip(run.results, digests, strict=True)):
        if result.status != "ok":
            result_manifest.append(None)
            continue
        if result.tensors or result.manifest is None:
            triples = [(t.name, t.kind, t.hash) for t in _ordered(result.tensors)]
            digest = tensors_digest or manifest_hash(triples)  # no tensors: the empty list
            if result.manifest is not None and result.manifest != digest:
                mismatched.append({"loc": ["body", "results", i, "manifest"],
                                   "msg": f"manifest {result.manifest} is not the hash of this "
                                          f"result's tensors ({digest})"})
            manifests.setdefault(digest, triples)
        else:
            digest = result.manifest
            referenced.setdefault(digest, ["body", "results", i, "manifest"])
        result_manifest.append(digest)
    if mismatched:
        raise InvalidDocument(mismatched)
    known = repository.existing_manifests(session, [*manifests, *referenced])
    unknown = [{"loc": loc, "msg": f"unknown manifest {digest}: the server does not have it, "
                                   "send the result's tensors"}
               for digest, loc in referenced.items() if digest not in known
               and digest not in manifests]
    if unknown:
        raise InvalidDocument(unknown)
    repository.insert_manifests(session, [
        {"hash": digest, "entries": [{"name": n, "kind": k, "hash": h}
                                     for n, k, h in manifests[digest]],
         "tensor_count": len(manifests[digest]), "created_at": now}
        for digest in sorted(manifests) if digest not in known
    ])
    return result_manifest


def _ordered(tensors: list[TensorEntry]) -> list[TensorEntry]:
    return [t for _, t in sorted(enumerate(tensors), key=lambda it: (it[1].order, it[0]))]


def _store_fingerprints(session: Session, run: RunDocument, *, now: Any) -> None:
    full: dict[str, TensorEntry] = {}
    bare: list[tuple[list[str | int], TensorEntry]] = []
    for i, result in enumerate(run.results):
        for j, tensor in enumerate(result.tensors):
            # Validation guarantees a full fingerprint has a dtype: no dtype means bare
            # (cheaper than TensorEntry.is_bare, which is hot here at ~400 tensors a run).
            if tensor.dtype is None:
                bare.append((["body", "results", i, "tensors", j, "hash"], tensor))
            else:
                full.setdefault(tensor.hash, tensor)
    known = repository.existing_fingerprints(
        session, [*full, *(tensor.hash for _, tensor in bare)]
    )
    unknown = [(loc, t) for loc, t in bare if t.hash not in known and t.hash not in full]
    if unknown:
        raise InvalidDocument([
            {"loc": loc, "msg": f"unknown fingerprint {t.hash} of tensor {t.name!r}: the server "
                                "does not have it, send the full fingerprint"}
            for loc, t in unknown
        ])
    # Sorted by hash: concurrent ingests then take row locks in one order (no deadlock).
    # Fingerprints the server already has are neither rebuilt nor sent again.
    repository.insert_fingerprints(
        session,
        [fingerprint_row(full[h], now=now) for h in sorted(full) if h not in known],
    )
    # The full values of a known large tensor, sent because the server asked for them:
    # filled into its row once (the schema checked them against the hash).
    repository.fill_values(session, [
        {"hash": h, **_values_columns(full[h]), **_stats_columns(full[h])}
        for h in sorted(full) if h in known and full[h].values is not None
    ])


def fingerprint_row(tensor: TensorEntry, *, now: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"hash": tensor.hash, "dtype": tensor.dtype, "shape": tensor.shape,
                           "created_at": now}
    row.update(_stats_columns(tensor))
    for name in ("sketch", "sample"):
        array = getattr(tensor, name)
        row[name] = array.raw if array is not None else None
        row[f"{name}_dtype"] = array.dtype if array is not None else None
    row.update(_values_columns(tensor))
    return row


def _stats_columns(tensor: TensorEntry) -> dict[str, Any]:
    """The statistics columns: those the values give when they travel (validation
    checked the declared ones against them, TensorEntry), else those declared."""
    stats = tensor.stats.model_dump() if tensor.stats is not None else {}
    return {field: stats.get(field) for field in STAT_FIELDS}


def _values_columns(tensor: TensorEntry) -> dict[str, Any]:
    """The ``values`` columns: a large tensor's values compressed (zlib at its fastest
    level: float data shrinks by a tenth to a half, and the server reads them rarely)."""
    if tensor.values is None:
        return {"values": None, "values_dtype": None, "values_codec": None}
    raw = tensor.values.raw
    if len(raw) <= VALUES_ALWAYS_MAX * 8:
        return {"values": raw, "values_dtype": tensor.values.dtype, "values_codec": None}
    return {"values": zlib.compress(raw, 1), "values_dtype": tensor.values.dtype,
            "values_codec": "zlib"}


def _outcome_row(result: ResultDoc, digest: str | None) -> dict[str, Any]:
    """Everything a result says but its timing, keyed by the sha256 of its canonical JSON."""
    row = {
        "suite": result.suite, "workload": result.workload,
        "workload_version": result.workload_version, "variant": result.variant,
        "device": result.device, "status": result.status, "reason": result.reason,
        "error": result.error, "input_hash": result.input_hash,
        "param_hash": result.param_hash, "manifest_hash": digest, "repeats": result.repeats,
        "repeats_agree": result.repeats_agree, "knobs": result.knobs,
    }
    # Only a traced result's hash covers its trace: outcomes stored before traces existed
    # keep their hashes, so an agent without --trace-ops adds no new outcome rows.
    if result.trace is not None:
        row["trace_hash"] = result.trace
    if result.checks is not None:  # the same for checks
        row["checks"] = {name: check.model_dump(mode="json")
                         for name, check in result.checks.items()}
    row["hash"] = content_hash(row)
    for column in ("trace_hash", "checks"):  # every row of the bulk insert has every column
        row.setdefault(column, None)
    return row


_PROMOTED_LENGTHS = {"gpu_name": 255, "compute_capability": 16, "driver": 64, "cuda": 64,
                     "cudnn": 64, "torch": 64, "cpu_capability": 64, "cpu_model": 255}


def promoted_columns(environment: dict[str, Any]) -> dict[str, str | None]:
    """The attributes inventories filter on, lifted out of the environment document."""

    def section(value: Any) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    gpus = environment.get("gpus")
    gpu = section(gpus[0]) if isinstance(gpus, list) and gpus else {}
    torch = section(environment.get("torch"))
    cpu = section(environment.get("cpu"))
    values = {
        "gpu_name": gpu.get("name"),
        "compute_capability": gpu.get("compute_capability"),
        "driver": gpu.get("driver"),
        "cuda": torch.get("cuda"),
        "cudnn": torch.get("cudnn"),
        "torch": torch.get("version"),
        "cpu_capability": cpu.get("capability"),
        "cpu_model": cpu.get("model"),
    }
    return {name: None if value is None else str(value)[: _PROMOTED_LENGTHS[name]]
            for name, value in values.items()}


def missing_fingerprints(*, session: Session, hashes: Sequence[str],
                         manifests: Sequence[str] = (), values: Sequence[str] = (),
                         trace_hashes: Sequence[str] = (),
                         max_body_bytes: int | None = None) -> MissingOut:
    """What the server lacks of what an agent is about to send (tensors, manifests, op
    traces). ``values``: hashes of
    large tensors whose full values the agent holds; the server wants every one it does
    not hold yet (no blind spots: any two differing answers are then compared on their
    full values), so a hash's values travel once, from the first node that has them.
    ``max_body_bytes``: the server's body limit, which the agent sizes its requests by."""
    wanted = list(dict.fromkeys(hashes))
    known = repository.existing_fingerprints(session, wanted)
    wanted_manifests = list(dict.fromkeys(manifests))
    known_manifests = repository.existing_manifests(session, wanted_manifests)
    offered = list(dict.fromkeys(values))
    held = repository.fingerprints_with_values(session, offered)
    wanted_traces = list(dict.fromkeys(trace_hashes))
    known_traces = repository.existing_traces(session, wanted_traces)
    return MissingOut(missing=[h for h in wanted if h not in known],
                      missing_manifests=[m for m in wanted_manifests if m not in known_manifests],
                      missing_values=[h for h in offered if h not in held],
                      missing_traces=[t for t in wanted_traces if t not in known_traces],
                      max_body_bytes=max_body_bytes)


def run_summary(*, session: Session, run_id: str) -> RunSummary:
    found = repository.run_summary_rows(session, run_id)
    if found is None:
        raise NotFound(f"no run with run_id {run_id!r}")
    run, node_name, env_key, results = found
    sizes = repository.manifest_sizes(session, [r.manifest_hash for r, _ in results
                                                if r.manifest_hash])
    return RunSummary(
        id=run.id, run_id=run.run_id, node=node_name, env_key=env_key,
        agent_version=run.agent_version, started_at=run.started_at,
        finished_at=run.finished_at, received_at=run.received_at, drill=run.drill,
        results=[
            ResultSummary(
                suite=r.suite, workload=r.workload, workload_version=r.workload_version,
                variant=r.variant, device=r.device, status=r.status, reason=r.reason,
                error=r.error, manifest_hash=r.manifest_hash, trace_hash=r.trace_hash,
                tensors=sizes.get(r.manifest_hash, 0) if r.manifest_hash else 0,
                repeats=r.repeats, repeats_agree=r.repeats_agree, wall_s=wall_s,
            )
            for r, wall_s in results
        ],
    )


def list_runs(*, session: Session, node: str | None, limit: int, offset: int
              ) -> Page[RunListItem]:
    total, rows = repository.list_runs(session, node=node, limit=limit, offset=offset)
    return Page[RunListItem](
        items=[RunListItem.model_validate(row, from_attributes=True) for row in rows],
        total=total, limit=limit, offset=offset,
    )
