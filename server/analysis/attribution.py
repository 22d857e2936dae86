"""Which environment attributes explain a split into groups (DESIGN §3.3)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .environment import UNSET, flatten_environment
from .groups import Group

Flattened = dict[tuple[str, str], dict[str, str]]


def flatten_members(groups: Sequence[Group]) -> Flattened:
    """Every member's flattened environment, by (node, run_id): flatten once, use often."""
    return {
        (member.node, member.run_id): flatten_environment(member.environment)
        for group in groups
        for member in group.members
    }


def _attributes(groups: Sequence[Group], flattened: Flattened | None
                ) -> tuple[dict[int, list[dict[str, str]]], list[str]]:
    if flattened is None:
        flattened = flatten_members(groups)
    flat = {
        group.id: [flattened[(member.node, member.run_id)] for member in group.members]
        for group in groups
    }
    names = sorted({name for envs in flat.values() for env in envs for name in env})
    return flat, names


def _values(envs: Sequence[Mapping[str, str]], name: str) -> set[str]:
    return {env.get(name, UNSET) for env in envs}


def separating_attributes(a: Group, b: Group, *, flattened: Flattened | None = None
                          ) -> list[dict[str, Any]]:
    """Attributes whose values are disjoint between the two groups ("unset" if missing).

    Sorted by fewest distinct values, then name. More than one means the fleet cannot
    tell from its data which of them causes the split.
    """
    flat, names = _attributes([a, b], flattened)
    found = []
    for name in names:
        values_a, values_b = _values(flat[a.id], name), _values(flat[b.id], name)
        if values_a.isdisjoint(values_b):
            found.append({"attribute": name, "a": sorted(values_a), "b": sorted(values_b)})
    found.sort(key=lambda item: (len(item["a"]) + len(item["b"]), item["attribute"]))
    return found


def _entropy(counts: Counter[int]) -> float:
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values() if c)


def rank_attributes(groups: Sequence[Group], *, flattened: Flattened | None = None
                    ) -> list[dict[str, Any]]:
    """Every attribute that varies across the key's members, best predictor of group first.

    ``conditional_entropy`` is H(group | attribute) in bits (0: the attribute's value
    determines the group); ``purity`` is the share of members in the majority group of
    their attribute value. Ranked by conditional entropy, then fewest distinct values
    (a per-node value "predicts" perfectly but explains nothing), then name. Empty
    when there is no split (fewer than two groups).
    """
    if len(groups) < 2:
        return []
    flat, names = _attributes(groups, flattened)
    rows = [(group_id, env) for group_id, envs in flat.items() for env in envs]
    total = len(rows)
    ranked = []
    for name in names:
        by_value: dict[str, Counter[int]] = {}
        for group_id, env in rows:
            by_value.setdefault(env.get(name, UNSET), Counter())[group_id] += 1
        if len(by_value) < 2:
            continue
        entropy = sum(sum(c.values()) / total * _entropy(c) for c in by_value.values())
        purity = sum(max(c.values()) for c in by_value.values()) / total
        ranked.append({
            "attribute": name,
            "distinct_values": len(by_value),
            # Rounded so that equal entropies reached by different sums rank as equal.
            "conditional_entropy": round(entropy, 12) + 0.0,
            "purity": purity,
        })
    ranked.sort(key=lambda r: (r["conditional_entropy"], r["distinct_values"], r["attribute"]))
    return ranked
