"""A loss whose gradients are computed in the same pass as its value: the shape of every fused loss candidate.

Why: a loss over a minibatch is a few dozen elementwise ops; eager autograd records each and replays each backward,
so dispatch overhead dominates at RL minibatch sizes. When the gradient has a closed form, one pass (torch, numpy or
C++) can produce the loss, its statistics and d loss / d input together; backward is then one multiply per input.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Compute = Callable[[], tuple[tuple[Tensor, ...], tuple[Tensor | None, ...]]]
"""() -> (outputs: loss first, then statistics; gradients of the loss, one per tensor argument, None where none)."""


class _PrecomputedGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, compute: Compute, *tensors: Tensor) -> tuple[Tensor, ...]:  # noqa: ARG004 - autograd's edges
        outputs, grads = compute()
        ctx.grads = grads
        ctx.mark_non_differentiable(*outputs[1:])
        return outputs

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *_: Tensor) -> tuple[Tensor | None, ...]:
        return (None, *(None if g is None else g * grad_loss for g in ctx.grads))


def fused_loss(compute: Compute, *tensors: Tensor) -> tuple[Tensor, ...]:
    """Run `compute` (which must read `tensors` detached) and connect its loss to `tensors` for backward.

    Only the first output is differentiable; the statistics after it are not, like the reference's detached ones.
    """
    return _PrecomputedGradients.apply(compute, *tensors)
