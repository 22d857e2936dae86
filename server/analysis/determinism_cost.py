"""The cost of determinism: the wall time of ``strict`` against ``default`` per environment."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WallTime:
    """The mean wall time of ``nodes`` nodes' latest results of one outcome."""

    environment: int
    workload: str
    variant: str
    wall_s: float
    nodes: int


@dataclass(frozen=True)
class WorkloadCost:
    workload: str
    default_s: float
    strict_s: float
    ratio: float | None  # None when default took no time


@dataclass(frozen=True)
class DeterminismCost:
    env_key: str | None
    nodes: int
    default_s: float  # summed over the workloads measured under both variants
    strict_s: float
    ratio: float | None
    workloads: list[WorkloadCost]


def _ratio(strict_s: float, default_s: float) -> float | None:
    return strict_s / default_s if default_s > 0 else None


def determinism_cost(times: Iterable[WallTime], env_keys: Mapping[int, str]
                     ) -> list[DeterminismCost]:
    """Per environment: the mean wall time of ``strict`` against ``default`` per workload
    and summed over the workloads that have both; the dearest first. Other variants are
    left out."""
    totals: dict[int, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0])))
    for time in times:
        if time.variant not in ("default", "strict"):
            continue
        total = totals[time.environment][time.workload][time.variant]
        total[0] += time.wall_s * time.nodes
        total[1] += time.nodes
    costs = []
    for env_id, workloads in totals.items():
        means = {w: {variant: s / n for variant, (s, n) in v.items() if n}
                 for w, v in sorted(workloads.items())}
        both = {w: v for w, v in means.items() if {"default", "strict"} <= v.keys()}
        if not both:
            continue
        default_s = sum(v["default"] for v in both.values())
        strict_s = sum(v["strict"] for v in both.values())
        costs.append(DeterminismCost(
            env_key=env_keys.get(env_id),
            # Nodes counted once per workload measured: the most of any workload.
            nodes=max(int(workloads[w]["default"][1]) for w in both),
            default_s=default_s, strict_s=strict_s, ratio=_ratio(strict_s, default_s),
            workloads=[WorkloadCost(w, v["default"], v["strict"],
                                    _ratio(v["strict"], v["default"]))
                       for w, v in both.items()]))
    costs.sort(key=lambda cost: (-float(cost.ratio or 0), str(cost.env_key or "")))
    return costs
