"""The CountSketch estimate of the relative L2 error, validated statistically."""

import numpy as np

from numparity_server.analysis import compare

PARTS = ("stats", "sketch")


def test_true_relative_l2_within_two_uncertainties(rng, make_fingerprint):
    inside = total = 0
    for _ in range(500):
        n = int(rng.integers(1000, 5000))
        b = rng.standard_normal(n) * rng.uniform(0.1, 10)
        scale = 10 ** rng.uniform(-5, 0)
        noise = rng.standard_normal(n)
        if rng.random() < 0.3:  # errors concentrated in a part of the tensor
            noise[rng.random(n) < 0.8] = 0.0
        a = b + scale * np.abs(b).mean() * noise
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        comparison = compare(make_fingerprint(a32, parts=PARTS), make_fingerprint(b32, parts=PARTS))
        if comparison.verdict == "identical":
            continue
        estimate = comparison.metrics["rel_l2_est"]
        uncertainty = comparison.metrics["rel_l2_err"]
        a64, b64 = a32.astype(np.float64), b32.astype(np.float64)
        exact = np.linalg.norm(a64 - b64) / np.linalg.norm(b64)
        total += 1
        inside += abs(exact - estimate) <= 2 * uncertainty
    assert total >= 450
    assert inside / total >= 0.85


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
