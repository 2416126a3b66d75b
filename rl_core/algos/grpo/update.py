"""GRPO (Shao et al., 2024), top to bottom: group-relative advantages, token log-probs, loss weights, the update.

G completions of one prompt form a group; a completion's advantage is its reward relative to its group's
(divided by the group's std unless `scale_std` is off: Dr. GRPO). The loss is PPO's clipped surrogate per sampled
token, plus an optional k3 KL to a frozen reference, weighted per token: sequence-level (each completion weighs the
same: GRPO) or token-level (each token weighs the same: DAPO). The hot ops go through `kernels.dispatch`.

The trainer recomputes each sampled token's log-prob under the distribution the generator sampled from
(temperature, then top-k and top-p renormalized): the ratio's denominator is that distribution's behaviour
log-prob, so any other recomputation would put a silent offset in every ratio.

Distributed: every rank reads the whole scored batch; a minibatch is a set of prompt groups, of which rank k takes
every K-th. Loss weights are computed from the global minibatch (its rows and tokens), times K, so the ranks'
averaged gradient is the one-process gradient.

Asynchronous (max_staleness S >= 1): a sample may come from an older policy than the one the update starts from
(the proximal policy). As in decoupled PPO (Hilton et al., 2022) with truncated importance sampling (TIS), the ratio
is clipped against the proximal policy's log-probs, recomputed before the first step, and each token's loss is
weighted by min(pi_prox / pi_behaviour, tis_cap); a sample staler than S is dropped (counted in the metrics).
With S = 0 every sample is fresh: the ratio's denominator is the behaviour log-prob and every weight is exactly 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import gymflow_kernels as kernels
from rl_core.algos.base import Epochs, Tensors, UpdateHooks
from rl_core.generation import SamplingParams, sampling_logprobs
from rl_core.optim.gradients import clip_grad_norm_, flat_grad_views
from rl_core.optim.instability import NonFiniteGuard, poison_if_not_finite
from rl_core.policies.llama import LlamaLM
from rl_core.seeding import torch_generator

STD_EPS = 1e-4
"""Added to a group's reward std: a group whose rewards are all equal gets advantage 0, not NaN."""

_grpo_loss = kernels.dispatch("grpo_loss")


def group_advantages(rewards: np.ndarray, groups: np.ndarray, scale_std: bool) -> np.ndarray:
    """(E,) advantage of each episode: reward minus its group's mean, divided by the group's std (unbiased, as in
    the paper's implementation) + STD_EPS when `scale_std`."""
    advantages = np.zeros(len(rewards), np.float32)
    for group in np.unique(groups):
        members = groups == group
        r = rewards[members].astype(np.float64)
        centred = r - r.mean()
        if scale_std:
            centred = centred / ((r.std(ddof=1) if len(r) > 1 else 0.0) + STD_EPS)
        advantages[members] = centred
    return advantages


def token_logprobs(model: LlamaLM, tokens: torch.Tensor, params: SamplingParams,
                   where: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L - 1) log-prob of tokens[:, t + 1] given tokens[:, :t + 1] under the sampled distribution of `params`;
    with `where` (B, L - 1), only at the positions it marks (the sampled tokens), 0 elsewhere: the LM head, the
    widest product, then skips the prompt's and the env's positions.

    The logits come from the model's own LM head and go through `sampling_logprobs`, exactly as the generator's do,
    in every sampling mode, and a row's result does not depend on the rows beside it: the behaviour log-probs are
    recomputed to the bit. (A fused log-softmax that divides the hidden state by the temperature first, the
    `token_logprobs` kernel, rounds differently.)"""
    hidden, _, _ = model.model(tokens[:, :-1], None)
    targets = tokens[:, 1:]
    if where is None:
        logprobs = sampling_logprobs(model.lm_head(hidden), params)
        return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    chosen = where > 0
    logprobs = sampling_logprobs(model.lm_head(hidden[chosen]), params)
    picked = logprobs.gather(-1, targets[chosen].unsqueeze(-1)).squeeze(-1)
    return torch.zeros(targets.shape, dtype=picked.dtype).masked_scatter(chosen, picked)


@dataclass(frozen=True)
class ScoredTokens:
    """What an update reads: token rows with their mask and behaviour log-probs, each row's advantage and group."""

    tokens: torch.Tensor  # (R, L) int64
    loss_mask: torch.Tensor  # (R, L) float32
    behaviour_logprobs: torch.Tensor  # (R, L) float32
    advantages: torch.Tensor  # (R,) float32: the row's episode's advantage
    groups: torch.Tensor  # (R,) int64: the row's prompt group
    lengths: torch.Tensor  # (R,) int64
    versions: torch.Tensor  # (R,) int64: the policy version that generated the row

    @classmethod
    def from_arrays(cls, arrays: Tensors) -> ScoredTokens:
        names = ("tokens", "loss_mask", "behaviour_logprobs", "advantages", "groups", "lengths", "versions")
        missing = [n for n in names if n not in arrays]
        if missing:
            raise ValueError(f"not a GRPO scored batch: fields {missing} are missing; rerun the score step")
        return cls(*(torch.from_numpy(np.array(arrays[n])) for n in names))

    def rows_of(self, groups: torch.Tensor) -> torch.Tensor:
        """Row indices (ascending) of the given prompt groups."""
        return torch.nonzero(torch.isin(self.groups, groups)).squeeze(1)

    def trimmed(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, target mask, target behaviour log-probs) of `rows`, cut to their longest row: positions
        1 .. L - 1 are the predicted ones."""
        width = int(self.lengths[rows].max())
        return (self.tokens[rows, :width], self.loss_mask[rows, 1:width], self.behaviour_logprobs[rows, 1:width])


def loss_weights(mask: torch.Tensor, global_rows: int, global_tokens: float, token_level: bool,
                 world_size: int) -> torch.Tensor:
    """Per-token loss weights of a rank's rows: mask / global tokens (token-level), or mask / own tokens / global
    rows (sequence-level), times `world_size` so that the ranks' mean gradient is the global one."""
    if token_level:
        return mask * (world_size / max(global_tokens, 1.0))
    return mask / mask.sum(1, keepdim=True).clamp(min=1) * (world_size / global_rows)


def logprob_parity(model: LlamaLM, batch: ScoredTokens, rows: torch.Tensor, params: SamplingParams,
                   hooks: UpdateHooks) -> dict[str, float]:
    """Max and mean |trainer log-prob - behaviour log-prob| over the sampled tokens of all ranks' rows: how exactly
    the trainer reproduces the distribution the generator sampled from. Rows from another policy version compare
    nothing (empty: no key)."""
    if not len(rows):
        return _parity(torch.zeros(0), torch.zeros(0), torch.zeros(0), hooks)
    with torch.no_grad():
        tokens, mask, behaviour = batch.trimmed(rows)
        return _parity(token_logprobs(model, tokens, params, mask), behaviour, mask, hooks)


def _parity(logprobs: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, hooks: UpdateHooks
            ) -> dict[str, float]:
    # where(): a position outside the sampled set (prompt, padding) may be -inf under top-k / top-p
    gap = torch.where(mask > 0, (logprobs - behaviour).abs(), 0.0)
    sums = torch.stack([gap.sum(), mask.sum()]).double()
    worst = gap.max().reshape(1) if gap.numel() else torch.zeros(1)
    hooks.all_reduce_mean(sums)
    hooks.all_reduce_max(worst)
    if sums[1] == 0:
        return {}
    return {"logprob_parity_max": float(worst[0]), "logprob_parity_mean": float(sums[0] / sums[1])}


@dataclass(frozen=True)
class UpdateStart:
    """What an update fixes before its first step, from the weights it starts from (the proximal policy)."""

    old_logprobs: torch.Tensor  # (R, L - 1): the ratio's denominator per predicted token
    importance: torch.Tensor  # (R, L - 1): min(pi_prox / pi_behaviour, cap) for stale rows, 1 for fresh ones
    kept: torch.Tensor  # (R,) float32: 0 for rows staler than max_staleness
    version: int  # the version the update starts from: rows it sampled are fresh
    metrics: dict[str, float]

    @classmethod
    def prepare(cls, model: LlamaLM, batch: ScoredTokens, params: SamplingParams, train_version: int,
                max_staleness: int, tis_cap: float, hooks: UpdateHooks) -> UpdateStart:
        """Proximal log-probs and truncated importance weights for the stale rows (every rank computes them for the
        whole batch: any rank may take any group). Fresh rows need no pass here: their proximal log-probs are the
        behaviour log-probs, which the trainer recomputes exactly (parity is measured on the update's first
        forward, `grpo_update`)."""
        staleness = train_version - batch.versions
        if (staleness < 0).any():
            raise ValueError(f"samples of policy version {int(batch.versions.max())} in the update of version "
                             f"{train_version}: a sample cannot come from a newer policy than the trainer's")
        old = batch.behaviour_logprobs[:, 1:].clone()
        importance = torch.ones_like(old)
        stale = torch.nonzero((staleness > 0) & (staleness <= max_staleness)).flatten()
        if len(stale):
            tokens, mask, behaviour = batch.trimmed(stale)
            with torch.no_grad():
                proximal = token_logprobs(model, tokens, params, mask)
            width = tokens.shape[1] - 1
            old[stale, :width] = proximal
            ratio = torch.where(mask > 0, (proximal - behaviour).exp().clamp(max=tis_cap), 1.0)
            importance[stale, :width] = ratio
        kept = (staleness <= max_staleness).float()
        stale_mask = batch.loss_mask[stale, 1:]
        metrics = {"staleness_mean": float(staleness.double().mean()),
                   "dropped_rows": float((kept == 0).sum()),
                   "importance_weight_mean": float((importance[stale] * stale_mask).sum() / stale_mask.sum())
                   if len(stale) and stale_mask.sum() > 0 else 1.0}
        return cls(old, importance, kept, train_version, metrics)


def grpo_update(
    model: LlamaLM,
    optimizer: torch.optim.Optimizer,
    batch: ScoredTokens,
    *,
    params: SamplingParams,
    minibatches: int,
    update_epochs: int,
    clip_eps: float,
    beta: float,
    token_level: bool,
    max_grad_norm: float,
    nonfinite_limit: int,
    generator_seed: int,
    start: UpdateStart,
    reference: LlamaLM | None = None,
    hooks: UpdateHooks = UpdateHooks(),
    done: Epochs = (),
) -> Epochs:
    """Minibatch steps over the prompt groups of `batch` for the epochs after `done`; every epoch's metrics.

    `start` (`UpdateStart.prepare`, before the first step) fixes each token's ratio denominator and importance
    weight. Epoch e visits the groups in the order drawn from (generator_seed, e), so an update resumed at an epoch
    boundary continues exactly as if it had never stopped."""
    history = list(done)
    if len(history) >= update_epochs:
        return history
    params_list = tuple(p for p in model.parameters() if p.requires_grad)  # LoRA: the adapters alone
    grad = flat_grad_views(params_list)
    parity: dict[str, float] = {}  # measured on epoch 0's first minibatch, before any step
    guard = NonFiniteGuard("GRPO", nonfinite_limit, hooks.rank)
    groups = torch.unique(batch.groups)
    per_minibatch = len(groups) // minibatches
    for epoch in range(len(history), update_epochs):
        order = groups[torch.randperm(len(groups), generator=torch_generator(generator_seed, epoch))]
        totals = torch.zeros(4, dtype=torch.float64)
        steps, skipped_before = 0, guard.skipped
        for m in range(minibatches):
            chosen = order[m * per_minibatch:(m + 1) * per_minibatch]
            global_rows = batch.rows_of(chosen)
            kept = start.kept[global_rows]
            global_tokens = float((batch.loss_mask[global_rows] * kept[:, None]).sum())
            rows = batch.rows_of(chosen[hooks.rank::hooks.world_size])
            tokens, mask, _ = batch.trimmed(rows)
            width = tokens.shape[1] - 1
            mask = mask * start.kept[rows, None]  # a dropped (too stale) row weighs nothing
            weights = loss_weights(mask, max(int(kept.sum()), 1), global_tokens, token_level, hooks.world_size)
            weights = weights * start.importance[rows, :width]
            old = start.old_logprobs[rows, :width]
            logprobs = token_logprobs(model, tokens, params, mask)
            if epoch == 0 and m == 0:  # before any step: the weights that sampled the fresh rows
                fresh = (batch.versions[rows] == start.version).float()[:, None]
                parity = _parity(logprobs.detach(), start.old_logprobs[rows, :width], mask * fresh, hooks)
            ref_logprobs = None
            if beta != 0 and reference is not None:
                with torch.no_grad():
                    ref_logprobs = token_logprobs(reference, tokens, params, mask)
            loss, kl, clip_fraction = _grpo_loss(logprobs, old, ref_logprobs, batch.advantages[rows], weights,
                                                 clip_eps, beta)
            grad.copy_(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params_list)]))
            poison_if_not_finite(loss, grad)
            hooks.all_reduce_mean(grad)
            if not guard.admit(grad, f"epoch {epoch}, minibatch {m}"):
                continue
            norm = clip_grad_norm_(grad, max_grad_norm)
            optimizer.step()
            totals += torch.stack([loss.detach(), kl, clip_fraction, norm]).double()
            steps += 1
        means = (totals / steps).float() if steps else torch.full((4,), float("nan"))
        hooks.all_reduce_mean(means)  # every rank reports (and resumes from) the same numbers
        metrics = dict(zip(("loss", "kl", "clip_fraction", "grad_norm"), map(float, means)))
        metrics.update(epoch=float(epoch), minibatch_steps=float(steps),
                       skipped_updates=float(guard.skipped - skipped_before))
        if epoch == 0:
            metrics.update(start.metrics, **parity)
        history.append(metrics)
        if hooks.on_epoch_end is not None:
            hooks.on_epoch_end(history, epoch + 1 == update_epochs)
    return history
