"""Token log-probs: log-softmax over the vocabulary, gathered at the target tokens, forward and backward.

Every implementation has the signature
    token_logprobs(hidden[B, T, D], weight[V, D], targets[B, T] int64) -> logprobs[B, T]
i.e. log softmax(hidden @ weight.T)[target] per token, with the log-softmax in float32 and the result in hidden's
dtype; differentiable w.r.t. hidden and weight (GRPO trains through it). The reference materialises the full
[B, T, V] logits and their log-softmax; at LM sizes that is gigabytes, so `chunked` walks the tokens in chunks
and never holds more than one chunk's logits, recomputing them in backward instead of storing them.
No numpy or C++ candidate: the work is one large matmul, which BLAS already does better than a hand loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.registry import Op, register

CHUNK_ELEMENTS = 1 << 20
"""Logits held at once by `chunked` (4 MiB in float32): large enough that each chunk's matmul stays efficient."""


def token_logprobs_reference(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Full logits, full log-softmax, then the gather: the textbook formula."""
    logits = F.linear(hidden, weight).float()
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).to(hidden.dtype)


def token_logprobs_logsumexp(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """logit[target] - logsumexp(logits): skips writing (and backpropagating through) a second [B, T, V] tensor."""
    logits = F.linear(hidden, weight).float()
    return (logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).to(hidden.dtype)


class _FusedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
        logp = torch.log_softmax(F.linear(hidden, weight).float(), -1)  # [N, V]; the logits die here
        out = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(hidden, weight, targets, logp.exp_())  # the softmax, in log-softmax's buffer
        ctx.spent = False
        return out.to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        if ctx.spent:
            raise RuntimeError("token_logprobs 'fused' reuses its saved softmax as the gradient buffer, so its "
                               "backward runs once; use the 'reference' implementation with retain_graph=True")
        ctx.spent = True
        hidden, weight, targets, probs = ctx.saved_tensors
        grad_out = grad_out.float()
        grad_logits = probs.mul_(-grad_out.unsqueeze(-1))  # d out / d logits = onehot(target) - softmax
        grad_logits = grad_logits.scatter_add_(-1, targets.unsqueeze(-1), grad_out.unsqueeze(-1)).to(hidden.dtype)
        grad_hidden = grad_logits @ weight if ctx.needs_input_grad[0] else None  # in hidden's dtype, like F.linear
        grad_weight = grad_logits.T @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None


def token_logprobs_fused(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """The log-softmax buffer becomes the softmax in place and then the gradient in place: backward touches one
    [N, V] tensor once, where the reference's writes two more (the gather's scatter, log-softmax's gradient)."""
    flat = _FusedLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1))
    return flat.view(hidden.shape[:-1])


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int) -> Tensor:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = F.linear(hidden[rows], weight).float()  # [chunk, V]: the only logits alive
            lse[rows] = logits.logsumexp(-1)
            out[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - lse[rows]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk = chunk
        return out.to(hidden.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        hidden, weight, targets, lse = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
        grad_out = grad_out.float()
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            # d out / d logits = onehot(target) - softmax, recomputed from the saved logsumexp
            grad_logits = (F.linear(hidden[rows], weight).float() - lse[rows, None]).exp_().mul_(-grad_out[rows, None])
            grad_logits = grad_logits.scatter_add_(-1, targets[rows].unsqueeze(-1), grad_out[rows].unsqueeze(-1))
            grad_logits = grad_logits.to(hidden.dtype)  # the matmuls run in hidden's dtype, like F.linear's backward
            if want_hidden:
                grad_hidden[rows] = grad_logits @ weight
            if want_weight:
                grad_weight += grad_logits.T @ hidden[rows]
        return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None


def token_logprobs_chunked(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk_elements: int = CHUNK_ELEMENTS
) -> Tensor:
    """Chunks of tokens, each chunk's logits made, used and dropped; backward recomputes them per chunk."""
    batch = hidden.shape[:-1]
    chunk = max(1, chunk_elements // weight.shape[0])
    flat = _ChunkedLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), chunk)
    return flat.view(batch)


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random arguments for {"B", "T", "D", "V"}; "scale" multiplies the logits (large: tests overflow safety)."""
    B, T, D, V = shape["B"], shape["T"], shape["D"], shape["V"]
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, D, generator=gen)
    weight = torch.randn(V, D, generator=gen) * (shape.get("scale", 1.0) / D**0.5)
    targets = torch.randint(0, V, (B, T), generator=gen)
    return place(shape, hidden, weight, targets)


def bucket(inputs: tuple) -> dict:
    """Tokens rounded up to a power of two; model width and vocabulary exactly (they are fixed per model)."""
    hidden, weight = inputs[0], inputs[1]
    if hidden.dim() < 2 or weight.dim() != 2:
        raise ValueError(f"token_logprobs expects hidden [..., D] and weight [V, D], found "
                         f"{tuple(hidden.shape)} and {tuple(weight.shape)}")
    return {"N": next_pow2(hidden[..., 0].numel()), "D": hidden.shape[-1], "V": weight.shape[0]}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 1, "T": 1, "D": 1, "V": 1},  # one-word vocabulary: every log-prob is 0
    {"B": 1, "T": 1, "D": 3, "V": 2},
    {"B": 3, "T": 7, "D": 5, "V": 33},
    {"B": 2, "T": 5, "D": 8, "V": 1000, "scale": 200.0},  # logits in the hundreds: naive exp would overflow
)

TOKEN_LOGPROBS = register(
    Op(
        name="token_logprobs",
        reference=token_logprobs_reference,
        candidates={"logsumexp": token_logprobs_logsumexp, "fused": token_logprobs_fused,
                    "chunked": token_logprobs_chunked,
                    "compile": compiled(token_logprobs_logsumexp)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B", "T", "D", "V"),
        edge_cases=EDGE_CASES,
        grad_argnums=(0, 1),
        default_shapes=({"B": 4, "T": 64, "D": 128, "V": 8192},),
        calls_per_run=1_000,
    )
)
