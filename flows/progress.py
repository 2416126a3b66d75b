"""Live progress of a training run on the terminal (rich), fed by the flow after each iteration.

The flow reports through `report_iteration`; without an active display (a deployment run, a test)
the reports go to the Prefect run logger only.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_display: "RunProgress | None" = None


class RunProgress:
    """A progress bar: iteration i/N, env steps per second, mean return of recent episodes."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]iteration"), MofNCompleteColumn(), BarColumn(),
            TextColumn("{task.fields[sps]:>7} env steps/s"), TextColumn("return {task.fields[ret]:>8}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
        )
        self._task = None
        self._last = time.perf_counter()

    def start(self, done: int, total: int) -> None:
        self._task = self._progress.add_task("train", total=total, completed=done, sps="-", ret="-")
        self._progress.start()
        self._last = time.perf_counter()

    def advance(self, env_steps: int, mean_return: float) -> None:
        now = time.perf_counter()
        sps = env_steps / max(now - self._last, 1e-9)
        self._last = now
        ret = "-" if math.isnan(mean_return) else f"{mean_return:.1f}"
        self._progress.update(self._task, advance=1, sps=f"{sps:,.0f}", ret=ret)

    def stop(self) -> None:
        self._progress.stop()


@contextlib.contextmanager
def terminal_progress(console: Console) -> Iterator[RunProgress]:
    """Show a progress bar for flows run inside this block (the CLI's main job)."""
    global _display
    _display = RunProgress(console)
    try:
        yield _display
    finally:
        _display.stop()
        _display = None


def start(done: int, total: int) -> None:
    if _display:
        _display.start(done, total)


def report_iteration(env_steps: int, mean_return: float) -> None:
    if _display:
        _display.advance(env_steps, mean_return)
