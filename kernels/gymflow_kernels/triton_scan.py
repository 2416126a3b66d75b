"""Triton kernel for the backward linear recurrence behind GAE and discounted returns (CUDA only).

    out[t] = delta[t] + decay[t] * out[t + 1],   out[T] = 0,   along dim 0 of [T, N] float32 tensors

Each program owns a block of columns and walks time backwards, keeping the carried value in registers: one read of
delta and decay and one write per element, where eager torch launches a kernel per time step. Imported only when a
CUDA tensor reaches a Triton candidate, so machines without triton or a GPU never import it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (64, 2), (128, 4), (256, 4), (512, 8))],
    key=["N"],
)
@triton.jit
def _backward_scan_kernel(delta_ptr, decay_ptr, out_ptr, T, N, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < N
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, T):
        offsets = (T - 1 - i) * N + cols
        delta = tl.load(delta_ptr + offsets, mask=inside, other=0.0)
        decay = tl.load(decay_ptr + offsets, mask=inside, other=0.0)
        carry = delta + decay * carry
        tl.store(out_ptr + offsets, carry, mask=inside)


def backward_scan(delta: Tensor, decay: Tensor) -> Tensor:
    """Solve the recurrence above for contiguous float32 [T, N] CUDA tensors."""
    delta, decay = delta.contiguous(), decay.contiguous()
    out = torch.empty_like(delta)
    T, N = delta.shape
    _backward_scan_kernel[lambda meta: (triton.cdiv(N, meta["BLOCK"]),)](delta, decay, out, T, N)
    return out
