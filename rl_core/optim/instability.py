"""The instability guard: a minibatch whose loss or gradient is not finite is skipped, and too many in a row discard
the whole update, so poisoned weights are never committed.

Every rank decides on the gradient after its all-reduce, which is the same tensor on every rank (a rank whose own
loss is not finite fills its share with NaN first, so the sum carries it), so all ranks skip the same minibatches
and give up together without another collective.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

logger = logging.getLogger("rl_core.algos")


class UnstableUpdate(FloatingPointError):
    """`limit` minibatch updates in a row had a non-finite loss or gradient: the update is abandoned."""

    def __init__(self, algorithm: str, where: str, skipped: int, limit: int) -> None:
        self.skipped = skipped
        super().__init__(f"{algorithm}: {limit} minibatch updates in a row had a non-finite loss or gradient (the "
                         f"last at {where}; {skipped} skipped in this update); the update is discarded. Lower "
                         "algorithm.learning_rate or check the rewards/observations for NaN or inf")


def poison_if_not_finite(loss: torch.Tensor, grad: torch.Tensor) -> None:
    """Before the all-reduce: a rank whose loss is NaN/inf makes its gradient NaN, so every rank sees it after."""
    if not math.isfinite(loss.item()):  # a Python float check: a fifth of torch.isfinite's per-minibatch cost
        grad.fill_(float("nan"))


@dataclass
class NonFiniteGuard:
    """Counts skipped minibatch updates in one update; `admit` says whether to step on the reduced gradient."""

    algorithm: str
    limit: int
    rank: int = 0
    skipped: int = 0
    in_a_row: int = 0

    def admit(self, grad: torch.Tensor, where: str, norm: torch.Tensor | None = None) -> bool:
        """True: `grad` is finite, step on it. False: skip this minibatch (logged). Raises UnstableUpdate at the
        limit. `norm`: `grad`'s L2 norm when the caller takes it anyway (to clip): a finite norm proves every element
        finite, so only a non-finite one (a NaN or inf element, or squares past float range) costs the element check.
        """
        if (norm is not None and math.isfinite(norm)) or bool(torch.isfinite(grad).all()):
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise UnstableUpdate(self.algorithm, where, self.skipped, self.limit)
        if self.rank == 0:
            logger.warning("%s: non-finite loss or gradient at %s; that minibatch update is skipped (%d in a row, "
                           "algorithm.nonfinite_limit %d)", self.algorithm, where, self.in_a_row, self.limit)
        return False
