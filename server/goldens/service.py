"""Pinned answers (design §3.11): pin and unpin, list, the drift of the fleet from its pins
(for the audit and /divergence) and the answers `numparity-agent check` compares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import goldens as rules
from numparity_server.analysis.policy import Policy
from numparity_server.goldens import repository
from numparity_server.goldens.schemas import (
    AgainstPin,
    CheckAnswer,
    CheckDevice,
    CheckPlan,
    DivergencePin,
    GoldenOut,
    GoldenPage,
    LeftOut,
    PinDriftRow,
    PinIn,
    PinnedAnswerOut,
    PinRef,
)
from numparity_server.kit.db import writing
from numparity_server.kit.errors import Conflict, InvalidDocument, NotFound
from numparity_server.models import Golden, GoldenAnswer
from numparity_server.reads.fingerprints import load_fingerprints
from numparity_server.reads.results import manifest_entries

# The tensors' hashes `check` is given: 16 hex digits (64 bits) name a tensor's bytes
# among a fleet's answers as surely as the whole hash, at a quarter of the size.
CHECK_HASH_CHARS = 16


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
    held = [h for h in repository.holdings(session, suite=request.suite, models=[model],
                                           environment_ids=in_scope)
            if _wanted(request, h.workload, h.variant)]
    answers: Answers = []
    left_out: list[LeftOut] = []
    for (workload, variant), found in rules.majority_answers(held).items():
        if found.answer is None:
            left_out.append(LeftOut(workload=workload, variant=variant,
                                    reason=found.note or "no majority"))
            continue
        answer = found.answer
        answers.append({"workload": workload, "workload_version": answer.workload_version,
                        "variant": variant, "manifest_hash": answer.manifest_hash,
                        "input_hash": answer.input_hash, "param_hash": answer.param_hash,
                        "holders": found.holders, "devices": found.devices})
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


# ---- drift ---------------------------------------------------------------------------


class _Against:
    """Answers compared with pinned ones, each pair once per request."""

    def __init__(self, session: Session, policy: Policy) -> None:
        self.session, self.policy = session, policy
        self.found: dict[tuple[str, str], AgainstPin] = {}

    def __call__(self, workload: str, pinned: str, answer: str) -> AgainstPin:
        if (pinned, answer) not in self.found:
            self.found[(pinned, answer)] = self._compare(workload, pinned, answer)
        return self.found[(pinned, answer)]

    def _compare(self, workload: str, pinned: str, answer: str) -> AgainstPin:
        entries = manifest_entries(self.session, [pinned, answer])
        if pinned not in entries or answer not in entries:
            return AgainstPin(verdict=None, decided_by=None, first_divergent_layer=None,
                              max_abs=None)
        reference, candidate = (_tensors(entries[pinned]), _tensors(entries[answer]))
        fingerprints = load_fingerprints(self.session, {h for _n, _k, h in
                                                        (*reference, *candidate)})
        rows = analysis.compare_manifests(
            candidate, reference, fingerprints,
            tolerance_for=lambda dtype: self.policy.tolerance(workload, dtype))
        decided = analysis.result_verdict(rows)
        layer = analysis.first_divergent_layer([r for r in rows if r["kind"] == "layer"])
        deciding = next((r for r in rows if decided is not None
                         and r["name"] == decided.tensor), None)
        max_abs = (deciding or {}).get("metrics", {}) or {}
        return AgainstPin(verdict=decided.verdict if decided else None,
                          decided_by=decided.tensor if decided else None,
                          first_divergent_layer=layer["name"] if layer else None,
                          max_abs=max_abs.get("max_abs"))


def _tensors(entries: Iterable[Mapping[str, Any]]) -> tuple[tuple[str, str, str], ...]:
    return tuple((e["name"], e["kind"], e["hash"]) for e in entries)


def drift(*, session: Session, policy: Policy) -> list[PinDriftRow]:
    """Every device group in a pin's scope whose latest answer of a pinned key is not the
    pinned one: the fleet's drift from its pins, whether one device moved or all of them
    (``peers_agree``). Each row's answer is compared with the pinned one."""
    pins = pins_in_force(session)
    if not pins:
        return []
    held = repository.holdings(session, models=sorted({p.model for p in pins}),
                               keys={key for p in pins for key in p.answers})
    environments = repository.environments(session, {h.environment_id for h in held})
    against = _Against(session, policy)
    return [PinDriftRow(
        pin_id=d.pin.id, pin_version=d.pin.version, model=d.pin.model,
        scope=rules.describe_scope(d.pin.scope), suite=d.pin.suite, workload=d.workload,
        workload_version=d.workload_version, variant=d.variant,
        env_key=environments[d.environment_id][0], devices=d.devices,
        environment_devices=d.environment_devices, first_node=d.first_node,
        peers_agree=d.usual, pinned_manifest=d.pinned, answer_manifest=d.answer,
        **against(d.workload, d.pinned, d.answer).model_dump(exclude={"max_abs"}))
        for d in rules.drift(pins, held, environments)]


def divergence_pins(*, session: Session, policy: Policy, suite: str, workload: str,
                    variant: str, workload_version: int | None, tensor: str | None,
                    groups: Sequence[tuple[int, str]]) -> list[DivergencePin]:
    """/divergence's pins of the key: each pin in force with an answer for it (of the
    version shown), the group giving the pinned answer, and the devices in its scope that
    give another (``groups``: the report's (id, hash))."""
    pins = [p for p in pins_in_force(session) if p.suite == suite
            and (found := p.answers.get((workload, variant))) is not None
            and found.workload_version == workload_version]
    if not pins:
        return []
    held = [h for h in repository.holdings(session, suite=suite,
                                           models=sorted({p.model for p in pins}),
                                           keys=[(workload, variant)])
            if h.status == "ok" and h.manifest_hash and h.workload_version == workload_version]
    environments = repository.environments(session, {h.environment_id for h in held})
    entries = manifest_entries(session, {p.answers[(workload, variant)].manifest_hash
                                             for p in pins} | {h.manifest_hash or "" for h in held})
    group_of = {digest: number for number, digest in groups}
    against = _Against(session, policy)

    def answer_of(manifest: str) -> str | None:
        if tensor is None:
            return manifest
        return next((e["hash"] for e in entries.get(manifest, []) if e["name"] == tensor), None)

    found = []
    for p in pins:
        pinned = p.answers[(workload, variant)].manifest_hash
        own = [h for h in held if h.model == p.model and getattr(rules.pin_in_force(
            pins, suite=suite, model=h.model, env_key=environments[h.environment_id][0],
            promoted=environments[h.environment_id][1]), "id", None) == p.id]
        on_pin = sum(h.devices for h in own if answer_of(h.manifest_hash or "")
                     == answer_of(pinned))
        totals = analysis.tally((answer_of(h.manifest_hash or "") or "", h.support) for h in own)
        usual = analysis.usual(totals)
        moved = usual if usual is not None and usual != answer_of(pinned) else None
        moved_manifest = next((h.manifest_hash for h in own if moved is not None
                               and answer_of(h.manifest_hash or "") == moved), None)
        found.append(DivergencePin(
            pin=pin_ref(session, p.id), workload_version=workload_version,
            pinned=answer_of(pinned) or "", pinned_group=group_of.get(answer_of(pinned) or ""),
            devices_in_scope=sum(h.devices for h in own), devices_on_pin=on_pin,
            drift=on_pin < sum(h.devices for h in own),
            in_scope_group=group_of.get(moved) if moved is not None else None,
            against_pin=against(workload, pinned, moved_manifest) if moved_manifest else None))
    return found


# ---- check ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckQuestion:
    """What an agent asks before `check` (the cache's key: every field)."""

    suite: str
    env_key: str
    models: tuple[str, ...]
    promoted: tuple[tuple[str, str | None], ...]  # used only for an unknown environment
    workloads: tuple[str, ...]
    variants: tuple[str, ...]
    budget_s: float
    child_s: float


def check_plan(*, session: Session, question: CheckQuestion) -> CheckPlan:
    """The answers `check` compares on the devices of each model: the pin in force's, else
    the fleet's majority on this environment, of the workloads the agent named or, when
    it named none, those the server chooses (``analysis.goldens.choose_checks``) among
    the variants it named (all when none)."""
    environment = repository.environment_by_key(session, question.env_key)
    promoted = (repository.promoted(environment) if environment is not None
                else dict(question.promoted))
    pins = [p for p in pins_in_force(session) if p.suite == question.suite]
    held = (repository.holdings(session, suite=question.suite, models=question.models,
                                environment_ids=[environment.id])
            if environment is not None else [])
    # Named workloads are run as named; named variants only narrow the server's choice.
    named = bool(question.workloads)
    split = repository.split_keys(session, question.suite) if not named else set()
    devices = []
    chosen_by_model: dict[str, list[tuple[rules.CheckCandidate, rules.PinnedAnswer, int, int]]] = {}
    for model in question.models:
        force = rules.pin_in_force(pins, suite=question.suite, model=model,
                                   env_key=question.env_key, promoted=promoted)
        own = [h for h in held if h.model == model]
        unsteady = {(h.workload, h.variant) for h in own if h.repeats_agree is False}
        fleet = rules.majority_answers(own)
        walls = {(h.workload, h.variant): h.wall_s for h in own if h.wall_s is not None}
        options: dict[tuple[str, str], tuple[str, rules.PinnedAnswer, int, int]] = {}
        for key, majority in fleet.items():
            if majority.answer is not None and key not in unsteady:
                options[key] = ("fleet", majority.answer, majority.holders, majority.devices)
        if force is not None:
            pinned_rows = {(a.workload, a.variant): a for a in repository.answers_of(
                session, [force.id]).get(force.id, [])}
            for key, answer in force.answers.items():
                row = pinned_rows[key]
                options[key] = ("pin", answer, row.holders, row.devices)
        options = {key: found for key, found in options.items()
                   if (not question.workloads or key[0] in question.workloads)
                   and (not question.variants or key[1] in question.variants)}
        entries = manifest_entries(session, {a.manifest_hash for _s, a, _h, _d
                                                 in options.values()})
        candidates = {key: rules.CheckCandidate(
            key[0], key[1], source, walls.get(key), key in split,
            any(e["kind"] == "layer" for e in entries.get(answer.manifest_hash, [])))
            for key, (source, answer, _h, _d) in options.items()}
        picked = (sorted(candidates.values(), key=lambda c: (c.workload, c.variant)) if named
                  else rules.choose_checks(list(candidates.values()),
                                           budget_s=question.budget_s,
                                           child_s=question.child_s))
        chosen_by_model[model] = [(c, options[(c.workload, c.variant)][1],
                                   options[(c.workload, c.variant)][2],
                                   options[(c.workload, c.variant)][3]) for c in picked]
        checks = [CheckAnswer(
            workload=answer.workload, workload_version=answer.workload_version,
            variant=answer.variant, source=candidate.source,  # type: ignore[arg-type]
            manifest_hash=answer.manifest_hash, input_hash=answer.input_hash,
            param_hash=answer.param_hash,
            tensors=[(e["name"], e["hash"][:CHECK_HASH_CHARS])
                     for e in entries.get(answer.manifest_hash, [])],
            holders=holders, devices=total)
            for candidate, answer, holders, total in chosen_by_model[model]]
        source = "pin" if force is not None else ("fleet" if options else "none")
        note = None
        if not checks:
            note = (f"no answer to compare with: the server knows no run on environment "
                    f"{question.env_key[:12]}" if environment is None else
                    f"no answer of {model} devices on environment {question.env_key[:12]} to "
                    "compare with") + (" and no pin holds it" if force is None else "")
            source = "none"
        devices.append(CheckDevice(model=model, source=source,  # type: ignore[arg-type]
                                   pin=pin_ref(session, force.id) if force else None,
                                   note=note, checks=checks))
    return CheckPlan(suite=question.suite, env_key=question.env_key,
                     environment_known=environment is not None,
                     chosen_by="agent" if named else "server", devices=devices)
