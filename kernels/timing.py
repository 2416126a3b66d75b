"""Timing: how verified candidates are measured, and the rule that picks a winner from the measurements.

`torch.utils.benchmark.Timer` is used because it fixes the thread count (a kernel that wins with 16 threads can
lose with 1), warms up, and reports the median and IQR over blocks of runs, which resist the outliers of a shared
machine better than a mean. The reference always wins ties: a candidate has to be measurably faster to replace it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.benchmark import Timer

from kernels.registry import REFERENCE, Kernel


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one implementation on one input."""

    median_s: float
    iqr_s: float
    runs: int
    """Number of timed blocks the median and IQR come from."""


def time_kernel(fn: Kernel, inputs: tuple, *, min_run_time: float, num_threads: int) -> Timing:
    """Median and IQR of `fn(*inputs)` measured for at least `min_run_time` seconds on `num_threads` threads."""
    timer = Timer(stmt="fn(*inputs)", globals={"fn": fn, "inputs": inputs}, num_threads=num_threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(median_s=measurement.median, iqr_s=measurement.iqr, runs=len(measurement.times))


def pick_winner(timings: dict[str, Timing]) -> str:
    """Fastest implementation by median; a candidate must be strictly faster than the reference to be picked.

    `timings` holds the reference and the verified candidates only: an unverified candidate has no timing and so
    can never be picked.
    """
    if REFERENCE not in timings:
        raise ValueError(f"expected a timing for {REFERENCE!r} to compare against, found {sorted(timings)}")
    best = REFERENCE
    for name, timing in timings.items():
        if timing.median_s < timings[best].median_s:
            best = name
    return best
