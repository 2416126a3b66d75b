"""PPO's clipped-surrogate update (Schulman et al., 2017), data-parallel over the ranks of a process group.

Read top to bottom: the batch, the loss (`ppo_loss`: clipped surrogate, value loss, entropy bonus), the minibatch
gradient (through the fused `ppo_grad` kernel for two-hidden-layer policies), then the epochs (`ppo_update`).

Every rank holds the whole scored rollout; each global minibatch (the same on every rank, drawn from a
generator seeded by (seed, iteration, epoch)) is split across ranks by stride, each rank averages the
loss over its part, and gradients are averaged across ranks. With equal parts this is the gradient of
the global minibatch mean, so K ranks compute what one process would (up to float summation order).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

import gymflow_kernels as kernels
from rl_core.algos.base import Epochs, UpdateHooks
from rl_core.algos.ppo.batches import ScoredBatch
from rl_core.config.control import PPOConfig
from rl_core.optim.adam import AdamStep, FusedAdam
from rl_core.optim.gradients import clip_grad_norm_, flat_grad_views
from rl_core.optim.instability import NonFiniteGuard, poison_if_not_finite
from rl_core.policies.mlp import ActorCritic
from rl_core.seeding import torch_generator

_ppo_loss = kernels.dispatch("ppo_loss")  # the tuned winner for each minibatch size, or the reference
_ppo_grad = kernels.dispatch("ppo_grad")  # model forward + loss + backward in one call, for two-hidden-layer models

STAT_NAMES = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""What the stats vector of `minibatch_gradient` holds, in order."""


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

    def rows(self, order: torch.Tensor) -> "RolloutBatch":
        """The samples `order` indexes, in that order (one `index_select` per field: a few times faster than
        indexing with a tensor, which takes the general advanced-indexing path)."""
        def pick(x: torch.Tensor) -> torch.Tensor:
            return torch.index_select(x, 0, order)

        weights = self.advantage_weights
        return RolloutBatch(obs=pick(self.obs), actions=pick(self.actions), logprobs=pick(self.logprobs),
                            values=pick(self.values), advantages=pick(self.advantages), returns=pick(self.returns),
                            advantage_weights=None if weights is None else pick(weights))

    @classmethod
    def from_scored(cls, scored: ScoredBatch) -> "RolloutBatch":
        """The update's tensors from the score step's batch (shared memory, no copies)."""
        return cls(obs=torch.from_numpy(scored.obs), actions=torch.from_numpy(scored.actions),
                   logprobs=torch.from_numpy(scored.logprobs), values=torch.from_numpy(scored.values),
                   advantages=torch.from_numpy(scored.advantages), returns=torch.from_numpy(scored.returns))


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
    """PPO's loss on samples `idx` with (normalized) advantages `adv`: clipped surrogate + value loss - entropy bonus
    (Schulman et al., 2017, eq. 7 and 9), and the statistics every epoch reports.

    Where the tuner found a faster implementation of the same arithmetic for this minibatch size (`ppo_loss` in
    `kernels/`, whose reference is this function's arithmetic op for op and which the verifier holds equal to it),
    that runs instead: the fast path of this function, not another loss.
    """
    dist = model.distribution(batch.obs[idx])
    new_logprob = dist.log_prob(batch.actions[idx]).sum(-1)
    new_value = model.value(batch.obs[idx])
    entropy = dist.entropy().sum(-1)
    old_logprob, old_value, returns = batch.logprobs[idx], batch.values[idx], batch.returns[idx]
    if _ppo_loss.choose(new_logprob, old_logprob, adv, new_value, old_value, returns, entropy, cfg.clip_coef,
                        cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss) != kernels.REFERENCE:
        loss, *stats = _ppo_loss(  # binds the keywords to the candidates' positions (some take *args only)
            new_logprob=new_logprob, old_logprob=old_logprob, advantages=adv, value=new_value, old_value=old_value,
            returns=returns, entropy=entropy, clip_coef=cfg.clip_coef, vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef,
            clip_vloss=cfg.clip_vloss)
        return loss, dict(zip(STAT_NAMES[1:], stats))
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    # Clipped surrogate objective, as a loss: the pessimistic bound of the unclipped and clipped ratio terms.
    policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    # Value loss: squared error to the GAE returns, optionally clipped around the behaviour values like the ratio.
    value_error = (new_value - returns) ** 2
    if cfg.clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_error = torch.max(value_error, (clipped_value - returns) ** 2)
    value_loss = 0.5 * value_error.mean()
    # Entropy bonus: keeps the Gaussian from collapsing early.
    entropy_bonus = entropy.mean()
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_bonus
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance estimator of KL(old || new)
        clip_fraction = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
    stats = (policy_loss.detach(), value_loss.detach(), entropy_bonus.detach(), approx_kl, clip_fraction)
    return loss, dict(zip(STAT_NAMES[1:], stats))


def minibatch_gradient(
    model: ActorCritic, batch: RolloutBatch, idx: torch.Tensor | slice, adv: torch.Tensor, cfg: PPOConfig,
    resolved: dict[int, Callable[..., tuple[torch.Tensor, torch.Tensor]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(stats [loss, policy_loss, value_loss, entropy, approx_kl, clip_fraction], gradient of the loss w.r.t.
    `model.ordered_parameters`, flattened in that order) on samples `idx` with (normalized) advantages `adv`.

    A model with the `ppo_grad` op's shape (two hidden layers per MLP) goes through the tuned op, whose reference is
    the autograd path below op for op; any other model takes that path directly. `resolved`: the op's implementation
    by minibatch size, kept by the caller across an update's minibatches so it is looked up once per size.
    """
    if model.fused_gradient_shape:
        args = (batch.obs[idx], batch.actions[idx], batch.logprobs[idx], adv, batch.values[idx], batch.returns[idx],
                *model.ordered_parameters, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss)
        if resolved is None:
            return _ppo_grad(*args)
        op = resolved.get(len(adv))
        if op is None:
            op = resolved[len(adv)] = _ppo_grad.resolve(*args)
        return op(*args)
    loss, stats = ppo_loss(model, batch, idx, adv, cfg)
    grads = torch.autograd.grad(loss, model.ordered_parameters)
    return torch.stack([loss.detach(), *stats.values()]), torch.cat([g.reshape(-1) for g in grads])


def ppo_update(
    model: ActorCritic,
    optimizer: FusedAdam | torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: PPOConfig,
    generator_seed: int,
    learning_rate: float,
    hooks: UpdateHooks = UpdateHooks(),
    done: Epochs = (),
) -> Epochs:
    """Minibatch SGD on `batch` for the epochs after `done` (those a resumed update already ran) up to
    `cfg.update_epochs`; returns every epoch's metrics, `done`'s first.

    Each epoch draws its own permutation from (generator_seed, epoch), so an update resumed at an epoch
    boundary (after `hooks.on_epoch_end` saved the state) continues exactly as if it had never stopped.
    """
    history = list(done)
    if (history and history[-1]["early_stop"]) or len(history) >= cfg.update_epochs:
        return history
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    grad = flat_grad_views(model.ordered_parameters)
    step = optimizer.step if isinstance(optimizer, FusedAdam) else AdamStep(optimizer)
    guard = NonFiniteGuard("PPO", cfg.nonfinite_limit, hooks.rank)
    resolved: dict[int, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}  # see minibatch_gradient
    size, rank, world = len(batch), hooks.rank, hooks.world_size
    starts = range(0, size, cfg.minibatch_size)
    for epoch in range(len(done), cfg.update_epochs):
        perm = torch.randperm(size, generator=torch_generator(generator_seed, epoch))
        # Gathered once per epoch, so each minibatch below reads contiguous slices: the batch in `perm`'s order (the
        # global minibatches one after another) and, with several ranks, this rank's share of each in turn.
        shuffled = batch.rows(perm)
        shares = [perm[start : start + cfg.minibatch_size][rank::world] for start in starts]
        mine = batch.rows(torch.cat(shares)) if world > 1 else shuffled
        totals: torch.Tensor | None = None
        steps, skipped_before, offset = 0, guard.skipped, 0
        for start, share in zip(starts, shares):
            part = slice(start, start + cfg.minibatch_size)
            adv = shuffled.advantages[part]
            if cfg.norm_adv:  # statistics of the global minibatch, identical on every rank
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            if shuffled.advantage_weights is not None:
                adv = adv * shuffled.advantage_weights[part]
            local = slice(offset, offset + len(share))
            offset = local.stop
            stats, minibatch_grad = minibatch_gradient(model, mine, local, adv[rank::world], cfg, resolved)
            grad.copy_(minibatch_grad)
            poison_if_not_finite(stats[0], grad)
            hooks.all_reduce_mean(grad)
            norm = torch.linalg.vector_norm(grad)
            if not guard.admit(grad, f"epoch {epoch}, minibatch {start // cfg.minibatch_size}", norm):
                continue
            clip_grad_norm_(grad, cfg.max_grad_norm, norm)
            step()
            totals = stats if totals is None else totals + stats
            steps += 1
        if totals is None:  # every minibatch of the epoch was skipped (fewer than the guard's limit)
            totals = torch.full((len(STAT_NAMES),), float("nan"), dtype=stats.dtype)
        means = totals[1:] / max(steps, 1)  # the loss itself is not reported, as before
        hooks.all_reduce_mean(means)  # every rank sees (and decides on) the same numbers
        metrics = {k: float(v) for k, v in sorted(zip(STAT_NAMES[1:], means))}
        stop = cfg.target_kl is not None and metrics["approx_kl"] > cfg.target_kl
        metrics.update(epoch=float(epoch), minibatch_steps=float(steps), early_stop=float(stop),
                       skipped_updates=float(guard.skipped - skipped_before))
        history.append(metrics)
        if hooks.on_epoch_end is not None:
            hooks.on_epoch_end(history, stop or epoch + 1 == cfg.update_epochs)
        if stop:
            break
    return history


def summarize_epochs(history: Epochs) -> dict[str, float]:
    """Mean of each metric over the epochs, plus how many epochs ran and how many minibatch steps were taken and
    skipped (non-finite: see instability.py)."""
    counts = ("epoch", "minibatch_steps", "early_stop", "skipped_updates")
    keys = [k for k in history[0] if k not in counts]
    summary = {k: sum(h[k] for h in history) / len(history) for k in keys}
    summary.update(epochs=float(len(history)), minibatch_steps=sum(h["minibatch_steps"] for h in history),
                   skipped_updates=sum(h.get("skipped_updates", 0.0) for h in history))
    return summary
