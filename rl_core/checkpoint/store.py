"""Delta-checkpoint store on any fsspec URL (``file://``, ``memory://``, ``s3://`` ...).

Layout under the store URL::

    chunks/<aa>/<sha256>      encoded tensor bytes, named by the sha256 of those bytes (aa = first 2 hex digits)
    versions/<%08d>.json      manifest of a version (see manifest.py)
    versions/<%08d>.commit    empty commit marker: the version exists if and only if this object exists

Commit protocol (why each step is there):

1. Encode every tensor (nothing is written yet, so an encoding error leaves no trace).
2. Write chunks that are not there yet. Each chunk object appears whole or not at all (object stores publish
   on upload completion; on local disks we write a temp file and rename it), because a chunk may be shared
   with committed versions and is never deleted. A chunk of the wrong size (left by a crashed writer on a
   backend without atomic uploads) is rewritten.
3. Claim the version by creating its manifest *exclusively*. The claim is what makes racing writers safe: a
   loser learns it lost before it writes anything a reader could see, so it can never overwrite the winner's
   manifest. The loser gets :class:`VersionConflictError`.
4. Create the commit marker exclusively. Readers list markers only, so the version becomes visible in one step,
   after everything it references is complete. If this fails, the manifest claim is removed again (unless the
   marker reached storage after all, in which case the version is committed).

A claim whose writer died before step 4 (manifest without marker) is invisible to readers; writers skip its
number, so the next version is ``1 + max(claimed or committed)``. Chunks written by a failed commit are complete
and unreferenced: harmless, and never deleted here (deleting a content-addressed chunk races with a writer that
is about to reuse it).

A commit is encoded against the version the store last committed or loaded (its ``parent``), so a trainer that
resumes from an older version deltas against what it actually continues from. Several writers on one run never
corrupt each other (every version restores to exactly what its writer committed) but interleave versions; the
intended use is one writer per run.

Exclusive create per backend: local files use ``open(path, "xb")`` (O_EXCL, atomic); ``memory://`` checks then
creates, which this module serialises with a process-wide lock (the memory filesystem is process-local, so that
is exact); other backends use ``pipe_file(mode="create")``, which s3fs sends as a conditional PUT
(``If-None-Match: *``, answered 412 -> FileExistsError). s3fs's ``open(path, "xb")`` is NOT exclusive for empty
objects (it falls back to a plain touch that overwrites), so it is never used here. A backend without a native
conditional create gets fsspec's generic check-then-write and only that much exclusivity.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from .codec import decode_full, decode_xor, encode_full, encode_xor
from .manifest import Codec, Manifest, TensorEntry

__all__ = [
    "CheckpointError",
    "CheckpointStore",
    "ChunkCorruptError",
    "ChunkError",
    "ChunkMissingError",
    "ManifestCorruptError",
    "RestoreError",
    "Snapshot",
    "VersionConflictError",
    "VersionNotFoundError",
]

logger = logging.getLogger("rl_core.checkpoint")

# memory:// implements exclusive create as exists-then-create; its store is process-global, so one
# process-wide lock makes that pair atomic.
_MEMORY_CREATE_LOCK = threading.Lock()

_NOT_SEARCHED = object()


# --------------------------------------------------------------------------------------------------- errors


class CheckpointError(Exception):
    """Base class of every failure the checkpoint store reports on purpose."""


class VersionNotFoundError(CheckpointError, LookupError):
    """The requested version has no commit marker."""

    def __init__(self, url: str, version: int | None, available: list[int]) -> None:
        self.url, self.version, self.available = url, version, list(available)
        if not available:
            asked = "" if version is None else f" (asked for version {version})"
            msg = f"checkpoint store {url} has no committed versions{asked}; commit() first"
        else:
            msg = (
                f"checkpoint store {url} has no version {version}; committed versions: {_fmt_versions(available)}. "
                "Pass one of those to load(), or call load() for the newest valid one"
            )
        super().__init__(msg)


class VersionConflictError(CheckpointError):
    """Another writer claimed the version this store was about to commit."""

    def __init__(self, url: str, version: int) -> None:
        self.url, self.version = url, version
        super().__init__(
            f"version {version} of checkpoint store {url} was claimed by another writer while this store was "
            "committing it; nothing of this commit is visible. Only one writer should append to a run: stop the "
            "other writer, or load() the newest version and commit again"
        )


class RestoreError(CheckpointError):
    """A committed version cannot be restored exactly. Says where, what, and which older version loads."""

    kind = "cannot restore"

    def __init__(
        self,
        *,
        url: str,
        version: int,
        detail: str,
        tensor: str | None = None,
        chunk: str | None = None,
        source_version: int | None = None,
        loadable: Any = _NOT_SEARCHED,
    ) -> None:
        self.url, self.version, self.detail = url, version, detail
        self.tensor, self.chunk, self.source_version = tensor, chunk, source_version
        self.loadable_version: int | None = None if loadable is _NOT_SEARCHED else loadable
        self._searched = loadable is not _NOT_SEARCHED
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"checkpoint store {self.url}, version {self.version}"
        if self.tensor is not None:
            where += f", tensor {self.tensor!r}"
        if self.chunk is not None:
            where += f", chunk {self.chunk}"
        if self.source_version is not None and self.source_version != self.version:
            where += f" (stored with version {self.source_version})"
        msg = f"{self.kind} in {where}: {self.detail}."
        if self._searched and self.loadable_version is None:
            msg += " No older version is loadable either."
        elif self._searched:
            v = self.loadable_version
            msg += f" Version {v} is the newest older version that loads: load({v})."
        return msg

    def with_fallback(self, loadable: int | None) -> RestoreError:
        """The same error, now saying which older version loads (None: none does)."""
        return type(self)(
            url=self.url,
            version=self.version,
            detail=self.detail,
            tensor=self.tensor,
            chunk=self.chunk,
            source_version=self.source_version,
            loadable=loadable,
        )


class ManifestCorruptError(RestoreError):
    """A committed version's manifest (or one it references) is missing or malformed."""

    kind = "manifest missing or corrupt"


class ChunkError(RestoreError):
    """A chunk a version needs is unusable."""


class ChunkMissingError(ChunkError):
    kind = "chunk missing"


class ChunkCorruptError(ChunkError):
    kind = "chunk corrupt"


# ------------------------------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Snapshot:
    """One restored version. Arrays are fresh, writable and own their memory."""

    version: int
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any]


@dataclass(frozen=True)
class _Reference:
    """Raw bytes of the version the next commit is encoded against, kept so a commit never re-reads it.
    Arrays are private read-only flat uint8 copies: the caller's arrays may change after commit/load."""

    version: int
    manifest: Manifest
    raw: dict[str, np.ndarray]


def _fmt_versions(versions: list[int]) -> str:
    if len(versions) <= 20:
        return ", ".join(map(str, versions))
    return f"{versions[0]}..{versions[-1]} ({len(versions)} versions)"


def _redact(url: str) -> str:
    """The URL without user info or query string, which is where credentials hide; safe to log."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _sha256(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def _raw_view(arr: np.ndarray) -> np.ndarray:
    """Flat uint8 view of a C-contiguous array's bytes (works for 0-d and empty arrays)."""
    return arr.reshape(-1).view(np.uint8)


def _prepare_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate and copy the caller's arrays: the copy is what gets encoded and kept as the next reference,
    so the caller may keep training on its arrays as soon as commit() returns."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> numpy array, got {type(tensors).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r} ({type(name).__name__})")
        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"tensor {name!r}: expected a numpy.ndarray, got {type(value).__name__}; convert torch tensors "
                "with t.detach().cpu().numpy() (bfloat16: t.view(torch.int16) first)"
            )
        dt = value.dtype
        if dt.hasobject or dt.fields is not None or dt.itemsize == 0 or np.dtype(dt.str) != dt:
            raise TypeError(
                f"tensor {name!r}: dtype {dt} is not a fixed-size plain numpy dtype; store structured arrays "
                "field by field and object arrays not at all"
            )
        arr = np.array(value, order="C", copy=True)
        arr.flags.writeable = False
        out[name] = arr
    return out


def _normalize_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Return meta exactly as load() will hand it back (JSON round trip: tuples become lists, ...), failing
    now rather than after chunks were written."""
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        return json.loads(json.dumps(dict(meta)))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"meta must be JSON-serializable ({exc}); convert numpy scalars with .item() and arrays to tensors"
        ) from exc


def _to_array(entry: TensorEntry, raw: np.ndarray) -> np.ndarray:
    """A fresh array that owns its memory, holding ``raw`` with the entry's dtype and shape."""
    arr = np.empty(entry.shape, dtype=np.dtype(entry.dtype))
    _raw_view(arr)[...] = raw
    return arr


# --------------------------------------------------------------------------------------------------- store


class CheckpointStore:
    """Versioned, lossless, content-addressed checkpoints of named numpy arrays plus JSON metadata.

    Every ``full_every``-th version (counted since the last full snapshot) stores every tensor in full; the
    versions in between store each tensor as the smallest of "same", "xor" (against the parent) and "full".
    Thread-safe; a process may hold several stores on one URL, but only one should commit to a run.
    """

    def __init__(self, url: str, *, full_every: int = 8, storage_options: dict[str, Any] | None = None) -> None:
        if not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1 (1 = every version full), got {full_every!r}")
        self._url = _redact(url)
        self._full_every = full_every
        self._fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self._root = root.rstrip("/")
        self._lock = threading.RLock()
        self._reference: _Reference | None = None
        self._manifests: dict[int, Manifest] = {}  # committed manifests never change
        self._known_chunks: set[str] = set()
        self._made_dirs: set[str] = set()

    def __repr__(self) -> str:
        return f"CheckpointStore({self._url!r}, full_every={self._full_every})"

    @property
    def url(self) -> str:
        """The store URL with any credentials removed."""
        return self._url

    @property
    def full_every(self) -> int:
        return self._full_every

    # ------------------------------------------------------------------------------------------- public

    def versions(self) -> list[int]:
        """Committed versions (those with a commit marker), ascending."""
        return sorted(self._scan()[0])

    def latest(self) -> int | None:
        """Newest committed version, or None for an empty store. It may still fail verification: load()
        falls back past it."""
        versions = self.versions()
        return versions[-1] if versions else None

    def commit(self, tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> int:
        """Store a new version encoded against the version this store last committed or loaded (a fresh store
        on an existing run loads the newest valid one once). Returns the new version number.

        Raises VersionConflictError if another writer claims the same version number first.
        """
        arrays = _prepare_tensors(tensors)
        meta_json = _normalize_meta(meta)
        with self._lock:
            ref = self._reference_for_commit()
            depth = 0 if ref is None or ref.manifest.depth + 1 >= self._full_every else ref.manifest.depth + 1
            base = ref if depth else None  # a full snapshot is encoded against nothing
            entries: dict[str, TensorEntry] = {}
            payloads: dict[str, bytes] = {}
            raws: dict[str, np.ndarray] = {}
            for name, arr in arrays.items():
                entry, payload, raws[name] = self._encode_tensor(name, arr, base)
                entries[name] = entry
                if entry.chunk is not None and payload is not None:
                    payloads[entry.chunk] = payload
            self._write_chunks(payloads)
            manifest = Manifest(
                version=self._next_version(),
                parent=None if ref is None else ref.version,
                depth=depth,
                tensors=entries,
                meta=meta_json,
            )
            self._publish(manifest)
            self._manifests[manifest.version] = manifest
            self._reference = _Reference(manifest.version, manifest, raws)
            return manifest.version

    def load(self, version: int | None = None) -> Snapshot:
        """Restore ``version`` exactly, verifying every chunk hash and every decoded tensor hash.

        ``None`` means the newest version that verifies: a failing newer version is logged as a warning and
        skipped. Raises VersionNotFoundError for an unknown version and a RestoreError subclass
        (ChunkMissingError, ChunkCorruptError, ManifestCorruptError) naming the newest older loadable version.
        """
        with self._lock:
            ref = self._load_reference(version)
        tensors = {name: _to_array(entry, ref.raw[name]) for name, entry in ref.manifest.tensors.items()}
        return Snapshot(version=ref.version, tensors=tensors, meta=copy.deepcopy(ref.manifest.meta))

    def manifest(self, version: int) -> dict[str, Any]:
        """The manifest of a committed version as a JSON-compatible dict (a copy)."""
        return json.loads(self._committed_manifest(version).to_json_bytes())

    def size_report(self, version: int) -> dict[str, Any]:
        """Bytes this version added to storage (its own chunks; "same" adds none) against its raw size."""
        manifest = self._committed_manifest(version)
        counts = {"full": 0, "xor": 0, "same": 0}
        for entry in manifest.tensors.values():
            counts[entry.codec] += 1
        return {"raw_bytes": manifest.raw_bytes(), "encoded_bytes": manifest.encoded_bytes(), "codec_counts": counts}

    # ------------------------------------------------------------------------------------------- paths

    def _chunk_path(self, sha: str) -> str:
        return f"{self._root}/chunks/{sha[:2]}/{sha}"

    def _manifest_path(self, version: int) -> str:
        return f"{self._root}/versions/{version:08d}.json"

    def _marker_path(self, version: int) -> str:
        return f"{self._root}/versions/{version:08d}.commit"

    # ----------------------------------------------------------------------------------------- writing

    def _reference_for_commit(self) -> _Reference | None:
        """The in-memory reference, or the newest valid stored version loaded once; None means "write a full
        snapshot" (empty store, or nothing in it verifies)."""
        if self._reference is None and self.versions():
            try:
                self._load_reference(None)
            except RestoreError as exc:
                logger.warning("%s Committing a full snapshot instead of a delta.", exc)
        return self._reference

    def _load_reference(self, version: int | None) -> _Reference:
        """Restore ``version`` (None: newest valid) and keep it as the reference for the next commit."""
        committed = self.versions()
        if version is None:
            manifest, raws = self._restore_newest(committed)
        else:
            if version not in committed:
                raise VersionNotFoundError(self._url, version, committed)
            try:
                manifest, raws = self._restore(version)
            except RestoreError as exc:
                raise exc.with_fallback(self._newest_loadable_before(version, committed, exc)) from None
        self._reference = _Reference(manifest.version, manifest, raws)
        return self._reference

    def _encode_tensor(
        self, name: str, arr: np.ndarray, ref: _Reference | None
    ) -> tuple[TensorEntry, bytes | None, np.ndarray]:
        """Pick the smallest lossless encoding against ``ref`` (None: full snapshot).
        Returns (entry, payload or None for "same", raw bytes to keep as the next reference)."""
        raw = _raw_view(arr)
        raw_sha = _sha256(raw)

        def entry(codec: Codec, payload: bytes | None, ref_version: int | None) -> TensorEntry:
            return TensorEntry(
                dtype=arr.dtype.str,
                shape=list(arr.shape),
                nbytes=arr.nbytes,
                codec=codec,
                chunk=None if payload is None else _sha256(payload),
                ref_version=ref_version,
                raw_sha256=raw_sha,
                encoded_bytes=0 if payload is None else len(payload),
            )

        prev = None if ref is None else ref.manifest.tensors.get(name)
        if ref is None or prev is None or (prev.dtype, prev.shape) != (arr.dtype.str, list(arr.shape)):
            full = encode_full(raw, arr.itemsize)
            return entry("full", full, None), full, raw
        if prev.raw_sha256 == raw_sha:
            return entry("same", None, ref.version), None, ref.raw[name]
        xor = encode_xor(raw, ref.raw[name], arr.itemsize)
        full = encode_full(raw, arr.itemsize)
        if len(xor) < len(full):
            return entry("xor", xor, ref.version), xor, raw
        return entry("full", full, None), full, raw

    def _write_chunks(self, payloads: dict[str, bytes]) -> None:
        """Write each chunk unless an object of that name and size exists (content addressing makes the
        name a promise about the content; the size check catches a truncated leftover)."""
        for sha, data in payloads.items():
            if sha in self._known_chunks:
                continue
            path = self._chunk_path(sha)
            if self._size_or_none(path) != len(data):
                self._put_whole(path, data)
            self._known_chunks.add(sha)

    def _next_version(self) -> int:
        committed, claimed = self._scan()
        return max(committed | claimed, default=-1) + 1

    def _publish(self, manifest: Manifest) -> None:
        """Claim the version with the manifest, then make it visible with the marker (see module docstring)."""
        version = manifest.version
        manifest_path, marker_path = self._manifest_path(version), self._marker_path(version)
        data = manifest.to_json_bytes()
        try:
            self._create_exclusive(manifest_path, data)
        except FileExistsError:
            raise VersionConflictError(self._url, version) from None
        except BaseException:
            self._discard_if_ours(manifest_path, data)
            raise
        try:
            self._create_exclusive(marker_path, b"")
        except FileExistsError:
            self._discard(manifest_path)
            raise VersionConflictError(self._url, version) from None
        except BaseException as exc:
            landed = self._exists_or_none(marker_path)
            if landed:  # our side saw an error but the marker reached storage: the version is committed
                logger.warning(
                    "commit marker %s was written despite %r; version %d is committed", marker_path, exc, version
                )
                return
            if landed is False:  # when unknown (None) keep the claim: an orphan claim only costs a number
                self._discard(manifest_path)
            raise

    # ------------------------------------------------------------------------------------- backend I/O

    def _scan(self) -> tuple[set[int], set[int]]:
        """(committed, claimed) version numbers, from a fresh listing of versions/ (other writers append)."""
        directory = f"{self._root}/versions"
        self._fs.invalidate_cache(directory)
        try:
            names = self._fs.ls(directory, detail=False)
        except FileNotFoundError:
            return set(), set()
        committed: set[int] = set()
        claimed: set[int] = set()
        for path in names:
            stem, _, ext = path.rstrip("/").rsplit("/", 1)[-1].partition(".")
            if stem.isascii() and stem.isdigit():
                if ext == "commit":
                    committed.add(int(stem))
                elif ext == "json":
                    claimed.add(int(stem))
        return committed, claimed

    def _makedirs(self, path: str) -> None:
        """Local directories must exist before a write; object stores and memory:// have none to make."""
        parent = path.rsplit("/", 1)[0]
        if isinstance(self._fs, LocalFileSystem) and parent not in self._made_dirs:
            self._fs.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)

    def _put_whole(self, path: str, data: bytes) -> None:
        """Write an object so that it appears complete or not at all. Object stores (s3fs ``pipe_file``: one
        PUT, or a multipart upload it aborts on error) and memory:// already do; a local file is written under a
        temporary name and renamed, so a concurrent writer of the same chunk never exposes a truncated file."""
        self._makedirs(path)
        if not isinstance(self._fs, LocalFileSystem):
            self._fs.pipe_file(path, data)
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            self._fs.pipe_file(tmp, data)
            self._fs.mv(tmp, path)
        except BaseException:
            self._discard(tmp)
            raise

    def _create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data``; raise FileExistsError if it exists. On failure after creating it
        partially, remove what was created (we own it: nobody else could create it)."""
        self._makedirs(path)
        if isinstance(self._fs, LocalFileSystem):
            f = self._fs.open(path, "xb")  # O_EXCL
            try:
                with f:
                    f.write(data)
            except BaseException:
                self._discard(path)
                raise
        elif isinstance(self._fs, MemoryFileSystem):
            with _MEMORY_CREATE_LOCK:
                self._fs.pipe_file(path, data, mode="create")
        else:
            self._fs.pipe_file(path, data, mode="create")  # s3fs: PUT with If-None-Match: *

    def _size_or_none(self, path: str) -> int | None:
        try:
            return self._fs.size(path)
        except FileNotFoundError:
            return None

    def _exists_or_none(self, path: str) -> bool | None:
        """Whether ``path`` exists, or None if storage cannot tell us right now."""
        try:
            self._fs.invalidate_cache(path)
            return bool(self._fs.exists(path))
        except Exception:  # noqa: BLE001 - already handling a storage failure; "unknown" is the answer
            return None

    def _discard_if_ours(self, path: str, data: bytes) -> None:
        """After a failed exclusive create, remove what it left at ``path`` (all of ``data`` whose reply was
        lost, or a prefix of it on a backend without atomic uploads). A different object there is another
        writer's claim and stays; if storage cannot be read, the claim stays too (an orphan claim is skipped)."""
        try:
            self._fs.invalidate_cache(path)
            existing = self._fs.cat_file(path)
        except Exception:  # noqa: BLE001 - FileNotFoundError: nothing left; anything else: cannot tell
            return
        if existing and data.startswith(existing):
            self._discard(path)

    def _discard(self, path: str) -> None:
        """Best-effort removal of an object this commit created; never masks the error being handled."""
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            logger.warning(
                "could not remove %s after a failed commit (%r); no committed version refers to it", path, exc
            )

    # ----------------------------------------------------------------------------------------- reading

    def _committed_manifest(self, version: int) -> Manifest:
        if version not in self._manifests:
            committed = self.versions()
            if version not in committed:
                raise VersionNotFoundError(self._url, version, committed)
        return self._read_manifest(version, version)

    def _read_manifest(self, version: int, requested: int) -> Manifest:
        """Parse a committed version's manifest (cached: committed manifests are immutable)."""
        cached = self._manifests.get(version)
        if cached is not None:
            return cached
        path = self._manifest_path(version)

        def corrupt(detail: str) -> ManifestCorruptError:
            return ManifestCorruptError(url=self._url, version=requested, source_version=version, detail=detail)

        try:
            data = self._fs.cat_file(path)
        except FileNotFoundError:
            raise corrupt(f"manifest {path} does not exist") from None
        try:
            manifest = Manifest.from_json_bytes(data)
        except ValueError as exc:
            raise corrupt(f"manifest {path} is not a valid schema-1 manifest ({str(exc)[:300]})") from None
        if manifest.version != version:
            raise corrupt(f"manifest {path} says it is version {manifest.version}")
        self._manifests[version] = manifest
        return manifest

    def _chain(self, requested: int, name: str) -> list[tuple[int, TensorEntry]]:
        """(version, entry) pairs to apply for one tensor, newest first, ending at its last full entry."""
        version, entry = requested, self._read_manifest(requested, requested).tensors[name]
        chain = [(version, entry)]
        while entry.ref_version is not None:  # "xor" and "same" have one, "full" has none
            ref_version = entry.ref_version
            ref = self._read_manifest(ref_version, requested).tensors.get(name)
            if ref is None or (ref.dtype, ref.shape) != (entry.dtype, entry.shape) or (
                entry.codec == "same" and ref.raw_sha256 != entry.raw_sha256
            ):
                raise ManifestCorruptError(
                    url=self._url,
                    version=requested,
                    tensor=name,
                    source_version=version,
                    detail=f"its {entry.codec!r} entry refers to version {ref_version}, which has no matching entry",
                )
            version, entry = ref_version, ref
            chain.append((version, entry))
        return chain

    def _restore(self, version: int) -> tuple[Manifest, dict[str, np.ndarray]]:
        """Verified raw bytes of every tensor of ``version``. All manifests on the chains are read first, so a
        broken manifest fails before any decoding."""
        manifest = self._read_manifest(version, version)
        chains = {name: self._chain(version, name) for name in manifest.tensors}
        return manifest, {name: self._apply_chain(version, name, chain) for name, chain in chains.items()}

    def _apply_chain(self, requested: int, name: str, chain: list[tuple[int, TensorEntry]]) -> np.ndarray:
        """Decode oldest (a "full" entry) to newest; "same" entries carry no chunk and change nothing (_chain
        checked that their raw hashes agree)."""
        raw = np.empty(0, dtype=np.uint8)
        for version, entry in reversed(chain):
            if entry.chunk is not None:
                raw = self._decode(requested, name, version, entry, entry.chunk, raw)
        raw.flags.writeable = False
        return raw

    def _decode(
        self, requested: int, name: str, version: int, entry: TensorEntry, chunk: str, parent_raw: np.ndarray
    ) -> np.ndarray:
        """One verified decode step: chunk hash, then decoded-bytes hash against the entry's raw_sha256."""
        payload = self._read_chunk(requested, name, version, chunk)

        def corrupt(detail: str) -> ChunkCorruptError:
            return ChunkCorruptError(
                url=self._url, version=requested, tensor=name, chunk=chunk, source_version=version, detail=detail
            )

        itemsize = np.dtype(entry.dtype).itemsize
        try:
            if entry.codec == "xor":
                raw = decode_xor(payload, parent_raw, itemsize)
            else:
                raw = decode_full(payload, itemsize)
        except ValueError as exc:
            raise corrupt(f"payload does not decode ({exc})") from None
        if raw.size != entry.nbytes or _sha256(raw) != entry.raw_sha256:
            raise corrupt("decoded bytes do not match the manifest's raw_sha256")
        return raw

    def _read_chunk(self, requested: int, name: str, version: int, chunk: str) -> bytes:
        path = self._chunk_path(chunk)
        fields: dict[str, Any] = dict(
            url=self._url, version=requested, tensor=name, chunk=chunk, source_version=version
        )
        try:
            data = self._fs.cat_file(path)
        except FileNotFoundError:
            raise ChunkMissingError(detail=f"object {path} does not exist", **fields) from None
        actual = _sha256(data)
        if actual != chunk:
            raise ChunkCorruptError(detail=f"object {path} hashes to {actual}", **fields)
        return data

    def _restore_newest(self, committed: list[int]) -> tuple[Manifest, dict[str, np.ndarray]]:
        """Newest version that verifies; each failing newer one is logged as a warning."""
        errors: list[RestoreError] = []
        for i in reversed(range(len(committed))):
            try:
                return self._restore(committed[i])
            except RestoreError as exc:
                errors.append(exc)
                target = f"version {committed[i - 1]}" if i else "nothing: no older version exists"
                logger.warning("%s Falling back to %s.", exc, target)
        if not errors:
            raise VersionNotFoundError(self._url, None, [])
        raise errors[0].with_fallback(None)

    def _newest_loadable_before(self, version: int, committed: Iterable[int], exc: RestoreError) -> int | None:
        """Newest older version that restores, for error messages. Versions that need the bad chunk are
        skipped without decoding anything."""
        for older in sorted((v for v in committed if v < version), reverse=True):
            try:
                if exc.chunk is not None and exc.chunk in self._chunks_needed(older):
                    continue
                self._restore(older)
            except RestoreError:
                continue
            return older
        return None

    def _chunks_needed(self, version: int) -> set[str]:
        manifest = self._read_manifest(version, version)
        return {
            entry.chunk
            for name in manifest.tensors
            for _, entry in self._chain(version, name)
            if entry.chunk is not None
        }
