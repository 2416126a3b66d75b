"""Named arrays plus a JSON header in one object on any fsspec URL (safetensors format: no pickle).

Used for experience shards, scored batches and staged learner state: the things steps hand to each
other through the store, so a retried or resumed step reads exactly what its predecessor wrote.
"""
from __future__ import annotations

import json
from typing import Any

import fsspec
import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

_META_KEY = "gymflow"


class TensorFileError(RuntimeError):
    """A tensor file is missing or unreadable; the message names the URL."""


def write_tensors(url: str, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> int:
    """Write `arrays` and JSON-able `meta` to `url` as one whole object; returns its size in bytes."""
    payload = st_save(
        {k: _c_contiguous(v) for k, v in arrays.items()},
        metadata={_META_KEY: json.dumps(meta or {})},
    )
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, payload)  # one whole put: no half-written object on object stores
    return len(payload)


def _c_contiguous(array: np.ndarray) -> np.ndarray:
    """C-ordered without changing shape (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def read_tensors(url: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and meta written by `write_tensors`."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        payload = fs.cat_file(path)
    except FileNotFoundError:
        raise TensorFileError(f"{url} is missing: the step that writes it has not completed") from None
    try:
        arrays = st_load(payload)
        header = _read_metadata(payload)
    except Exception as err:  # safetensors raises its own error types for truncated/garbled files
        raise TensorFileError(f"{url} is not a readable tensor file ({err}); rerun the step that writes it") from err
    return {k: np.array(v) for k, v in arrays.items()}, header


def _read_metadata(payload: bytes) -> dict[str, Any]:
    """The JSON meta from the safetensors header (8-byte little-endian length, then JSON)."""
    size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + size])
    return json.loads(header.get("__metadata__", {}).get(_META_KEY, "{}"))
