"""The judge, end to end: crafted tensor pairs through the real agent and a live server.

Two nodes run the user workload ``crafted_pairs:crafted`` (side a and side b of every
pair: four float dtypes, small and large tensors, ±0, subnormals, ±Inf, NaN, one ULP
inside and outside the tolerance, outliers, uniform errors) and upload to a real
server, on SQLite and on PostgreSQL.
Each node's agent offers the full values of its large tensors and the server asks for
those it does not hold. For every tensor, ``/compare``'s verdict must be what
``torch.testing.assert_close`` says, and every max abs / max rel / max ULP it reports
must equal exact arithmetic.
"""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.torch_oracle import expected_verdict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import crafted_pairs  # noqa: E402

WORKLOAD = "crafted_pairs:crafted"
_BITS = {torch.float16: (torch.int16, 15), torch.bfloat16: (torch.int16, 15),
         torch.float32: (torch.int32, 31), torch.float64: (torch.int64, 63)}


def _rank(value: int, bits: int) -> int:
    """The integer of a float's bit pattern that grows with its value (nulp_diff's)."""
    magnitude = value & ((1 << bits) - 1)
    return -magnitude if value < 0 else magnitude


def exact_metrics(a: torch.Tensor, b: torch.Tensor) -> dict[str, float | None]:
    """max |b - a| and max |b - a| / |a| over finite pairs in exact rational arithmetic,
    rounded once to float64 (inf where a is 0 and b is not), and the max ULP distance
    over pairs without a NaN, counted in the dtype's own steps."""
    a64, b64 = a.double().tolist(), b.double().tolist()
    max_abs: Fraction | None = None
    max_rel: Fraction | float | None = None
    for x, y in zip(a64, b64, strict=True):
        if not (abs(x) < float("inf") and abs(y) < float("inf")):
            continue
        diff = abs(Fraction(y) - Fraction(x))
        max_abs = diff if max_abs is None else max(max_abs, diff)
        rel: Fraction | float = (diff / abs(Fraction(x)) if x != 0
                                 else (float("inf") if diff else Fraction(0)))
        max_rel = rel if max_rel is None else max(max_rel, rel)
    int_type, bits = _BITS[a.dtype]
    ranks_a = [_rank(v, bits) for v in a.view(int_type).tolist()]
    ranks_b = [_rank(v, bits) for v in b.view(int_type).tolist()]
    nan = (torch.isnan(a) | torch.isnan(b)).tolist()
    ulps = [abs(x - y) for x, y, skip in zip(ranks_a, ranks_b, nan, strict=True) if not skip]
    return {"max_abs": None if max_abs is None else float(max_abs),
            "max_rel": None if max_rel is None else float(max_rel),
            "max_ulp": float(max(ulps)) if ulps else None}


@pytest.fixture(scope="module")
def oracle() -> dict[str, tuple[str, dict[str, float | None]]]:
    """Per tensor name: the verdict and exact metrics, computed once for both databases."""
    # Run a is the reference (expected), run b the candidate (actual).
    return {name: (expected_verdict(b, a), exact_metrics(a, b))
            for name, (a, b) in crafted_pairs.pairs().items()}


def run_node(server: Any, node: str, side: str, spool: Path) -> None:
    env = {**os.environ, "NUMPARITY_TOKEN": server.agent_token,
           "NUMPARITY_CRAFTED_SIDE": side,
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "run", "--node", node, "--server",
         server.base_url, "--spool", str(spool), "--workloads", WORKLOAD,
         "--variants", "default", "--repeats", "1"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def newest_run(server: Any, node: str) -> str:
    response = httpx.get(f"{server.base_url}/api/v1/runs", params={"node": node},
                         headers={"Authorization": f"Bearer {server.reader_token}"},
                         timeout=60)
    assert response.status_code == 200, response.text
    runs = sorted(response.json()["items"], key=lambda run: run["started_at"])
    return str(runs[-1]["run_id"])


PAGE = 100


def test_every_verdict_is_assert_closes_and_every_reported_metric_is_exact(
        live_server: Any, tmp_path: Path, oracle: dict[str, Any]) -> None:
    run_node(live_server, "crafted-a", "a", tmp_path / "spool-a")
    run_node(live_server, "crafted-b", "b", tmp_path / "spool-b")
    runs = {"run_a": newest_run(live_server, "crafted-a"),
            "run_b": newest_run(live_server, "crafted-b")}
    # The tensor rows come a page at a time: read every page (bounded by the total).
    tensors: dict[str, Any] = {}
    offset, total = 0, None
    while total is None or offset < total:
        response = httpx.get(
            f"{live_server.base_url}/api/v1/compare",
            params={**runs, "limit": PAGE, "offset": offset},
            headers={"Authorization": f"Bearer {live_server.reader_token}"}, timeout=120)
        assert response.status_code == 200, response.text
        body = response.json()
        (pair,) = body["pairs"]
        total = body["tensors_total"]
        assert pair["tensors"] and offset < 10 * len(oracle)
        tensors.update((row["name"], row) for row in pair["tensors"])
        offset += len(pair["tensors"])
    assert tensors.keys() == oracle.keys()

    wrong = {name: (row["verdict"], oracle[name][0], row["basis"])
             for name, row in tensors.items() if row["verdict"] != oracle[name][0]}
    assert wrong == {}, f"verdicts that differ from assert_close (got, want, basis): {wrong}"

    inexact = {}
    for name, row in tensors.items():
        exact = oracle[name][1]
        for metric in ("max_abs", "max_rel", "max_ulp"):
            reported = row["metrics"].get(metric)
            # Reported or not; an infinite max_rel travels as null (JSON has no inf).
            if reported is not None and reported != exact[metric]:
                inexact[f"{name}.{metric}"] = (reported, exact[metric])
    assert inexact == {}, f"metrics that differ from exact arithmetic: {inexact}"
    # Large tensors were judged from their full values, not from a sample.
    bases = {row["basis"] for name, row in tensors.items()
             if ".large." in name and row["verdict"] != "identical"}
    assert bases == {"values"}
    assert pair["summary"]["result_verdict"]["verdict"] == "nonfinite"
