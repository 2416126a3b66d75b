"""Live progress of a training run on the terminal (rich), fed by the flow after each iteration.

The flow reports through `report_iteration` (control) or `report_agent_iteration` (agent); without an active
display (a deployment run, a test) the reports go to the Prefect run logger only.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_display: "RunProgress | None" = None

CONTROL_COLUMNS = ("{task.fields[rate]:>7} env steps/s", "return {task.fields[ret]:>8}")
AGENT_COLUMNS = ("acc {task.fields[acc]:>6}", "reward {task.fields[ret]:>6}", "{task.fields[rate]:>6} tokens/s",
                 "parity {task.fields[parity]:>8}")


class RunProgress:
    """A progress bar: iteration i/N, then the run's own columns (env steps/s and return, or an agent's accuracy,
    reward, tokens/s and log-prob parity)."""

    def __init__(self, console: Console, columns: tuple[str, ...] = CONTROL_COLUMNS) -> None:
        self._progress = Progress(
            TextColumn("[bold]iteration"), MofNCompleteColumn(), BarColumn(), *map(TextColumn, columns),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
        )
        self._task = None
        self._last = time.perf_counter()

    def start(self, done: int, total: int) -> None:
        self._task = self._progress.add_task("train", total=total, completed=done, rate="-", ret="-", acc="-",
                                             parity="-")
        self._progress.start()
        self._last = time.perf_counter()

    def advance(self, work: float, **fields: str) -> None:
        """One iteration done that did `work` (env steps or tokens) since the last one."""
        now = time.perf_counter()
        rate = work / max(now - self._last, 1e-9)
        self._last = now
        self._progress.update(self._task, advance=1, rate=f"{rate:,.0f}", **fields)

    def stop(self) -> None:
        self._progress.stop()


@contextlib.contextmanager
def terminal_progress(console: Console, columns: tuple[str, ...] = CONTROL_COLUMNS) -> Iterator[RunProgress]:
    """Show a progress bar for flows run inside this block (the CLI's main job)."""
    global _display
    _display = RunProgress(console, columns)
    try:
        yield _display
    finally:
        _display.stop()
        _display = None


def _number(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else format(value, fmt)


def start(done: int, total: int) -> None:
    if _display:
        _display.start(done, total)


def report_iteration(env_steps: int, mean_return: float) -> None:
    if _display:
        _display.advance(env_steps, ret=_number(mean_return, ".1f"))


def report_agent_iteration(tokens: float, accuracy: float, mean_reward: float, parity_max: float) -> None:
    if _display:
        _display.advance(tokens, acc=_number(accuracy, ".1%"), ret=_number(mean_reward, ".3f"),
                         parity=_number(parity_max, ".1e"))
