"""Byte codecs: exact round trips, the byte-plane layout, XOR behaviour and error reporting."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zstandard

from rl_core.checkpoint import codec
from rl_core.checkpoint.codec import decode_full, decode_xor, encode_full, encode_xor

DTYPES = ["<f4", "<f8", "<i8", "|u1", "|b1", "<c16", "<f2", ">f4", "<i2"]
SIZES = [0, 1, 7, 1000]


def _random(dtype: str, n: int, seed: int) -> np.ndarray:
    """Random arrays with every byte pattern plausible for the dtype (raw random bytes, not just values)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt)
    return np.frombuffer(rng.bytes(n * dt.itemsize), dtype=dt).copy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_full_round_trip_is_byte_exact(dtype: str, n: int) -> None:
    arr = _random(dtype, n, seed=n)
    out = decode_full(encode_full(arr.tobytes(), arr.itemsize), arr.itemsize)
    assert out.dtype == np.uint8 and out.tobytes() == arr.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_xor_round_trip_is_byte_exact(dtype: str, n: int) -> None:
    parent, new = _random(dtype, n, seed=1), _random(dtype, n, seed=2)
    enc = encode_xor(new.tobytes(), parent.tobytes(), new.itemsize)
    assert decode_xor(enc, parent.tobytes(), new.itemsize).tobytes() == new.tobytes()


def test_byte_planes_put_byte_k_of_every_element_together() -> None:
    arr = np.array([1.0, 2.0, -3.5], dtype="<f4")
    planes = zstandard.ZstdDecompressor().decompress(encode_full(arr.tobytes(), 4))
    by_element = np.frombuffer(arr.tobytes(), np.uint8).reshape(3, 4)
    assert planes == by_element.T.tobytes()
    assert planes[9:12] == bytes(by_element[:, 3])  # plane 3 = the sign/exponent bytes


def test_xor_against_identical_parent_is_all_zero_and_tiny() -> None:
    arr = _random("<f8", 10_000, seed=3)
    enc = encode_xor(arr.tobytes(), arr.tobytes(), 8)
    assert zstandard.ZstdDecompressor().decompress(enc) == bytes(arr.nbytes)
    assert len(enc) < 100


def test_xor_of_small_update_is_smaller_than_full() -> None:
    rng = np.random.default_rng(4)
    old = rng.standard_normal(100_000).astype(np.float32)
    new = old.copy()
    new[rng.choice(old.size, 1000, replace=False)] += 1e-3
    assert len(encode_xor(new, old, 4)) < len(encode_full(new, 4)) / 10


def test_accepts_bytes_memoryview_and_arrays_alike() -> None:
    arr = _random("<f4", 64, seed=5)
    encodings = {encode_full(x, 4) for x in (arr.tobytes(), memoryview(arr), arr, arr.view(np.uint8))}
    assert len(encodings) == 1


@pytest.mark.parametrize("shape", [(), (0, 4), (3, 5)])
def test_decode_into_out_fills_the_callers_array(shape: tuple[int, ...]) -> None:
    parent = _random("<f8", int(np.prod(shape)), seed=6).reshape(shape)
    new = _random("<f8", int(np.prod(shape)), seed=7).reshape(shape)
    out = np.empty(shape, "<f8")
    decode_full(encode_full(new.tobytes(), 8), 8, out=out)
    assert out.tobytes() == new.tobytes()
    out2 = np.empty(shape, "<f8")
    decode_xor(encode_xor(new.tobytes(), parent.tobytes(), 8), parent.tobytes(), 8, out=out2)
    assert out2.tobytes() == new.tobytes()


def test_errors_say_what_was_expected() -> None:
    with pytest.raises(ValueError, match="not a multiple of itemsize 4"):
        encode_full(b"12345", 4)
    with pytest.raises(ValueError, match="same-sized"):
        encode_xor(bytes(8), bytes(12), 4)
    with pytest.raises(ValueError, match="not a valid zstd frame"):
        decode_full(b"definitely not zstd", 4)
    with pytest.raises(ValueError, match="output buffer holds"):
        decode_full(encode_full(bytes(8), 4), 4, out=np.empty(3, "<f4"))
    with pytest.raises(ValueError, match="parent_raw has"):
        decode_xor(encode_full(bytes(8), 4), bytes(4), 4)


def test_zstd_contexts_are_reused_per_thread_not_shared() -> None:
    assert codec._compressor() is codec._compressor()
    assert codec._decompressor() is codec._decompressor()
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(codec._compressor()))
    thread.start()
    thread.join()
    assert other[0] is not codec._compressor()


@pytest.mark.parametrize("itemsize,cols", [(4, 16), (8, 3), (1, 5), (2, 64)])
def test_rows_round_trip_is_byte_exact(itemsize: int, cols: int) -> None:
    from rl_core.checkpoint.codec import decode_rows, encode_rows, xor_bytes

    rng = np.random.default_rng(itemsize * cols)
    row = itemsize * cols
    parent = np.frombuffer(rng.bytes(500 * row), np.uint8)
    new = parent.copy()
    for r in rng.choice(500, 7, replace=False):
        new[r * row + rng.integers(row)] ^= 0x5A
    enc = encode_rows(xor_bytes(new, parent, itemsize), itemsize, row)
    assert decode_rows(enc, parent, itemsize, row).tobytes() == new.tobytes()
    assert len(enc) < 20 * row + 200
    same = encode_rows(xor_bytes(parent, parent, itemsize), itemsize, row)
    assert decode_rows(same, parent, itemsize, row).tobytes() == parent.tobytes()


def test_rows_decoder_rejects_bad_payloads() -> None:
    from rl_core.checkpoint.codec import decode_rows, encode_rows

    parent = bytes(64)
    with pytest.raises(ValueError, match="not a valid zstd frame"):
        decode_rows(b"nope", parent, 4, 16)
    bad = zstandard.ZstdCompressor().compress(np.array([99], "<u8").tobytes())
    with pytest.raises(ValueError, match="does not hold 99 rows"):
        decode_rows(bad, parent, 4, 16)
    with pytest.raises(ValueError, match="row_bytes"):
        encode_rows(bytes(64), 4, 6)
