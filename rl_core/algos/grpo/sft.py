"""The supervised warm start of an agent run: next-token loss on the env's scripted demonstrations.

A demonstration is an episode played with scripted actions (`sft_demonstration` where the env defines one, else
`demonstration`), laid out exactly as a rollout lays out an episode (`trajectories.Segment`): the loss covers the
agent's action tokens only, never the prompt or the env's observations. Step s trains on the train-split problems
[s * batch_size, (s + 1) * batch_size), so the warm start is a pure function of the config.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from rl_core.algos.grpo.trajectories import Message, Segment, Tokenizer, extend_or_restart
from rl_core.envs.agent import AgentEnv
from rl_core.optim.gradients import clip_grad_norm_, flat_grad_views
from rl_core.policies.llama import LlamaLM

FINAL_LR_FRACTION = 0.1
"""The cosine schedule ends at this fraction of the peak learning rate."""
MAX_GRAD_NORM = 1.0


def demonstration_segment(env: AgentEnv, tokenizer: Tokenizer, seed: int, actions: list[str] | None = None) -> Segment:
    """Problem `seed` played with `actions` (default: what SFT imitates, the env's `sft_demonstration` where it has
    one, else its `demonstration`), as the token sequence a rollout would hold (one segment: a demonstration whose
    turns the tokenizer would not render as one sequence is refused, to keep it exact)."""
    messages: list[Message] = [("user", env.reset(seed))]
    segments = [Segment.start(tokenizer.conversation_ids(messages))]
    actions = actions or getattr(env, "sft_demonstration", env.demonstration)(seed)
    for turn, action in enumerate(actions, start=1):
        ids = tokenizer.action_ids(action)
        segments[-1].append(ids, 2 * turn - 1, [0.0] * len(ids))
        messages.append(("assistant", action))
        if turn == len(actions):
            break  # the last action's outcome is not needed (for a simulated env it would cost a simulation)
        observation, _, done, _ = env.step(action)
        if done:
            raise ValueError(f"{env.name}: the demonstration of problem {seed} ended after {turn} of its "
                             f"{len(actions)} actions")
        messages.append(("user", observation))
        extend_or_restart(segments, tokenizer, messages, 2 * turn)
        if len(segments) > 1:
            raise ValueError(f"{env.name}: the demonstration of problem {seed} does not tokenize as one sequence")
    return segments[0]


def demonstration_batch(env: AgentEnv, tokenizer: Tokenizer, seeds: list[int], pad_id: int, context: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, L), loss mask (B, L)) of the demonstrations of `seeds`, right-padded."""
    segments = [demonstration_segment(env, tokenizer, seed) for seed in seeds]
    width = max(len(s.tokens) for s in segments)
    if width > context:
        raise ValueError(f"{env.name}: a demonstration of {width} tokens does not fit the model's context of "
                         f"{context}; use a model with a longer context")
    tokens = torch.full((len(seeds), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seeds), width)
    for row, segment in enumerate(segments):
        tokens[row, :len(segment.tokens)] = torch.tensor(segment.tokens)
        mask[row, :len(segment.tokens)] = torch.tensor(segment.loss_mask)
    return tokens, mask


def learning_rate(peak: float, step: int, steps: int) -> float:
    """Cosine decay from `peak` to FINAL_LR_FRACTION of it over `steps`."""
    progress = step / max(steps - 1, 1)
    return peak * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def supervised_warm_start(model: LlamaLM, tokenizer: Tokenizer, env: AgentEnv, steps: int, batch_size: int,
                          peak_lr: float, problem_seeds: Callable[[int, int], list[int]]) -> dict[str, float]:
    """Train `model` in place for `steps` Adam steps on demonstrations; `problem_seeds(count, start)` gives the
    train split's seeds. Returns the first and last loss and the seconds taken."""
    started = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=peak_lr)
    grad = flat_grad_views(tuple(params))
    pad_id = tokenizer.pad_id
    losses: list[float] = []
    model.train()
    for step in range(steps):
        tokens, mask = demonstration_batch(env, tokenizer, problem_seeds(batch_size, step * batch_size), pad_id,
                                           model.spec.max_position_embeddings)
        hidden, _, _ = model.model(tokens[:, :-1], None)
        targets = mask[:, 1:] > 0  # the LM head, the widest product, only where a demonstrated token is predicted
        logits = model.lm_head(hidden[targets])
        loss = F.cross_entropy(logits, tokens[:, 1:][targets])
        if not torch.isfinite(loss):
            raise FloatingPointError(f"SFT loss is {loss.item()} at step {step}; lower sft.learning_rate")
        grad.copy_(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
        clip_grad_norm_(grad, MAX_GRAD_NORM)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(peak_lr, step, steps)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return {"sft_steps": float(steps), "sft_first_loss": losses[0] if losses else math.nan,
            "sft_last_loss": float(np.mean(losses[-10:])) if losses else math.nan,
            "sft_seconds": time.perf_counter() - started}
