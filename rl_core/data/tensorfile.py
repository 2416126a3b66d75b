"""Named arrays plus a JSON header in one object on any fsspec URL (safetensors format: no pickle).

Used for experience shards, scored batches and staged learner state: the things steps hand to each
other through the store, so a retried or resumed step reads exactly what its predecessor wrote. The header
carries an XXH3-128 of the arrays (names, dtypes, shapes, bytes) and the meta, checked on every read: safetensors
checks only that the header's offsets cover the file, so a damaged byte would otherwise read as another value.
"""
from __future__ import annotations

import json
from typing import Any

import fsspec
import numpy as np
import xxhash
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

_META_KEY = "gymflow"
_DIGEST_KEY = "gymflow_xxh3"


class TensorFileError(RuntimeError):
    """A tensor file is missing or unreadable; the message names the URL."""


Tensors = dict[str, np.ndarray]
"""Named arrays: what steps hand each other through the store and what a checkpoint holds."""

def write_tensors(url: str, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> int:
    """Write `arrays` and JSON-able `meta` to `url` as one whole object; returns its size in bytes."""
    arrays = {k: _c_contiguous(v) for k, v in arrays.items()}
    meta_json = json.dumps(meta or {})
    payload = st_save(arrays, metadata={_META_KEY: meta_json, _DIGEST_KEY: _digest(arrays, meta_json)})
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(fs._parent(path), exist_ok=True)
    fs.pipe_file(path, payload)  # one whole put: no half-written object on object stores
    return len(payload)


def _c_contiguous(array: np.ndarray) -> np.ndarray:
    """C-ordered without changing shape (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _digest(arrays: dict[str, np.ndarray], meta_json: str) -> str:
    """XXH3-128 of what a reader gets back: each array's name, dtype, shape and bytes (little-endian, as safetensors
    stores them), then the meta's JSON."""
    h = xxhash.xxh3_128()
    for name in sorted(arrays):
        array = arrays[name]
        stored = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        h.update(json.dumps([name, stored.dtype.str, list(array.shape)]).encode())
        h.update(stored)
    h.update(meta_json.encode())
    return h.hexdigest()


def read_tensors(url: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and meta written by `write_tensors`."""
    fs, path = fsspec.core.url_to_fs(url)
    try:
        payload = fs.cat_file(path)
    except FileNotFoundError:
        raise TensorFileError(f"{url} is missing: the step that writes it has not completed") from None
    try:
        arrays = st_load(payload)
        meta_json, digest = _read_metadata(payload)
        meta = json.loads(meta_json)
    except Exception as err:  # safetensors raises its own error types for truncated/garbled files
        raise TensorFileError(f"{url} is not a readable tensor file ({err}); rerun the step that writes it") from err
    if digest is not None and digest != _digest(arrays, meta_json):
        raise TensorFileError(f"{url} does not hold what was written: its arrays or meta no longer match the "
                              "checksum written with them (damaged in storage); rerun the step that writes it")
    return {k: np.array(v) for k, v in arrays.items()}, meta


def _read_metadata(payload: bytes) -> tuple[str, str | None]:
    """The meta's JSON and the checksum from the safetensors header (8-byte little-endian length, then JSON). A file
    written before the checksum existed holds the meta alone: any other key there means a damaged header."""
    size = int.from_bytes(payload[:8], "little")
    metadata = json.loads(payload[8 : 8 + size]).get("__metadata__") or {}
    if _DIGEST_KEY not in metadata and set(metadata) - {_META_KEY}:
        raise ValueError(f"its header metadata holds {sorted(metadata)}, not what write_tensors writes")
    return metadata.get(_META_KEY, "{}"), metadata.get(_DIGEST_KEY)
