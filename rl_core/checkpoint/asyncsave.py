"""Saving checkpoints without stopping training: copy to host buffers now, encode and upload on a thread.

``AsyncSaver(store).save(tensors, meta)`` blocks only while it copies the tensors into reusable host buffers
(numpy arrays, or torch tensors on any device: bf16 is kept as its uint16 bit patterns) and returns a
``concurrent.futures.Future`` of the version number. One background thread runs ``store.commit`` (which
itself spreads chunk encoding over the store's worker threads). At most ``max_pending`` saves are copied
but not yet committed; a further ``save`` blocks until one finishes, so memory stays bounded at
``max_pending`` buffer sets. A background failure is stored and raised (as :class:`AsyncSaveError`, chained
to the original) by the next ``save``, ``flush`` or ``close``: never silent. The future carries it too.

Thread, not process. zstd (python-zstandard), hashlib.sha256 on buffers > 2 KiB and numpy's XOR/copy loops
release the GIL, so the encoder thread holds it only for short Python glue between chunks. On a 2-core machine, a
1-thread torch MLP step next to a loop of commits slowed as much with the encoder in a thread as with the same
encoder in a forked process (within noise): the cost is the two cores being shared, not the GIL.
A process saver would also need a second copy of every byte (or shared-memory plumbing) to hand buffers over,
so the thread wins. On a box with spare cores the encoder slows training by much less; give it fewer worker
threads (``CheckpointStore(workers=1)``) where training needs every core.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from .chunks import normalize_meta
from .errors import CheckpointError
from .store import CheckpointStore

__all__ = ["AsyncSaveError", "AsyncSaver"]


class AsyncSaveError(CheckpointError):
    """A background save failed; raised by the next save/flush/close. ``__cause__`` is the original error."""


class _Buffers:
    """One reusable set of host buffers, re-allocated per tensor only when its shape or dtype changes."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.logical: dict[str, str] = {}

    def fill(self, tensors: Mapping[str, Any]) -> None:
        arrays: dict[str, np.ndarray] = {}
        logical: dict[str, str] = {}
        for name, value in tensors.items():
            if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
                arrays[name] = self._copy_torch(name, value, logical)
            else:
                if not isinstance(value, np.ndarray):
                    raise TypeError(f"tensor {name!r}: expected a numpy.ndarray or torch.Tensor, got {type(value).__name__}")
                buf = self._buffer(name, value.shape, value.dtype)
                np.copyto(buf, value)
                arrays[name] = buf
        self.arrays, self.logical = arrays, logical

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        buf = self.arrays.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype:
            buf = np.empty(shape, dtype=dtype)
        return buf

    def _copy_torch(self, name: str, t: Any, logical: dict[str, str]) -> np.ndarray:
        import torch

        t = t.detach()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bit patterns (uint16, like the store)
            buf = self._buffer(name, tuple(t.shape), np.dtype(np.uint16))
            torch.from_numpy(buf.view(np.int16)).copy_(t.view(torch.int16))  # torch has no uint16 copy on CPU
            logical[name] = "bfloat16"
            return buf
        buf = self._buffer(name, tuple(t.shape), torch.empty(0, dtype=t.dtype).numpy().dtype)
        torch.from_numpy(buf).copy_(t)  # also device -> host, and any strides
        return buf


class AsyncSaver:
    """Background checkpoint saves into ``store`` with at most ``max_pending`` saves in flight."""

    def __init__(self, store: CheckpointStore, max_pending: int = 2) -> None:
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        self.store = store
        self._free: queue.Queue[_Buffers] = queue.Queue()
        for _ in range(max_pending):
            self._free.put(_Buffers())
        self._jobs: queue.Queue[tuple[_Buffers, dict[str, Any], Future] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="checkpoint-saver", daemon=True)
        self._thread.start()

    def save(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> Future:
        """Copy ``tensors`` into host buffers (the only blocking part, plus waiting for a free buffer set when
        ``max_pending`` saves are in flight) and commit them in the background. Returns a Future of the version.
        Raises AsyncSaveError if an earlier background save failed."""
        if self._closed:
            raise CheckpointError(f"AsyncSaver for {self.store.url} is closed")
        self._raise_error()
        meta_json = normalize_meta(meta)
        if not isinstance(tensors, Mapping):
            raise TypeError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}")
        buffers = self._free.get()
        try:
            buffers.fill(tensors)
        except BaseException:
            self._free.put(buffers)
            raise
        future: Future = Future()
        future.set_running_or_notify_cancel()
        self._jobs.put((buffers, meta_json, future))
        return future

    def flush(self) -> None:
        """Wait until every accepted save is committed (or failed); raise AsyncSaveError on a failure."""
        self._jobs.join()
        self._raise_error()

    def close(self) -> None:
        """Flush, then stop the background thread. Idempotent."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            self._thread.join()
        self._raise_error()

    def __enter__(self) -> AsyncSaver:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the caller's exception with a background one
            try:
                self.close()
            except AsyncSaveError:
                pass

    def _raise_error(self) -> None:
        with self._error_lock:
            error, self._error = self._error, None
        if error is not None:
            raise AsyncSaveError(f"a background save to checkpoint store {self.store.url} failed: {error}") from error

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._jobs.task_done()
                return
            buffers, meta, future = job
            try:
                version = self.store.commit(buffers.arrays, meta, logical_dtypes=buffers.logical)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller via future + next call
                with self._error_lock:
                    if self._error is None:
                        self._error = exc
                future.set_exception(exc)
            else:
                future.set_result(version)
            finally:
                self._free.put(buffers)
                self._jobs.task_done()
