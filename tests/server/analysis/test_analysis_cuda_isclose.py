"""The judge's isclose in a CUDA device's arithmetic, pinned by exact fractions (issue 28).

ATen's isclose computes ``allowed = atol + (rtol * other).abs()`` and ``actual =
(self - other).abs()``; float16 and bfloat16 operations are done in float32 and rounded
to the dtype. On the CPU the scalar ``atol`` is first rounded to the dtype (TensorIterator
promotes CPU operands); on CUDA it stays a double scalar that the kernel reads as a
float32 (``server/analysis/closeness.py`` cites the source). The oracle below writes
those steps with exact rationals and round-to-nearest-even into each format, never
with the server's code or numpy's floats. Pairs are derived from the source: each
reference ``b`` with candidates ``a`` placed at and one step around both devices'
boundaries, so some pairs are close on one device and not on the other.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from numparity_server.analysis import Tolerance, compare
from numparity_server.analysis.closeness import close_count, semantics_of

# (significand bits with the implicit one, smallest normal exponent, largest exponent)
FORMATS = {"float16": (11, -14, 15), "bfloat16": (8, -126, 127), "float32": (24, -126, 127)}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
INF = Fraction(10) ** 400  # stands for an overflow to infinity


def rn(x: Fraction, dtype: str) -> Fraction:
    """``x`` rounded to the nearest value of ``dtype``, ties to even (overflow: INF)."""
    if x == 0 or abs(x) >= INF:
        return x
    p, emin, emax = FORMATS[dtype]
    sign, x = (-1 if x < 0 else 1), abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if Fraction(2) ** e > x:
        e -= 1
    ulp = Fraction(2) ** (max(e, emin) - p + 1)
    n, rest = divmod(x, ulp)
    n = int(n) + (1 if rest > ulp / 2 or (rest == ulp / 2 and int(n) % 2) else 0)
    y = n * ulp
    return sign * (INF if y >= Fraction(2) ** (emax + 1) else y)


def oracle_close(a: Fraction, b: Fraction, dtype: str, rtol: float, atol: float,
                 device: str) -> bool:
    """isclose(a, b) as ATen computes it for a float16/bfloat16 pair on ``device``."""
    if a == b:
        return True
    actual = rn(rn(abs(a - b), "float32"), dtype)
    scaled = rn(rn(abs(b) * rn(Fraction(rtol), "float32"), "float32"), dtype)
    atol_term = (rn(rn(Fraction(atol), "float32"), dtype) if device == "cpu"
                 else rn(Fraction(atol), "float32"))
    allowed = rn(rn(scaled + atol_term, "float32"), dtype)
    return actual < INF and actual <= allowed


def neighbours(x: Fraction, dtype: str) -> list[Fraction]:
    """``x`` and the values of ``dtype`` one step below and above it."""
    p, emin, _ = FORMATS[dtype]
    e = max(x.numerator.bit_length() - x.denominator.bit_length(), emin) if x else emin
    ulp = Fraction(2) ** (e - p + 1)
    return [rn(x - ulp, dtype), x, rn(x + ulp, dtype)]


def boundary_pairs(dtype: str, rtol: float, atol: float, count: int, seed: int
                   ) -> list[tuple[Fraction, Fraction]]:
    """References log-uniform from far below atol to 16, either sign; for each, the
    candidates at and around a + allowed on the CPU and on CUDA (the oracle's)."""
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.standard_normal(count) * np.exp(rng.uniform(-14, 3, count)))
    pairs = []
    for b in (Fraction(float(v)) for v in values.to(TORCH[dtype]).float()):
        for device in ("cpu", "cuda"):
            atol_term = (rn(rn(Fraction(atol), "float32"), dtype) if device == "cpu"
                         else rn(Fraction(atol), "float32"))
            scaled = rn(rn(abs(b) * rn(Fraction(rtol), "float32"), "float32"), dtype)
            allowed = rn(rn(scaled + atol_term, "float32"), dtype)
            for edge in neighbours(rn(b + allowed, dtype), dtype):
                pairs.append((edge, b))
    return pairs


def _verdicts(pairs: list[tuple[Fraction, Fraction]], dtype: str, rtol: float, atol: float,
              semantics: str) -> list[bool]:
    """The server's close_count, one pair at a time (each pair its own array)."""
    tolerance = Tolerance(rtol=rtol, atol=atol)
    return [close_count(np.array([float(a)], np.float32), np.array([float(b)], np.float32),
                        dtype, tolerance, semantics) == 1 for a, b in pairs]


CASES = [("float16", 1e-3, 1e-5), ("float16", 1e-2, 1e-3), ("bfloat16", 1.6e-2, 1e-5),
         ("bfloat16", 1e-2, 1e-3)]


@pytest.mark.parametrize(("dtype", "rtol", "atol"), CASES)
def test_cuda_semantics_is_atens_cuda_arithmetic_at_the_boundary(dtype, rtol, atol):
    pairs = boundary_pairs(dtype, rtol, atol, count=400, seed=len(dtype) + int(1 / rtol))
    pairs = [(a, b) for a, b in pairs if abs(a) < INF]
    want_cuda = [oracle_close(a, b, dtype, rtol, atol, "cuda") for a, b in pairs]
    want_cpu = [oracle_close(a, b, dtype, rtol, atol, "cpu") for a, b in pairs]
    assert _verdicts(pairs, dtype, rtol, atol, "cuda") == want_cuda
    assert _verdicts(pairs, dtype, rtol, atol, "cpu") == want_cpu
    # The CPU's oracle is torch's own CPU isclose: the two oracles share every step but one.
    a = torch.tensor([float(x) for x, _ in pairs]).to(TORCH[dtype])
    b = torch.tensor([float(y) for _, y in pairs]).to(TORCH[dtype])
    assert torch.isclose(a, b, rtol=rtol, atol=atol).tolist() == want_cpu
    # Both verdicts occur, so either semantics could fail this test.
    assert 0 < sum(want_cuda) < len(pairs)


def test_the_devices_part_on_pairs_where_atols_rounding_decides():
    """float16 with rtol 1e-2 and atol 1e-3 (a lab's policy): 1e-3 is 1.0004e-3 as a
    float16, 1.0e-3 as a float32, and some pairs fall between the two boundaries."""
    pairs = boundary_pairs("float16", 1e-2, 1e-3, count=400, seed=3)
    parted = [(a, b) for a, b in pairs
              if oracle_close(a, b, "float16", 1e-2, 1e-3, "cpu")
              != oracle_close(a, b, "float16", 1e-2, 1e-3, "cuda")]
    assert parted  # the source says they exist; the oracle finds them
    cuda = _verdicts(parted, "float16", 1e-2, 1e-3, "cuda")
    cpu = _verdicts(parted, "float16", 1e-2, 1e-3, "cpu")
    assert all(x != y for x, y in zip(cuda, cpu, strict=True))
    assert cuda == [oracle_close(a, b, "float16", 1e-2, 1e-3, "cuda") for a, b in parted]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_with_rtol_zero_and_in_float32_the_devices_agree(dtype):
    pairs = boundary_pairs(dtype, 0.0, 1e-3, count=300, seed=11)
    assert _verdicts(pairs, dtype, 0.0, 1e-3, "cuda") == _verdicts(pairs, dtype, 0.0, 1e-3,
                                                                    "cpu")
    rng = np.random.default_rng(5)
    b = (rng.standard_normal(5000) * np.exp(rng.uniform(-12, 3, 5000))).astype(np.float32)
    a = (b * (1 + rng.uniform(-3e-6, 3e-6, 5000))).astype(np.float32)
    tolerance = Tolerance(rtol=1.3e-6, atol=1e-5)
    assert close_count(a, b, "float32", tolerance, "cuda") == close_count(
        a, b, "float32", tolerance, "cpu") == int(torch.isclose(
            torch.from_numpy(a), torch.from_numpy(b), rtol=1.3e-6, atol=1e-5).sum())


def test_compare_says_which_semantics_it_applied(make_fingerprint):
    a = np.array([1.0, 2.0], dtype=np.float16)
    b = np.array([1.0, 2.001], dtype=np.float16)
    for semantics in ("cpu", "cuda"):
        found = compare(make_fingerprint(a, "float16", name="a"),
                        make_fingerprint(b, "float16", name="b"), semantics=semantics)
        assert found.semantics == semantics and found.to_dict()["semantics"] == semantics
    assert semantics_of("cuda:0", "cuda:0", same_device=True) == "cuda"
    # Two devices' tensors: assert_close moves both to the CPU (check_device=False).
    assert semantics_of("cuda:0", "cuda:3", same_device=False) == "cpu"
    assert semantics_of("cuda:0", "cpu", same_device=False) == "cpu"
    assert semantics_of("cpu", "cpu", same_device=True) == "cpu"
