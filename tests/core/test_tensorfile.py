"""Step outputs round-trip exactly, and a missing or garbled one names its URL."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors import SafetensorError

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


def test_a_local_write_leaves_no_partial_file_and_replaces_whole(tmp_path) -> None:
    """Written beside its name and renamed: the folder holds the file alone, and a rewrite replaces it whole."""
    url = f"file://{tmp_path}/a.safetensors"
    write_tensors(url, {"x": np.zeros(3)}, {"n": 1})
    size = write_tensors(url, {"x": np.arange(5.0), "flags": np.array([True, False])}, {"n": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert size == (tmp_path / "a.safetensors").stat().st_size
    back, meta = read_tensors(url)
    assert meta == {"n": 2} and np.array_equal(back["x"], np.arange(5.0)) and back["flags"].dtype == bool
    back["x"][0] = 7.0  # the arrays read are the caller's own, writable


def test_a_failed_local_write_leaves_the_old_file(tmp_path) -> None:
    url = f"file://{tmp_path}/a.safetensors"
    write_tensors(url, {"x": np.ones(2)})
    with pytest.raises(SafetensorError, match="Unknown dtype"):
        write_tensors(url, {"x": np.array(["text"], dtype=object)})  # no such safetensors dtype
    assert [p.name for p in tmp_path.iterdir()] == ["a.safetensors"]
    assert np.array_equal(read_tensors(url)[0]["x"], np.ones(2))
