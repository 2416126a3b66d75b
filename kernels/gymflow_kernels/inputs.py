"""Helpers shared by the ops' input generators and shape buckets.

A shape dict may carry "dtype" (e.g. "bfloat16") and "device" (e.g. "cuda") beside its sizes: the tuner copies them
into every edge case, so a bucket is verified in the dtype and on the device it is tuned for.
"""

from __future__ import annotations

import torch
from torch import Tensor


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): bucket edges, so one tuning serves every size up to the edge."""
    return 1 << max(n - 1, 0).bit_length()


def place(shape: dict, *tensors: Tensor) -> tuple[Tensor, ...]:
    """`tensors` moved to the shape's "device" (default cpu), floating ones cast to its "dtype" (default float32)."""
    dtype = getattr(torch, shape.get("dtype", "float32"))
    device = torch.device(shape.get("device", "cpu"))
    return tuple(x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype) for x in tensors)
