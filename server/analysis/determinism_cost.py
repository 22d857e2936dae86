"""The cost of determinism: the wall time of ``strict`` against ``default`` per environment,
with its uncertainty (design §3.3.12).

A device's wall time is the median of its timed repeats after a warm-up, and its spread
half their range (the agent's ``wall_s_spread``). An environment's time for a workload and
variant is the mean over its devices; its uncertainty is the larger of the devices'
standard deviation and their mean spread, over the square root of the devices (a lone
device with one timed repeat has none: unknown). The ratio's uncertainty follows from
the two sums' by the usual propagation for a quotient. A ratio is shown only when it is
further from 1 than its uncertainty: one noisy run never reads "strict costs 0.33×".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WallTime:
    """The wall times of ``nodes`` devices' latest results of one outcome, as means that
    are weighted by their counts when several outcomes of one key add up: of the times,
    of their squares, and of the agents' spreads over the ``spreads`` devices that sent
    one."""

    environment: int
    workload: str
    variant: str
    wall_s: float  # the mean
    nodes: int
    wall_sq_s: float | None = None  # the mean of the squares (None: as if all equal)
    spread_s: float | None = None  # the mean spread of those that sent one
    spreads: int = 0


@dataclass
class _Sums:
    total: float = 0.0
    squares: float = 0.0
    count: int = 0
    spread: float = 0.0
    spreads: int = 0

    def add(self, time: WallTime) -> None:
        self.total += time.wall_s * time.nodes
        square = time.wall_sq_s if time.wall_sq_s is not None else time.wall_s ** 2
        self.squares += square * time.nodes
        self.count += time.nodes
        if time.spread_s is not None and time.spreads:
            self.spread += time.spread_s * time.spreads
            self.spreads += time.spreads

    def measured(self) -> Measured:
        mean = self.total / self.count
        spread = self.spread / self.spreads if self.spreads else None
        sd = (math.sqrt(max(0.0, (self.squares - self.count * mean ** 2) / (self.count - 1)))
              if self.count > 1 else None)
        known = [value for value in (sd, spread) if value is not None]
        return Measured(mean, max(known) / math.sqrt(self.count) if known else None)


@dataclass(frozen=True)
class Measured:
    seconds: float
    uncertainty: float | None  # None: unknown (one device, one timed repeat)


@dataclass(frozen=True)
class Ratio:
    """strict / default: ``value`` and its uncertainty; ``shown`` only when the effect
    (its distance from 1) exceeds the uncertainty."""

    value: float | None  # None when default took no time
    uncertainty: float | None

    @property
    def shown(self) -> bool:
        return (self.value is not None and self.uncertainty is not None
                and abs(self.value - 1.0) > self.uncertainty)


@dataclass(frozen=True)
class WorkloadCost:
    workload: str
    default_s: float
    strict_s: float
    ratio: float | None  # None unless shown
    ratio_estimate: float | None
    ratio_uncertainty: float | None


@dataclass(frozen=True)
class DeterminismCost:
    env_key: str | None
    nodes: int
    default_s: float  # summed over the workloads measured under both variants
    strict_s: float
    ratio: float | None  # None unless shown
    ratio_estimate: float | None
    ratio_uncertainty: float | None
    note: str
    workloads: list[WorkloadCost] = field(default_factory=list)


def measured(times: Iterable[Measured]) -> Measured:
    """Several devices' (or studies') times of one thing, each its median and spread, as
    one: the rule above (their mean; the larger of their standard deviation and mean
    spread, over √n). One time with a spread keeps it; one without has none."""
    sums = _Sums()
    for time in times:
        sums.add(WallTime(0, "", "", time.seconds, 1, None, time.uncertainty,
                          1 if time.uncertainty is not None else 0))
    return sums.measured()


def ratio(strict: Measured, default: Measured) -> Ratio:
    if default.seconds <= 0:
        return Ratio(None, None)
    value = strict.seconds / default.seconds
    if strict.uncertainty is None or default.uncertainty is None:
        return Ratio(value, None)
    relative = math.hypot(strict.uncertainty / strict.seconds if strict.seconds else 0.0,
                          default.uncertainty / default.seconds)
    return Ratio(value, value * relative)


def _sum(parts: Iterable[Measured]) -> Measured:
    parts = list(parts)
    known = [p.uncertainty for p in parts]
    return Measured(sum(p.seconds for p in parts),
                    None if None in known else math.hypot(*known))  # type: ignore[arg-type]


def note(found: Ratio) -> str:
    """What the audit says of a ratio, in words."""
    if found.value is None:
        return "default took no time"
    if found.uncertainty is None:
        return ("one timed run per environment, no uncertainty: not shown (more nodes, "
                "or --repeats 3 for each run's own spread)")
    figure = f"{found.value:.2f}× ± {found.uncertainty:.2f}"
    return figure if found.shown else f"{figure}: within the noise, not shown"


def determinism_cost(times: Iterable[WallTime], env_keys: Mapping[int, str]
                     ) -> list[DeterminismCost]:
    """Per environment: ``strict`` against ``default`` per workload and summed over the
    workloads that have both; the dearest shown first, then those within the noise.
    Other variants are left out."""
    sums: dict[int, dict[str, dict[str, _Sums]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(_Sums)))
    for time in times:
        if time.variant in ("default", "strict") and time.nodes > 0:
            sums[time.environment][time.workload][time.variant].add(time)
    costs = []
    for env_id, workloads in sums.items():
        both = {w: {v: s.measured() for v, s in per.items()}
                for w, per in sorted(workloads.items()) if {"default", "strict"} <= per.keys()}
        if not both:
            continue
        default = _sum(m["default"] for m in both.values())
        strict = _sum(m["strict"] for m in both.values())
        total = ratio(strict, default)
        costs.append(DeterminismCost(
            env_key=env_keys.get(env_id),
            # Nodes counted once per workload measured: the most of any workload.
            nodes=max(workloads[w]["default"].count for w in both),
            default_s=default.seconds, strict_s=strict.seconds,
            ratio=total.value if total.shown else None, ratio_estimate=total.value,
            ratio_uncertainty=total.uncertainty, note=note(total),
            workloads=[_workload(w, m["default"], m["strict"]) for w, m in both.items()]))
    costs.sort(key=lambda cost: (cost.ratio is None, -float(cost.ratio or 0),
                                 str(cost.env_key or "")))
    return costs


def _workload(name: str, default: Measured, strict: Measured) -> WorkloadCost:
    found = ratio(strict, default)
    return WorkloadCost(name, default.seconds, strict.seconds,
                        found.value if found.shown else None, found.value, found.uncertainty)
