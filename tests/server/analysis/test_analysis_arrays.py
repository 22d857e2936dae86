import base64

import numpy as np
import pytest
import torch

from numparity_server.analysis import decode_array, encode_array, fingerprint_from_wire


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "int32", "uint8"])
def test_decode_little_endian_round_trip(dtype, rng):
    values = (rng.standard_normal(12) * 50).astype(dtype)
    raw = values.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    decoded = decode_array(dtype, _b64(raw), (3, 4))
    assert decoded.shape == (3, 4)
    assert decoded.dtype == np.dtype(dtype)
    assert np.array_equal(decoded.ravel(), values)
    assert np.array_equal(decode_array(dtype, raw), values)  # raw bytes, flat


def test_decode_big_endian_host_independent():
    # The wire is little-endian whatever the host: 1.0f is 00 00 80 3f.
    assert decode_array("float32", bytes([0, 0, 0x80, 0x3F]))[0] == 1.0


def test_bfloat16_decodes_exactly_as_torch_holds_it():
    patterns = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    as_bf16 = patterns.view(torch.bfloat16)
    raw = patterns.numpy().astype("<i2").tobytes()
    decoded = decode_array("bfloat16", _b64(raw))
    expected = as_bf16.float().numpy()
    assert decoded.dtype == np.float32
    finite = np.isfinite(expected)
    assert np.array_equal(decoded[finite], expected[finite])
    assert np.array_equal(np.signbit(decoded[finite]), np.signbit(expected[finite]))
    assert np.array_equal(np.isnan(decoded), np.isnan(expected))
    assert np.array_equal(np.isposinf(decoded), np.isposinf(expected))


def test_encode_bfloat16_rounds_like_torch(rng):
    values = (rng.standard_normal(1000) * 1e3).astype(np.float32)
    wire = encode_array(values, "bfloat16")
    expected = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert np.array_equal(decode_array(wire["dtype"], wire["data"]), expected)


def test_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match=r"10 bytes.*float32 of shape \[3\] needs 12"):
        decode_array("float32", b"\0" * 10, (3,))
    with pytest.raises(ValueError, match="not a multiple"):
        decode_array("float64", b"\0" * 12)


def test_bad_base64_and_dtype_are_clear_errors():
    with pytest.raises(ValueError, match="base64"):
        decode_array("float32", "not*base64!")
    with pytest.raises(ValueError, match="unsupported dtype"):
        decode_array("complex32", b"")


def test_fingerprint_from_wire_decodes_every_part(rng, make_wire):
    values = rng.standard_normal((8, 16)).astype(np.float32)
    fingerprint = fingerprint_from_wire(make_wire(values))
    assert fingerprint.shape == (8, 16)
    assert np.array_equal(fingerprint.values, values)
    assert fingerprint.sketch.shape == (256,) and fingerprint.sketch.dtype == np.float64
    assert fingerprint.sample.shape == (64,) and fingerprint.sample.dtype == np.float32
    assert fingerprint.stats["count"] == 128


def test_fingerprint_from_wire_names_the_broken_field(rng, make_wire):
    entry = make_wire(rng.standard_normal(10).astype(np.float32))
    entry["sample"]["data"] = _b64(b"\0" * 12)
    with pytest.raises(ValueError, match="sample: m=64 but data holds 3"):
        fingerprint_from_wire(entry)
    del entry["hash"]
    with pytest.raises(ValueError, match="hash"):
        fingerprint_from_wire(entry)
