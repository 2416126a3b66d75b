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
        scaled = scaled.masked_fill(outside_nucleus(scaled.softmax(dim=-1), params.top_p), float("-inf"))
    return scaled.log_softmax(dim=-1)


NUCLEUS_CANDIDATES = 64
"""The most likely tokens first examined for the nucleus; 8x more each time they do not reach top_p."""


def outside_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(..., vocab) True for the tokens outside the nucleus: in descending order of probability, the tokens whose
    probability mass before them already reaches top_p (the most likely token is always kept).

    Only the most likely tokens are sorted, as many as reach top_p together (a large vocabulary mostly holds
    negligible mass): any token after them has at least that much mass before it. Sorting the whole vocabulary (all
    49,152 tokens of SmolLM2) at every decoding step costs in proportion to the vocabulary; this, to the nucleus."""
    vocab = probs.shape[-1]
    k = min(NUCLEUS_CANDIDATES, vocab)
    while True:
        if k == vocab:
            top, order = probs.sort(dim=-1, descending=True, stable=True)
        else:
            top, order = probs.topk(k, dim=-1)
        cumulative = top.cumsum(dim=-1)
        if k == vocab or bool((cumulative[..., -1] >= top_p).all()):
            break
        k = min(8 * k, vocab)
    removed = (cumulative - top) >= top_p  # in sorted order; scattered back to vocabulary order
    return torch.ones_like(probs, dtype=torch.bool).scatter_(-1, order, removed)
