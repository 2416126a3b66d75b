"""Delta-checkpoint store on any fsspec URL (``file://``, ``memory://``, ``s3://`` ...).

Layout under the store URL::

    chunks/<aa>/<sha256>      one encoded chunk, named by the sha256 of its stored bytes (aa = first 2 hex digits);
                              objects of at most ``embed_bytes`` (4 KiB) live in the manifests instead
    versions/<%08d>.json      manifest of a version (schema 3, or 4 when a chunk is chained or an object embedded;
                              see manifest.py)
    versions/<%08d>.commit    commit marker: the version exists if and only if this object exists; it holds the
                              manifest's sha256 (JSON), so a manifest edited in storage is refused (empty before
                              December 2026: such a version's manifest is not checked)

Encoding. Each tensor's raw bytes are cut into chunks of ``chunk_bytes`` (default 8 MiB; rounded to whole rows
for 2-D+ tensors; small tensors are one chunk). A *base* version stores every chunk "full" (byte planes +
zstd-1). The next versions are deltas against that base: each chunk is the smallest of "same"
(equal to the base's chunk: references the base's object, costs nothing), "diff" (wrap-around difference
of the bit patterns from the base's chunk, byte planes, zstd-1), "xor" (the same with XOR), "rows" (indices + XOR
of the changed rows, for 2-D tensors where few rows change) and "full". A sparse-row chunk whose rows changed
since the parent are at most half of those changed since the base is chained instead: stored as the rows changed
since the parent, decoded through the parent's delta (chunks.py says why only those). A new base is written after
``full_every - 1`` deltas, or right after a delta whose new bytes exceeded ``rebase_ratio`` (0.7) times the base's
stored size (the base has then aged so much that deltas cost nearly a full copy; a new base makes the next deltas
small again). A version restores from at most two objects per chunk, its own and the base's, plus one per link of
a chained chunk (fewer than ``full_every``).

Commit protocol: five steps, each there for a reason given in ``writer.py``, the writer's state and its commit.

Garbage collection (:meth:`CheckpointStore.gc`) is safe while a writer is active: ``gc.py`` says how.

Forks (:meth:`CheckpointStore.fork`): a new store whose first versions borrow this one's objects without copying them
(``fork.py``); the fork pins them here (``pins/<id>.json``, ``pins.py``) and gc keeps what pins list.

How each backend publishes whole objects and creates exclusively: ``objects.py``. Reading back: ``restore.py``.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from .chunks import normalize_meta, prepare_tensors, to_array
from .errors import (
    CheckpointError,
    ChunkCorruptError,
    ChunkError,
    ChunkMissingError,
    ManifestCorruptError,
    RestoreError,
    StorageError,
    VersionConflictError,
    VersionNotFoundError,
    _fmt_versions,
)
from .fork import fork_versions
from .gc import collect_garbage
from .jobs import run_jobs
from .manifest import Manifest
from .objects import StoreObjects, redact
from .pins import read_pins
from .restore import VersionReader
from .writer import VersionWriter

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "ChunkCorruptError",
    "ChunkError",
    "ChunkMissingError",
    "ManifestCorruptError",
    "RestoreError",
    "Snapshot",
    "StorageError",
    "VersionConflictError",
    "VersionNotFoundError",
]


DEFAULT_CHUNK_BYTES = 8 << 20
INLINE_MAX_BYTES = 4 << 20
"""Below this much data per batch of chunk jobs, a local store encodes, writes and restores on the calling thread."""
DEFAULT_EMBED_BYTES = 4 << 10
"""Objects up to this size are embedded in the manifest instead of stored on their own (see manifest.py)."""


# ------------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Snapshot:
    """One restored version. Arrays are fresh, writable and own their memory.

    ``logical_dtypes`` names tensors whose bytes mean a dtype numpy lacks (``{"w": "bfloat16"}``: ``w`` is
    returned as ``<u2`` holding bf16 bit patterns); :meth:`to_torch` returns torch tensors of the logical dtype.
    """

    version: int
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any]
    logical_dtypes: dict[str, str] = field(default_factory=dict)

    def to_torch(self) -> dict[str, Any]:
        """Tensors as torch tensors sharing this snapshot's memory, bf16 bit patterns reinterpreted."""
        import torch

        out = {}
        for name, arr in self.tensors.items():
            t = torch.from_numpy(arr)
            logical = self.logical_dtypes.get(name)
            out[name] = t.view(getattr(torch, logical)) if logical else t
        return out


# --------------------------------------------------------------------------------------------------- store


class CheckpointStore:
    """Versioned, lossless, content-addressed checkpoints of named arrays plus JSON metadata.

    ``full_every``: a full base at least every ``full_every`` versions (1 = every version full).
    ``chunk_bytes``: chunk size (4-16 MiB suits object stores; default 8 MiB).
    ``rebase_ratio``: write a new base after a delta whose new bytes exceed this fraction of the base's size.
    ``embed_bytes``: objects up to this size go into the manifest, not storage (0: none; see manifest.py).
    ``workers``: threads that encode, upload and decode chunks (zstd, hashlib and numpy release the GIL).
    ``sole_writer``: the caller guarantees no other writer commits to this URL while it lives (it holds the run's
    lease): a claim left by a writer that died mid-commit is then withdrawn, not skipped, so each commit's number
    is the newest committed version + 1 (see writer.py).
    Thread-safe; a process may hold several stores on one URL, but only one should commit to a run.
    """

    def __init__(
        self,
        url: str,
        *,
        full_every: int = 8,
        storage_options: dict[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        rebase_ratio: float = 0.7,
        workers: int | None = None,
        embed_bytes: int = DEFAULT_EMBED_BYTES,
        sole_writer: bool = False,
    ) -> None:
        if not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1 (1 = every version full), got {full_every!r}")
        if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be a positive int (4-16 MiB suits object stores), got {chunk_bytes!r}")
        if not rebase_ratio > 0:
            raise ValueError(f"rebase_ratio must be > 0, got {rebase_ratio!r}")
        if not isinstance(embed_bytes, int) or embed_bytes < 0:
            raise ValueError(f"embed_bytes must be an int >= 0 (0 = embed nothing), got {embed_bytes!r}")
        self._embed_bytes = embed_bytes
        self._sole_writer = sole_writer
        self._url = redact(url)
        self._full_every = full_every
        self._chunk_bytes = chunk_bytes
        self._rebase_ratio = float(rebase_ratio)
        self._workers = max(1, workers if workers is not None else min(4, os.cpu_count() or 1))
        self._storage_options = storage_options
        self._objects = StoreObjects(url, storage_options)
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._reader = VersionReader(self._objects, self._url, self._map)
        self._writer = self._new_writer()

    def __repr__(self) -> str:
        return f"CheckpointStore({self._url!r}, full_every={self._full_every})"

    @property
    def url(self) -> str:
        """The store URL with any credentials removed."""
        return self._url

    @property
    def full_every(self) -> int:
        return self._full_every

    @property
    def chunk_bytes(self) -> int:
        return self._chunk_bytes

    # ------------------------------------------------------------------------------------------- public

    def versions(self) -> list[int]:
        """Committed versions (those with a commit marker), ascending; StorageError naming the store when it cannot
        be listed."""
        return sorted(self._storage_call("list versions", lambda: self._objects.scan()[0]))

    def latest(self) -> int | None:
        """Newest committed version, or None for an empty store. It may still fail verification: load()
        falls back past it."""
        versions = self.versions()
        return versions[-1] if versions else None

    def commit(
        self, tensors: Mapping[str, Any], meta: Mapping[str, Any], *, logical_dtypes: Mapping[str, str] | None = None
    ) -> int:
        """Store a new version: a full base, or a delta against the current base (see the module docstring).
        ``tensors`` maps names to numpy arrays (or torch tensors). Returns the new version number.

        Raises VersionConflictError if another writer claims the same version number first, StorageError
        (naming the store URL) if storage fails; in both cases nothing of the commit is visible.
        """
        arrays, logical = prepare_tensors(tensors, logical_dtypes)
        meta_json = normalize_meta(meta)
        with self._lock:
            return self._writer.commit(arrays, logical, meta_json)

    def load(self, version: int | None = None) -> Snapshot:
        """Restore ``version`` exactly, verifying every chunk hash and every decoded chunk hash.

        ``None`` means the newest version that verifies: a failing newer version is logged as a warning and
        skipped. Raises VersionNotFoundError for an unknown version and a RestoreError subclass
        (ChunkMissingError, ChunkCorruptError, ManifestCorruptError) naming the newest older loadable version.
        The next commit builds on the loaded version (as its parent, against its base).
        """
        with self._lock:
            manifest, raws = self._storage_call("load", lambda: self._load_verified(version))
            self._writer.loaded(manifest, raws)
        tensors = {name: to_array(entry, raws[name]) for name, entry in manifest.tensors.items()}
        logical = {n: e.logical_dtype for n, e in manifest.tensors.items() if e.logical_dtype}
        return Snapshot(version=manifest.version, tensors=tensors, meta=copy.deepcopy(manifest.meta),
                        logical_dtypes=logical)

    def manifest(self, version: int) -> dict[str, Any]:
        """The manifest of a committed version as a JSON-compatible dict (a copy)."""
        return json.loads(self._committed_manifest(version).to_json_bytes())

    def meta(self, version: int) -> dict[str, Any]:
        """The JSON meta of a committed version (a copy), without serialising its tensors' entries as
        ``manifest`` does."""
        return copy.deepcopy(self._committed_manifest(version).meta)

    def size_report(self, version: int) -> dict[str, Any]:
        """``encoded_bytes``: bytes this version's commit added to storage ("same" chunks and objects already
        referenced add none); ``stored_bytes``: bytes of the objects its chunks name (a "same" chunk names the
        base's object; the base objects that "diff"/"xor"/"rows" chunks decode against are not counted);
        ``raw_bytes``; ``codec_counts`` per chunk; ``base`` (None: a full base) and ``depth``; ``borrowed``: for a
        fork's borrowed version, the path to the store holding its objects (its base and depth are that store's)."""
        m = self._committed_manifest(version)
        return {
            "raw_bytes": m.raw_bytes(),
            "encoded_bytes": m.encoded_bytes(),
            "stored_bytes": m.stored_bytes(),
            "codec_counts": m.codec_counts(),
            "chunks": sum(len(e.chunks) for e in m.tensors.values()),
            "base": m.base,
            "depth": m.depth,
            "borrowed": None if m.borrowed is None else m.borrowed.store,
        }

    def verify(self, version: int | None = None) -> dict[str, Any]:
        """Read and check every object (sha256 of stored bytes) and every decoded chunk (raw_xxh3) of
        ``version``, or of every committed version when None. Returns ``{"checked": [...], "errors": {v: msg}}``
        and never raises for corruption (VersionNotFoundError for an unknown version)."""
        with self._lock:
            committed = self.versions()
            targets = committed if version is None else [version]
            if version is not None and version not in committed:
                raise VersionNotFoundError(self._url, version, committed)
            errors: dict[int, str] = {}
            for v in targets:
                try:
                    self._reader.restore(v)
                except RestoreError as exc:
                    errors[v] = str(exc)
            return {"checked": targets, "errors": errors}

    def set_aside(self, version: int) -> str:
        """Take the newest committed version, one that fails verification, out of the store: its commit marker and
        manifest move under ``set-aside/`` (kept for inspection; its chunks stay until gc), so the version before
        it is the newest and the next commit reuses the number. Returns where they went. Only the newest can go:
        nothing builds on it yet."""
        with self._lock:
            committed = self.versions()
            if not committed or committed[-1] != version:
                raise CheckpointError(f"checkpoint store {self._url}: only the newest version can be set aside "
                                      f"(asked {version}, committed {_fmt_versions(committed)})")
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            for source, suffix in ((self._objects.marker_path(version), "commit"),
                                   (self._objects.manifest_path(version), "json")):
                data = self._storage_call("set a version aside", lambda: self._objects.read(source))
                target = self._objects.set_aside_path(version, stamp, suffix)
                self._storage_call("set a version aside", lambda: self._objects.put_whole(target, data))
                self._storage_call("set a version aside", lambda: self._objects.remove(source))
            # Start over as a new store instance would: the set-aside version may hold a corrupt object that must be
            # written again, not trusted as known.
            self._reader = VersionReader(self._objects, self._url, self._map)
            self._writer = self._new_writer()
            return self._objects.set_aside_path(version, stamp, "*")

    def set_aside_count(self) -> int:
        """How many versions were ever set aside: each one started a new line of versions after it."""
        return len(self._storage_call("list set-aside versions", self._objects.set_aside_markers))

    def gc(
        self,
        keep_last: int = 1,
        keep_every: int | None = None,
        *,
        grace_s: float = 3600.0,
        claim_grace_s: float = 3600.0,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Delete versions outside the retention policy, then objects no remaining manifest references.

        Kept: the newest ``keep_last`` (>= 1) committed versions, every version divisible by ``keep_every``,
        every version a fork pins, and every version a kept one references (its base). Objects are deleted only
        when unreferenced by every manifest, committed or in flight, and by every fork's pin, and older than
        ``grace_s``; safe while a writer commits or a fork is made (gc.py gives the argument). A claim (manifest
        without marker) is deleted only when older than ``claim_grace_s``: a younger one may belong to a writer about
        to create its marker. A borrowed version this store deletes gives up its pin in the store it borrowed from.
        Returns a report of what was (``dry_run``: would be) deleted, the pinned versions, the pins released and
        ``unclaimed_pins``: pins whose fork holds no version naming them (pins.py).
        """
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1 (the newest version is always kept), got {keep_last!r}")
        if keep_every is not None and (not isinstance(keep_every, int) or keep_every < 1):
            raise ValueError(f"keep_every must be None or an int >= 1, got {keep_every!r}")
        with self._lock:
            return self._storage_call("collect garbage", lambda: collect_garbage(
                self._objects, self._reader, self._url, keep_last=keep_last, keep_every=keep_every, grace_s=grace_s,
                claim_grace_s=claim_grace_s, dry_run=dry_run, forget_version=self._writer.forget_version,
                forget_object=self._writer.forget_object,
            ))

    def fork(self, target_url: str, versions: Iterable[int], *, meta: Mapping[str, Any] | None = None,
             lineage: Mapping[str, Any] | None = None) -> list[int]:
        """Start the empty store at ``target_url`` (on this store's filesystem) from committed ``versions`` of this
        one, copying no object: each becomes a borrowed version there (its number kept; fork.py says how, and gc.py
        why this store's gc never deletes what the fork reads). Its meta is this version's with ``meta`` over it and
        ``forked_from``: ``lineage`` plus the version and the sha256 of its manifest. Nothing is verified beyond the
        manifests: verify() a version first to fork only one that restores. Returns the versions."""
        chosen = sorted(set(versions))
        if not chosen:
            raise ValueError("fork needs at least one version to borrow")
        target = StoreObjects(target_url, self._storage_options)
        if target.fs != self._objects.fs:
            raise ValueError(f"fork target {redact(target_url)} is not on the filesystem of {self._url}: a fork "
                             "borrows objects in place, so it lives in the same store (same scheme and options)")
        extra, about = normalize_meta(meta or {}), normalize_meta(lineage or {})
        with self._lock:
            return self._storage_call("fork", lambda: fork_versions(
                self._objects, self._reader, self._url, target, redact(target_url), chosen, extra, about))

    def pins(self) -> dict[str, dict[str, Any]]:
        """The pins forks hold on this store's objects, by id: each fork's store (a path from this store's root),
        the version it borrows and how many stored objects that version reads (pins.py)."""
        pins = self._storage_call("list pins", lambda: read_pins(self._objects, self._url, grace_s=float("inf")))
        return {i: {"fork": p.fork, "version": p.version, "objects": len(p.objects)} for i, p in pins.items()}

    def close(self) -> None:
        """Stop the worker threads (the store stays usable; they restart on demand)."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    # ----------------------------------------------------------------------------- writer, threads, storage

    def _new_writer(self) -> VersionWriter:
        """A writer that knows nothing yet: its first commit reads what it builds on from storage."""
        return VersionWriter(
            self._objects, self._reader, self._url, run_jobs=self._map, storage_call=self._storage_call,
            storage_error=self._storage_error, versions=self.versions, full_every=self._full_every,
            chunk_bytes=self._chunk_bytes, rebase_ratio=self._rebase_ratio, embed_bytes=self._embed_bytes,
            sole_writer=self._sole_writer,
        )

    def _map(self, fn: Callable[..., Any], items: list[Any], nbytes: int) -> list[Any]:
        """Run ``fn`` over items (``nbytes`` of data in all) on ``workers`` threads, the caller one of them (see
        jobs.py), in order; the first failure is raised. Small work on a local filesystem runs inline: there the
        GIL hand-offs cost more than the work (a small learner state, such as PPO's, commits and loads faster
        inline). Object stores keep the threads at any size, since each job waits on a network round trip."""
        if len(items) <= 1 or self._workers == 1 or (self._objects.local and nbytes < INLINE_MAX_BYTES):
            return [fn(*it) for it in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers - 1, thread_name_prefix="ckpt")
        return run_jobs(self._pool, self._workers - 1, fn, items)

    def _storage_call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a storage operation; backend failures (an unreachable endpoint, no permission) become StorageError
        naming the store URL. A corrupt or missing object is a CheckpointError of its own and passes through."""
        try:
            return fn()
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - botocore, aiohttp, OSError ...: all mean "storage failed"
            raise self._storage_error(what, exc) from exc

    def _storage_error(self, what: str, exc: BaseException) -> StorageError:
        if what in ("list versions", "load", "list pins"):
            consequence = "nothing was read or changed; try again when storage is reachable"
        elif what == "fork":
            consequence = ("nothing of the fork is visible (a pin it could not remove keeps objects only, and gc "
                           "reports it as unclaimed); fork again when storage is reachable")
        elif what == "collect garbage":
            consequence = "every committed version it kept is intact; run gc again when storage is reachable"
        else:
            consequence = "nothing of this commit is visible, commit again when storage is reachable"
        return StorageError(f"checkpoint store {self._url}: could not {what} ({type(exc).__name__}: {exc}); "
                            f"{consequence}")

    # ----------------------------------------------------------------------------------------- reading

    def _committed_manifest(self, version: int) -> Manifest:
        if not self._reader.is_cached(version):
            committed = self.versions()
            if version not in committed:
                raise VersionNotFoundError(self._url, version, committed)
        return self._reader.manifest(version, version)

    def _load_verified(self, version: int | None) -> tuple[Manifest, dict[str, np.ndarray]]:
        committed = self.versions()
        if version is None:
            return self._reader.restore_newest(committed)
        if version not in committed:
            raise VersionNotFoundError(self._url, version, committed)
        try:
            return self._reader.restore(version)
        except RestoreError as exc:
            raise exc.with_fallback(self._reader.newest_loadable_before(version, committed, exc)) from None
