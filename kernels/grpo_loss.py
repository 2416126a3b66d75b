"""GRPO's loss (group-relative advantages, clipped ratio, optional KL to a reference), forward and backward.

Every implementation has the signature
    grpo_loss(logprobs[B, T], old_logprobs[B, T], ref_logprobs[B, T] | None, rewards[B], mask[B, T],
              group_size, clip_eps, beta) -> (loss, advantages[B], kl, clip_fraction)
B = groups x group_size completions, consecutive rows forming a group; `mask` is 1.0 on generated tokens. As in
DeepSeekMath (Shao et al., 2024): A_i = (r_i - mean(group)) / (std(group) + 1e-4), per token
    -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * (exp(ref - lp) - (ref - lp) - 1),
averaged over each sequence's tokens, then over sequences. beta = 0 (ref_logprobs may then be None) drops the KL
term. Only `loss` is differentiable, w.r.t. `logprobs`; `kl` and `clip_fraction` are token means (detached).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.compiled import compiled
from kernels.fused import fused_loss
from kernels.inputs import next_pow2, place
from kernels.native import F64, I64, PTR, float32_cpu, load_function
from kernels.registry import Op, candidate, register

STD_EPS = 1e-4
"""Added to the group's reward std: a group whose rewards are all equal gets advantage 0, not NaN."""


def grpo_loss_reference(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, rewards: Tensor, mask: Tensor,
    group_size: int, clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GRPO as the paper writes it, in eager torch."""
    if group_size < 2 or rewards.shape[0] % group_size:
        raise ValueError(f"grpo_loss needs groups of >= 2 completions filling the batch; found group_size "
                         f"{group_size} for {rewards.shape[0]} rewards")
    groups = rewards.view(-1, group_size)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + STD_EPS)).view(-1)
    ratio = (logprobs - old_logprobs).exp()
    adv = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    kl = torch.zeros_like(logprobs)
    if beta != 0:
        log_ref_ratio = ref_logprobs - logprobs
        kl = log_ref_ratio.exp() - log_ref_ratio - 1  # k3 estimator: unbiased and >= 0
        per_token = per_token + beta * kl
    tokens = mask.sum(1).clamp(min=1)
    loss = ((per_token * mask).sum(1) / tokens).mean()
    with torch.no_grad():
        all_tokens = mask.sum().clamp(min=1)
        kl_mean = (kl * mask).sum() / all_tokens
        clip_fraction = (((ratio - 1).abs() > clip_eps).to(mask.dtype) * mask).sum() / all_tokens
    return loss, advantages.detach(), kl_mean, clip_fraction


def grpo_loss_fused(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, rewards: Tensor, mask: Tensor,
    group_size: int, clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Closed-form d loss / d logprobs in the forward pass (no graph recorded); backward is one multiply."""

    def compute() -> tuple:
        lp, old, r, m = (x.detach() for x in (logprobs, old_logprobs, rewards, mask))
        groups = r.view(-1, group_size)
        advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + STD_EPS)).view(-1)
        ratio = (lp - old).exp()
        adv = advantages.unsqueeze(1)
        unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
        in_range = (ratio >= 1 - clip_eps) & (ratio <= 1 + clip_eps)
        # d min(a, b): the smaller one's gradient, half of each on a tie (torch's rule); d a / d lp = a
        grad_clipped = torch.where(in_range, unclipped, 0 * unclipped)
        grad = -torch.where(unclipped < clipped, unclipped,
                            torch.where(unclipped > clipped, grad_clipped, 0.5 * (unclipped + grad_clipped)))
        per_token = -torch.minimum(unclipped, clipped)
        kl = torch.zeros_like(lp)
        if beta != 0:
            log_ref_ratio = ref_logprobs.detach() - lp
            ref_ratio = log_ref_ratio.exp()
            kl = ref_ratio - log_ref_ratio - 1
            per_token = per_token + beta * kl
            grad = grad + beta * (1 - ref_ratio)
        weight = mask_weights(m)  # d loss / d per_token
        all_tokens = m.sum().clamp(min=1)
        clip_fraction = (((ratio - 1).abs() > clip_eps).to(m.dtype) * m).sum() / all_tokens
        outputs = ((per_token * weight).sum(), advantages, (kl * m).sum() / all_tokens, clip_fraction)
        return outputs, (grad * weight,)

    return fused_loss(compute, logprobs)


def mask_weights(mask: Tensor) -> Tensor:
    """Weight of each token in the loss: mask / (tokens in its sequence) / sequences."""
    return mask / (mask.sum(1, keepdim=True).clamp(min=1) * mask.shape[0])


_CPP_SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>

// GRPO loss and d loss / d logprobs over [B, T] float32 buffers; B rows in groups of G (sums in double).
// stats: loss, kl (token mean), clip_fraction (token mean). ref may be null when beta == 0.
extern "C" void gymflow_grpo_loss(const float* lp, const float* old, const float* ref, const float* rewards,
                                  const float* mask, std::int64_t B, std::int64_t T, std::int64_t G, double eps_d,
                                  double beta, double std_eps, float* stats, float* advantages, float* grad) {
  const float lo = static_cast<float>(1 - eps_d), hi = static_cast<float>(1 + eps_d), eps = static_cast<float>(eps_d);
  for (std::int64_t g0 = 0; g0 < B; g0 += G) {
    double mean = 0, var = 0;
    for (std::int64_t i = g0; i < g0 + G; ++i) mean += rewards[i];
    mean /= G;
    for (std::int64_t i = g0; i < g0 + G; ++i) var += (rewards[i] - mean) * (rewards[i] - mean);
    const double std = std::sqrt(var / (G - 1));
    for (std::int64_t i = g0; i < g0 + G; ++i)
      advantages[i] = static_cast<float>((rewards[i] - mean) / (std + std_eps));
  }
  double loss = 0, kl_sum = 0, clipped = 0, all_tokens = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    double tokens = 0;
    for (std::int64_t t = 0; t < T; ++t) tokens += mask[b * T + t];
    const float weight_per_mask = static_cast<float>(1.0 / (std::max(tokens, 1.0) * B));
    const float adv = advantages[b];
    double row = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t k = b * T + t;
      const float ratio = std::exp(lp[k] - old[k]);
      const float a = ratio * adv, c = std::min(std::max(ratio, lo), hi) * adv;
      const float ga = a, gc = ratio >= lo && ratio <= hi ? a : 0.0f;
      float per_token = -std::min(a, c), g = -(a < c ? ga : (a > c ? gc : 0.5f * (ga + gc))), kl = 0;
      if (beta != 0) {
        const float d = ref[k] - lp[k], e = std::exp(d);
        kl = e - d - 1;
        per_token += static_cast<float>(beta) * kl;
        g += static_cast<float>(beta) * (1 - e);
      }
      const float w = mask[k] * weight_per_mask;
      row += per_token * w;
      grad[k] = g * w;
      kl_sum += kl * mask[k];
      clipped += (std::fabs(ratio - 1) > eps ? 1 : 0) * mask[k];
    }
    loss += row;
    all_tokens += tokens;
  }
  all_tokens = std::max(all_tokens, 1.0);
  stats[0] = static_cast<float>(loss);
  stats[1] = static_cast<float>(kl_sum / all_tokens);
  stats[2] = static_cast<float>(clipped / all_tokens);
}
"""


@candidate(source=_CPP_SOURCE)
def grpo_loss_cpp(
    logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor | None, rewards: Tensor, mask: Tensor,
    group_size: int, clip_eps: float, beta: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Advantages, loss, statistics and gradient in two C++ loops (built on first use, cached on disk)."""
    kernel = load_function("grpo_loss", _CPP_SOURCE, "gymflow_grpo_loss",
                           (PTR,) * 5 + (I64,) * 3 + (F64,) * 3 + (PTR,) * 3)
    ref = ref_logprobs if beta != 0 else logprobs  # not read when beta == 0

    def compute() -> tuple:
        lp, old, ref_, r, m = float32_cpu("grpo_loss", logprobs, old_logprobs, ref, rewards, mask)
        B, T = lp.shape
        if old.shape != lp.shape or ref_.shape != lp.shape or m.shape != lp.shape or r.shape != (B,) or B % group_size:
            raise ValueError(f"grpo_loss expects [B, T] log-probs and mask, [B] rewards, B a multiple of group_size "
                             f"{group_size}; found {tuple(lp.shape)}, {tuple(m.shape)} and {tuple(r.shape)}")
        stats, advantages, grad = torch.empty(3), torch.empty(B), torch.empty(B, T)
        kernel(lp.data_ptr(), old.data_ptr(), ref_.data_ptr(), r.data_ptr(), m.data_ptr(), B, T, group_size,
               clip_eps, beta, STD_EPS, stats.data_ptr(), advantages.data_ptr(), grad.data_ptr())
        loss, kl, clip_fraction = (x.clone() for x in stats.unbind())
        return (loss, advantages, kl, clip_fraction), (grad,)

    return fused_loss(compute, logprobs)


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random arguments for {"B", "T", "G"} (B sequences in groups of G); "beta" (default 0.04; 0 passes no
    reference), "clip_eps", "spread" (std of lp - old), "rewards": "tied" (equal within each group), "mask":
    "random" (ragged lengths, some empty) | "full"."""
    B, T, G = shape["B"], shape["T"], shape["G"]
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(B, T, generator=gen) * 5
    old = logprobs + shape.get("spread", 0.2) * torch.randn(B, T, generator=gen)
    ref = logprobs + 0.3 * torch.randn(B, T, generator=gen)
    rewards = torch.randn(B, generator=gen)
    if shape.get("rewards") == "tied":
        rewards = rewards.view(-1, G)[:, :1].expand(-1, G).reshape(-1)
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = (torch.arange(T) < lengths[:, None]).float() if shape.get("mask", "random") == "random" else torch.ones(B, T)
    beta = shape.get("beta", 0.04)
    logprobs, old, ref, rewards, mask = place(shape, logprobs, old, ref, rewards, mask)
    return logprobs, old, ref if beta != 0 else None, rewards, mask, G, shape.get("clip_eps", 0.2), beta


def bucket(inputs: tuple) -> dict:
    """Sequences and length rounded up to powers of two; the group size exactly (it changes the work per group)."""
    logprobs, group_size = inputs[0], inputs[5]
    if logprobs.dim() != 2:
        raise ValueError(f"grpo_loss expects logprobs of shape [B, T], found {tuple(logprobs.shape)}")
    return {"B": next_pow2(logprobs.shape[0]), "T": next_pow2(logprobs.shape[1]), "G": group_size}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 2, "T": 1, "G": 2},
    {"B": 4, "T": 3, "G": 2, "rewards": "tied"},  # zero std: advantages 0, every min() a tie
    {"B": 6, "T": 7, "G": 3, "beta": 0.0},  # no KL term, no reference passed
    {"B": 9, "T": 5, "G": 3, "spread": 0.0, "mask": "full"},  # ratio exactly 1
    {"B": 8, "T": 33, "G": 4, "spread": 3.0, "beta": 0.1},  # nearly everything clipped
    {"B": 16, "T": 1, "G": 16, "mask": "full"},
)

GRPO_LOSS = register(
    Op(
        name="grpo_loss",
        reference=grpo_loss_reference,
        candidates={"fused": grpo_loss_fused, "cpp": grpo_loss_cpp, "compile": compiled(grpo_loss_reference)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B", "T", "G"),
        edge_cases=EDGE_CASES,
        grad_argnums=(0,),
        default_shapes=({"B": 64, "T": 256, "G": 8},),  # 8 prompts x 8 completions of up to 256 tokens
        calls_per_run=1_000,
    )
)
