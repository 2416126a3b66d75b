"""The checkpoint store's objects on an fsspec filesystem: where each lives, how they are listed, and the
writes the commit protocol relies on (whole-or-nothing uploads, exclusive creates, best-effort removal).

Durability on a local disk: every object is flushed to the disk before it is renamed or closed, and its directory
after it appears, so the commit protocol's order (chunks, then the manifest, then the commit marker) also holds after
a power loss: a marker never survives without the manifest and chunks it commits. A commit's chunks are flushed
together (``put_many``): one ``syncfs`` for all their bytes and one for all their names, where Linux has it, instead of
two fsyncs per chunk (each an ext4 journal commit, so their CPU cost grows with the number of chunks: at a quick
flow state's few dozen, several times that of the two syncs).

Exclusive create per backend: local files use ``open(path, "xb")`` (O_EXCL, atomic); ``memory://`` checks then
creates under a process-wide lock; other backends use ``pipe_file(mode="create")``, which s3fs sends as a
conditional PUT (``If-None-Match: *``, answered 412 -> FileExistsError). s3fs's ``open(path, "xb")`` is NOT
exclusive for empty objects, so it is never used here.
"""
from __future__ import annotations

import copy
import ctypes
import errno
import logging
import os
import posixpath
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

logger = logging.getLogger("rl_core.checkpoint")

# memory:// implements exclusive create as exists-then-create; its store is process-global, so one
# process-wide lock makes that pair atomic.
_MEMORY_CREATE_LOCK = threading.Lock()


def _fsync_directory(path: str) -> None:
    """Make a new or renamed entry of a local directory durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _libc_syncfs() -> Callable[[int], int] | None:
    """Linux's ``syncfs(fd)`` (flush every file of the filesystem holding ``fd``), None where the C library has none."""
    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    syncfs.argtypes, syncfs.restype = [ctypes.c_int], ctypes.c_int
    return syncfs


_SYNCFS = _libc_syncfs()


def _flush_filesystem(directory: str) -> None:
    """Make every write to the filesystem holding ``directory`` durable (data and names): one journal commit,
    however many files were written. It also flushes other writers' data on that filesystem, so it takes longer
    on a disk busy with other writes; a failed writeback is raised (Linux >= 5.8 reports it)."""
    if _SYNCFS is None:
        raise OSError(errno.ENOSYS, "this C library has no syncfs")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {directory}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _write_durably(fs: LocalFileSystem, path: str, data: bytes, mode: str) -> None:
    """Write a local file and fsync it before it is closed."""
    with fs.open(path, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def redact(url: str) -> str:
    """The URL without user info or query string, which is where credentials hide; safe to log."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _check_scheme(url: str) -> None:
    """Refuse a URL whose scheme fsspec has no filesystem for, naming the URL. fsspec's own error names the scheme
    only, and it reads a one-letter scheme ("z://bucket") as a Windows drive, i.e. a local folder named "z:"."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if scheme and scheme.group(1).lower() not in fsspec.available_protocols():
        raise ValueError(f"checkpoint store {redact(url)}: no storage backend for the scheme {scheme.group(1)!r}; use "
                         "file://, s3:// (s3fs), memory:// or another scheme fsspec knows, or a plain local path")


def mtime(info: Mapping[str, Any]) -> float | None:
    """Modification time (seconds since the epoch) from an fsspec info dict, None when the backend has none."""
    for key in ("mtime", "LastModified", "last_modified", "created", "ctime"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


class StoreObjects:
    """The objects under one store URL (layout in ``store.py``'s docstring): chunks, manifests, commit markers."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        _check_scheme(url)
        self.fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.local = bool(protocols & {"file", "local", "memory"})
        self._root = root.rstrip("/")
        self._made_dirs: set[str] = set()

    # ------------------------------------------------------------------------------------------- paths

    @property
    def root(self) -> str:
        """The store's folder as the filesystem names it (no scheme)."""
        return self._root

    def chunk_path(self, sha: str) -> str:
        return f"{self._root}/chunks/{sha[:2]}/{sha}"

    def manifest_path(self, version: int) -> str:
        return f"{self._root}/versions/{version:08d}.json"

    def marker_path(self, version: int) -> str:
        return f"{self._root}/versions/{version:08d}.commit"

    def pin_path(self, pin: str) -> str:
        """A fork's pin on this store's objects (gc.py, fork.py)."""
        return f"{self._root}/pins/{pin}.json"

    def at(self, relative: str) -> StoreObjects:
        """The store at ``relative`` (a path from this store's root) on the same filesystem: where a fork's borrowed
        version finds its objects, and where a pin finds its fork."""
        other = copy.copy(self)
        other._root = posixpath.normpath(posixpath.join(self._root, relative))
        other._made_dirs = set()
        return other

    def relative_to(self, other: StoreObjects) -> str:
        """The path from ``other``'s root to this store's root (what :meth:`at` takes)."""
        return posixpath.relpath(self._root, other._root)

    def set_aside_markers(self) -> list[str]:
        """The commit markers of every version ever set aside (oldest name first)."""
        directory = f"{self._root}/set-aside"
        self.fs.invalidate_cache(directory)
        try:
            return sorted(p for p in self.fs.ls(directory, detail=False) if p.endswith(".commit"))
        except FileNotFoundError:
            return []

    def set_aside_path(self, version: int, stamp: str, suffix: str) -> str:
        """Where a version that failed verification keeps its manifest and marker, out of the version listing."""
        return f"{self._root}/set-aside/{version:08d}-{stamp}.{suffix}"

    # ----------------------------------------------------------------------------------------- listing

    def scan(self) -> tuple[set[int], set[int]]:
        """(committed, claimed) version numbers, from a fresh listing of versions/ (other writers append)."""
        directory = f"{self._root}/versions"
        self.fs.invalidate_cache(directory)
        try:
            names = self.fs.ls(directory, detail=False)
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

    def list_chunks(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """sha -> (path, info) of every chunk object (temp files of interrupted local writes included by path)."""
        directory = f"{self._root}/chunks"
        self.fs.invalidate_cache(directory)
        try:
            found = self.fs.find(directory, detail=True)
        except FileNotFoundError:
            return {}
        return {path.rstrip("/").rsplit("/", 1)[-1]: (path, info) for path, info in found.items()}

    def list_pins(self) -> list[str]:
        """The names of the pins forks hold on this store's objects, from a fresh listing of pins/."""
        directory = f"{self._root}/pins"
        self.fs.invalidate_cache(directory)
        try:
            names = self.fs.ls(directory, detail=False)
        except FileNotFoundError:
            return []
        return sorted(n.rstrip("/").rsplit("/", 1)[-1].removesuffix(".json") for n in names if n.endswith(".json"))

    # ----------------------------------------------------------------------------------------- reading

    def read(self, path: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist."""
        return self.fs.cat_file(path)

    def read_fresh(self, path: str) -> bytes:
        """The object's bytes as storage holds them now (not from a listing cache)."""
        self.fs.invalidate_cache(path)
        return self.fs.cat_file(path)

    def info_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            self.fs.invalidate_cache(path)
            return self.fs.info(path)
        except FileNotFoundError:
            return None

    def exists_or_none(self, path: str) -> bool | None:
        """Whether ``path`` exists, or None if storage cannot tell us right now."""
        try:
            self.fs.invalidate_cache(path)
            return bool(self.fs.exists(path))
        except Exception:  # noqa: BLE001 - already handling a storage failure; "unknown" is the answer
            return None

    # ----------------------------------------------------------------------------------------- writing

    def _makedirs(self, path: str) -> None:
        """Local directories must exist before a write; object stores and memory:// have none to make."""
        parent = path.rsplit("/", 1)[0]
        if isinstance(self.fs, LocalFileSystem) and parent not in self._made_dirs:
            self.fs.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)

    def put_whole(self, path: str, data: bytes) -> None:
        """Write an object so that it appears complete or not at all. Object stores (s3fs ``pipe_file``: one
        PUT, or a multipart upload it aborts on error) and memory:// already do; a local file is written under a
        temporary name and renamed, so a concurrent writer of the same chunk never exposes a truncated file."""
        self._makedirs(path)
        if not isinstance(self.fs, LocalFileSystem):
            self.fs.pipe_file(path, data)
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            _write_durably(self.fs, tmp, data, "wb")
            os.replace(tmp, path)
        except BaseException:
            self.discard(tmp)
            raise
        _fsync_directory(os.path.dirname(path))

    def put_many(self, items: list[tuple[str, bytes]], run_jobs: Callable[..., Any]) -> None:
        """``put_whole`` of every (path, data); ``run_jobs(fn, items, nbytes)`` runs the uploads (the store's
        worker threads). On a local disk with ``syncfs`` (Linux), the temporary files are written, flushed
        together, renamed, and the names flushed together: two journal commits for a whole commit's chunks."""
        if not (isinstance(self.fs, LocalFileSystem) and _SYNCFS is not None and items):
            run_jobs(self.put_whole, items, sum(len(data) for _, data in items))
            return
        renames: list[tuple[str, str]] = []
        try:
            for path, data in items:
                self._makedirs(path)
                renames.append((f"{path}.tmp-{uuid.uuid4().hex}", path))
                with self.fs.open(renames[-1][0], "wb") as f:
                    f.write(data)
            _flush_filesystem(self._root)
            for tmp, path in renames:
                os.replace(tmp, path)
        except BaseException:
            for tmp, _ in renames:
                self.discard(tmp)  # a renamed one is gone already: discard ignores it
            raise
        _flush_filesystem(self._root)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Create ``path`` holding ``data``; raise FileExistsError if it exists. On failure after creating it
        partially, remove what was created (we own it: nobody else could create it)."""
        self._makedirs(path)
        if isinstance(self.fs, LocalFileSystem):
            try:
                _write_durably(self.fs, path, data, "xb")  # O_EXCL
            except FileExistsError:
                raise
            except BaseException:
                self.discard(path)
                raise
            _fsync_directory(os.path.dirname(path))
        elif isinstance(self.fs, MemoryFileSystem):
            with _MEMORY_CREATE_LOCK:
                self.fs.pipe_file(path, data, mode="create")
        else:
            self.fs.pipe_file(path, data, mode="create")  # s3fs: PUT with If-None-Match: *

    def remove(self, path: str) -> None:
        """Delete an object; storage errors propagate (gc reports them)."""
        self.fs.rm_file(path)

    def discard_if_ours(self, path: str, data: bytes) -> None:
        """After a failed exclusive create, remove what it left at ``path`` (all of ``data`` whose reply was
        lost, or a prefix of it on a backend without atomic uploads). A different object there is another
        writer's claim and stays; if storage cannot be read, the claim stays too (an orphan claim is skipped)."""
        try:
            existing = self.read_fresh(path)
        except Exception:  # noqa: BLE001 - FileNotFoundError: nothing left; anything else: cannot tell
            return
        if existing and data.startswith(existing):
            self.discard(path)

    def landed(self, path: str, data: bytes) -> bool | None:
        """After an exclusive create of ``path`` reported an error: did ``data`` land whole (True), or not at all
        (False; a prefix a backend without atomic uploads left is removed)? None: storage cannot tell."""
        try:
            existing = self.read_fresh(path)
        except FileNotFoundError:
            return False
        except Exception:  # noqa: BLE001 - unreachable storage: cannot tell
            return None
        if existing == data:
            return True
        if data.startswith(existing):
            self.discard(path)
            return False
        return None

    def discard(self, path: str) -> None:
        """Best-effort removal of an object this commit created; never masks the error being handled."""
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            logger.warning(
                "could not remove %s after a failed commit (%r); no committed version refers to it", path, exc
            )
