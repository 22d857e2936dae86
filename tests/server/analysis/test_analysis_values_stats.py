"""A tensor's statistics from values that arrive in pieces (analysis.tensor_stats
``ValuesStats``, what completing values uploaded in parts computes): against an
independent float64 oracle (exact sums by ``math.fsum``), whatever the pieces' byte
boundaries, across many chunks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from numparity_server.analysis.tensor_stats import CHUNK_ELEMENTS, SUM_RTOL, ValuesStats

TINY = {"float16": 2.0**-14, "float32": 2.0**-126, "float64": 2.0**-1022}


def _oracle(x: np.ndarray, tiny: float) -> dict[str, float]:
    finite = x[np.isfinite(x)]
    mean = math.fsum(finite) / finite.size
    return {"count": x.size, "nan": int(np.isnan(x).sum()), "pos_inf": int((x == np.inf).sum()),
            "neg_inf": int((x == -np.inf).sum()), "zero": int((finite == 0).sum()),
            "subnormal": int(((finite != 0) & (np.abs(finite) < tiny)).sum()),
            "fp16_overflow": int((np.abs(finite) > 65504).sum()),
            "fp16_underflow": int(((finite != 0) & (np.abs(finite) < 2.0**-14)).sum()),
            "min": finite.min(), "max": finite.max(), "abs_max": np.abs(finite).max(),
            "mean": mean, "std": math.sqrt(math.fsum((finite - mean) ** 2) / finite.size),
            "l2": math.sqrt(math.fsum(finite * finite))}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_statistics_of_values_in_pieces_are_the_wholes(dtype):
    rng = np.random.default_rng(5)
    n = 3 * CHUNK_ELEMENTS + 1001  # several chunks and a partial one
    x = (rng.standard_normal(n) * 3 + 0.5).astype(dtype)
    x[[0, 17, CHUNK_ELEMENTS, n - 1]] = [np.nan, np.inf, -np.inf, 0.0]
    x[[5, 6]] = [TINY[dtype] / 4, 70000.0 if dtype != "float16" else -0.0]
    raw = x.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    stats = ValuesStats(dtype)
    # Pieces that split elements: a byte, an odd count, a chunk and a byte, the rest.
    cuts = [0, 1, 8, 8 + CHUNK_ELEMENTS * x.itemsize + 1, len(raw)]
    for start, end in itertools.pairwise(cuts):
        stats.add(raw[start:end])
    found = stats.result()
    expected = _oracle(x.astype(np.float64), TINY[dtype])
    assert found["inf"] == expected["pos_inf"] + expected["neg_inf"]
    for key, value in expected.items():
        if key in ("mean", "std", "l2"):
            assert found[key] == pytest.approx(value, rel=SUM_RTOL), key
        else:
            assert found[key] == value, key


def test_bytes_past_the_last_whole_element_are_an_error():
    stats = ValuesStats("float32")
    stats.add(b"\0" * 6)
    with pytest.raises(ValueError, match="2 bytes past"):
        stats.result()
