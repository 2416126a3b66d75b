"""PPO in one process, without Prefect, Ray or a store: the reference the orchestrated flow is measured against.

It runs the same pieces the flow's steps run, in the same order and with the same counter-based seeds:
worker w's envs [w * envs_per_worker, (w + 1) * envs_per_worker) collect, on a thread per worker, each env with the
action noise of (seed, iteration, env index); the rollouts are scored together; one PPO update (world size 1) follows.
So with ``num_ranks=1`` it computes the flow's weights bit for bit; with more ranks the flow differs only by
float summation order (see ppo.py).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from rl_core.algos.advantages import score_experience
from rl_core.algos.evaluation import evaluate_learner
from rl_core.algos.hot_ops import hot_ops, tune_hot_ops
from rl_core.algos.learner import TRAINER_THREADS, PPOLearner, policy_sha256
from rl_core.algos.ppo import RolloutBatch, decoupled, ppo_update, summarize_epochs
from rl_core.algos.rollout import collect_rollout
from rl_core.config import RunConfig
from rl_core.envs import make_batch
from rl_core.iteration_clock import IterationClock
from rl_core.policies.normalizer import Moments
from rl_core.seeding import action_noise, derive_seed


@dataclass
class InProcessResult:
    """What a run produced: the evaluation, the policy hash, and how fast it went."""

    evaluation: dict[str, float]
    policy_sha256: str
    env_steps: int
    train_s: float  # collection + updates, with the envs' creation and the kernels' tuning before them
    wall_s: float  # train_s + the final evaluation
    loop_s: float  # the iterations alone: first collection to last update
    first_iteration_s: float  # the first of them, which pays one-off costs (see IterationClock)
    iterations: list[dict[str, float]] = field(default_factory=list)


def train_in_process(
    cfg: RunConfig, on_iteration: Callable[[int, dict[str, float]], None] | None = None,
    torch_threads: int = TRAINER_THREADS,
) -> InProcessResult:
    """Train ``cfg.iterations`` iterations from the seed and evaluate ``cfg.eval_episodes`` episodes.

    With ``cfg.overlap`` the collection of iteration i+1 runs on a thread during iteration i's update, acting
    with a copy of the policy from before that update: the flow's schedule and math (`acting_version`).

    ``torch_threads``: torch's threads for the run; the caller's setting is restored after. The default is the
    flow's trainer ranks' count (its env workers run one thread too), and eager autograd's float sums depend on
    the count, so it is what gives the flow's weights. It is also the faster setting here: HalfCheetah ran 14.1k
    steps/s at one thread and 13.2k at two (a 64-unit MLP's ops are too small to split).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        return _train(cfg, on_iteration)
    finally:
        torch.set_num_threads(previous)


def _train(cfg: RunConfig, on_iteration: Callable[[int, dict[str, float]], None] | None) -> InProcessResult:
    start = time.perf_counter()
    tune_hot_ops(hot_ops(cfg))  # as the flow's kernel_autotune step does, for this process's calls
    # As the flow's env workers do, the workers' batches collect at the same time, here on threads (MuJoCo's
    # stepping and the policy kernel release the GIL), each stepping its physics on its share of the cores. So one
    # batch's observations and policy run while another steps; collecting one batch after another, each on every
    # core, left a core idle meanwhile. Hopper's collection (two batches of 32 envs, two cores) took 0.48 s instead
    # of 0.54 s, best of 20. An env's physics does not depend on which thread steps it, so the weights stay the
    # flow's bit for bit.
    physics_threads = max(1, (os.cpu_count() or 1) // cfg.num_workers)
    envs = [make_batch(cfg.env, cfg.envs_per_worker, cfg.seed, w * cfg.envs_per_worker, cfg.randomization,
                       min(physics_threads, cfg.envs_per_worker))
            for w in range(cfg.num_workers)]
    learner = PPOLearner(envs[0].obs_dim, envs[0].action_dim, cfg.ppo, cfg.seed)
    stale = PPOLearner(envs[0].obs_dim, envs[0].action_dim, cfg.ppo, cfg.seed) if cfg.overlap else None
    discounted = [np.zeros(cfg.envs_per_worker) for _ in envs]

    def collect_worker(iteration: int, acting: PPOLearner, w: int) -> tuple[dict[str, np.ndarray], dict]:
        noise = action_noise(cfg.seed, iteration, w * cfg.envs_per_worker, cfg.envs_per_worker,
                             cfg.rollout_steps, envs[w].action_dim)
        return collect_rollout(envs[w], acting, cfg.rollout_steps, cfg.ppo.gamma, discounted[w], noise)

    def collect(iteration: int, acting: PPOLearner) -> tuple[list[dict[str, np.ndarray]], list[float], float]:
        parts, finished = [], []
        for arrays, info in workers.map(lambda w: collect_worker(iteration, acting, w), range(len(envs))):
            parts.append(arrays)
            finished += info["finished_returns"]
        return parts, finished, acting.reward_scale()

    history: list[dict[str, float]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="collect") as collector, \
            ThreadPoolExecutor(len(envs), thread_name_prefix="env-worker") as workers:
        collecting: Future | None = None
        clock = IterationClock()
        for iteration in range(cfg.iterations):
            parts, finished, reward_scale = collecting.result() if collecting else collect(iteration, learner)
            scored = score_experience(parts, reward_scale, cfg.ppo.gamma, cfg.ppo.gae_lambda)
            collecting = None
            if stale is not None and iteration + 1 < cfg.iterations:
                stale.load_policy(learner.state())  # version `iteration`, before this update
                collecting = collector.submit(collect, iteration + 1, stale)
            metrics = summarize_epochs(_update(cfg, learner, scored, iteration))
            learner.update_statistics(_moments(scored, "obs_moments"), _moments(scored, "ret_moments"))
            metrics["mean_return"] = float(np.mean(finished)) if finished else float("nan")
            history.append(metrics)
            if on_iteration is not None:
                on_iteration(iteration, metrics)
            clock.lap()
    train_s = time.perf_counter() - start
    evaluation = evaluate_learner(cfg, learner, cfg.eval_episodes)
    return InProcessResult(evaluation, policy_sha256(learner.state()), cfg.iterations * cfg.batch_size, train_s,
                           time.perf_counter() - start, clock.total_s, clock.first_s, history)


def _update(cfg: RunConfig, learner: PPOLearner, scored: dict[str, np.ndarray], iteration: int) -> list[dict]:
    """The flow's train_shard update with one rank (same generator seed and learning-rate schedule)."""
    batch = RolloutBatch.from_scored(scored)
    if cfg.overlap:  # collected one update ago: clip against the weights the update starts from
        batch = decoupled(learner.model, batch)
    frac = 1.0 - iteration / cfg.iterations if cfg.ppo.anneal_lr else 1.0
    return ppo_update(learner.model, learner.optimizer, batch, cfg.ppo,
                      generator_seed=derive_seed(cfg.seed, iteration, 7),
                      learning_rate=cfg.ppo.learning_rate * max(frac, 0.0))


def _moments(scored: dict[str, np.ndarray], name: str) -> Moments:
    return Moments(float(scored[f"{name}.count"]), scored[f"{name}.mean"], scored[f"{name}.m2"])
