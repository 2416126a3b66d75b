"""Hand the heap a step freed back to the operating system.

glibc keeps freed blocks in its arenas for reuse: after an update of a pretrained model (its activations, the
staged copy of the learner state) a trainer rank stays resident at several times its live set, and so do the driver
after a commit and the generator after a weight sync. The run's processes share one machine's memory, so each
holding its peak made a full fine-tune of SmolLM2 on a 23 GB machine end in Ray's out-of-memory kill. Trimming
after those steps returns the free pages; the next step maps them again.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None on a C library without it (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


def release_free_memory() -> bool:
    """Return the heap's free pages to the system; whether the C library could (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
