"""Lossless delta checkpoints of named numpy arrays (or torch tensors) + JSON metadata on any fsspec URL.

``CheckpointStore(url).commit(tensors, meta)`` writes a version: a full base every ``full_every`` versions
(or sooner when deltas grow), otherwise each chunk (8 MiB by default) of each tensor as "same", "diff", "xor",
"rows" (sparse rows) or "full" against the base, in content-addressed objects plus one JSON manifest and a commit
marker per version. ``load()`` restores the newest version that verifies (every object and every decoded chunk
is hashed). ``gc()`` applies a retention policy; :class:`AsyncSaver` saves in the background; ``python -m
rl_core.checkpoint`` is the command line (ls, show, verify, gc, export).
No pickle anywhere: tensors are raw bytes, dtype/shape/metadata are JSON. See store.py for the layout and the
commit protocol, objects.py for how each backend writes objects, restore.py for verified reads, gc.py for
retention, manifest.py for the schema, chunks.py for how chunks are cut and encoded, codec.py for the byte codecs
(and their registry: a new codec is one ``register_codec`` call) and errors.py for what can go wrong.
"""

from .asyncsave import AsyncSaveError, AsyncSaver
from .codec import (
    CodecSpec,
    available_codecs,
    decode_diff,
    decode_full,
    decode_rows,
    decode_xor,
    encode_diff,
    encode_full,
    encode_rows,
    encode_xor,
    get_codec,
    register_codec,
    unregister_codec,
)
from .manifest import EXTENDED_SCHEMA_VERSION, SCHEMA_VERSION, ChainLink, ChunkEntry, Manifest, TensorEntry
from .store import (
    CheckpointError,
    CheckpointStore,
    ChunkCorruptError,
    ChunkError,
    ChunkMissingError,
    ManifestCorruptError,
    RestoreError,
    Snapshot,
    StorageError,
    VersionConflictError,
    VersionNotFoundError,
)

__all__ = [
    "EXTENDED_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "AsyncSaveError",
    "AsyncSaver",
    "ChainLink",
    "ChunkEntry",
    "CodecSpec",
    "StorageError",
    "available_codecs",
    "get_codec",
    "register_codec",
    "unregister_codec",
    "decode_rows",
    "encode_rows",
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
    "decode_diff",
    "decode_full",
    "decode_xor",
    "encode_diff",
    "encode_full",
    "encode_xor",
]
