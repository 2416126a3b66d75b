"""Timing: how verified candidates are measured, and the rule that picks a winner from the measurements.

`torch.utils.benchmark.Timer` is used because it fixes the thread count (a kernel that wins with 16 threads can
lose with 1), warms up, and times blocks of runs; the median and IQR over those blocks resist the outliers of a
shared machine better than a mean, and interleaving rounds across implementations spreads a burst of load evenly.
The reference always wins ties: a candidate has to be measurably faster to replace it. Differentiable ops (losses)
are timed forward + backward, since training pays for both. On CUDA the Timer synchronizes the device around each
block, so GPU kernels are timed to completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch.utils.benchmark import Timer

from gymflow_kernels.registry import REFERENCE, Kernel


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one implementation on one input."""

    median_s: float
    iqr_s: float
    runs: int
    """Number of timed blocks the median and IQR come from."""


ROUNDS = 3
"""Timing rounds per implementation, interleaved across implementations: a burst of load from another process
then hits one round of each rather than all of one implementation's measurement."""


def time_kernels(
    fns: dict[str, Kernel], inputs: tuple, *, min_run_time: float, num_threads: int,
    grad_argnums: tuple[int, ...] = (), rounds: int = ROUNDS,
) -> dict[str, Timing]:
    """Median and IQR per call (plus its backward, for `grad_argnums`) of each of `fns` on `inputs`, over at least
    `min_run_time` seconds each, split into `rounds` interleaved rounds whose timed blocks are pooled."""
    steps = {name: forward_backward(fn, inputs, grad_argnums) if grad_argnums else _call(fn, inputs)
             for name, fn in fns.items()}
    blocks: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, step in steps.items():
            timer = Timer(stmt="step()", globals={"step": step}, num_threads=num_threads)
            blocks[name] += timer.blocked_autorange(min_run_time=min_run_time / rounds).times
    return {name: _summarize(times) for name, times in blocks.items()}


def _call(fn: Kernel, inputs: tuple) -> Callable[[], object]:
    return lambda: fn(*inputs)


def _summarize(times: list[float]) -> Timing:
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return Timing(median_s=float(median), iqr_s=float(q3 - q1), runs=len(times))


def forward_backward(fn: Kernel, inputs: tuple, grad_argnums: tuple[int, ...]) -> Callable[[], None]:
    """A call of `fn` followed by the backward of its differentiable outputs into the `grad_argnums` arguments."""
    leaves = list(inputs)
    for i in grad_argnums:
        leaves[i] = leaves[i].detach().requires_grad_(True)
    wrt = [leaves[i] for i in grad_argnums]
    probe = _as_tuple(fn(*leaves))
    differentiable = [k for k, out in enumerate(probe) if isinstance(out, torch.Tensor) and out.requires_grad]
    cotangents = [torch.ones_like(probe[k]) for k in differentiable]

    def step() -> None:
        outputs = _as_tuple(fn(*leaves))
        torch.autograd.grad([outputs[k] for k in differentiable], wrt, cotangents, allow_unused=True)

    return step


def _as_tuple(outputs: object) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def pick_winner(timings: dict[str, Timing], setup_per_call_s: dict[str, float] | None = None) -> str:
    """Cheapest implementation by median plus its amortised per-process setup; a candidate must be strictly
    cheaper than the reference to be picked.

    `timings` holds the reference and the verified candidates only: an unverified candidate has no timing and so
    can never be picked. `setup_per_call_s` is a JIT compile's cost spread over the expected calls per run.
    """
    if REFERENCE not in timings:
        raise ValueError(f"expected a timing for {REFERENCE!r} to compare against, found {sorted(timings)}")
    extra = setup_per_call_s or {}
    cost = {name: timing.median_s + extra.get(name, 0.0) for name, timing in timings.items()}
    best = REFERENCE
    for name in timings:
        if cost[name] < cost[best]:
            best = name
    return best
