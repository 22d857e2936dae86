"""Drift: what changed when a node moved to another environment between two runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .environment import environment_diff

# (suite, workload, variant, device): a result of a run.
OutputKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class AttributeChange:
    attribute: str
    before: str
    after: str


@dataclass(frozen=True)
class ChangedOutput:
    suite: str
    workload: str
    variant: str
    device: str


def attribute_changes(before: Mapping[str, str], after: Mapping[str, str]
                      ) -> list[AttributeChange]:
    """The attributes that differ between two flattened environments, by name."""
    return [AttributeChange(d["attribute"], d["a"], d["b"])
            for d in environment_diff(before, after)]


def outputs_changed(before: Mapping[OutputKey, str | None], after: Mapping[OutputKey, str | None]
                    ) -> list[ChangedOutput]:
    """The results both runs have whose answer (manifest hash) differs, by key."""
    return [ChangedOutput(*key) for key in sorted(after.keys() & before.keys())
            if after[key] != before[key]]
