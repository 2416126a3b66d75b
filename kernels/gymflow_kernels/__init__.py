"""Hot ops with tuned implementations: call `dispatch(op)` instead of a fixed function.

Why: the fastest way to compute an op (GAE, losses, gathers) depends on shape, dtype, device and library versions,
and fast rewrites are easy to get subtly wrong. So each op keeps a readable reference, candidates are verified
against it and timed (`autotune`), the winner per shape bucket is cached on disk, and `dispatch` routes each call to
that winner, or to the reference when nothing is tuned. A wrong or slower candidate can never be chosen.
GYMFLOW_KERNELS=reference makes every dispatcher run the reference (to measure what tuning buys, or to rule it out).
Tune from the command line with `python -m gymflow_kernels --ops gae --report` (kernels/gymflow_kernels/cli.py).

This package stands alone: it imports nothing from rl_core, flows, tasks or prefect.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Each op module registers its op on import.
from gymflow_kernels import gae, grpo_loss, logprobs, policy_mlp, ppo_grad, ppo_loss, returns  # noqa: F401
from gymflow_kernels.autotune import autotune
from gymflow_kernels.cache import WinnerFile, cache_key, winners_path
from gymflow_kernels.native import parallel_cores, using_cores
from gymflow_kernels.registry import (
    COMPILE,
    REFERENCE,
    CandidateUnavailable,
    Kernel,
    Op,
    Tolerance,
    candidate,
    describe,
    get_op,
    register,
    registered_ops,
    unregister,
)
from gymflow_kernels.report import BucketReport, CandidateResult, TuneReport, fast_p, geomean_speedup, summary

__all__ = [
    "COMPILE", "REFERENCE", "BucketReport", "CandidateResult", "CandidateUnavailable", "Dispatcher", "Kernel", "Op",
    "Tolerance", "TuneReport", "autotune", "candidate", "dispatch", "fast_p", "geomean_speedup", "get_op",
    "parallel_cores", "register", "registered_ops", "summary", "unregister", "using_cores",
]


class Dispatcher:
    """Callable standing in for an op: each call runs the cached winner for the call's bucket, else the reference.

    The cache file is read lazily and re-read when it changes, so a winner tuned by another process is picked up
    without a restart. Per call this costs one stat() and a dict lookup.
    """

    def __init__(self, op: Op) -> None:
        self.op = op
        self._signature = inspect.signature(op.reference)
        self._files: dict[Path, WinnerFile] = {}
        self._chosen: dict[tuple, str] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self._positional(args, kwargs)
        return self.resolve(*inputs)(*inputs)

    def resolve(self, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """The implementation a call with these arguments runs, for a caller that makes many calls of one shape (a
        rollout's steps, an update's minibatches): calling it directly skips the per-call lookup (a stat of the
        winners file, the bucket, the cache key: as much as a small op itself may cost), and a winner tuned meanwhile
        is picked up at the next resolve."""
        name = self.choose(*args, **kwargs)
        return self.op.reference if name == REFERENCE else self.op.candidates[name]

    def choose(self, *args: Any, **kwargs: Any) -> str:
        """Name of the implementation a call with these arguments runs (useful for logs and tests)."""
        if os.environ.get("GYMFLOW_KERNELS") == REFERENCE:
            return REFERENCE
        inputs = self._positional(args, kwargs)
        path = winners_path()
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = WinnerFile(path)
        if file.refresh():
            self._chosen = {}
        bucket, (dtype, device), threads = self.op.bucket(inputs), describe(inputs), torch.get_num_threads()
        memo = (path, tuple(bucket.items()), dtype, device, threads)
        if memo not in self._chosen:
            winner = file.winner(cache_key(self.op, bucket, dtype, device, threads))
            self._chosen[memo] = winner if winner in self.op.candidates else REFERENCE
        return self._chosen[memo]

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        if not kwargs:
            return args
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args


def dispatch(op: str) -> Dispatcher:
    """A callable with the signature of `op`'s reference that runs the tuned winner for each call's shape."""
    return Dispatcher(get_op(op))
