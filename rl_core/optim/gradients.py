"""One flat gradient buffer per model: what trainer ranks all-reduce and what the norm clip scales.

A minibatch's gradient is written into one flat tensor whose slices are every parameter's `.grad`, so averaging it
across ranks is one collective and the optimizer reads the averaged values without a copy.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


def flat_grad_views(params: tuple[nn.Parameter, ...]) -> torch.Tensor:
    """One flat buffer whose slices become each parameter's `.grad`: a minibatch's flat gradient (what the ranks
    all-reduce) lands in every `.grad` with one copy, and the norm clip is one reduction over it."""
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def clip_grad_norm_(flat: torch.Tensor, max_norm: float, norm: torch.Tensor | None = None) -> torch.Tensor:
    """`nn.utils.clip_grad_norm_` on the flat gradient: scale it to norm `max_norm` when it is longer; returns the
    norm before clipping. `norm`: `flat`'s norm when the caller has already taken it (`NonFiniteGuard.admit`)."""
    norm = torch.linalg.vector_norm(flat) if norm is None else norm
    flat.mul_(clip_scale(float(norm), max_norm))
    return norm


def clip_scale(norm: float, max_norm: float) -> float:
    """min(max_norm / (norm + 1e-6), 1) with torch's float32 bits for a float32 `norm` (torch computes it on the 0-d
    norm tensor: the sum in float32, `Tensor.__rdiv__`'s reciprocal times `max_norm`, the clamp), on numpy scalars:
    each of those four torch ops on a 0-d tensor pays torch's dispatch, a visible share of a small minibatch step,
    where numpy's scalar arithmetic does the same float32 operations for a fraction of it."""
    scaled = np.float32(max_norm) * (np.float32(1.0) / (np.float32(norm) + np.float32(1e-6)))
    return float(min(scaled, np.float32(1.0)))
