"""The CountSketch estimate of the relative L2 error, validated statistically."""

import math

import numpy as np

from numparity_server.analysis import compare

PARTS = ("stats", "sketch")


# How often a normal variable lies within 1, 2, 3 standard deviations of its mean.
NORMAL_COVERAGE = {1: 0.6827, 2: 0.9545, 3: 0.9973}
PAIRS = 1500
# Shapes of the error a - b: spread over every element, over a fifth of them, over 2 %
# (fewer elements than the sketch has buckets), along b (a rescaling plus a little
# noise), and partly along b.
ERRORS = ("dense", "sparse", "few", "along", "mixed")


def _random_pair(rng, error: str) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.integers(1000, 5000))
    b = rng.standard_normal(n) * rng.uniform(0.1, 10)
    if rng.random() < 0.3:  # a ReLU-like reference, half zeros
        b[rng.random(n) < 0.5] = 0.0
    unit = np.abs(b).mean()
    noise = rng.standard_normal(n)
    if error == "sparse":
        noise[rng.random(n) < 0.8] = 0.0
    elif error == "few":
        noise[rng.random(n) > 0.02] = 0.0
    elif error == "along":
        noise = 0.2 * noise + b / unit
    elif error == "mixed":
        noise = noise + rng.uniform(-2, 2) * b / unit
    a = b + 10 ** rng.uniform(-5, 0) * unit * noise
    return a.astype(np.float32), b.astype(np.float32)


def test_interval_covers_the_true_relative_l2_at_the_stated_rate(rng, make_fingerprint):
    """rel_l2_est ± z·rel_l2_err holds the true relative L2 as often as a standard error
    says (68 % for z=1, 95 % for z=2, 99.7 % for z=3), overall and for each shape of error,
    within a binomial margin of 4 standard deviations of the observed rate."""
    deviations: dict[str, list[tuple[float, float]]] = {error: [] for error in ERRORS}
    for i in range(PAIRS):
        error = ERRORS[i % len(ERRORS)]
        a32, b32 = _random_pair(rng, error)
        comparison = compare(make_fingerprint(a32, parts=PARTS), make_fingerprint(b32, parts=PARTS))
        if comparison.verdict == "identical":
            continue
        assert comparison.basis == "sketch"
        a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
        exact = np.linalg.norm(a64 - b64) / np.linalg.norm(b64)
        estimate = comparison.metrics["rel_l2_est"]
        deviations[error].append((abs(exact - estimate), comparison.metrics["rel_l2_err"]))

    def rate(pairs: list[tuple[float, float]], z: int) -> float:
        return sum(off <= z * err for off, err in pairs) / len(pairs)

    def margin(p: float, count: int) -> float:
        return 4 * math.sqrt(p * (1 - p) / count)

    every = [pair for pairs in deviations.values() for pair in pairs]
    assert len(every) >= 0.95 * PAIRS
    for z, p in NORMAL_COVERAGE.items():
        assert abs(rate(every, z) - p) <= margin(p, len(every)), (z, rate(every, z))
    for error, pairs in deviations.items():
        for z in (1, 2):
            p = NORMAL_COVERAGE[z]
            assert abs(rate(pairs, z) - p) <= margin(p, len(pairs)), (error, z, rate(pairs, z))


def test_sketch_only_verdicts(rng, make_fingerprint):
    b = rng.standard_normal(20_000).astype(np.float32)
    close = np.nextafter(b, np.float32(np.inf))
    far = (b * 1.1).astype(np.float32)
    reference = make_fingerprint(b, parts=PARTS)
    near_verdict = compare(make_fingerprint(close, parts=PARTS), reference)
    assert (near_verdict.verdict, near_verdict.basis) == ("equivalent", "sketch")
    far_verdict = compare(make_fingerprint(far, parts=PARTS), reference)
    assert (far_verdict.verdict, far_verdict.basis) == ("divergent", "sketch")
    assert abs(far_verdict.metrics["rel_l2_est"] - 0.1) < 0.03
