"""The binary frame: arrays travel exactly, in the dtypes it allows; any other bytes are a FrameError saying what is
wrong, never another exception and never an array read past the frame's end."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rl_core.runtime.serving.frames import MAGIC, FrameError, decode_frame, encode_frame


def test_arrays_and_data_travel_exactly() -> None:
    arrays = {"obs": np.random.default_rng(0).normal(size=(3, 17)), "done": np.array([True, False, True]),
              "ended": np.array([0, 2]), "half": np.ones((2, 2), np.float32), "none": np.zeros((0, 17))}
    kind, data, got = decode_frame(encode_frame("observation", {"reward": None, "done": False}, arrays))
    assert (kind, data) == ("observation", {"reward": None, "done": False})
    for name, array in arrays.items():
        np.testing.assert_array_equal(got[name], array)
        assert got[name].dtype == (np.float32 if name == "half" else np.int64 if name == "ended" else array.dtype)


def frame(header: object, payload: bytes = b"", length: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw) if length is None else length) + raw + payload


@pytest.mark.parametrize("data, says", [
    (b"GFB", "starts with"),
    (b"XXXX\x00\x00\x00\x00", "starts with"),
    (frame({"type": "step"}, length=999), "header length 999 exceeds"),
    (MAGIC + struct.pack("<I", 2) + b"\xff\xfe", "not UTF-8 JSON"),
    (MAGIC + struct.pack("<I", 50000) + b"[" * 50000, "not UTF-8 JSON"),
    (frame([1]), 'string "type"'),
    (frame({"type": "step", "data": 1}), '"data" must be a JSON object'),
    (frame({"type": "step", "arrays": [{"name": "a", "dtype": "|O", "shape": [1]}]}, b"x" * 8), "dtype must be"),
    (frame({"type": "step", "arrays": [{"name": "a", "dtype": "<f8", "shape": [1, 1, 1]}]}, b"x" * 8), "shape must"),
    (frame({"type": "step", "arrays": [{"name": "a", "dtype": "<f8", "shape": [-1]}]}), "shape must"),
    (frame({"type": "step", "arrays": [{"name": "a", "dtype": "<f8", "shape": [2, 3]}]}, b"x" * 47), "needs 48"),
    (frame({"type": "step", "arrays": []}, b"x"), "1 bytes follow"),
    (frame({"type": "step", "arrays": [{"name": "a", "dtype": "<f8"}]}), "each array description"),
])
def test_a_malformed_frame_says_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(FrameError, match=says):
        decode_frame(data)


@given(st.binary(max_size=200) | st.binary(max_size=100).map(lambda tail: MAGIC + tail))
def test_random_bytes_are_a_frame_error_or_a_frame(data: bytes) -> None:
    try:
        decode_frame(data)
    except FrameError:
        pass
