"""Deterministic evaluation: full episodes of the policy's mean action, next to a uniform-random policy.

Evaluation envs are seeded apart from training envs (``EVAL_SEED_OFFSET``), so evaluating never shares
reset noise with training and gives the same numbers for the same weights wherever it runs.
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from rl_core.algos.base import Tensors, build_policy, policy_sha256
from rl_core.checkpoint import CheckpointStore
from rl_core.config.control import ControlRunConfig
from rl_core.data import RunLayout
from rl_core.envs import BatchedMujocoEnv, GymnasiumBatch, make_batch
from rl_core.seeding import derive_seed

EVAL_SEED_OFFSET = 1_000_003  # evaluation envs never share reset noise with training envs

Actions = Callable[[np.ndarray], np.ndarray]
"""Raw observations (N, obs_dim) -> actions (N, action_dim)."""


class ControlPolicy(Protocol):
    """A policy of a control algorithm, as evaluation uses it."""

    def deterministic_action(self, obs: np.ndarray) -> np.ndarray: ...

    def load_state(self, state: Tensors) -> None: ...


def evaluate_control_policy(cfg: ControlRunConfig, policy: ControlPolicy, episodes: int) -> dict[str, float]:
    """Mean and std of the deterministic policy's episode returns, and a uniform-random policy's mean."""
    eval_seed = derive_seed(cfg.seed, EVAL_SEED_OFFSET)
    randomization = cfg.env.randomization
    learned = run_control_episodes(make_batch(cfg.env.name, episodes, eval_seed, randomization=randomization),
                           policy.deterministic_action)
    env = make_batch(cfg.env.name, episodes, eval_seed, randomization=randomization)
    rng = np.random.default_rng(eval_seed)
    random = run_control_episodes(
        env, lambda obs: rng.uniform(env.action_low, env.action_high, (episodes, env.action_dim)))
    return {"final_return": float(np.mean(learned)), "final_return_std": float(np.std(learned)),
            "random_return": float(np.mean(random)), "episodes": episodes}


def evaluate_control_version(cfg: ControlRunConfig, version: int | None, episodes: int) -> dict:
    """Evaluate checkpoint ``version`` of the run (None: the newest loadable one) in this process."""
    snapshot = CheckpointStore(RunLayout(cfg.run_url).checkpoints).load(version)
    policy = build_policy(cfg)
    policy.load_state(snapshot.tensors)
    result = evaluate_control_policy(cfg, policy, episodes)
    result.update(version=snapshot.version, env_steps=snapshot.meta.get("env_steps"),
                  policy_sha256=policy_sha256(snapshot.tensors))
    return result


def run_control_episodes(env: BatchedMujocoEnv | GymnasiumBatch, policy: Actions) -> np.ndarray:
    """Step until every env finished its first episode; returns the per-env episode returns."""
    returns = np.full(env.num_envs, np.nan)
    while np.isnan(returns).any():
        done_before = ~np.isnan(returns)
        result = env.step(policy(env.observe()))
        ended = (result.terminated | result.truncated) & ~done_before
        returns[ended] = _episode_returns(result, ended)
    return returns


def _episode_returns(result, ended: np.ndarray) -> np.ndarray:
    """Returns of the episodes that ended, in env order (StepResult lists finished returns in env order)."""
    done = result.terminated | result.truncated
    by_env = np.full(done.shape, np.nan)
    by_env[done] = result.finished_returns
    return by_env[ended]
