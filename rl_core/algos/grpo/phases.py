"""The phases of an agent run that are not the update: which problems an iteration plays, one rollout chunk
(a safe point of the rollout step), the held-out evaluation, and the up-front check that prompts fit the model.

Iteration i plays the train-split problems [i * P, (i + 1) * P) (P = prompts_per_iteration), G samples each; its
prompt groups are generated and written in chunks of `rollout_groups_per_write`, so a retried rollout regenerates
only the chunks that are missing. A chunk's episodes draw from counters (seed, ROLLOUT_STREAM, iteration, group,
sample, turn) and are always generated together, so regenerating a chunk gives the same bits.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rl_core.algos.grpo.episodes import (
    EVAL_STREAM,
    ROLLOUT_STREAM,
    EpisodeSpec,
    Generate,
    first_prompts,
    run_agent_episodes,
    sampling_params,
)
from rl_core.algos.grpo.sft import demonstration_segment
from rl_core.algos.grpo.trajectories import Episode, Tokenizer, TrajectoryBatch, episode_meta
from rl_core.data.tensorfile import Tensors
from rl_core.envs.agent import AgentEnv

if TYPE_CHECKING:
    from rl_core.config.agent import AgentRunConfig

MakeEnv = Callable[[], AgentEnv]


def iteration_problems(cfg: "AgentRunConfig", env: AgentEnv, iteration: int) -> list[int]:
    """Problem seed of each prompt group of `iteration`: the train split's next P problems."""
    count = cfg.algorithm.prompts_per_iteration
    return env.problem_seeds("train", count, start=iteration * count)


def behaviour_version(cfg: "AgentRunConfig", iteration: int) -> int:
    """The policy version that samples iteration `iteration`: the version it trains from, or with max_staleness >= 1
    the one before (its rollout runs while the previous iteration trains), so samples are at most one version
    stale. A rule, not a mode: a retried or resumed rollout asks for the same version."""
    return iteration if cfg.algorithm.max_staleness == 0 else max(iteration - 1, 0)


def chunk_groups(cfg: "AgentRunConfig", chunk: int) -> range:
    """Prompt groups written together as rollout chunk `chunk`."""
    per_chunk, total = cfg.rollout_groups_per_write, cfg.algorithm.prompts_per_iteration
    return range(chunk * per_chunk, min((chunk + 1) * per_chunk, total))


def num_chunks(cfg: "AgentRunConfig") -> int:
    return -(-cfg.algorithm.prompts_per_iteration // cfg.rollout_groups_per_write)


def rollout_chunk(cfg: "AgentRunConfig", make_env: MakeEnv, tokenizer: Tokenizer, generate: Generate,
                  context: int, iteration: int, version: int, chunk: int, step_threads: int = 1
                  ) -> tuple[dict[str, np.ndarray], dict]:
    """The token-exact trajectories of chunk `chunk`'s prompt groups, G episodes each, sampled from `version`:
    (arrays of a TrajectoryBatch, JSON meta: which groups, from which version, env infos)."""
    seeds = iteration_problems(cfg, make_env(), iteration)
    groups = chunk_groups(cfg, chunk)
    specs = [EpisodeSpec(g, s, seeds[g]) for g in groups for s in range(cfg.algorithm.group_size)]
    episodes = run_agent_episodes(specs, make_env, tokenizer, generate, sampling_params(cfg),
                                  (cfg.seed, ROLLOUT_STREAM, iteration), context, version, step_threads)
    batch = TrajectoryBatch.from_episodes(episodes, tokenizer.pad_id)
    meta = {"iteration": iteration, "version": version, "chunk": chunk, "groups": [groups.start, groups.stop],
            **episode_meta(episodes)}
    return batch.to_arrays(), meta


def check_iteration_fits(cfg: "AgentRunConfig", make_env: MakeEnv, tokenizer: Tokenizer, context: int,
                         iteration: int) -> None:
    """A ValueError when a prompt of `iteration` leaves no room for a completion: before anything is generated."""
    check_prompts_fit(cfg, make_env, tokenizer, context, iteration_problems(cfg, make_env(), iteration), "train")


def iteration_metrics(chunks: list[Tensors], pad_id: int) -> dict[str, float]:
    """`rollout_metrics` of an iteration's chunks (arrays of TrajectoryBatches, in order)."""
    return rollout_metrics(TrajectoryBatch.concatenate([TrajectoryBatch.from_arrays(c) for c in chunks], pad_id))


def rollout_metrics(episodes: list[Episode] | TrajectoryBatch) -> dict[str, float]:
    """Mean reward, accuracy (the env's `correct`) and tokens generated of a set of episodes."""
    if isinstance(episodes, TrajectoryBatch):
        rewards, correct, tokens = episodes.rewards, episodes.correct, episodes.generated_tokens
    else:
        rewards = np.array([e.reward for e in episodes])
        correct = np.array([bool(e.info.get("correct", False)) for e in episodes])
        tokens = sum(e.generated_tokens for e in episodes)
    return {"mean_reward": float(rewards.mean()) if len(rewards) else float("nan"),
            "accuracy": float(correct.mean()) if len(correct) else float("nan"),
            "episodes": float(len(rewards)), "tokens": float(tokens)}


def evaluate_heldout(cfg: "AgentRunConfig", make_env: MakeEnv, tokenizer: Tokenizer, generate: Generate,
                     context: int, version: int, step_threads: int = 1) -> dict[str, Any]:
    """One episode per held-out problem (`cfg.eval_problems`), sampled as rollouts sample, with the same counters
    for every version evaluated (so two versions are compared on the same draws)."""
    seeds = make_env().problem_seeds("heldout", cfg.eval_problems)
    specs = [EpisodeSpec(i, 0, seed) for i, seed in enumerate(seeds)]
    episodes = run_agent_episodes(specs, make_env, tokenizer, generate, sampling_params(cfg), (cfg.seed, EVAL_STREAM),
                                  context, version, step_threads)
    return {"version": version, **rollout_metrics(episodes)}


def check_prompts_fit(cfg: "AgentRunConfig", make_env: MakeEnv, tokenizer: Tokenizer, context: int,
                      seeds: list[int], split: str) -> None:
    """A ValueError naming the problem when a first prompt leaves no room for a completion in the context."""
    for seed, length in zip(seeds, first_prompts(make_env, tokenizer, seeds)):
        if length >= context:
            raise ValueError(f"{cfg.env.name} {split} problem {seed}: its prompt is {length} tokens (bos included), "
                             f"which leaves no room for a completion in the model's context of {context} positions; "
                             "use a model with a longer context (model.context, --context, for a built one)")


def check_demonstrations_fit(cfg: "AgentRunConfig", env: AgentEnv, tokenizer: Tokenizer, context: int,
                             seeds: list[int]) -> None:
    """A ValueError naming the problem when a demonstration the SFT warm start imitates overflows the context."""
    for seed in seeds:
        length = len(demonstration_segment(env, tokenizer, seed).tokens)
        if length > context:
            raise ValueError(f"{cfg.env.name} train problem {seed}: its demonstration is {length} tokens, over the "
                             f"model's context of {context} positions; use a model with a longer context "
                             "(model.context, --context, for a built one)")
