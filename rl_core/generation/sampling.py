"""The distribution a token is actually sampled from, as one function that both the generator and the trainer call.

Behaviour log-probs are those of this distribution (temperature, top-k, top-p), not of the raw softmax: a trainer
that recomputes them any other way gets a silent offset in its importance ratios (vllm#42259, trl#6789).
"""
from __future__ import annotations

import torch

from rl_core.generation.base import SamplingParams


def sampling_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., vocab) log-probs of the sampled distribution: softmax(logits / temperature) restricted to the top_k
    most likely tokens, then to the nucleus reaching top_p of that, renormalized; -inf outside. Computed in fp32."""
    scaled = logits.float() / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))  # ties with the k-th are kept, as vLLM does
    if params.top_p < 1:
        probs, order = scaled.softmax(dim=-1).sort(dim=-1, descending=True, stable=True)
        mass_before = probs.cumsum(dim=-1) - probs  # the most likely token has 0 before it: always kept
        removed = mass_before >= params.top_p  # in sorted order; scattered back to vocabulary order
        outside = torch.empty_like(removed).scatter_(-1, order, removed)
        scaled = scaled.masked_fill(outside, float("-inf"))
    return scaled.log_softmax(dim=-1)
