"""single_bit_flip: one element, one bit — or nothing (rounding changes more)."""

from __future__ import annotations

import numpy as np
import pytest

from numparity_server.analysis import Fingerprint, single_bit_flip


def fingerprint(values: np.ndarray, dtype: str) -> Fingerprint:
    return Fingerprint(hash=str(values.tobytes()), dtype=dtype, shape=values.shape,
                       values=values)


@pytest.mark.parametrize("dtype, unsigned, bit", [("float32", np.uint32, 20),
                                                  ("float16", np.uint16, 7),
                                                  ("float64", np.uint64, 49)])
def test_one_bit_of_one_element_is_named(dtype, unsigned, bit):
    a = np.linspace(-2, 3, 24, dtype=dtype).reshape(4, 6)
    b = a.copy()
    b.reshape(-1).view(unsigned)[9] ^= unsigned(1 << bit)
    flip = single_bit_flip(fingerprint(b, dtype), fingerprint(a, dtype))
    assert flip == {"index": 9, "bit": bit, "reference": float(a.flat[9]),
                    "candidate": float(b.flat[9])}
    # The oracle: the element's bit patterns differ in that bit alone.
    assert bin(int(a.view(unsigned).flat[9] ^ b.view(unsigned).flat[9])).count("1") == 1


def test_rounding_differences_and_wider_changes_are_not_a_flip():
    a = np.linspace(-2, 3, 24, dtype="float32")
    two_elements = a.copy()
    two_elements[[3, 4]] = np.nextafter(two_elements[[3, 4]], np.float32(10))
    two_bits = a.copy()
    two_bits.view(np.uint32)[5] ^= np.uint32(0b11)
    for b in (two_elements, two_bits, a.copy()):
        assert single_bit_flip(fingerprint(b, "float32"), fingerprint(a, "float32")) is None
    no_values = Fingerprint(hash="x", dtype="float32", shape=(24,))
    assert single_bit_flip(no_values, fingerprint(a, "float32")) is None
