"""PPO's clipped-surrogate update, data-parallel over the ranks of a process group.

Every rank holds the whole scored rollout; each global minibatch (the same on every rank, drawn from a
generator seeded by (seed, iteration, epoch)) is split across ranks by stride, each rank averages the
loss over its part, and gradients are averaged across ranks. With equal parts this is the gradient of
the global minibatch mean, so K ranks compute what one process would (up to float summation order).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from torch import nn

import kernels
from rl_core.config import PPOConfig
from rl_core.policies.mlp import ActorCritic
from rl_core.seeding import torch_generator

_ppo_loss = kernels.dispatch("ppo_loss")  # the tuned winner for each minibatch size, or the reference
_ppo_grad = kernels.dispatch("ppo_grad")  # model forward + loss + backward in one call, for two-hidden-layer models

# Averages a flat gradient (or metric) vector across ranks in place; identity for a single process.
AllReduceMean = Callable[[torch.Tensor], None]


def single_process(_: torch.Tensor) -> None:
    """AllReduceMean for one process: nothing to average."""


@dataclass(frozen=True)
class RolloutBatch:
    """A scored rollout flattened to B = steps * envs samples (float32 tensors)."""

    obs: torch.Tensor  # (B, obs_dim) normalized observations the behaviour policy saw
    actions: torch.Tensor  # (B, act_dim) sampled (unclipped) actions
    logprobs: torch.Tensor  # (B,) behaviour log-probs
    values: torch.Tensor  # (B,) behaviour value estimates
    advantages: torch.Tensor  # (B,)
    returns: torch.Tensor  # (B,) GAE returns, the value targets
    advantage_weights: torch.Tensor | None = None  # (B,) set by `decoupled`: per-sample importance weights

    def __len__(self) -> int:
        return self.obs.shape[0]

    @classmethod
    def from_scored(cls, scored: dict[str, np.ndarray]) -> "RolloutBatch":
        """The update's tensors from the score step's arrays (shared memory, no copies)."""
        return cls(*(torch.from_numpy(scored[k]) for k in
                     ("obs", "actions", "logprobs", "values", "advantages", "returns")))


def decoupled(model: ActorCritic, batch: RolloutBatch) -> RolloutBatch:
    """`batch` re-anchored on the policy the update starts from, for a batch an older policy collected (overlap).

    Decoupled PPO (Hilton et al., 2022, "Batch size-invariance for policy optimization"): the clipped ratio is
    taken against the proximal policy (the current weights, before this update), not the behaviour policy, so the
    trust region sits where the update starts; each sample's advantage is weighted by proximal / behaviour
    probability to stay an estimate under the proximal policy. The weight is truncated at 1 (as V-trace's rho-bar),
    so a sample the behaviour policy rarely chose cannot dominate a minibatch. Call it before the first epoch:
    its output depends only on the weights the update starts from, so a resumed update recomputes it exactly.
    """
    with torch.no_grad():
        proximal = model.distribution(batch.obs).log_prob(batch.actions).sum(-1)
    weights = torch.exp(proximal - batch.logprobs).clamp_(max=1.0)
    return replace(batch, logprobs=proximal, advantage_weights=weights)


def ppo_loss(
    model: ActorCritic, batch: RolloutBatch, idx: torch.Tensor, adv: torch.Tensor, cfg: PPOConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate + value loss - entropy bonus on samples `idx` with (normalized) advantages `adv`.

    The model's outputs are computed here; the loss arithmetic (and its backward) is the tuned `ppo_loss` kernel,
    whose reference is this function's former body op for op, so untuned runs are bit-identical to it.
    """
    dist = model.distribution(batch.obs[idx])
    logprob = dist.log_prob(batch.actions[idx]).sum(-1)
    value = model.value(batch.obs[idx])
    entropy = dist.entropy().sum(-1)
    loss, pg_loss, v_loss, entropy_mean, approx_kl, clip_fraction = _ppo_loss(
        logprob, batch.logprobs[idx], adv, value, batch.values[idx], batch.returns[idx], entropy,
        cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss,
    )
    stats = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_mean, "approx_kl": approx_kl,
             "clip_fraction": clip_fraction}
    return loss, stats


STAT_NAMES = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""What the stats vector of `minibatch_gradient` holds, in order."""


def minibatch_gradient(
    model: ActorCritic, batch: RolloutBatch, idx: torch.Tensor, adv: torch.Tensor, cfg: PPOConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(stats [loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction], gradient of the loss w.r.t.
    `model.ordered_parameters`, flattened in that order) on samples `idx` with (normalized) advantages `adv`.

    A model with the `ppo_grad` op's shape (two hidden layers per MLP) goes through the tuned op, whose reference is
    the autograd path below op for op; any other model takes that path directly.
    """
    if model.fused_gradient_shape:
        return _ppo_grad(batch.obs[idx], batch.actions[idx], batch.logprobs[idx], adv, batch.values[idx],
                         batch.returns[idx], *model.ordered_parameters, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef,
                         cfg.clip_vloss)
    loss, stats = ppo_loss(model, batch, idx, adv, cfg)
    grads = torch.autograd.grad(loss, model.ordered_parameters)
    return torch.stack([loss.detach(), *stats.values()]), torch.cat([g.reshape(-1) for g in grads])


def _flat_grad_views(params: tuple[nn.Parameter, ...]) -> torch.Tensor:
    """One flat buffer whose slices become each parameter's `.grad`: a minibatch's flat gradient (what the ranks
    all-reduce) lands in every `.grad` with one copy, and the norm clip is one reduction over it."""
    flat = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def _clip_grad_norm(flat: torch.Tensor, max_norm: float) -> None:
    """`nn.utils.clip_grad_norm_` on the flat gradient: scale it to norm `max_norm` when it is longer."""
    flat.mul_(torch.clamp(max_norm / (torch.linalg.vector_norm(flat) + 1e-6), max=1.0))


def ppo_update(
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: PPOConfig,
    generator_seed: int,
    learning_rate: float,
    rank: int = 0,
    world_size: int = 1,
    all_reduce_mean: AllReduceMean = single_process,
    start_epoch: int = 0,
    on_epoch_end: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Epochs `start_epoch`..`cfg.update_epochs - 1` of minibatch SGD on `batch`; one metrics dict per epoch run.

    Each epoch draws its own permutation from (generator_seed, epoch), so an update resumed at an epoch
    boundary (after `on_epoch_end` saved the state) continues exactly as if it had never stopped.
    """
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    grad = _flat_grad_views(model.ordered_parameters)
    size = len(batch)
    history: list[dict[str, float]] = []
    for epoch in range(start_epoch, cfg.update_epochs):
        perm = torch.randperm(size, generator=torch_generator(generator_seed, epoch))
        totals: torch.Tensor | None = None
        steps = 0
        for start in range(0, size, cfg.minibatch_size):
            mb = perm[start : start + cfg.minibatch_size]
            adv = batch.advantages[mb]
            if cfg.norm_adv:  # statistics of the global minibatch, identical on every rank
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            if batch.advantage_weights is not None:
                adv = adv * batch.advantage_weights[mb]
            local = slice(rank, None, world_size)
            stats, minibatch_grad = minibatch_gradient(model, batch, mb[local], adv[local], cfg)
            if not torch.isfinite(stats[0]):
                raise FloatingPointError(
                    f"PPO loss is {stats[0].item()} at epoch {epoch}, minibatch {start // cfg.minibatch_size} "
                    f"(rank {rank}); the weights were not updated with it and the last committed version is "
                    "intact. Lower ppo.learning_rate or check the rewards/observations for NaN or inf.")
            grad.copy_(minibatch_grad)
            all_reduce_mean(grad)
            _clip_grad_norm(grad, cfg.max_grad_norm)
            optimizer.step()
            totals = stats if totals is None else totals + stats
            steps += 1
        means = totals[1:] / steps  # the loss itself is not reported, as before
        all_reduce_mean(means)  # every rank sees (and decides on) the same numbers
        metrics = {k: float(v) for k, v in sorted(zip(STAT_NAMES[1:], means))}
        stop = cfg.target_kl is not None and metrics["approx_kl"] > cfg.target_kl
        metrics.update(epoch=float(epoch), minibatch_steps=float(steps), early_stop=float(stop))
        history.append(metrics)
        if on_epoch_end is not None:
            on_epoch_end(metrics)
        if stop:
            break
    return history


def summarize_epochs(history: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the epochs, plus how many epochs and minibatch steps ran."""
    keys = [k for k in history[0] if k not in ("epoch", "minibatch_steps", "early_stop")]
    summary = {k: sum(h[k] for h in history) / len(history) for k in keys}
    summary.update(epochs=float(len(history)), minibatch_steps=sum(h["minibatch_steps"] for h in history))
    return summary
