"""Drift from the pinned answers (design §3.11): the devices in a pin's scope whose latest
answer is another — the audit's `pinned` table and `/divergence`'s `pins` — each answer
compared with the pinned one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis import goldens as rules
from numparity_server.analysis.policy import Policy
from numparity_server.goldens import repository
from numparity_server.goldens.schemas import AgainstPin, DivergencePin, PinDriftRow
from numparity_server.goldens.service import pin_ref, pins_in_force
from numparity_server.reads.fingerprints import load_fingerprints
from numparity_server.reads.results import manifest_entries


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


