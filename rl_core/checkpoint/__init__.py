"""Lossless delta checkpoints of named numpy arrays + JSON metadata on any fsspec URL.

``CheckpointStore(url).commit(tensors, meta)`` writes a version: a full snapshot every ``full_every`` versions,
otherwise each tensor as "same" (unchanged), "xor" (bit-pattern XOR with the parent) or "full", always byte
planes + zstd-1, in content-addressed chunks plus one JSON manifest and a commit marker per version.
``load()`` restores the newest version that verifies (every chunk and every decoded tensor is hashed).
No pickle anywhere: tensors are raw bytes, dtype/shape/metadata are JSON. See store.py for the layout and the
commit protocol, manifest.py for the schema and codec.py for the byte codecs.
"""

from .codec import decode_full, decode_xor, encode_full, encode_xor
from .manifest import SCHEMA_VERSION, Manifest, TensorEntry
from .store import (
    CheckpointError,
    CheckpointStore,
    ChunkCorruptError,
    ChunkError,
    ChunkMissingError,
    ManifestCorruptError,
    RestoreError,
    Snapshot,
    VersionConflictError,
    VersionNotFoundError,
)

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointError",
    "CheckpointStore",
    "ChunkCorruptError",
    "ChunkError",
    "ChunkMissingError",
    "Manifest",
    "ManifestCorruptError",
    "RestoreError",
    "Snapshot",
    "TensorEntry",
    "VersionConflictError",
    "VersionNotFoundError",
    "decode_full",
    "decode_xor",
    "encode_full",
    "encode_xor",
]
