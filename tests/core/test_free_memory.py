"""release_free_memory: the pages a step freed leave the process (the run's processes share one machine's memory)."""
from __future__ import annotations

import ctypes.util
import os

import numpy as np
import pytest

from rl_core.runtime.free_memory import release_free_memory


def _resident_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm") or ctypes.util.find_library("c") is None,
                    reason="needs Linux's /proc and a C library")
def test_freed_small_blocks_leave_the_process() -> None:
    blocks = [np.ones(64 * (i % 50 + 1)) for i in range(60_000)]  # ~1 GB in blocks under the mmap threshold
    kept = blocks[::1_000]  # a few survivors pin the heap's top, so glibc's automatic trim cannot shrink it
    del blocks
    before = _resident_bytes()
    assert release_free_memory()
    assert _resident_bytes() < before - 500 * 2**20, "the freed blocks stayed resident"
    assert len(kept) == 60
