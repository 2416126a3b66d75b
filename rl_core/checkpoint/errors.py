"""The checkpoint store's errors: each names the store, the version and what to do next."""

from __future__ import annotations

from typing import Any

_NOT_SEARCHED = object()


def _fmt_versions(versions: list[int]) -> str:
    if len(versions) <= 20:
        return ", ".join(map(str, versions))
    return f"{versions[0]}..{versions[-1]} ({len(versions)} versions)"


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


class StorageError(CheckpointError, OSError):
    """Storage failed (unreachable endpoint, permissions, ...): a commit left nothing visible, a read changed nothing."""
