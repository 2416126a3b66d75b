"""The agent flow's rollout chunk and held-out evaluation when the agent is the user's program (`--agent`): the same
problems, counters, safe points and trajectory files as the built-in turn loop's (`rl_core.algos.grpo.phases`), with
each episode played by `program_rollout.run_programs`."""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rl_core.algos.grpo.episodes import EVAL_STREAM, ROLLOUT_STREAM, EpisodeSpec, Generate
from rl_core.algos.grpo.phases import chunk_groups, iteration_problems, rollout_metrics
from rl_core.algos.grpo.trajectories import TrajectoryBatch, episode_meta
from rl_core.config.agent import AgentRunConfig
from rl_core.data import RunLayout
from rl_core.envs.agent import AgentEnv
from rl_core.envs.agent.programs import AgentProgram
from rl_core.policies.lm_policy import tokenizer_of
from rl_core.runtime.agent.program_rollout import CallLog, ProgramEndpoint, run_programs


class ProgramActors(Protocol):
    """What these steps use of the run's actors (`rl_core.runtime.agent.actors.AgentActors`, which calls them)."""

    program: AgentProgram
    endpoint: ProgramEndpoint

    def make_env(self) -> AgentEnv: ...


def call_log(cfg: AgentRunConfig, iteration: int, chunk: int, version: int) -> CallLog:
    """Where chunk `chunk` of `iteration` records its calls: in the iteration's step outputs, which its commit
    removes (once the chunk's trajectories are written they are the safe point)."""
    return CallLog(f"{RunLayout(cfg.run_url).iteration(iteration)}/calls/chunk-{chunk:03d}", version,
                   iteration=iteration, chunk=chunk)


def program_chunk(cfg: AgentRunConfig, actors: ProgramActors, generate: Generate, iteration: int, version: int,
                  chunk: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Chunk `chunk`'s prompt groups, G program runs each, sampled from `version`: (TrajectoryBatch arrays, meta)."""
    seeds = iteration_problems(cfg, actors.make_env(), iteration)
    groups = chunk_groups(cfg, chunk)
    specs = [EpisodeSpec(g, s, seeds[g]) for g in groups for s in range(cfg.algorithm.group_size)]
    episodes, calls = run_programs(actors.program, specs, actors.make_env, actors.endpoint, generate,
                                   (cfg.seed, ROLLOUT_STREAM, iteration), version, "train", cfg.agent_timeout_s,
                                   call_log(cfg, iteration, chunk, version))
    batch = TrajectoryBatch.from_episodes(episodes, tokenizer_of(cfg).pad_id)
    meta = {"iteration": iteration, "version": version, "chunk": chunk, "groups": [groups.start, groups.stop],
            "calls": calls, **episode_meta(episodes)}
    return batch.to_arrays(), meta


def evaluate_programs(cfg: AgentRunConfig, actors: ProgramActors, generate: Generate, version: int) -> dict[str, Any]:
    """One program run per held-out problem, with the same counters for every version evaluated."""
    seeds = actors.make_env().problem_seeds("heldout", cfg.eval_problems)
    specs = [EpisodeSpec(i, 0, seed) for i, seed in enumerate(seeds)]
    episodes, calls = run_programs(actors.program, specs, actors.make_env, actors.endpoint, generate,
                                   (cfg.seed, EVAL_STREAM), version, "heldout", cfg.agent_timeout_s)
    return {"version": version, **rollout_metrics(episodes), "failed_programs": calls.get("failed_programs", 0)}
