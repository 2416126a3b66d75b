"""Run a batch of chunk jobs on the calling thread and a pool's threads together.

The caller works through the batch beside the pool instead of waiting for it, so ``workers`` threads work in all
with one fewer hand-off. That matters most when the pool's threads have been idle: a commit after a training
interval starts with the caller's core busy and warm and the others cold, and the caller's share is done at full
speed. So a commit ends sooner than with the caller waiting on the pool, after an idle interval and back to back
alike (bench/checkpoint.py's MLP; the figures are in docs/benchmarks.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_jobs(pool: ThreadPoolExecutor, helpers: int, fn: Callable[..., Any], items: Sequence[tuple]) -> list[Any]:
    """``[fn(*item) for item in items]``, computed by the caller and up to ``helpers`` of ``pool``'s threads, each
    taking the next item in order. On a failure no further item is started, and once the running ones end the
    failure of the earliest item is raised."""
    results: list[Any] = [None] * len(items)
    failures: dict[int, BaseException] = {}
    lock = threading.Lock()
    taken = 0

    def work() -> None:
        nonlocal taken
        while True:
            with lock:
                if taken >= len(items) or failures:
                    return
                index, taken = taken, taken + 1
            try:
                results[index] = fn(*items[index])
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller, once every thread is done
                with lock:
                    failures[index] = exc
                return

    started = [pool.submit(work) for _ in range(min(helpers, len(items) - 1))]
    try:
        work()
    finally:
        for future in started:
            future.result()
    if failures:
        raise failures[min(failures)]
    return results
