"""Pinned answers (design §3.11): pin and unpin, list, and the pins in force as the
analysis reads them (``drift`` and ``check`` read them too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server.analysis import goldens as rules
from numparity_server.goldens import repository
from numparity_server.goldens.schemas import (
    GoldenOut,
    GoldenPage,
    LeftOut,
    PinIn,
    PinnedAnswerOut,
    PinRef,
)
from numparity_server.kit.db import writing
from numparity_server.kit.errors import Conflict, InvalidDocument, NotFound
from numparity_server.models import Golden, GoldenAnswer


def pin(*, session: Session, request: PinIn, pinned_by: str) -> GoldenOut:
    """A new version of the pin (suite, model, scope) holding the answers asked for.
    InvalidDocument naming the field when nothing can be pinned; NotFound for an
    unknown run, node or environment."""
    if request.source == "run":
        model, scope, answers, left_out = _from_run(session, request)
    else:
        model, scope, answers, left_out = _from_majority(session, request)
    if not answers:
        reasons = "; ".join(f"{o.workload}/{o.variant}: {o.reason}" for o in left_out)
        raise InvalidDocument.at(["body", "source"], "nothing to pin: no ok answer in scope"
                                 + (f" ({reasons})" if reasons else ""))
    created = _add_version(session, suite=request.suite, model=model, scope=scope, row={
        "source": request.source, "source_run_id": request.run_id,
        "source_device": request.device if request.source == "run" else None,
        "reason": request.reason, "pinned_by": pinned_by[:255]}, answers=answers)
    return _out(session, created, with_answers=True, left_out=left_out)


def unpin(*, session: Session, golden_id: int, reason: str, pinned_by: str) -> GoldenOut:
    """A version that unpins the subject of pin ``golden_id`` (any of its versions)."""
    found = repository.golden(session, golden_id)
    if found is None:
        raise NotFound(f"no pin with id {golden_id}")
    newest = repository.newest_of_subject(session, found.subject)
    if newest is not None and newest.retired:
        raise Conflict(f"pin {golden_id}'s subject is already unpinned (version "
                       f"{newest.version}, id {newest.id})")
    created = _add_version(session, suite=found.suite, model=found.model, scope=found.scope,
                           row={"source": "unpin", "source_run_id": None,
                                "source_device": None, "retired": True, "reason": reason,
                                "pinned_by": pinned_by[:255]}, answers=[])
    return _out(session, created, with_answers=True)


def list_pins(*, session: Session, suite: str | None, model: str | None, in_force: bool,
              limit: int, offset: int) -> GoldenPage:
    rows, total = repository.list_goldens(session, suite=suite, model=model,
                                          in_force=in_force, limit=limit, offset=offset)
    counts = repository.answer_counts(session, [row.id for row in rows])
    forced = _in_force_ids(session)
    return GoldenPage(items=[_out(session, row, counts=counts, forced=forced) for row in rows],
                      total=total, limit=limit, offset=offset)


def get_pin(*, session: Session, golden_id: int) -> GoldenOut:
    found = repository.golden(session, golden_id)
    if found is None:
        raise NotFound(f"no pin with id {golden_id}")
    return _out(session, found, with_answers=True)


def pins_in_force(session: Session) -> list[rules.Pin]:
    """The pins in force, as the analysis reads them."""
    rows = repository.pins_in_force(session)
    answers = repository.answers_of(session, [row.id for row in rows])
    return [rules.Pin(row.id, row.version, row.suite, row.model, dict(row.scope), {
        (a.workload, a.variant): rules.PinnedAnswer(a.workload, a.workload_version, a.variant,
                                                    a.manifest_hash, a.input_hash,
                                                    a.param_hash)
        for a in answers.get(row.id, [])}) for row in rows]


def pin_ref(session: Session, pin_id: int) -> PinRef:
    row = repository.golden(session, pin_id)
    assert row is not None
    return _ref(row)


# ---- pinning -------------------------------------------------------------------------


Answers = list[dict[str, Any]]


def _from_run(session: Session, request: PinIn
              ) -> tuple[str, dict[str, str | None], Answers, list[LeftOut]]:
    if not request.run_id:
        raise InvalidDocument.at(["body", "run_id"], "source=run needs the run's run_id")
    found = repository.run_results(session, request.run_id)
    if found is None:
        raise NotFound(f"no run {request.run_id!r}")
    run, results = found
    results = [r for r in results if r.suite == request.suite]
    slots = list(dict.fromkeys(r.device for r in results))
    models = {r.device: r.model or ("cpu" if r.device == "cpu" else r.device) for r in results}
    if request.device is not None:
        if request.device not in slots:
            raise InvalidDocument.at(["body", "device"], f"run {request.run_id} has no "
                                     f"{request.suite} result on {request.device}; its devices: "
                                     f"{', '.join(slots) or 'none'}")
        slot = request.device
    else:
        candidates = [s for s in slots if request.model is None or models[s] == request.model]
        if not candidates:
            raise InvalidDocument.at(["body", "model"], f"run {request.run_id} has no device "
                                     f"of model {request.model}; its devices: "
                                     + ", ".join(f"{s} ({models[s]})" for s in slots))
        slot = candidates[0]
    model = models[slot]
    if request.model is not None and request.model != model:
        raise InvalidDocument.at(["body", "model"], f"{slot} of run {request.run_id} is a "
                                 f"{model}, not a {request.model}")
    request.device = slot
    scope = _scope(request, model, run.env_key, repository.promoted(run))
    answers: Answers = []
    left_out: list[LeftOut] = []
    for result in results:
        if result.device != slot or not _wanted(request, result.workload, result.variant):
            continue
        if result.status != "ok" or not result.manifest_hash:
            left_out.append(LeftOut(workload=result.workload, variant=result.variant,
                                    reason=f"{result.status} in that run"))
            continue
        answers.append({"workload": result.workload,
                        "workload_version": result.workload_version,
                        "variant": result.variant, "manifest_hash": result.manifest_hash,
                        "input_hash": result.input_hash, "param_hash": result.param_hash,
                        "holders": 1, "devices": 1})
    return model, scope, answers, left_out


def _from_majority(session: Session, request: PinIn
                   ) -> tuple[str, dict[str, str | None], Answers, list[LeftOut]]:
    environment = None
    if request.env_key is not None:
        environment = repository.environment_by_key(session, request.env_key)
        if environment is None:
            raise NotFound(f"no environment {request.env_key!r}")
    elif request.node is not None:
        environment = repository.node_environment(session, request.node)
        if environment is None:
            raise NotFound(f"no node {request.node!r} with a run")
    elif request.scope == "environment" or not request.match:
        raise InvalidDocument.at(["body", "env_key"], "source=majority needs the environment "
                                 "(env_key or node) whose stack is pinned, or a stack given "
                                 "whole with match and model")
    model = request.model
    if model is None:
        if environment is None:
            raise InvalidDocument.at(["body", "model"], "name the device model of the stack")
        models = sorted({h.model for h in repository.holdings(
            session, suite=request.suite, environment_ids=[environment.id])
            if h.status == "ok"})
        if len(models) != 1:
            raise InvalidDocument.at(["body", "model"], "name the device model: environment "
                                     f"{environment.env_key[:12]} has "
                                     + (", ".join(models) or "no results"))
        model = models[0]
    if environment is not None:
        scope = _scope(request, model, environment.env_key, repository.promoted(environment))
    else:
        scope = _checked_scope(dict(request.match))
    in_scope = [env_id for env_id, (env_key, promoted) in repository.environments(session).items()
                if rules.in_scope(scope, env_key, promoted)]
    held = [a for a in repository.node_answers(session, suite=request.suite, model=model,
                                               environment_ids=in_scope)
            if _wanted(request, a.workload, a.variant)]
    answers: Answers = []
    left_out: list[LeftOut] = []
    # Nodes vote (``majority_answers``): one node's devices, versions or uploads never
    # make the answer a pin holds.
    for (workload, variant), found in rules.majority_answers(held).items():
        if found.answer is None:
            left_out.append(LeftOut(workload=workload, variant=variant,
                                    reason=found.note or "no majority"))
            continue
        answer = found.answer
        answers.append({"workload": workload, "workload_version": answer.workload_version,
                        "variant": variant, "manifest_hash": answer.manifest_hash,
                        "input_hash": answer.input_hash, "param_hash": answer.param_hash,
                        "holders": found.holders, "devices": found.devices,
                        "held_by": list(found.held_by)})
    return model, scope, answers, left_out


def _wanted(request: PinIn, workload: str, variant: str) -> bool:
    return ((not request.workloads or workload in request.workloads)
            and (not request.variants or variant in request.variants))


def _scope(request: PinIn, model: str, env_key: str, promoted: Mapping[str, str | None]
           ) -> dict[str, str | None]:
    if request.scope == "environment":
        if request.match:
            raise InvalidDocument.at(["body", "match"], "scope=environment pins one env_key: "
                                     "match belongs to a stack")
        return {rules.ENV_KEY: env_key}
    return _checked_scope({**rules.default_scope(model, promoted), **request.match})


def _checked_scope(scope: Mapping[str, Any]) -> dict[str, str | None]:
    try:
        return rules.check_scope(scope)
    except rules.ScopeError as exc:
        raise InvalidDocument.at(["body", "match"], str(exc)) from None


def _add_version(session: Session, *, suite: str, model: str, scope: Mapping[str, Any],
                 row: dict[str, Any], answers: Answers) -> Golden:
    subject = rules.subject(suite, model, scope)
    try:
        with writing(session):
            newest = repository.newest_of_subject(session, subject)
            return repository.add_golden(session, {
                "subject": subject, "suite": suite, "model": model, "scope": dict(scope),
                "version": (newest.version + 1) if newest is not None else 1,
                "retired": False, **row}, answers)
    except IntegrityError:
        # Two pins of one subject at once: the unique (subject, version) keeps one.
        raise Conflict("this pin was changed at the same moment: ask again") from None


# ---- views ---------------------------------------------------------------------------


def _in_force_ids(session: Session) -> set[int]:
    return {row.id for row in repository.pins_in_force(session)}


def _ref(row: Golden) -> PinRef:
    return PinRef(id=row.id, version=row.version, model=row.model, scope=dict(row.scope),
                  scope_text=rules.describe_scope(row.scope), pinned_by=row.pinned_by,
                  pinned_at=row.pinned_at, reason=row.reason)


def _out(session: Session, row: Golden, *, with_answers: bool = False,
         counts: Mapping[int, int] | None = None, forced: set[int] | None = None,
         left_out: list[LeftOut] | None = None) -> GoldenOut:
    answers: list[GoldenAnswer] | None = None
    if with_answers:
        answers = repository.answers_of(session, [row.id]).get(row.id, [])
        count = len(answers)
    else:
        count = (counts or {}).get(row.id, 0)
    forced = forced if forced is not None else _in_force_ids(session)
    return GoldenOut(
        id=row.id, subject=row.subject, suite=row.suite, model=row.model,
        scope=dict(row.scope), scope_text=rules.describe_scope(row.scope),
        version=row.version, retired=row.retired, in_force=row.id in forced,
        source=row.source,  # type: ignore[arg-type]
        source_run_id=row.source_run_id, source_device=row.source_device, reason=row.reason,
        pinned_by=row.pinned_by, pinned_at=row.pinned_at, answers_count=count,
        answers=None if answers is None else [PinnedAnswerOut.model_validate(
            {name: getattr(a, name) for name in PinnedAnswerOut.model_fields})
            for a in answers],
        left_out=left_out)
