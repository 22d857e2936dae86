"""Data pipeline determinism per environment (design §3.3.12): does the seeds' DataLoader
recipe hold, and what breaks without it — read from the checks the agent's `data`
workload and a lab's DataLoader factories report (design §2.2), never recomputed.

A pipeline check is named ``<configuration>_<check>``: the configuration ``recipe`` (the
seeds' recipe), ``no_recipe`` (the built-in loader without it) or ``own`` (a lab's
loader as its factory built it); the check one of ``CHECKS``. Each says ``equal``: the
property holds. The recipe *holds* for an environment when its configuration's
``HOLDS`` checks hold on every device there; ``workers_agree`` (the same bytes whatever
the worker count) is shown apart, because the recipe does not promise it: an
augmentation depends on which worker's stream draws it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RECIPE = "recipe"
# The configurations without the recipe: the built-in's, and a lab's own loader.
WITHOUT = ("no_recipe", "own")
CONFIGURATIONS = (RECIPE, *WITHOUT)
CHECKS = ("order_reproducible", "runs_agree", "workers_agree", "streams_distinct")
# What "the recipe holds" means: reproducible from run to run, no stream repeated.
HOLDS = ("order_reproducible", "runs_agree", "streams_distinct")
# How a page and the doctor say that a check does not hold.
BROKEN = {"order_reproducible": "the order changes between runs",
          "runs_agree": "the batches change between runs",
          "workers_agree": "the batches depend on num_workers",
          "streams_distinct": "workers repeat each other's augmentations"}


def split_check(name: str) -> tuple[str, str] | None:
    """(configuration, check) of a pipeline check's name; None for any other check."""
    for configuration in CONFIGURATIONS:
        prefix = f"{configuration}_"
        if name.startswith(prefix) and name[len(prefix):] in CHECKS:
            return configuration, name[len(prefix):]
    return None


def is_pipeline_check(name: str) -> bool:
    return split_check(name) is not None


@dataclass(frozen=True)
class Reported:
    """One outcome's checks as ``devices`` devices of one environment hold them."""

    environment: int
    suite: str
    variant: str
    workload: str
    checks: Mapping[str, Mapping[str, Any]]
    devices: int


@dataclass(frozen=True)
class Duplicate:
    augmentation: str
    workers: tuple[int, ...]
    num_workers: int


@dataclass(frozen=True)
class Break:
    """A check of one configuration that does not hold, and where."""

    configuration: str
    check: str
    op: str | None  # the first leaf (augmentation) that differs, or "order"
    num_workers: tuple[int, ...]  # the counts where it breaks (workers_agree: compared)
    augmentations: tuple[str, ...]  # every leaf that differs
    duplicates: tuple[Duplicate, ...]  # streams_distinct: the repeated streams
    devices: int

    @property
    def words(self) -> str:
        """The break in a line: what a page or the doctor prints."""
        if self.duplicates:
            alike: dict[tuple[tuple[int, ...], int], list[str]] = {}
            for d in self.duplicates:
                alike.setdefault((d.workers, d.num_workers), []).append(d.augmentation)
            return "; ".join(
                f"{', '.join(names)} {'repeats' if len(names) == 1 else 'repeat'} in workers "
                f"{', '.join(map(str, workers))} (num_workers={count})"
                for (workers, count), names in alike.items())
        where = f" (num_workers {', '.join(map(str, self.num_workers))})" \
            if self.num_workers and self.check != "workers_agree" else ""
        what = f": {', '.join(self.augmentations)}" if self.augmentations else ""
        return f"{BROKEN[self.check]}{where}{what}"


@dataclass(frozen=True)
class PipelineRow:
    environment: int
    suite: str
    workload: str
    variant: str
    devices: int
    recipe_holds: bool | None  # None: no configuration "recipe" reported
    without: str | None  # the configuration without the recipe ("no_recipe" or "own")
    without_holds: bool | None
    workers_agree: bool | None  # under the recipe
    breaks: list[Break] = field(default_factory=list)

    @property
    def needs_recipe(self) -> bool | None:
        """Whether something the recipe holds breaks without it (None: not both known)."""
        if self.recipe_holds is None or self.without_holds is None:
            return None
        return self.recipe_holds and not self.without_holds


def data_pipelines(reported: Iterable[Reported]) -> list[PipelineRow]:
    """A row per (environment, suite, workload, variant) with pipeline checks, sorted by
    those."""
    by_key: dict[tuple[int, str, str, str], list[Reported]] = defaultdict(list)
    for entry in reported:
        if any(is_pipeline_check(name) for name in entry.checks):
            by_key[(entry.environment, entry.suite, entry.workload, entry.variant)].append(entry)
    return [_row(key, entries) for key, entries in sorted(by_key.items())]


def _row(key: tuple[int, str, str, str], entries: list[Reported]) -> PipelineRow:
    seen: set[tuple[str, str]] = set()
    breaks: dict[tuple[str, str, str | None], Break] = {}
    for entry in entries:
        for name, check in entry.checks.items():
            found = split_check(name)
            if found is None:
                continue
            seen.add(found)
            if check.get("equal") is True:
                continue
            place = (*found, check.get("op"))
            before = breaks.get(place)
            made = _break(found, check, entry.devices)
            breaks[place] = made if before is None else _merged(before, made)
    ordered = sorted(breaks.values(), key=lambda b: (CONFIGURATIONS.index(b.configuration),
                                                     CHECKS.index(b.check), b.op or ""))
    without = next((c for c in WITHOUT if any(s[0] == c for s in seen)), None)

    def holds(configuration: str | None, checks: tuple[str, ...]) -> bool | None:
        if configuration is None or not any((configuration, c) in seen for c in checks):
            return None
        return not any(b.configuration == configuration and b.check in checks
                       for b in ordered)

    return PipelineRow(
        environment=key[0], suite=key[1], workload=key[2], variant=key[3],
        # The row's outcomes (its devices' answers, on each device model) hold apart.
        devices=sum(entry.devices for entry in entries),
        recipe_holds=holds(RECIPE, HOLDS), without=without,
        without_holds=holds(without, HOLDS),
        workers_agree=holds(RECIPE, ("workers_agree",)), breaks=ordered)


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value) else ()


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _break(found: tuple[str, str], check: Mapping[str, Any], devices: int) -> Break:
    configuration, name = found
    duplicates = tuple(
        Duplicate(str(d.get("augmentation")), _ints(d.get("workers")),
                  int(d.get("num_workers") or 0))
        for d in (check.get("duplicates") or []) if isinstance(d, Mapping))
    augmentations = _strs(check.get("augmentations"))
    if name == "workers_agree" and isinstance(check.get("differing"), Mapping):
        augmentations = tuple(dict.fromkeys(
            leaf for leaves in check["differing"].values() for leaf in _strs(leaves)))
    op = check.get("op")
    return Break(configuration, name, op if isinstance(op, str) else None,
                 _ints(check.get("num_workers")), augmentations, duplicates, devices)


def _merged(a: Break, b: Break) -> Break:
    """One break reported by several outcomes of an environment."""
    return Break(a.configuration, a.check, a.op,
                 tuple(sorted(set(a.num_workers) | set(b.num_workers))),
                 tuple(dict.fromkeys([*a.augmentations, *b.augmentations])),
                 tuple(dict.fromkeys([*a.duplicates, *b.duplicates])), a.devices + b.devices)
