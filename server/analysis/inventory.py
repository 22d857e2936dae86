"""The fleet's inventory: nodes counted by each promoted environment column."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

INVENTORY_COLUMNS = ("gpu_name", "compute_capability", "driver", "cuda", "cudnn", "torch",
                     "cpu_capability")


@dataclass(frozen=True)
class InventoryCount:
    value: str | None  # None: the environment does not say (no GPU, no cuDNN …)
    nodes: int


def inventory(node_env: Mapping[str, int], columns: Mapping[int, Mapping[str, str | None]]
              ) -> dict[str, list[InventoryCount]]:
    """``node_env`` (node → its current environment) and each environment's columns →
    per column, the nodes per value, the most common first (ties by the value's text)."""
    return inventory_of(Counter(node_env.values()), columns)


def inventory_of(per_env: Mapping[int, int], columns: Mapping[int, Mapping[str, str | None]]
                 ) -> dict[str, list[InventoryCount]]:
    """``inventory`` from the nodes per environment."""
    found: dict[str, list[InventoryCount]] = {}
    for column in INVENTORY_COLUMNS:
        counts: Counter[str | None] = Counter()
        for env_id, count in per_env.items():
            counts[columns[env_id][column]] += count
        found[column] = [InventoryCount(value, count) for value, count in
                         sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))]
    return found
