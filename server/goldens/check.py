"""What `numparity-agent check` is answered (design §2.12, §3.11): per device model the
pin in force, else the fleet's majority on the environment, and the answers to compute."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from numparity_server.analysis import goldens as rules
from numparity_server.goldens import repository
from numparity_server.goldens.schemas import (
    CheckAnswer,
    CheckDevice,
    CheckPlan,
    PinRef,
    Undecided,
)
from numparity_server.goldens.service import pin_ref, pins_in_force
from numparity_server.kit.figures import workload_coverage
from numparity_server.reads.results import manifest_entries

# The tensors' hashes `check` is given: 16 hex digits (64 bits) name a tensor's bytes
# among a fleet's answers as surely as the whole hash, at a quarter of the size.
CHECK_HASH_CHARS = 16


@dataclass(frozen=True)
class CheckQuestion:
    """What an agent asks before `check`, less its budget (the cache's key: every field).
    The budget only chooses among the ranked answers (``check_plan``), so no value of it
    makes the server rank again."""

    suite: str
    env_key: str
    models: tuple[str, ...]
    promoted: tuple[tuple[str, str | None], ...]  # used only for an unknown environment
    workloads: tuple[str, ...]
    variants: tuple[str, ...]


# The undecided keys a plan names per device model (strict first): enough to say why a
# check compares less, bounded whatever the fleet uploaded.
MAX_UNDECIDED = 16


@dataclass(frozen=True)
class _Expected:
    """An answer `check` may compare: where it comes from and who held it."""

    source: str  # "pin" | "fleet"
    answer: rules.PinnedAnswer
    holders: int
    devices: int
    held_by: tuple[str, ...] = ()


def _asked(question: CheckQuestion, key: tuple[str, str]) -> bool:
    """A key the agent named, or may be given: an opt-in variant (`compiled`, whose
    compile takes minutes, past any check's budget) only when it named that variant."""
    if key[1] in rules.OPT_IN_VARIANTS and key[1] not in question.variants:
        return False
    return ((not question.workloads or key[0] in question.workloads)
            and (not question.variants or key[1] in question.variants))


def _expected(session: Session, question: CheckQuestion, force: rules.Pin | None,
              fleet: dict[tuple[str, str], rules.Majority]
              ) -> tuple[dict[tuple[str, str], _Expected], list[Undecided]]:
    """The answers of the keys asked: the pin's where it has the key, else the fleet's
    majority on the environment (``analysis.goldens.majority_answers``: nodes vote, one
    node alone decides nothing; keys whose repeats disagree on most nodes left out); and
    the keys neither decides, with why."""
    found = {key: _Expected("fleet", majority.answer, majority.holders, majority.devices,
                            majority.held_by)
             for key, majority in fleet.items()
             if majority.answer is not None and not majority.unsteady}
    if force is not None:
        rows = {(a.workload, a.variant): a for a in repository.answers_of(
            session, [force.id]).get(force.id, [])}
        found.update({key: _Expected("pin", answer, rows[key].holders, rows[key].devices,
                                     tuple(rows[key].held_by or ()))
                      for key, answer in force.answers.items()})
    undecided = sorted((key for key, majority in fleet.items()
                        if majority.answer is None and key not in found and _asked(question, key)),
                       key=lambda k: (k[1] != "strict", k))
    return ({key: expected for key, expected in found.items() if _asked(question, key)},
            [Undecided(workload=key[0], variant=key[1], note=fleet[key].note or "no answer")
             for key in undecided[:MAX_UNDECIDED]])


@dataclass(frozen=True)
class RankedDevice:
    """A device model's part of a ranking: what it is compared with and its candidate
    answers, best first (``analysis.goldens.rank_checks``)."""

    model: str
    source: str  # "pin" | "fleet" | "none" (no candidate)
    pin: PinRef | None
    note: str | None
    candidates: tuple[tuple[rules.CheckCandidate, _Expected], ...]
    undecided: tuple[Undecided, ...]


@dataclass(frozen=True)
class Ranking:
    """The answers `check` may compare on each device model of a question, ranked: what
    is kept per question (and pin version). Reads no manifest's entries: whether a
    result records layers is one indexed statement for all of them."""

    question: CheckQuestion
    environment_known: bool
    devices: tuple[RankedDevice, ...]

    def chosen(self, *, budget_s: float, child_s: float
               ) -> tuple[tuple[tuple[str, str], ...], ...]:
        """Per device model the keys ``check_plan`` sends within the budget."""
        named = bool(self.question.workloads)
        return tuple(tuple((c.workload, c.variant) for c in (
            [c for c, _ in device.candidates] if named else rules.choose_checks(
                [c for c, _ in device.candidates], budget_s=budget_s, child_s=child_s,
                coverage=workload_coverage())))
            for device in self.devices)


def check_ranking(*, session: Session, question: CheckQuestion) -> Ranking:
    """The answers `check` may compare on the devices of each model: the pin in force's,
    else the fleet's majority on this environment; of the workloads the agent named (in
    their order) or, when it named none, all the decided ones among the variants it named
    (all when none), ranked as ``analysis.goldens.choose_checks`` takes them."""
    environment = repository.environment_by_key(session, question.env_key)
    promoted = (repository.promoted(environment) if environment is not None
                else dict(question.promoted))
    pins = [p for p in pins_in_force(session) if p.suite == question.suite]
    # Named workloads are run as named; named variants only narrow the server's choice.
    named = bool(question.workloads)
    devices = []
    for model in question.models:
        force = rules.pin_in_force(pins, suite=question.suite, model=model,
                                   env_key=question.env_key, promoted=promoted)
        fleet = rules.majority_answers(repository.node_answers(
            session, suite=question.suite, model=model,
            environment_ids=[environment.id] if environment is not None else []))
        expected, undecided = _expected(session, question, force, fleet)
        walls = {key: majority.wall_s for key, majority in fleet.items()
                 if majority.wall_s is not None}
        split = repository.split_keys(session, question.suite, expected) if not named else set()
        layered = repository.layered_manifests(
            session, {e.answer.manifest_hash for e in expected.values()}) if not named else set()
        candidates = [(rules.CheckCandidate(
            key[0], key[1], found.source, walls.get(key), key in split,
            found.answer.manifest_hash in layered), found) for key, found in expected.items()]
        ranked = sorted(candidates, key=lambda pair: (
            (pair[0].workload, pair[0].variant) if named else rules.check_rank(pair[0])))
        source, note = ("pin" if force is not None else "fleet"), None
        if not ranked:
            source = "none"
            note = (f"no answer to compare with: the server knows no run on environment "
                    f"{question.env_key[:12]}" if environment is None else
                    f"no answer of {model} devices on environment {question.env_key[:12]} "
                    f"that {rules.MIN_HOLDER_NODES} or more nodes decide") \
                + (" and no pin holds it" if force is None else "")
        devices.append(RankedDevice(model, source, pin_ref(session, force.id) if force else None,
                                    note, tuple(ranked), tuple(undecided)))
    return Ranking(question, environment is not None, tuple(devices))


def check_plan(*, session: Session, ranking: Ranking,
               chosen: tuple[tuple[tuple[str, str], ...], ...]) -> CheckPlan:
    """The plan of a ranking's ``chosen`` keys (``Ranking.chosen``): the manifests of
    those answers alone are read, for their tensors."""
    picked = [[found for candidate, found in device.candidates
               if (candidate.workload, candidate.variant) in set(keys)]
              for device, keys in zip(ranking.devices, chosen, strict=True)]
    order = [{key: n for n, key in enumerate(keys)} for keys in chosen]
    entries = manifest_entries(session, {found.answer.manifest_hash
                                         for device in picked for found in device})
    devices = []
    for device, found_list, rank in zip(ranking.devices, picked, order, strict=True):
        checks = [CheckAnswer(
            workload=found.answer.workload, workload_version=found.answer.workload_version,
            variant=found.answer.variant, source=found.source,  # type: ignore[arg-type]
            manifest_hash=found.answer.manifest_hash, input_hash=found.answer.input_hash,
            param_hash=found.answer.param_hash,
            tensors=[(e["name"], e["hash"][:CHECK_HASH_CHARS])
                     for e in entries.get(found.answer.manifest_hash, [])],
            holders=found.holders, devices=found.devices, held_by=list(found.held_by))
            for found in sorted(found_list, key=lambda f: rank[(f.answer.workload,
                                                                  f.answer.variant)])]
        devices.append(CheckDevice(model=device.model,
                                   source=device.source,  # type: ignore[arg-type]
                                   pin=device.pin, note=device.note, checks=checks,
                                   undecided=list(device.undecided)))
    question = ranking.question
    return CheckPlan(suite=question.suite, env_key=question.env_key,
                     environment_known=ranking.environment_known,
                     chosen_by="agent" if question.workloads else "server", devices=devices)
