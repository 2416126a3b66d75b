"""PPO's loss (clipped surrogate + value loss - entropy bonus), forward and backward, as a tunable op.

Every implementation has the signature
    ppo_loss(new_logprob[B], old_logprob[B], advantages[B], value[B], old_value[B], returns[B], entropy[B],
             clip_coef, vf_coef, ent_coef, clip_vloss)
        -> (loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction)     all 0-dim
Only `loss` is differentiable, w.r.t. new_logprob, value and entropy (the outputs of the model); the statistics are
detached. The reference is exactly the arithmetic of `rl_core.algos.ppo.update.ppo_loss`, op for op, so routing the
update through `dispatch("ppo_loss")` changes no bit while the reference is chosen. Ties in max() split the
gradient evenly and clamp passes it at its bounds, as torch's autograd does, so the fused gradients match.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.fused import fused_loss
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import F64, I64, PTR, cpp_source, float32_cpu, load_function
from gymflow_kernels.registry import Op, candidate, register


def ppo_loss_reference(
    new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, value: Tensor, old_value: Tensor,
    returns: Tensor, entropy: Tensor, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool,
) -> tuple[Tensor, ...]:
    """The clipped objective as the PPO paper writes it (Schulman et al., 2017, eq. 7 and 9), in eager torch."""
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    v_err = (value - returns) ** 2
    if clip_vloss:
        clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        v_err = torch.max(v_err, (clipped - returns) ** 2)
    v_loss = 0.5 * v_err.mean()
    entropy_mean = entropy.mean()
    loss = pg_loss + vf_coef * v_loss - ent_coef * entropy_mean
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance KL estimator
        clip_fraction = ((ratio - 1).abs() > clip_coef).float().mean()
    return loss, pg_loss.detach(), v_loss.detach(), entropy_mean.detach(), approx_kl, clip_fraction


def loss_and_grads(xp: ModuleType, nl, ol, adv, v, ov, ret, ent, clip: float, vf: float, ec: float, clip_v: bool):
    """Loss, statistics and d loss / d (new_logprob, value, entropy) in one pass; `xp` is torch or numpy."""
    n = nl.shape[0]
    log_ratio = nl - ol
    ratio = xp.exp(log_ratio)
    unclipped, clipped = -adv * ratio, -adv * ratio.clip(1 - clip, 1 + clip)
    pg_loss = xp.maximum(unclipped, clipped).mean()
    in_range = (ratio >= 1 - clip) & (ratio <= 1 + clip)
    g_pg = _max_grad(xp, unclipped, clipped, -adv * ratio, xp.where(in_range, -adv * ratio, 0 * ratio))
    diff = v - ret
    v_err, g_v = diff**2, 2 * diff
    if clip_v:
        delta = v - ov
        v_clipped = ov + delta.clip(-clip, clip)
        err_clipped = (v_clipped - ret) ** 2
        passes = (delta >= -clip) & (delta <= clip)
        g_v = _max_grad(xp, v_err, err_clipped, g_v, xp.where(passes, 2 * (v_clipped - ret), 0 * diff))
        v_err = xp.maximum(v_err, err_clipped)
    v_loss = 0.5 * v_err.mean()
    entropy_mean = ent.mean()
    loss = pg_loss + vf * v_loss - ec * entropy_mean
    approx_kl = ((ratio - 1) - log_ratio).mean()
    clip_fraction = xp.where(abs(ratio - 1) > clip, 1.0, 0.0).mean()
    grads = (g_pg / n, (0.5 * vf / n) * g_v, 0 * ent - ec / n)
    return (loss, pg_loss, v_loss, entropy_mean, approx_kl, clip_fraction), grads


def _max_grad(xp: ModuleType, a, b, grad_a, grad_b):
    """Gradient of max(a, b) given those of a and b: the larger one's, half of each on a tie (torch's rule)."""
    return xp.where(a > b, grad_a, xp.where(a < b, grad_b, 0.5 * (grad_a + grad_b)))


def ppo_loss_fused(
    new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, value: Tensor, old_value: Tensor,
    returns: Tensor, entropy: Tensor, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool,
) -> tuple[Tensor, ...]:
    """Closed-form gradients in the forward pass (torch, no graph recorded); backward is three multiplies."""
    tensors = (new_logprob, old_logprob, advantages, value, old_value, returns, entropy)

    def compute() -> tuple:
        outputs, (g_nl, g_v, g_ent) = loss_and_grads(torch, *(x.detach() for x in tensors), clip_coef, vf_coef,
                                                      ent_coef, clip_vloss)
        return (*outputs[:-1], outputs[-1].to(torch.float32)), (g_nl, None, None, g_v, None, None, g_ent)

    return fused_loss(compute, *tensors)


def ppo_loss_numpy(
    new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, value: Tensor, old_value: Tensor,
    returns: Tensor, entropy: Tensor, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool,
) -> tuple[Tensor, ...]:
    """The same closed form in numpy: a ufunc costs about a microsecond, a torch op several."""
    tensors = (new_logprob, old_logprob, advantages, value, old_value, returns, entropy)

    def compute() -> tuple:
        arrays = [x.detach().numpy() for x in float32_cpu("ppo_loss", *tensors)]
        outputs, (g_nl, g_v, g_ent) = loss_and_grads(np, *arrays, clip_coef, vf_coef, ent_coef, clip_vloss)
        outputs = tuple(torch.tensor(float(x), dtype=torch.float32) for x in outputs)
        return outputs, (torch.from_numpy(g_nl), None, None, torch.from_numpy(g_v), None, None, torch.from_numpy(g_ent))

    return fused_loss(compute, *tensors)


CPP_PPO_LOSS = cpp_source("ppo_loss.cpp")


@candidate(source=CPP_PPO_LOSS)
def ppo_loss_cpp(
    new_logprob: Tensor, old_logprob: Tensor, advantages: Tensor, value: Tensor, old_value: Tensor,
    returns: Tensor, entropy: Tensor, clip_coef: float, vf_coef: float, ent_coef: float, clip_vloss: bool,
) -> tuple[Tensor, ...]:
    """One C++ loop for loss, statistics and gradients (built on first use, cached on disk)."""
    kernel = load_function("ppo_loss", CPP_PPO_LOSS, "gymflow_ppo_loss",
                           (PTR,) * 7 + (I64,) + (F64,) * 3 + (I64,) + (PTR,) * 4)
    tensors = (new_logprob, old_logprob, advantages, value, old_value, returns, entropy)

    def compute() -> tuple:
        inputs = float32_cpu("ppo_loss", *tensors)
        B = inputs[0].shape[0]
        if any(x.shape != (B,) for x in inputs):
            raise ValueError(f"ppo_loss expects seven [B] tensors, found shapes {[tuple(x.shape) for x in inputs]}")
        stats, g_nl, g_v, g_ent = torch.empty(6), torch.empty(B), torch.empty(B), torch.empty(B)
        kernel(*(x.data_ptr() for x in inputs), B, clip_coef, vf_coef, ent_coef, int(clip_vloss),
               stats.data_ptr(), g_nl.data_ptr(), g_v.data_ptr(), g_ent.data_ptr())
        return tuple(x.clone() for x in stats.unbind()), (g_nl, None, None, g_v, None, None, g_ent)

    return fused_loss(compute, *tensors)


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random arguments for {"B"}; "spread" is the std of new - old log-prob (0: ratio exactly 1, large: most
    clipped), "advantages": "zero" makes every max() a tie; "clip_vloss", "clip_coef", "vf_coef", "ent_coef"."""
    B = shape["B"]
    gen = torch.Generator().manual_seed(seed)
    new_logprob = torch.randn(B, generator=gen) - 1
    old_logprob = new_logprob - shape.get("spread", 0.2) * torch.randn(B, generator=gen)
    advantages = torch.randn(B, generator=gen) * (0.0 if shape.get("advantages") == "zero" else 1.0)
    value, returns = torch.randn(B, generator=gen), torch.randn(B, generator=gen)
    old_value = value + 0.3 * torch.randn(B, generator=gen)
    entropy = torch.randn(B, generator=gen) + 1
    tensors = place(shape, new_logprob, old_logprob, advantages, value, old_value, returns, entropy)
    return (*tensors, shape.get("clip_coef", 0.2), shape.get("vf_coef", 0.5), shape.get("ent_coef", 0.0),
            shape.get("clip_vloss", False))


def bucket(inputs: tuple) -> dict:
    """Minibatch size rounded up to the next power of two."""
    if inputs[0].dim() != 1:
        raise ValueError(f"ppo_loss expects new_logprob of shape [B], found {tuple(inputs[0].shape)}")
    return {"B": next_pow2(inputs[0].shape[0])}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 1},
    {"B": 7, "spread": 0.0},  # ratio exactly 1: nothing clipped, every max() of the surrogate a tie
    {"B": 33, "spread": 3.0, "ent_coef": 0.01},  # nearly everything clipped, both sides
    {"B": 5, "advantages": "zero", "clip_vloss": True},
    {"B": 65, "clip_vloss": True, "clip_coef": 0.1, "vf_coef": 1.0},
    {"B": 1000, "spread": 0.5, "clip_vloss": True, "ent_coef": 0.001},
)

PPO_LOSS = register(
    Op(
        name="ppo_loss",
        reference=ppo_loss_reference,
        candidates={"fused": ppo_loss_fused, "numpy": ppo_loss_numpy, "cpp": ppo_loss_cpp,
                    "compile": compiled(ppo_loss_reference)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B",),
        edge_cases=EDGE_CASES,
        grad_argnums=(0, 3, 6),
        default_shapes=({"B": 256},),  # the quick preset: minibatch 512 split over 2 ranks
        calls_per_run=16_000,  # 16 minibatches x 10 epochs x 100 iterations
    )
)
