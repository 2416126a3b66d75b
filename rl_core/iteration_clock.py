"""The wall time of a run's iterations, with the first one apart.

The first iteration pays one-off costs: the actors' first collection and update, and a fresh process's optimizer
(creating one imports `torch._dynamo`, a heavy import). Benchmarks count it as start-up and compare the iterations
after it.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class IterationClock:
    """Created just before the first iteration; `lap()` at the end of each."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._started_at = time.time()  # wall clock, to compare with a process's start time
        self.first_s = 0.0  # the first iteration
        self.total_s = 0.0  # from the first iteration's start to the last one's end

    @property
    def first_started_at(self) -> float | None:
        """Wall-clock time (epoch seconds) the first iteration started; None until one has ended."""
        return self._started_at if self.first_s else None

    def lap(self) -> float:
        """Mark the end of an iteration; returns its seconds."""
        previous, self.total_s = self.total_s, time.perf_counter() - self._started
        self.first_s = self.first_s or self.total_s
        return self.total_s - previous


class StepWaits:
    """Seconds an iteration waited for each of its steps (`<step>_s`): with overlap, a step that ran in the
    background while another did counts only the time the loop still had to wait for it."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[f"{step}_s"] = time.perf_counter() - started
