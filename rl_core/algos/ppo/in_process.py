"""A control run in one process, without Prefect, Ray or a store: the reference the orchestrated flow is measured
against.

It runs the same phase functions the flow's steps run (the algorithm's collect and score, the learner's update), in
the same order and with the same counter-based seeds: worker w's envs [w * envs_per_worker, (w + 1) *
envs_per_worker) collect on a thread per worker; the rollouts are scored together; one update (world size 1) follows.
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

from rl_core.algos.base import (
    Learner,
    Policy,
    Spaces,
    Tensors,
    algorithm_of,
    build_learner,
    build_policy,
    policy_sha256,
)
from rl_core.algos.hot_ops import hot_ops, tune_hot_ops
from rl_core.algos.ppo.evaluation import evaluate_control_policy
from rl_core.algos.preflight import preflight
from rl_core.config.control import ControlRunConfig
from rl_core.config.threads import TRAINER_THREADS
from rl_core.envs import make_batch
from rl_core.iteration_clock import IterationClock


@dataclass
class InProcessResult:
    """What a run produced: the evaluation, the final policy and its hash, and how fast it went."""

    evaluation: dict[str, float]
    policy_sha256: str
    policy: Tensors  # the final policy's `model.` tensors, which `policy_sha256` hashes
    env_steps: int
    train_s: float  # collection + updates, with the envs' creation and the kernels' tuning before them
    wall_s: float  # train_s + the final evaluation
    loop_s: float  # the iterations alone: first collection to last update
    first_iteration_s: float  # the first of them, which pays one-off costs (see IterationClock)
    iterations: list[dict[str, float]] = field(default_factory=list)


def train_in_process(
    cfg: ControlRunConfig, on_iteration: Callable[[int, dict[str, float]], None] | None = None,
    torch_threads: int = TRAINER_THREADS,
) -> InProcessResult:
    """Train ``cfg.iterations`` iterations from the seed and evaluate ``cfg.eval_episodes`` episodes.

    With ``cfg.overlap`` the collection of iteration i+1 runs on a thread during iteration i's update, acting
    with a copy of the policy from before that update: the flow's schedule and math (`acting_version`).

    ``torch_threads``: torch's threads for the run; the caller's setting is restored after. The default is the
    flow's trainer ranks' count (its env workers run one thread too), and eager autograd's float sums depend on
    the count, so it is what gives the flow's weights. It is also the faster setting for these policies: a 64-unit
    MLP's ops are too small to gain from splitting over threads.
    """
    preflight(cfg)  # an edge, like the command line: the env module imported, the env registered
    previous = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        return _train(cfg, on_iteration)
    finally:
        torch.set_num_threads(previous)


def _train(cfg: ControlRunConfig, on_iteration: Callable[[int, dict[str, float]], None] | None) -> InProcessResult:
    start = time.perf_counter()
    tune_hot_ops(hot_ops(cfg))  # as the flow's kernel_autotune step does, for this process's calls
    # As the flow's env workers do, the workers' batches collect at the same time, here on threads (MuJoCo's
    # stepping and the policy kernel release the GIL), each stepping its physics on its share of the cores. So one
    # batch's observations and policy run while another steps; collecting one batch after another, each on every
    # core, left a core idle meanwhile. An env's physics does not depend on which thread steps it, so the weights
    # stay the flow's bit for bit.
    algorithm = algorithm_of(cfg)
    per_worker, workers = cfg.env.envs_per_worker, cfg.env.num_workers
    physics_threads = max(1, (os.cpu_count() or 1) // workers)
    envs = [make_batch(cfg.env.name, per_worker, cfg.seed, w * per_worker, cfg.env.randomization,
                       min(physics_threads, per_worker))
            for w in range(workers)]
    spaces = Spaces(envs[0].obs_dim, envs[0].action_dim)
    learner: Learner = build_learner(cfg, spaces)
    stale: Policy | None = build_policy(cfg, spaces) if cfg.overlap else None
    carries = [algorithm.initial_carry(per_worker) for _ in envs]

    def collect(iteration: int, acting: Policy) -> tuple[list[Tensors], list[dict]]:
        """Every worker's experience and meta, in worker order (the flow's simulate step)."""
        results = list(pool.map(lambda w: algorithm.collect(cfg, acting, envs[w], carries[w], iteration,
                                                            w * per_worker), range(len(envs))))
        return [experience for experience, _ in results], [meta for _, meta in results]

    history: list[dict[str, float]] = []
    with ThreadPoolExecutor(1, thread_name_prefix="collect") as collector, \
            ThreadPoolExecutor(len(envs), thread_name_prefix="env-worker") as pool:
        collecting: Future | None = None
        clock = IterationClock()
        for iteration in range(cfg.iterations):
            parts, metas = collecting.result() if collecting else collect(iteration, learner.policy)
            scored = algorithm.score(cfg, parts, metas)
            collecting = None
            if stale is not None and iteration + 1 < cfg.iterations:
                stale.load_state(learner.policy_state())  # version `iteration`, before this update
                collecting = collector.submit(collect, iteration + 1, stale)
            metrics = learner.update(scored, iteration)
            finished = [r for meta in metas for r in meta["finished_returns"]]
            metrics["mean_return"] = float(np.mean(finished)) if finished else float("nan")
            history.append(metrics)
            if on_iteration is not None:
                on_iteration(iteration, metrics)
            clock.lap()
    train_s = time.perf_counter() - start
    evaluation = evaluate_control_policy(cfg, learner.policy, cfg.eval_episodes)
    state = learner.state()
    policy = {name: value for name, value in state.items() if name.startswith("model.")}
    return InProcessResult(evaluation, policy_sha256(state), policy, cfg.iterations * cfg.batch_size, train_s,
                           time.perf_counter() - start, clock.total_s, clock.first_s, history)
