"""GRPO's policy loss (clipped ratio, optional KL to a reference policy) over per-token weights, forward and backward.

Every implementation has the signature
    grpo_loss(logprobs[B, T], old_logprobs[B, T], ref_logprobs[B, T] | None, advantages[B], weights[B, T],
              clip_eps, beta) -> (loss, kl, clip_fraction)     all 0-dim
With ratio = exp(logprobs - old_logprobs), each token costs
    -min(ratio * A_b, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A_b) + beta * (exp(ref - lp) - (ref - lp) - 1),
the KL term (the k3 estimator, as in DeepSeekMath, Shao et al., 2024) only when beta != 0 (ref_logprobs may then be
None). loss = sum of cost * weight; kl and clip_fraction (|ratio - 1| > clip_eps) are means over the tokens of
nonzero weight, detached, 0 where there are none. Only `loss` is differentiable, w.r.t. `logprobs`.

Why advantages and weights come from the caller: how advantages are made (group-relative, with or without std
scaling) is the scoring step's choice, and how tokens are averaged is the trainer's: per sequence (GRPO), over all
tokens (DAPO), or as one rank's share of a global minibatch (weights normalized over the global minibatch, times the
number of ranks), so that ranks averaging their gradients step exactly as one process would. The weights carry the
mask too: a token of weight 0 reaches no output whatever its log-probs hold (padding may even be NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.fused import fused_loss
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import F64, I64, PTR, cpp_source, float32_cpu, load_function
from gymflow_kernels.registry import Op, candidate, register


def _check_arguments(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, weights: Tensor,
    beta: float,
) -> None:
    """Refuse a missing reference and mismatched shapes: [B, 1] advantages or [T] weights would broadcast into a
    wrong loss instead of raising."""
    if beta != 0 and ref_logprobs is None:
        raise ValueError(f"grpo_loss: beta is {beta} but ref_logprobs is None; pass the reference policy's "
                         f"log-probs, or beta=0 to drop the KL term")
    per_token = {"logprobs": logprobs, "old_logprobs": old_logprobs, "weights": weights}
    if beta != 0:
        per_token["ref_logprobs"] = ref_logprobs
    if (logprobs.dim() != 2 or any(x.shape != logprobs.shape for x in per_token.values())
            or advantages.shape != logprobs.shape[:1]):
        found = ", ".join(f"{name} {tuple(x.shape)}" for name, x in {**per_token, "advantages": advantages}.items())
        raise ValueError(f"grpo_loss expects [B, T] log-probs and weights and [B] advantages; found {found}")


def grpo_loss_reference(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, weights: Tensor,
    clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """The clipped objective plus k3 KL, weighted per token, in eager torch."""
    _check_arguments(logprobs, old_logprobs, ref_logprobs, advantages, weights, beta)
    live = weights != 0
    ratio = torch.where(live, logprobs - old_logprobs, 0.0).exp()  # where(): padding reaches neither value nor grad
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    kl = torch.zeros_like(logprobs)
    if beta != 0:
        log_ref_ratio = torch.where(live, ref_logprobs - logprobs, 0.0)
        kl = log_ref_ratio.exp() - log_ref_ratio - 1  # k3 estimator: unbiased and >= 0; 0 where weight is 0
        per_token = per_token + beta * kl
    loss = (per_token * weights).sum()
    with torch.no_grad():
        tokens = live.sum().clamp(min=1)
        kl_mean = kl.sum() / tokens
        clip_fraction = ((((ratio - 1).abs() > clip_eps) & live).sum() / tokens).to(logprobs.dtype)
    return loss, kl_mean, clip_fraction


def grpo_loss_fused(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, weights: Tensor,
    clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Closed-form d loss / d logprobs in the forward pass (no graph recorded); backward is one multiply."""
    _check_arguments(logprobs, old_logprobs, ref_logprobs, advantages, weights, beta)

    def compute() -> tuple:
        lp, old, adv, w = (x.detach() for x in (logprobs, old_logprobs, advantages, weights))
        live = w != 0
        ratio = torch.where(live, lp - old, 0.0).exp()
        adv = adv.unsqueeze(1)
        unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
        in_range = (ratio >= 1 - clip_eps) & (ratio <= 1 + clip_eps)
        # d min(a, b): the smaller one's gradient, half of each on a tie (torch's rule); d a / d lp = a
        grad_clipped = torch.where(in_range, unclipped, 0 * unclipped)
        grad = -torch.where(unclipped < clipped, unclipped,
                            torch.where(unclipped > clipped, grad_clipped, 0.5 * (unclipped + grad_clipped)))
        per_token = -torch.minimum(unclipped, clipped)
        kl = torch.zeros_like(lp)
        if beta != 0:
            log_ref_ratio = torch.where(live, ref_logprobs.detach() - lp, 0.0)
            ref_ratio = log_ref_ratio.exp()
            kl = ref_ratio - log_ref_ratio - 1
            per_token = per_token + beta * kl
            grad = grad + beta * (1 - ref_ratio)
        tokens = live.sum().clamp(min=1)
        clip_fraction = ((((ratio - 1).abs() > clip_eps) & live).sum() / tokens).to(lp.dtype)
        return ((per_token * w).sum(), kl.sum() / tokens, clip_fraction), (grad * w,)

    return fused_loss(compute, logprobs)


_CPP_SOURCE = cpp_source("grpo_loss.cpp")


@candidate(source=_CPP_SOURCE)
def grpo_loss_cpp(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, advantages: Tensor, weights: Tensor,
    clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Loss, statistics and gradient in one C++ loop (built on first use, cached on disk)."""
    _check_arguments(logprobs, old_logprobs, ref_logprobs, advantages, weights, beta)
    kernel = load_function("grpo_loss", _CPP_SOURCE, "gymflow_grpo_loss",
                           (PTR,) * 5 + (I64,) * 2 + (F64,) * 2 + (PTR,) * 2)
    ref = ref_logprobs if beta != 0 else logprobs  # not read when beta == 0

    def compute() -> tuple:
        lp, old, ref_, adv, w = float32_cpu("grpo_loss", logprobs, old_logprobs, ref, advantages, weights)
        B, T = lp.shape
        stats, grad = torch.empty(3), torch.empty(B, T)
        kernel(lp.data_ptr(), old.data_ptr(), ref_.data_ptr(), adv.data_ptr(), w.data_ptr(), B, T, clip_eps, beta,
               stats.data_ptr(), grad.data_ptr())
        return tuple(x.clone() for x in stats.unbind()), (grad,)

    return fused_loss(compute, logprobs)


WEIGHTS = ("random", "tokens", "zero", "full")
"""`make_inputs`'s "weights" kinds."""


def example_weights(kind: str, B: int, T: int, gen: torch.Generator) -> Tensor:
    """Weights of one kind: "random" (ragged masks, every eighth row from the second empty, each row averaged as in
    GRPO), "tokens" (the same masks averaged over all tokens, as in DAPO), "zero" (nothing counts) or "full" (every
    token, weight 1: unnormalized, so gradients are O(1) and the verifier's absolute tolerance cannot hide them)."""
    if kind not in WEIGHTS:
        raise ValueError(f"grpo_loss inputs: unknown weights {kind!r}; expected one of {', '.join(WEIGHTS)}")
    if kind == "full":
        return torch.ones(B, T)
    if kind == "zero":
        return torch.zeros(B, T)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    lengths[1::8] = 0  # completions cut to nothing
    mask = (torch.arange(T) < lengths[:, None]).float()
    if kind == "tokens":
        return mask / mask.sum().clamp(min=1)
    return mask / (mask.sum(1, keepdim=True).clamp(min=1) * B)


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random arguments for {"B", "T"}; "beta" (default 0.04; 0 passes no reference), "clip_eps" (0.2), "spread"
    (std of lp - old, 0.2; 0: ratio exactly 1, large: most clipped), "weights" (see `example_weights`, default
    "random"), "advantages": "zero" (every min() a tie), "padding": a value such as "nan" written into the three
    log-probs wherever the weight is 0 (it must reach no output)."""
    B, T = shape["B"], shape["T"]
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, T, generator=gen) * 5
    old = logprobs + shape.get("spread", 0.2) * torch.randn(B, T, generator=gen)
    ref = logprobs + 0.3 * torch.randn(B, T, generator=gen)
    advantages = torch.randn(B, generator=gen) * (0.0 if shape.get("advantages") == "zero" else 1.0)
    weights = example_weights(shape.get("weights", "random"), B, T, gen)
    if "padding" in shape:
        logprobs, old, ref = (x.masked_fill(weights == 0, float(shape["padding"])) for x in (logprobs, old, ref))
    beta = shape.get("beta", 0.04)
    logprobs, old, ref, advantages, weights = place(shape, logprobs, old, ref, advantages, weights)
    return logprobs, old, ref if beta != 0 else None, advantages, weights, shape.get("clip_eps", 0.2), beta


def bucket(inputs: tuple) -> dict:
    """Sequences and length rounded up to powers of two."""
    logprobs = inputs[0]
    if logprobs.dim() != 2:
        raise ValueError(f"grpo_loss expects logprobs of shape [B, T], found {tuple(logprobs.shape)}")
    return {"B": next_pow2(logprobs.shape[0]), "T": next_pow2(logprobs.shape[1])}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 1, "T": 1, "weights": "full"},
    {"B": 2, "T": 3},
    {"B": 9, "T": 5, "spread": 0.0, "weights": "full"},  # ratio exactly 1: nothing clipped, every min() a tie
    {"B": 8, "T": 33, "spread": 3.0, "beta": 0.1},  # nearly everything clipped, both sides
    {"B": 6, "T": 7, "beta": 0.0},  # no KL term, no reference passed
    {"B": 5, "T": 4, "weights": "zero"},  # no token counts: every output 0
    {"B": 4, "T": 3, "advantages": "zero", "weights": "full"},  # every min() a tie at 0
    {"B": 16, "T": 9, "weights": "tokens", "padding": "nan"},  # DAPO's weights; padding must not leak
    {"B": 16, "T": 1, "weights": "full"},
)

GRPO_LOSS = register(
    Op(
        name="grpo_loss",
        reference=grpo_loss_reference,
        candidates={"fused": grpo_loss_fused, "cpp": grpo_loss_cpp, "compile": compiled(grpo_loss_reference)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B", "T"),
        edge_cases=EDGE_CASES,
        grad_argnums=(0,),
        default_shapes=({"B": 128, "T": 64},),  # the agent flow: 16 prompts x 8 samples of up to 64 tokens
        calls_per_run=1_000,
    )
)
