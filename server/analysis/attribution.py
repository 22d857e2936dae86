"""Which environment attributes explain a split into groups (design §3.3)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from .environment import UNSET, flatten_environment, is_blob, short_difference
from .groups import Group

# env_key -> its flattened environment: every node of an environment shares its attributes.
Flattened = dict[str, dict[str, str]]


def flatten_members(groups: Sequence[Group]) -> Flattened:
    """Every environment of the groups' members, flattened once (a fleet of 10,000 nodes
    has a few dozen environments)."""
    flattened: Flattened = {}
    for group in groups:
        for env_key, document in group.environments.items():
            if env_key not in flattened:
                flattened[env_key] = flatten_environment(document)
    return flattened


def _env_counts(groups: Sequence[Group], flattened: Flattened | None
                ) -> tuple[dict[int, Counter[str]], Flattened, list[str]]:
    """Members per (group, env_key), the flattened environments and every attribute name."""
    if flattened is None:
        flattened = flatten_members(groups)
    counts = {group.id: Counter(group.env_counts) for group in groups}
    names = sorted({name for envs in counts.values() for env in envs
                    for name in flattened[env]})
    return counts, flattened, names


def _values(envs: Iterable[str], flattened: Flattened, name: str) -> set[str]:
    return {flattened[env].get(name, UNSET) for env in envs}


def separating_attributes(a: Group, b: Group, *, flattened: Flattened | None = None
                          ) -> list[dict[str, Any]]:
    """Attributes whose values are disjoint between the two groups ("unset" if missing).

    Every one of them separates the groups perfectly; they are ordered as a person reads
    an explanation (``reading_order``): fewest distinct values, then versions, then other
    short values, then blobs, then name. More than one means the fleet cannot tell from
    its data which of them causes the split. For a long value (one on each side),
    ``a_short``/``b_short`` show the part that differs (``a``/``b`` keep the whole values).
    """
    if flattened is None:
        flattened = flatten_members([a, b])
    return separating_environments(set(a.env_counts), set(b.env_counts), flattened)


def separating_environments(envs_a: Collection[str], envs_b: Collection[str],
                            flattened: Flattened) -> list[dict[str, Any]]:
    """``separating_attributes`` of two groups given the environments of their members
    (the attributes are the environments', so the members need not be walked again)."""
    names = sorted({name for env in (*envs_a, *envs_b) for name in flattened[env]})
    found = []
    for name in names:
        values_a = _values(envs_a, flattened, name)
        values_b = _values(envs_b, flattened, name)
        if values_a.isdisjoint(values_b):
            item: dict[str, Any] = {"attribute": name, "a": sorted(values_a),
                                    "b": sorted(values_b)}
            if len(values_a) == len(values_b) == 1 and any(map(is_blob, values_a | values_b)):
                item["a_short"], item["b_short"] = short_difference(item["a"][0], item["b"][0])
            found.append(item)
    found.sort(key=lambda item: (len(item["a"]) + len(item["b"]),
                                 *reading_order(item["attribute"],
                                                any(map(is_blob, item["a"] + item["b"])))))
    return found


# A device's attributes, in the order a person reads them (issue 28: a host's GPU and its
# CPU share an environment, so no environment attribute tells their answers apart).
DEVICE_ATTRIBUTES = ("device.type", "device.model", "device.compute_capability")


def device_attributes(model: str) -> dict[str, str]:
    """The attributes of a device model as ingest records it: "cpu", or an accelerator's
    type/name/compute capability ("cuda/NVIDIA H200/9.0"; "cuda" when only the type is
    known). A part a model lacks is ``UNSET``."""
    kind, _, rest = model.partition("/")
    name, _, capability = rest.rpartition("/")
    if not name or not capability.replace(".", "").isdigit():
        name, capability = rest, ""
    return dict(zip(DEVICE_ATTRIBUTES, (kind or UNSET, name or UNSET, capability or UNSET),
                    strict=True))


def separating_devices(models_a: Collection[str], models_b: Collection[str]
                       ) -> list[dict[str, Any]]:
    """The device attributes whose values are disjoint between two groups' device models
    (type, then model, then compute capability): what explains a split between devices
    of one environment."""
    found = []
    for name in DEVICE_ATTRIBUTES:
        values_a = {device_attributes(model)[name] for model in models_a}
        values_b = {device_attributes(model)[name] for model in models_b}
        if values_a.isdisjoint(values_b):
            found.append({"attribute": name, "a": sorted(values_a), "b": sorted(values_b)})
    return found


def reading_order(name: str, blob: bool) -> tuple[int, str]:
    """Of equally good explanations, the one a person reads first: a version (torch.version,
    python.version, a driver's), then other short values, then blobs (torch.config)."""
    if blob:
        return 2, name
    leaf = name.rsplit(".", 1)[-1]
    return (0 if "version" in leaf or leaf in {"driver", "cuda", "cudnn", "nccl"} else 1), name


def _entropy(counts: Counter[int]) -> float:
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values() if c)


def rank_attributes(groups: Sequence[Group], *, flattened: Flattened | None = None
                    ) -> list[dict[str, Any]]:
    """Every attribute that varies across the key's members, best predictor of group first.

    ``conditional_entropy`` is H(group | attribute) in bits (0: the attribute's value
    determines the group); ``purity`` is the share of members in the majority group of
    their attribute value. Ranked by conditional entropy, then fewest distinct values
    (a per-node value "predicts" perfectly but explains nothing), then versions before
    other short values before blobs (``reading_order``), then name. Empty when there is
    no split (fewer than two groups).
    """
    if len(groups) < 2:
        return []
    ranked = _rank_environment(groups, flattened) + _rank_devices(groups)
    # A device attribute ranks after an environment attribute that predicts as well, and
    # the device's own in the order type, model, compute capability.
    ranked.sort(key=lambda r: (r["conditional_entropy"], r["distinct_values"],
                               _device_rank(r["attribute"]),
                               *reading_order(r["attribute"], r["blob"])))
    return ranked


def _device_rank(name: str) -> int:
    return DEVICE_ATTRIBUTES.index(name) + 1 if name in DEVICE_ATTRIBUTES else 0


def _rank_devices(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """``rank_attributes``' rows of the members' device attributes that vary."""
    rows = [(group.id, device_attributes(model), n) for group in groups
            for model, n in group.model_counts.items()]
    return [row for name in DEVICE_ATTRIBUTES
            if (row := _ranked(name, [(g, attrs[name], n) for g, attrs, n in rows]))]


def _ranked(name: str, rows: Sequence[tuple[int, str, int]]) -> dict[str, Any] | None:
    """One attribute's row from (group, value, members); None when it does not vary."""
    by_value: dict[str, Counter[int]] = {}
    for group_id, value, n in rows:
        by_value.setdefault(value, Counter())[group_id] += n
    if len(by_value) < 2:
        return None
    total = sum(n for _group, _value, n in rows)
    entropy = sum(sum(c.values()) / total * _entropy(c) for c in by_value.values())
    purity = sum(max(c.values()) for c in by_value.values()) / total
    return {
        "attribute": name,
        "blob": any(is_blob(value) for value in by_value),
        "distinct_values": len(by_value),
        # Rounded so that equal entropies reached by different sums rank as equal.
        "conditional_entropy": round(entropy, 12) + 0.0,
        "purity": purity,
    }


def _rank_environment(groups: Sequence[Group], flattened: Flattened | None
                      ) -> list[dict[str, Any]]:
    counts, flattened, names = _env_counts(groups, flattened)
    # (group, environment, members): a fleet's thousands of nodes in a few dozen rows.
    rows = [(group_id, flattened[env], n) for group_id, envs in counts.items()
            for env, n in envs.items()]
    return [row for name in names
            if (row := _ranked(name, [(g, env.get(name, UNSET), n) for g, env, n in rows]))]
