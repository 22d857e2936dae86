"""LLM-era numerics per environment (design §3.3.12): does a request get the same answer
alone and inside a batch, does decoding with a KV cache give the prefill's logits, do the
attention backends agree — read from the checks the agent's workloads report (design
§2.2: the decoder's three, the invariance probe's batch invariance), never recomputed.

A column holds for an environment (on one device model, under one variant) when every
check of that name, of every workload that reports one, says ``equal`` on every device
there; where one does not, the column names the operation where the two computations
first part (the decoder's module, the probe's op, the backend).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .data_pipeline import is_pipeline_check

# The audit's columns: the check names the agent reports, in the order the table shows.
COLUMNS = ("batch_invariant", "decode_equals_prefill", "attention_backends_agree")
# How the dashboard and the demo's report name them.
LABELS = {"batch_invariant": "batch-invariant", "decode_equals_prefill": "decode = prefill",
          "attention_backends_agree": "attention backends agree"}


@dataclass(frozen=True)
class Reported:
    """One outcome's checks as ``devices`` devices of one environment hold them."""

    environment: int
    model: str
    suite: str
    variant: str
    workload: str
    checks: Mapping[str, Mapping[str, Any]]
    devices: int


@dataclass(frozen=True)
class Break:
    """A check that does not hold: where, how far, on how many devices."""

    workload: str
    check: str
    op: str | None
    max_ulp: int | None
    max_rel: float | None
    devices: int


@dataclass(frozen=True)
class Verdict:
    holds: bool
    op: str | None  # "workload: op" of the first break (None: it holds, or names none)


@dataclass(frozen=True)
class NumericsRow:
    environment: int
    model: str
    suite: str
    variant: str
    devices: int  # the most devices any reporting workload ran on
    columns: dict[str, Verdict | None]  # None: no workload reports that check here
    breaks: list[Break] = field(default_factory=list)


def numerics(reported: Iterable[Reported]) -> list[NumericsRow]:
    """A row per (environment, device model, suite, variant) with any checks, sorted by
    those: the large suite's decoder is another question than the standard one's."""
    by_key: dict[tuple[int, str, str, str], list[Reported]] = defaultdict(list)
    for entry in reported:
        # The data pipeline's checks are another table's (`data_pipeline`).
        checks = {name: check for name, check in entry.checks.items()
                  if not is_pipeline_check(name)}
        if checks:
            by_key[(entry.environment, entry.model, entry.suite, entry.variant)].append(
                replace(entry, checks=checks))
    return [_row(key, entries) for key, entries in sorted(by_key.items())]


def _row(key: tuple[int, str, str, str], entries: list[Reported]) -> NumericsRow:
    breaks: dict[tuple[str, str, str | None], Break] = {}
    seen: set[str] = set()
    devices: dict[str, int] = defaultdict(int)
    for entry in sorted(entries, key=lambda e: e.workload):
        devices[entry.workload] += entry.devices
        for name, check in sorted(entry.checks.items()):
            seen.add(name)
            if check.get("equal") is True:
                continue
            place = (entry.workload, name, check.get("op"))
            ulp, rel, count = check.get("max_ulp"), check.get("max_rel"), entry.devices
            before = breaks.get(place)
            if before is not None:
                ulp, rel = _larger(ulp, before.max_ulp), _larger(rel, before.max_rel)
                count += before.devices
            breaks[place] = Break(entry.workload, name, place[2], ulp, rel, count)
    ordered = sorted(breaks.values(), key=_order)
    return NumericsRow(
        environment=key[0], model=key[1], suite=key[2], variant=key[3],
        devices=max(devices.values()),
        columns={name: _verdict(name, seen, ordered) for name in COLUMNS},
        breaks=ordered)


def _order(found: Break) -> tuple[int, str, str, str]:
    """The probe's op first (an operation is what a lab fixes), then a model's module."""
    return (0 if found.workload == "invariance" else 1, found.check, found.workload,
            found.op or "")


def _larger(value: Any, other: Any) -> Any:
    """The larger distance; unknown (None: a NaN without a match) wins."""
    return None if value is None or other is None else max(value, other)


def _verdict(name: str, seen: set[str], breaks: list[Break]) -> Verdict | None:
    if name not in seen:
        return None
    first = next((b for b in breaks if b.check == name), None)
    if first is None:
        return Verdict(True, None)
    return Verdict(False, f"{first.workload}: {first.op}" if first.op else None)


def check_holds(checks: Mapping[str, Mapping[str, Any]] | None, name: str) -> bool | None:
    """Whether ``name`` holds in one outcome's checks (None: not reported)."""
    check = (checks or {}).get(name)
    return None if check is None else check.get("equal") is True
