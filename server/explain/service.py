"""`explain`'s side on the server (design §2.11, §3.2): the reference a node reads to
reproduce another run's bits, and the findings it posts back.

The reference reveals only what the search needs (the results' tensor hashes and the
run's numeric environment), so an agent token, even one bound to its own node, may read
any run: explaining against another node is the point, and nothing a reader route shows
of that node (its name, labels, statistics, values, device identities) is in it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server.explain import repository
from numparity_server.explain.schemas import (
    SUPPORTED_SCHEMAS,
    ExplanationDocument,
    ExplanationsStored,
    ReferenceCpu,
    ReferenceEnvironment,
    ReferenceGpu,
    ReferenceOut,
    ReferenceResult,
    ReferenceTensor,
    ReferenceThreads,
    ReferenceTorch,
)
from numparity_server.kit.db import writing
from numparity_server.kit.errors import InvalidDocument, NotFound, UnsupportedSchema
from numparity_server.kit.pagination import Page
from numparity_server.reads import explanations as reads
from numparity_server.reads.explanations import ExplanationOut

# Variables of the environment's env_vars the reference leaves out: they say which
# devices a process sees (possibly by GPU UUID), not how it computes, and explain never
# tries them.
_NOT_NUMERIC_SETTINGS = frozenset({"CUDA_VISIBLE_DEVICES"})
# An eager-target finding restores the same run's answer of this variant (design §2.14;
# `compiled.service.EAGER_VARIANT`, not imported: one domain's service never imports
# another's).
TARGET_EAGER, EAGER_VARIANT = "eager", "default"


def reference(*, session: Session, run_id: str, workload: str | None = None,
              variant: str | None = None) -> ReferenceOut:
    """Run ``run_id`` as explain reads it (three queries: the run with its environment,
    its ok results, their manifests)."""
    run = repository.reference_run(session, run_id)
    if run is None:
        raise NotFound(f"no run with run_id {run_id!r}")
    results = repository.ok_results(session, run.pk, workload=workload, variant=variant)
    entries = repository.manifests(session, {r.manifest_hash for r in results})
    return ReferenceOut(
        run_id=run.run_id,
        environment=reference_environment(run.env_key, run.environment),
        results=[
            ReferenceResult(
                suite=r.suite, workload=r.workload, workload_version=r.workload_version,
                variant=r.variant, device=r.device, status="ok", input_hash=r.input_hash,
                param_hash=r.param_hash,
                tensors=[ReferenceTensor(name=e["name"], kind=e["kind"], hash=e["hash"])
                         for e in entries.get(r.manifest_hash, ())],
            )
            for r in results
        ],
    )


def reference_environment(env_key: str, document: dict[str, Any]) -> ReferenceEnvironment:
    """The numeric part of a stored environment document, field by field.

    The document is the first reporter's, free-form beyond ``env_key`` (design §2.5): a
    value of another type than the agent writes reads as null (or is left out of a
    mapping) rather than failing the answer.
    """
    def section(name: str) -> dict[str, Any]:
        value = document.get(name)
        return value if isinstance(value, dict) else {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    def integer(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def flag(value: Any) -> bool | None:
        return value if isinstance(value, bool) else None

    threads, cpu, torch = section("threads"), section("cpu"), section("torch")
    gpus = document.get("gpus")
    cudnn = torch.get("cudnn")
    return ReferenceEnvironment(
        env_key=env_key,
        env_vars={name: value for name, value in section("env_vars").items()
                  if isinstance(value, str) and name not in _NOT_NUMERIC_SETTINGS},
        threads=ReferenceThreads(num_threads=integer(threads.get("num_threads")),
                                 num_interop_threads=integer(threads.get("num_interop_threads"))),
        knobs={name: value for name, value in section("knobs").items()
               if value is None or isinstance(value, (bool, int, float, str))},
        cpu=ReferenceCpu(model=text(cpu.get("model")), capability=text(cpu.get("capability")),
                         logical_cpus=integer(cpu.get("logical_cpus"))),
        torch=ReferenceTorch(
            version=text(torch.get("version")), git_version=text(torch.get("git_version")),
            cuda=text(torch.get("cuda")),
            cudnn=cudnn if integer(cudnn) is not None or isinstance(cudnn, str) else None,
            mkl_available=flag(torch.get("mkl_available")),
            mkldnn_available=flag(torch.get("mkldnn_available"))),
        gpus=[ReferenceGpu(name=text(gpu.get("name")),
                           compute_capability=text(gpu.get("compute_capability")))
              for gpu in (gpus if isinstance(gpus, list) else []) if isinstance(gpu, dict)],
    )


def node_name(document: dict[str, Any]) -> str:
    """The findings' node as sent, read before validation for the token's node binding
    (as ``runs.service.node_name``): anything but a string reads as "", which no binding
    admits and validation refuses."""
    name = document.get("node")
    return name if isinstance(name, str) else ""


def validate_explanation(document: dict[str, Any]) -> ExplanationDocument:
    schema = document.get("schema")
    if schema is None:
        raise InvalidDocument.at(["body", "schema"], "Field required")
    if schema not in SUPPORTED_SCHEMAS:
        raise UnsupportedSchema(
            f"unsupported schema {schema!r}; supported: {', '.join(SUPPORTED_SCHEMAS)}")
    try:
        return ExplanationDocument.model_validate(document)
    except ValidationError as exc:
        raise InvalidDocument(
            [{"loc": ["body", *e["loc"]], "msg": e["msg"]} for e in exc.errors()]) from None


def store_explanations(*, session: Session, document: dict[str, Any]) -> ExplanationsStored:
    """Store each finding of a ``numparity.explain/v1`` document as a row; 422 naming the
    field when its node never uploaded a run, its ``against`` is not a stored run, or a
    finding is not about an ok result of that run."""
    explanation = validate_explanation(document)
    node = repository.node_by_name(session, explanation.node)
    run = repository.reference_run(session, explanation.against)
    problems: list[dict[str, Any]] = []
    if node is None:
        problems.append({"loc": ["body", "node"], "msg": (
            f"node {explanation.node!r} has uploaded no run: findings are stored for a node "
            "the server knows (numparity-agent run, with the same --node, first)")})
    if run is None:
        problems.append({"loc": ["body", "against"],
                         "msg": f"no run with run_id {explanation.against!r}"})
    if node is None or run is None:
        raise InvalidDocument(problems)
    versions = {(r.suite, r.workload, r.variant, r.device): r.workload_version
                for r in repository.ok_results(session, run.pk)}
    for index, finding in enumerate(explanation.findings):
        suite, workload, variant, device = finding.key
        if finding.key not in versions:
            problems.append({"loc": ["body", "findings", index], "msg": (
                f"run {run.run_id!r} has no ok result of {suite}/{workload}/{variant} on "
                f"device {device!r}")})
        elif explanation.target == TARGET_EAGER and (
                (suite, workload, EAGER_VARIANT, device) not in versions):
            # Eager's bits are the same run's default answer on the same device.
            problems.append({"loc": ["body", "findings", index], "msg": (
                f"run {run.run_id!r} has no ok {EAGER_VARIANT} result of {suite}/{workload} "
                f"on device {device!r}: no eager answer to restore")})
    if problems:
        raise InvalidDocument(problems)
    # Where the findings hold: the environment explain computed in when the server knows
    # it (an explain run from another shell may not be the node's newest environment).
    environment_id = (repository.environment_id(session, explanation.env_key)
                      if explanation.env_key else None) or node.environment_id
    rows = [{
        "node_id": node.id, "environment_id": environment_id,
        "against_run_pk": run.pk, "against_node_id": run.node_id,
        "target": explanation.target,
        "suite": finding.suite, "workload": finding.workload,
        # The reference's version, as stored (the agent copies it from the reference).
        "workload_version": versions[finding.key],
        "variant": finding.variant, "device": finding.device,
        "local_device": explanation.device, "status": finding.status,
        "label": finding.label,
        "setting": None if finding.setting is None else finding.setting.model_dump(),
        "closest": None if finding.closest is None else finding.closest.model_dump(),
        "detail": finding.detail, "tried": finding.tried, "seconds": finding.seconds,
    } for finding in explanation.findings]
    try:
        with writing(session):
            repository.insert_explanations(session, rows)
    except IntegrityError:
        # The run was dropped (retention) between the look-up and the insert.
        raise InvalidDocument.at(["body", "against"], (
            f"no run with run_id {explanation.against!r}: it was removed while the "
            "findings were stored")) from None
    return ExplanationsStored(stored=len(rows))


def list_explanations(*, session: Session, node: str | None, against_node: str | None,
                      workload: str | None, variant: str | None, limit: int, offset: int,
                      target: str | None = None) -> Page[ExplanationOut]:
    total, items = reads.list_explanations(session, node=node, against_node=against_node,
                                           workload=workload, variant=variant,
                                           target=target, limit=limit, offset=offset)
    return Page[ExplanationOut](items=items, total=total, limit=limit, offset=offset)
