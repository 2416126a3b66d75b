"""Kernel benchmark: every registered op at the shapes the flows call it with, then a PPO iteration's hot ops.

Part 1 runs the tuner's own verify-and-time step (`tune_bucket`) per op, so it measures exactly what `autotune`
would decide, and prints each op's table. Part 2 times one whole quick-preset iteration in one process (2 workers x
32 envs x 128 steps of real MuJoCo, the policy forward at every step, scoring, then 10 epochs of 512-sample
minibatches) with kernels dispatch on, after tuning the ops it dispatches, against the same with
GYMFLOW_KERNELS=reference; runs alternate.
Everything happens in a temporary cache dir: the user's tuned winners are neither read nor changed.

Part 1b times each winner of an op the flows dispatch (the control and agent quick presets' hot ops) against the
reference once more, on fresh inputs, apart from the tuning that picked it: ``geomean_speedup`` is the geometric
mean of those re-timed speedups; ``tuning_geomean_all_ops`` is the tuning's own figure over every registered op.

The last line is one JSON object:
    {"geomean_speedup", "retimed_speedups", "tuning_geomean_all_ops", "fast_1.0", "fast_1.5",
     "iteration_time_tuned_over_untuned", ...}

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

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports (examples/ included).
sys.path[0] = str(Path(__file__).resolve().parents[1])

import gymflow_kernels as kernels  # noqa: E402
from gymflow_kernels import COMPILE, TuneReport, get_op, registered_ops  # noqa: E402
from gymflow_kernels.autotune import DEFAULT_MIN_RUN_TIME, tune_bucket  # noqa: E402
from gymflow_kernels.registry import REFERENCE  # noqa: E402
from gymflow_kernels.timing import time_kernels  # noqa: E402
from gymflow_kernels.verify import FRESH_SEED  # noqa: E402
from rl_core.algos.base import Spaces  # noqa: E402
from rl_core.algos.hot_ops import hot_ops  # noqa: E402
from rl_core.algos.ppo.advantages import score_experience  # noqa: E402
from rl_core.algos.ppo.collect import collect_rollout  # noqa: E402
from rl_core.algos.ppo.learner import PPOLearner  # noqa: E402
from rl_core.algos.ppo.update import RolloutBatch, ppo_update  # noqa: E402
from rl_core.config.control import PPOConfig  # noqa: E402
from rl_core.config.presets import (
    build_agent_config,  # noqa: E402
    build_control_config,  # noqa: E402
)
from rl_core.envs import make_batch  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402
from rl_core.seeding import action_noise  # noqa: E402

TASK, WORKERS, ENVS, STEPS = "HalfCheetah-v5", 2, 32, 128
"""The quick preset on HalfCheetah."""
QUICK = build_control_config("quick", run_name="bench-kernels", env=TASK, num_workers=WORKERS, envs_per_worker=ENVS,
                     rollout_steps=STEPS)
ITERATION_OPS = {op: shape for op, (shape, _) in hot_ops(QUICK).items()}
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


def dispatched_ops() -> set[str]:
    """The ops the flows' default runs dispatch (the control quick preset's and the agent quick preset's)."""
    return set(hot_ops(QUICK)) | set(hot_ops(build_agent_config("quick", run_name="bench-kernels-agent")))


def retimed_speedups(reports: list[TuneReport], min_run_time: float) -> dict[str, float]:
    """Each op's winner against the reference once more, on fresh inputs and apart from the timing that picked it
    (which favours whichever candidate its noise flattered): the speedup a run of the flow gets."""
    speedups = {}
    for report in reports:
        op = get_op(report.op)
        for bucket in report.buckets:
            if bucket.winner == REFERENCE:
                speedups[report.op] = 1.0
                continue
            winner = op.candidates[bucket.winner]
            timing = time_kernels({REFERENCE: op.reference, bucket.winner: winner},
                                  op.make_inputs(bucket.shape, FRESH_SEED), min_run_time=min_run_time,
                                  num_threads=torch.get_num_threads(), grad_argnums=op.grad_argnums)
            speedups[report.op] = timing[REFERENCE].median_s / timing[bucket.winner].median_s
    return speedups


def iteration_s(mode: str | None) -> float:
    """Seconds for one quick-preset iteration from the same seeded start: two workers' rollouts in real MuJoCo
    (the policy forward at every step), scoring and one PPO update; `mode` sets GYMFLOW_KERNELS."""
    if mode is None:
        os.environ.pop("GYMFLOW_KERNELS", None)
    else:
        os.environ["GYMFLOW_KERNELS"] = mode
    cfg = PPOConfig()
    envs = [make_batch(TASK, ENVS, seed=0, env_offset=w * ENVS) for w in range(WORKERS)]
    run = QUICK.model_copy(update={"seed": 0, "algorithm": cfg})  # PPO's defaults, seed 0
    learner = PPOLearner(run, Spaces(envs[0].obs_dim, envs[0].action_dim))
    policy = learner.policy
    start = time.perf_counter()
    parts = [collect_rollout(env, policy.model, policy.obs_norm, STEPS, cfg.gamma, np.zeros(ENVS),
                             action_noise(0, 0, w * ENVS, ENVS, STEPS, env.action_dim))[0]
             for w, env in enumerate(envs)]
    scored = score_experience(parts, 1.0, cfg.gamma, cfg.gae_lambda)
    batch = RolloutBatch.from_scored(scored)
    ppo_update(policy.model, learner.optimizer, batch, cfg, generator_seed=0, learning_rate=cfg.learning_rate)
    return time.perf_counter() - start


def iteration_ratio(repeats: int, min_run_time: float) -> tuple[float, float, float]:
    """(median tuned s, median reference s, median of the per-pair ratios tuned / reference) after tuning the
    iteration's dispatched ops. Runs alternate, and each ratio compares two neighbouring runs, which saw about the
    same load from whatever else shares the machine."""
    for name, shape in ITERATION_OPS.items():
        winner = kernels.autotune(name, [shape], min_run_time=min_run_time, opt_in=frozenset()).buckets[0].winner
        print(f"tuned {name} at {shape} for the iteration: winner {winner}", flush=True)
    iteration_s(None), iteration_s("reference")  # warm-up: libraries loaded, allocator primed
    tuned, reference = [], []
    for _ in range(repeats):
        tuned.append(iteration_s(None))
        reference.append(iteration_s("reference"))
    os.environ.pop("GYMFLOW_KERNELS", None)
    t, r = statistics.median(tuned), statistics.median(reference)
    ratio = statistics.median(a / b for a, b in zip(tuned, reference))
    print(f"quick-preset iteration (2 x 32 envs x 128 steps of {TASK}, scoring, one update), {repeats} "
          f"alternating pairs: tuned median {t:.3f} s "
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
    use_private_temp_dir("gymflow-bench-kernels-")  # removed at exit, after a failure or SIGTERM too
    with tempfile.TemporaryDirectory(prefix="gymflow-bench-kernels-") as cache:
        os.environ["GYMFLOW_CACHE_DIR"] = cache
        reports = tune_all(args.min_run_time, frozenset({COMPILE}) if args.compile else frozenset())
        headline = kernels.summary(reports)
        dispatched = dispatched_ops()
        retimed = retimed_speedups([r for r in reports if r.op in dispatched], args.min_run_time)
        for op, speedup in sorted(retimed.items()):
            print(f"re-timed {op}: winner {speedup:.2f}x the reference", flush=True)
        tuned_s, reference_s, ratio = iteration_ratio(args.repeats, args.min_run_time)
    print(json.dumps({
        "geomean_speedup": round(statistics.geometric_mean(retimed.values()), 3),  # the dispatched ops, re-timed
        "retimed_speedups": {op: round(v, 3) for op, v in sorted(retimed.items())},
        "tuning_geomean_all_ops": headline["geomean_speedup"],  # every registered op, as the tuning timed them
        "fast_1.0": headline["fast_1.0"],
        "fast_1.5": headline["fast_1.5"],
        "iteration_time_tuned_over_untuned": round(ratio, 4),
        "iteration_s": {"tuned": round(tuned_s, 4), "reference": round(reference_s, 4)},
        "speedups": {f"{r.op} {b.winner}": round(b.winner_speedup, 2) for r in reports for b in r.buckets},
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
