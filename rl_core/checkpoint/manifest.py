"""The JSON manifest of one checkpoint version, and how it is (de)serialized.

A manifest is the whole description of a version: which tensors it holds, how each one's bytes were encoded
and which chunk (content-addressed object) holds them, plus free-form JSON metadata. Tensor payloads are raw
bytes; dtype and shape live here, so nothing ever needs pickle.

Codecs per tensor entry:

* ``"full"``: ``chunk`` holds the tensor's own bytes (byte planes + zstd); ``ref_version`` is None.
* ``"xor"``: ``chunk`` holds XOR(raw, raw of the same tensor at ``ref_version``), byte planes + zstd.
* ``"same"``: raw bytes are identical to the same tensor at ``ref_version``; no chunk is stored
  (``chunk`` is None, ``encoded_bytes`` is 0). Pointing at the parent version (not at the version that
  owns a chunk) keeps every entry one hop from its reference, like ``"xor"``, so a restore walks one chain
  shape for both codecs; full snapshots every ``full_every`` versions bound that chain.

``ref_version`` always names an older version whose entry for the same tensor name has the same dtype and
shape. ``raw_sha256`` is the hash of the tensor's raw (decoded) bytes, checked on every restore.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["SCHEMA_VERSION", "Codec", "Manifest", "TensorEntry", "utc_now_iso"]

SCHEMA_VERSION = 1

Codec = Literal["full", "xor", "same"]

_SHA256_HEX = r"^[0-9a-f]{64}$"


def utc_now_iso() -> str:
    """Creation timestamps are UTC so that manifests written on different machines compare directly."""
    return datetime.now(timezone.utc).isoformat()


class TensorEntry(BaseModel):
    """How one tensor of one version is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = Field(description='numpy dtype string, e.g. "<f4"')
    shape: list[int]
    nbytes: int = Field(ge=0)
    codec: Codec
    chunk: str | None = Field(default=None, pattern=_SHA256_HEX, description="sha256 of the encoded bytes")
    ref_version: int | None = Field(default=None, ge=0)
    raw_sha256: str = Field(pattern=_SHA256_HEX)
    encoded_bytes: int = Field(ge=0)

    @field_validator("dtype")
    @classmethod
    def _dtype_is_plain(cls, value: str) -> str:
        """Only dtypes whose string form round-trips exactly can be restored from the manifest."""
        try:
            dt = np.dtype(value)
        except TypeError as exc:
            raise ValueError(f"dtype {value!r} is not a numpy dtype string") from exc
        if dt.hasobject or dt.fields is not None or dt.itemsize == 0:
            raise ValueError(f"dtype {value!r} is not a fixed-size, non-structured numpy dtype")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TensorEntry:
        """Reject entries a restore could not follow, so a bad manifest fails on parse, not mid-restore."""
        if any(d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape} has a negative dimension")
        expected = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if self.nbytes != expected:
            raise ValueError(f"nbytes {self.nbytes} != prod(shape {self.shape}) * itemsize ({expected})")
        if self.codec == "full" and (self.chunk is None or self.ref_version is not None):
            raise ValueError("codec 'full' needs a chunk and no ref_version")
        if self.codec == "xor" and (self.chunk is None or self.ref_version is None):
            raise ValueError("codec 'xor' needs a chunk and a ref_version")
        if self.codec == "same" and (self.chunk is not None or self.ref_version is None or self.encoded_bytes):
            raise ValueError("codec 'same' needs a ref_version, no chunk and encoded_bytes 0")
        return self


class Manifest(BaseModel):
    """One version: its lineage, its tensors and its metadata.

    ``parent`` is the version this one was built on (the version the writing store last committed or
    loaded), kept for lineage even on full snapshots. ``depth`` counts delta versions since the last full
    snapshot (0 = full snapshot); the writer starts a new full snapshot when depth would reach
    ``full_every``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    version: int = Field(ge=0)
    parent: int | None = Field(default=None, ge=0)
    depth: int = Field(default=0, ge=0)
    created: str = Field(default_factory=utc_now_iso, description="ISO 8601 creation time, UTC")
    tensors: dict[str, TensorEntry]
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("created")
    @classmethod
    def _created_is_iso(cls, value: str) -> str:
        datetime.fromisoformat(value)
        return value

    @model_validator(mode="after")
    def _refs_point_back(self) -> Manifest:
        """References must point to older versions; anything else would make a restore chain cycle."""
        if self.parent is not None and self.parent >= self.version:
            raise ValueError(f"parent {self.parent} is not older than version {self.version}")
        for name, entry in self.tensors.items():
            if entry.ref_version is not None and entry.ref_version >= self.version:
                raise ValueError(
                    f"tensor {name!r}: ref_version {entry.ref_version} is not older than version {self.version}"
                )
        return self

    def to_json_bytes(self) -> bytes:
        """Serialize with the stdlib json module so ``meta`` round-trips as Python wrote it (NaN included;
        pydantic's JSON mode would turn NaN into null)."""
        return json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse and validate; raises ValueError (pydantic's ValidationError included) on anything malformed."""
        return cls.model_validate(json.loads(data))

    def raw_bytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())

    def encoded_bytes(self) -> int:
        return sum(e.encoded_bytes for e in self.tensors.values())
