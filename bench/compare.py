"""Comparison benchmark: every metric of two large float32 tensors. Not run by CI.

    .venv/bin/python bench/compare.py [--numel 50000000] [--repeats 3] [--seed 0]

For each case, two float32 arrays of ``--numel`` elements (activation-like values: a
normal distribution with a few exact zeros), the reference ``b`` and ``a``:

- ``close``: ``a`` is ``b`` with 10 % of its elements moved by 1 to 4 ULP (the kind of
  change a different reduction order makes), within assert_close's float32 tolerance;
- ``divergent``: as ``close``, plus 0.1 % of the elements off by 1e-3 relative, beyond
  the tolerance, so assert_close raises and builds its mismatch message (the timing
  includes that; the AssertionError is caught).

It times, best of ``--repeats``:

- numparity: ``numparity_server.analysis.compare`` on two ``Fingerprint`` objects that
  carry the whole tensor as ``values`` (all metrics: max_abs, max_rel, max_ulp,
  mismatch_fraction, rmse, cosine, sqnr_db, rel_l2, and the verdict). The hashes are
  two different placeholder strings: the server receives the hashes, it does not
  compute them;
- torch: ``torch.testing.assert_close`` with its defaults on ``torch.from_numpy`` of the
  same arrays (no copy), with torch's default thread count;

and prints both times, the ratio numparity / torch (target <= 1.0x: no slower while
computing more), and whether the verdict agrees with assert_close.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from numparity_server.analysis import Fingerprint, compare

TARGET_RATIO = 1.0


def make_pair(numel: int, case: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) float32, b the reference."""
    rng = np.random.default_rng(seed)
    b = rng.standard_normal(numel, dtype=np.float32)
    b[rng.integers(0, numel, numel // 1000)] = 0.0  # ReLU-like exact zeros
    a = b.copy()
    moved = rng.integers(0, numel, numel // 10)
    steps = rng.integers(1, 5, moved.size).astype(np.int32) * rng.choice(
        np.int32([-1, 1]), moved.size
    )
    # Stepping the bit pattern moves a nonzero float32 by |step| ULP (away from or towards
    # zero); the zeros stay exact zeros, as they do under a reordered sum.
    nonzero = a[moved] != 0
    a.view(np.int32)[moved[nonzero]] += steps[nonzero]
    if case == "divergent":
        far = rng.integers(0, numel, numel // 1000)
        a[far] = b[far] * np.float32(1.001) + np.float32(1e-3)
    return a, b


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def numparity_compare(a: np.ndarray, b: np.ndarray) -> tuple[str, dict]:
    shape = a.shape
    fa = Fingerprint(hash="a", dtype="float32", shape=shape, values=a)
    fb = Fingerprint(hash="b", dtype="float32", shape=shape, values=b)
    comparison = compare(fa, fb)
    return comparison.verdict, comparison.metrics


def torch_assert_close(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b))
    except AssertionError as exc:
        str(exc)  # the message is built inside assert_close; make sure it is complete
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=50_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="best of N (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", nargs="+", default=["close", "divergent"],
                        choices=["close", "divergent"])
    args = parser.parse_args()

    print(f"numel {args.numel:,} float32 ({args.numel * 4 / 2**20:.0f} MiB per array), "
          f"best of {args.repeats}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; numpy "
          f"{np.__version__}; cpus {os.cpu_count()}; python {sys.version.split()[0]}")
    print()
    print(f"{'case':<10} {'numparity s':>12} {'assert_close s':>15} {'ratio':>7}  "
          f"{'verdict':<11} {'assert_close':<12} target")
    worst = 0.0
    for case in args.cases:
        a, b = make_pair(args.numel, case, args.seed)
        ours_s, (verdict, metrics) = best_of(args.repeats, lambda a=a, b=b: numparity_compare(a, b))
        torch_s, passes = best_of(args.repeats, lambda a=a, b=b: torch_assert_close(a, b))
        ratio = ours_s / torch_s
        worst = max(worst, ratio)
        agrees = (verdict == "equivalent") == passes
        print(f"{case:<10} {ours_s:>12.3f} {torch_s:>15.3f} {ratio:>6.2f}x  {verdict:<11} "
              f"{'passes' if passes else 'raises':<12} "
              f"{'ok' if ratio <= TARGET_RATIO else 'OVER TARGET'}"
              f"{'' if agrees else '  (VERDICT DISAGREES)'}")
        shown = ", ".join(f"{k}={v:.6g}" for k, v in metrics.items() if v is not None)
        print(f"{'':<10} {shown}")
        del a, b
    print()
    print(f"worst ratio {worst:.2f}x (target <= {TARGET_RATIO:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
