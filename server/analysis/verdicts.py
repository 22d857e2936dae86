"""One verdict for a whole result: the worst of its tensors' verdicts, and which decided.

A result passes ``torch.testing.assert_close`` over all its tensors only when every tensor
does, so the result's verdict is the most severe of its tensors' (``nonfinite`` over
``divergent`` over ``equivalent`` over ``identical``); of equally severe tensors the first
in the reference's execution order decides, so the answer names where it starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SEVERITY: dict[str, int] = {"identical": 0, "equivalent": 1, "divergent": 2, "nonfinite": 3}


@dataclass(frozen=True)
class ResultVerdict:
    verdict: str
    tensor: str  # the tensor that decided it (the first of the most severe)
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "tensor": self.tensor, "kind": self.kind}


def worst_verdict(verdicts: Iterable[str]) -> str | None:
    """The most severe of ``verdicts`` (None when there is none)."""
    return max(verdicts, key=SEVERITY.__getitem__, default=None)


def result_verdict(rows: Iterable[Mapping[str, Any]]) -> ResultVerdict | None:
    """``rows``: per-tensor comparisons in reference order, each with ``name``, ``kind``
    and ``verdict`` (as ``compare_manifests`` gives them). None when there is no tensor."""
    decided: Mapping[str, Any] | None = None
    for row in rows:
        if decided is None or SEVERITY[row["verdict"]] > SEVERITY[decided["verdict"]]:
            decided = row
    if decided is None:
        return None
    return ResultVerdict(decided["verdict"], decided["name"], decided["kind"])
