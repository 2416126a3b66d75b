"""Kernel benchmark: every registered op at the shapes the flows call it with, then a PPO iteration's hot ops.

Part 1 runs the tuner's own verify-and-time step (`tune_bucket`) per op, so it measures exactly what `autotune`
would decide, and prints each op's table. Part 2 times `score_experience` + `ppo_update` (the hot ops of one
quick-preset iteration: 2 workers x 32 envs x 128 steps, minibatches of 512, 10 epochs) with kernels dispatch on,
after tuning the ops they dispatch, against the same with GYMFLOW_KERNELS=reference; runs alternate.
Everything happens in a temporary cache dir: the user's tuned winners are neither read nor changed.

The last line is one JSON object:
    {"geomean_speedup", "fast_1.0", "fast_1.5", "iteration_time_tuned_over_untuned", "winners", ...}

Usage: python bench/kernels.py [--min-run-time SECONDS] [--compile] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

# Run as a script, this file's folder comes first on sys.path, and this file (bench/kernels.py) would shadow the
# `kernels` package it benchmarks; the repository root goes there instead.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import kernels  # noqa: E402
from kernels import COMPILE, TuneReport, get_op, registered_ops  # noqa: E402
from kernels.autotune import DEFAULT_MIN_RUN_TIME, tune_bucket  # noqa: E402
from rl_core.algos.advantages import score_experience  # noqa: E402
from rl_core.algos.learner import PPOLearner  # noqa: E402
from rl_core.algos.ppo import RolloutBatch, ppo_update  # noqa: E402
from rl_core.config import PPOConfig  # noqa: E402
from rl_core.policies.normalizer import Moments  # noqa: E402

WORKERS, ENVS, STEPS, OBS_DIM, ACT_DIM = 2, 32, 128, 17, 6
"""The quick preset on HalfCheetah."""
ITERATION_OPS = {"gae": {"T": STEPS, "N": WORKERS * ENVS}, "ppo_loss": {"B": PPOConfig().minibatch_size}}
"""What the iteration dispatches, at its shapes (one process, so a minibatch is not split across ranks)."""


def tune_all(min_run_time: float, opt_in: frozenset[str]) -> list[TuneReport]:
    """One bucket per op at its default shape, measured and printed; nothing is cached."""
    reports = []
    for name in registered_ops():
        op = get_op(name)
        for shape in op.default_shapes:
            bucket = tune_bucket(op, shape, min_run_time=min_run_time, opt_in=opt_in)
            reports.append(TuneReport(name, [bucket]))
            print(reports[-1].table(), flush=True)
    return reports


def rollout_parts(seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Synthetic worker outputs shaped like a quick-preset rollout, with actions near the initial policy's."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(WORKERS):
        actions = rng.standard_normal((STEPS, ENVS, ACT_DIM)).astype(np.float32)
        part = {
            "obs": rng.standard_normal((STEPS, ENVS, OBS_DIM)).astype(np.float32),
            "actions": actions,
            "logprobs": (-0.5 * actions**2 - 0.5 * np.log(2 * np.pi)).sum(-1).astype(np.float32),
            "values": (0.1 * rng.standard_normal((STEPS, ENVS))).astype(np.float32),
            "rewards": rng.standard_normal((STEPS, ENVS)).astype(np.float32),
            "dones": (rng.random((STEPS, ENVS)) < 0.005).astype(np.float32),
            "trunc_values": np.zeros((STEPS, ENVS), np.float32),
            "next_value": (0.1 * rng.standard_normal(ENVS)).astype(np.float32),
        }
        for name, data in (("obs_moments", part["obs"]), ("ret_moments", part["rewards"][..., None])):
            moments = Moments.of(data)
            part.update({f"{name}.count": np.array(moments.count), f"{name}.mean": moments.mean,
                         f"{name}.m2": moments.m2})
        parts.append(part)
    return parts


def iteration_s(parts: list[dict[str, np.ndarray]], mode: str | None) -> float:
    """Seconds for scoring and one PPO update from the same initial learner; `mode` sets GYMFLOW_KERNELS."""
    if mode is None:
        os.environ.pop("GYMFLOW_KERNELS", None)
    else:
        os.environ["GYMFLOW_KERNELS"] = mode
    cfg = PPOConfig()
    learner = PPOLearner(OBS_DIM, ACT_DIM, cfg, seed=0)
    start = time.perf_counter()
    scored = score_experience(parts, 1.0, cfg.gamma, cfg.gae_lambda)
    batch = RolloutBatch(*(torch.from_numpy(scored[k]) for k in
                           ("obs", "actions", "logprobs", "values", "advantages", "returns")))
    ppo_update(learner.model, learner.optimizer, batch, cfg, generator_seed=0, learning_rate=cfg.learning_rate)
    return time.perf_counter() - start


def iteration_ratio(repeats: int, min_run_time: float) -> tuple[float, float, float]:
    """(median tuned s, median reference s, median of the per-pair ratios tuned / reference) after tuning the
    iteration's dispatched ops. Runs alternate, and each ratio compares two neighbouring runs, which saw about the
    same load from whatever else shares the machine."""
    for name, shape in ITERATION_OPS.items():
        winner = kernels.autotune(name, [shape], min_run_time=min_run_time, opt_in=frozenset()).buckets[0].winner
        print(f"tuned {name} at {shape} for the iteration: winner {winner}", flush=True)
    parts = rollout_parts()
    iteration_s(parts, None), iteration_s(parts, "reference")  # warm-up: libraries loaded, allocator primed
    tuned, reference = [], []
    for _ in range(repeats):
        tuned.append(iteration_s(parts, None))
        reference.append(iteration_s(parts, "reference"))
    os.environ.pop("GYMFLOW_KERNELS", None)
    t, r = statistics.median(tuned), statistics.median(reference)
    ratio = statistics.median(a / b for a, b in zip(tuned, reference))
    print(f"iteration hot ops (score_experience + ppo_update), {repeats} alternating pairs: tuned median {t:.3f} s "
          f"(min {min(tuned):.3f}), reference median {r:.3f} s (min {min(reference):.3f}); median pair ratio "
          f"{ratio:.3f}", flush=True)
    return t, r, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-run-time", type=float, default=DEFAULT_MIN_RUN_TIME,
                        help="timing budget in seconds per implementation and shape")
    parser.add_argument("--compile", action="store_true", help="also try torch.compile candidates (minutes)")
    parser.add_argument("--repeats", type=int, default=7, help="timed iterations per mode (tuned, reference)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gymflow-bench-kernels-") as cache:
        os.environ["GYMFLOW_CACHE_DIR"] = cache
        reports = tune_all(args.min_run_time, frozenset({COMPILE}) if args.compile else frozenset())
        headline = kernels.summary(reports)
        tuned_s, reference_s, ratio = iteration_ratio(args.repeats, args.min_run_time)
    print(json.dumps({
        "geomean_speedup": headline["geomean_speedup"],
        "fast_1.0": headline["fast_1.0"],
        "fast_1.5": headline["fast_1.5"],
        "iteration_time_tuned_over_untuned": round(ratio, 4),
        "iteration_s": {"tuned": round(tuned_s, 4), "reference": round(reference_s, 4)},
        "speedups": {f"{r.op} {b.winner}": round(b.winner_speedup, 2) for r in reports for b in r.buckets},
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
