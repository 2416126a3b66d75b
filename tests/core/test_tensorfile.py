"""Step outputs round-trip exactly, and a missing or garbled one names its URL."""
from __future__ import annotations

import numpy as np
import pytest

from rl_core.data import TensorFileError, read_tensors, write_tensors


def test_round_trip_keeps_shapes_dtypes_and_meta(tmp_path) -> None:
    arrays = {"scalar": np.array(2.5), "m": np.arange(12, dtype=np.int64).reshape(3, 4),
              "t": np.arange(6, dtype=np.float32).reshape(2, 3).T}  # a non-contiguous view
    url = f"file://{tmp_path}/x/a.safetensors"
    write_tensors(url, arrays, {"iteration": 3})
    back, meta = read_tensors(url)
    assert meta == {"iteration": 3}
    for k, v in arrays.items():
        assert back[k].shape == v.shape and back[k].dtype == v.dtype and np.array_equal(back[k], v)


def test_missing_file_names_the_url(tmp_path) -> None:
    with pytest.raises(TensorFileError, match="missing"):
        read_tensors(f"file://{tmp_path}/nope.safetensors")


def test_garbled_file_names_the_url(tmp_path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(TensorFileError, match="not a readable tensor file"):
        read_tensors(f"file://{path}")
