"""The four checks of a measured DataLoader configuration (design §2.2): pure functions
over the hashes of its batches (`Epoch`), named `<configuration>_<check>`, each
`{"equal", "max_ulp", "max_rel", "op", …}` (`_checks`' shape; `equal`: the property
holds; no distance in ULPs means anything between two random draws).

A check's details must be the same whenever its verdict is (leaves in the order a batch
holds them, never in the order they were found to differ): the server stores a result's
checks in its outcome, so two nodes with one verdict and two orders would hold two
answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

# The check names, in the order a reader asks them.
CHECKS = ("order_reproducible", "runs_agree", "workers_agree", "streams_distinct")


@dataclass
class Epoch:
    """One pass: the indices the sampler handed out for the batches read, and each
    batch's worker, leaf names and hashes (and tensors, when kept)."""

    order: list[list[int]]
    workers: list[int]
    names: list[list[str]]
    hashes: list[list[str]]
    tensors: list[list[torch.Tensor]] = field(default_factory=list)

    def leaf_hashes(self, batch: int) -> dict[str, str]:
        return dict(zip(self.names[batch], self.hashes[batch], strict=True))


@dataclass
class Measured:
    name: str
    counts: tuple[int, ...]
    first: dict[int, Epoch]
    second: dict[int, Epoch]
    probes: dict[int, Epoch]


def _check(equal: bool, op: str | None, **details: Any) -> dict[str, Any]:
    """A check as the result carries it (`_checks`' shape): `equal` says the property
    holds; no distance in ULPs means anything between two random draws."""
    return {"equal": equal, "max_ulp": None, "max_rel": None, "op": op, **details}


def _canonical(names: Iterable[str], epochs: Iterable[Epoch]) -> list[str]:
    """`names` in the order a batch holds its leaves (then by name): a check's details
    must not depend on which batch happened to differ first, or two nodes (and two runs
    of one) that agree on every verdict would report two outcomes."""
    order: dict[str, int] = {}
    for epoch in epochs:
        for batch_names in epoch.names:
            for name in batch_names:
                order.setdefault(name, len(order))
    return sorted(set(names), key=lambda name: (order.get(name, len(order)), name))


def _differing(a: Epoch, b: Epoch) -> list[str]:
    """The leaves that differ between a and b in any batch (`<batches>`: not as many)."""
    differing: set[str] = set()
    for batch in range(max(len(a.hashes), len(b.hashes))):
        if batch >= len(a.hashes) or batch >= len(b.hashes):
            differing.add("<batches>")
            continue
        mine, theirs = a.leaf_hashes(batch), b.leaf_hashes(batch)
        differing.update(n for n in [*mine, *theirs] if mine.get(n) != theirs.get(n))
    return _canonical(differing, (a, b))


def order_reproducible(m: Measured) -> dict[str, Any]:
    """The sampler hands out the same indices in both runs, at every count."""
    differs = [n for n in m.counts if m.first[n].order != m.second[n].order]
    return _check(not differs, "order" if differs else None, num_workers=differs)


def runs_agree(m: Measured) -> dict[str, Any]:
    """Every batch is the same bytes in both runs, at every count; `op` the first leaf
    (in the batch's order) that differs."""
    differs: list[int] = []
    augmentations: set[str] = set()
    for n in m.counts:
        names = _differing(m.first[n], m.second[n])
        if names:
            differs.append(n)
            augmentations.update(names)
    names = _canonical(augmentations, [*m.first.values(), *m.second.values()])
    return _check(not differs, names[0] if names else None, num_workers=differs,
                  augmentations=names)


def workers_agree(m: Measured) -> dict[str, Any]:
    """Run 1's batches are the same bytes at every worker count as without workers (the
    lowest count); `order_equal` says whether at least the sampler's order is."""
    base = m.counts[0]
    differing: dict[str, list[str]] = {}
    for n in m.counts[1:]:
        names = _differing(m.first[base], m.first[n])
        if names:
            differing[str(n)] = names
    first = _canonical({leaf for leaves in differing.values() for leaf in leaves},
                       m.first.values())
    return _check(not differing, first[0] if first else None, num_workers=list(m.counts),
                  differing=differing,
                  order_equal=all(m.first[n].order == m.first[base].order for n in m.counts))


def random_leaves(m: Measured) -> list[str]:
    """The leaves that draw randomness: in one process (the lowest count, no workers)
    the same batch of indices gives other bytes the second time."""
    probe = m.probes[m.counts[0]]
    if len(probe.hashes) < 2:
        return []
    once = probe.leaf_hashes(0)
    return [name for name in probe.names[0]
            if any(once[name] != probe.leaf_hashes(r).get(name)
                   for r in range(1, len(probe.hashes)))]


def streams_distinct(m: Measured) -> dict[str, Any]:
    """No two workers draw the same augmentations: in each probe with workers, a random
    leaf whose bytes two workers return alike in every round (the same indices, the same
    place in their streams) is a duplicated stream, named with the workers'."""
    randomness = random_leaves(m)
    duplicates: list[dict[str, Any]] = []
    for n in m.counts:
        if n < 2:
            continue
        probe = m.probes[n]
        for leaf in randomness:
            streams: dict[int, list[str]] = {}
            for worker, batch in zip(probe.workers, range(len(probe.hashes)), strict=True):
                streams.setdefault(worker, []).append(probe.leaf_hashes(batch).get(leaf, ""))
            alike: dict[tuple[str, ...], list[int]] = {}
            for worker, drawn in sorted(streams.items()):
                alike.setdefault(tuple(drawn), []).append(worker)
            duplicates.extend({"augmentation": leaf, "workers": workers, "num_workers": n}
                              for workers in alike.values() if len(workers) > 1)
    return _check(not duplicates, duplicates[0]["augmentation"] if duplicates else None,
                  duplicates=duplicates, random=randomness)


def checks_of(m: Measured) -> dict[str, dict[str, Any]]:
    """The four checks of a configuration, named `<configuration>_<check>`."""
    return {f"{m.name}_{name}": check(m) for name, check in (
        ("order_reproducible", order_reproducible), ("runs_agree", runs_agree),
        ("workers_agree", workers_agree), ("streams_distinct", streams_distinct))}


def reproducible(checks: Mapping[str, Mapping[str, Any]], name: str) -> bool:
    """Whether configuration `name`'s bytes are the same from run to run."""
    return all(checks[f"{name}_{check}"]["equal"] for check in ("order_reproducible",
                                                                 "runs_agree"))
