"""Causal attention in one fixed order of operations: a query's output has the same bits whatever else the call holds.

    causal_attention(q[B, H, T, D], k[B, Hkv, S, D], v[B, Hkv, S, D], first[B] int64) -> [B, T, H, D]

Query i of row b sits at position first[b] + i and sees keys 0 .. first[b] + i (so S >= first[b] + T); keys past
those a row's queries see are never read (a decoding cache's stale or empty slots). Query head h reads kv head
h // (H // Hkv) (grouped-query attention); scores are scaled by 1 / sqrt(D). k and v may hold different S (each at
least the keys seen). Differentiable in q, k and v.

Why: an LM decoding one token at a time (one query per row, each row at its own position) and a full forward over
the same tokens (T queries per row) must give the same bits, so that a trainer recomputes its generator's log-probs
exactly. Through BLAS they do not: MKL's gemm rounds an element differently with the M and N of the call (its
blocking), and a softmax and P @ V sum over as many keys as the call holds, so the two paths' scores differ in most
elements' last bits even in float64, and now and then a float32 rounding of the output flips. The C++ kernel
(csrc/causal_attention.cpp) computes every element by one sequence of operations, fixed by D and the query's own
position alone; the sums run in float64, the output is rounded to float32 once.

Why not an `Op` of the registry: dispatch routes each shape bucket to its own tuned winner, and decoding and a full
forward fall in different buckets; parity needs one implementation for every shape. So callers call this function
where it runs (`fixed_order_applies`: float32 on CPU, a compiler to build it) and the reference elsewhere.

The backward pass recomputes the reference (PyTorch's scaled_dot_product_attention, memory-efficient) in float32 and
returns its gradients: only the forward's values must match decoding, and float32 is the precision the rest of a
training step runs in. They agree with the gradients of the float64 attention LlamaLM ran before this kernel to
float32's precision (tests/kernels/test_causal_attention.py).
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from gymflow_kernels.native import F64, I64, PTR, cpp_source, load_function
from gymflow_kernels.registry import CandidateUnavailable

_CPP_SOURCE = cpp_source("causal_attention.cpp")


def causal_attention_reference(q: Tensor, k: Tensor, v: Tensor, first: Tensor) -> Tensor:
    """The definition, through scaled_dot_product_attention in the inputs' dtype (any device, differentiable): the
    keys repeated for their query heads, a mask of the keys each query sees."""
    _check_shapes(q, k, v, first)
    steps = q.shape[2]
    positions = first.to(q.device)[:, None] + torch.arange(steps, device=q.device)  # (B, T)
    seen = int(positions.max()) + 1
    mask = torch.arange(seen, device=q.device) <= positions[..., None]  # (B, T, seen)
    groups = q.shape[1] // k.shape[1]
    keys = k[:, :, :seen].repeat_interleave(groups, dim=1)  # kv head h serves query heads [h*g, (h+1)*g)
    values = v[:, :, :seen].repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None]).transpose(1, 2)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, first: Tensor) -> None:
    """Refuse what the kernel would read out of bounds (and the reference would broadcast into a wrong answer)."""
    if (q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0]
            or not q.shape[3] == k.shape[3] == v.shape[3] or q.shape[1] % k.shape[1] != 0
            or first.shape != (q.shape[0],) or first.dtype != torch.int64):
        raise ValueError(f"causal_attention expects q [B, H, T, D], k and v [B, Hkv, S, D] with Hkv dividing H and "
                         f"first [B] int64; found q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"first {tuple(first.shape)} {first.dtype}")


@functools.cache
def causal_attention_problem() -> str | None:
    """Why the fixed-order kernel cannot run in this process (no compiler, a failed build), or None where it can.
    Decided once: it builds the kernel on first use (cached on disk) and runs it on a small case."""
    try:
        q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # B 1, H 1, T 2, D 2
        out = _kernel(q, q, q, torch.zeros(1, dtype=torch.int64))
    except CandidateUnavailable as exc:
        return str(exc)
    expected = causal_attention_reference(q.double(), q.double(), q.double(), torch.zeros(1, dtype=torch.int64))
    if not torch.allclose(out.double(), expected, rtol=1e-6, atol=1e-7):
        return f"the fixed-order attention kernel computed {out.tolist()} where {expected.tolist()} was expected"
    return None


def fixed_order_applies(*tensors: Tensor) -> bool:
    """Whether `causal_attention` runs the fixed-order kernel on these tensors: float32 on CPU, kernel built."""
    return all(x.dtype is torch.float32 and x.is_cpu for x in tensors) and causal_attention_problem() is None


def causal_attention(q: Tensor, k: Tensor, v: Tensor, first: Tensor) -> Tensor:
    """Attention by the fixed-order kernel (see the module's docstring); float32 CPU tensors (`fixed_order_applies`).
    With autograd, backward is the reference's."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _FixedOrderAttention.apply(q, k, v, first)
    return _kernel(q, k, v, first)


def _kernel(q: Tensor, k: Tensor, v: Tensor, first: Tensor) -> Tensor:
    """Call the C++ kernel: it reads float32 CPU memory at the tensors' strides, head_dim contiguous."""
    _check_shapes(q, k, v, first)
    if not all(x.dtype is torch.float32 and x.is_cpu for x in (q, k, v)) or first.device.type != "cpu":
        raise TypeError(f"the fixed-order attention kernel reads float32 CPU tensors, found {q.dtype} on "
                        f"{q.device}, {k.dtype} on {k.device}, {v.dtype} on {v.device}; call "
                        "causal_attention_reference elsewhere")
    batch, heads, steps, dim = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    first = first.contiguous()
    held = min(k.shape[2], v.shape[2])
    if batch and (int(first.min()) < 0 or int(first.max()) + steps > held):
        raise ValueError(f"causal_attention: queries at positions first + [0, {steps}) need keys up to "
                         f"{int(first.max()) + steps}, but k and v hold {held} (first in "
                         f"[{int(first.min())}, {int(first.max())}])")
    out = torch.empty(batch, steps, heads, dim)
    out_strides = (out.stride(0), out.stride(2), out.stride(1))  # written as [B, H, T, D]
    strides = (ctypes.c_int64 * 12)(*(s for x in (q, k, v) for s in x.stride()[:3]), *out_strides)
    function = load_function("causal_attention", _CPP_SOURCE, "gymflow_causal_attention",
                             (PTR,) * 5 + (I64,) * 5 + (PTR, F64))
    function(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), first.data_ptr(), batch, steps, heads,
             k.shape[1], dim, strides, dim ** -0.5)
    return out


class _FixedOrderAttention(torch.autograd.Function):
    """Forward: the kernel. Backward: the gradients of the reference, recomputed from the saved inputs."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, first: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(q, k, v, first)
        return _kernel(q, k, v, first)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        q, k, v, first = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_(need) for x, need in zip((q, k, v), ctx.needs_input_grad)]
            out = causal_attention_reference(*inputs, first)
            grads = iter(torch.autograd.grad(out, [x for x in inputs if x.requires_grad], grad))
        return (*(next(grads) if x.requires_grad else None for x in inputs), None)
