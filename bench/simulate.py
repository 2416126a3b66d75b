"""Simulation throughput, latency and Ray pool start-up, all in one run so the ratios are comparable.

For HalfCheetah, Ant and Humanoid (v5), env steps per second (1 env step = frame_skip physics steps) of:
- the physical limit: one process per core, each stepping one MjData with `mujoco.rollout.rollout` (C only, no
  Python per step) through the env steps our 64-env batch took: after ours is timed, its batch goes on for
  `LIMIT_STEPS` more batch steps, recording each env's state (full physics and warm start) and action before each
  one, and the limit replays those `LIMIT_STEPS` x 64 env steps (each its frame_skip substeps under the action).
  So it is the same physics on the same states: an earlier limit started its episodes from the reset distribution
  and ran them for our mean episode length, and those states stepped ~5% cheaper than the ones Ant's batch visits
  (125 against 131 us per env step on one core here), which no stepping code could reach. `<task>_envpool_vs_limit`
  is EnvPool's share of the limit, so limit / EnvPool is the most any system can lead EnvPool by on that task;
- ours: `BatchedMujocoEnv` with 64 and 256 envs on `nthread = cores`, observations, rewards, terminations and
  auto-resets included;
- EnvPool (if installed) with the same envs and thread count; gymnasium `SyncVectorEnv` with the same envs;
  gymnasium `AsyncVectorEnv` with one process per env, capped at 4 per core (`--async-envs`): more processes
  than that only add memory and context switches on a small machine.
Then the per-call latency of a 64-env HalfCheetah batch step (ours, p50/p99) against raw stepping of the same
batch (`mujoco.batch.Batch.step(nstep=frame_skip)` with controls written, nothing else), and the seconds per
actor to start an `EnvWorkerPool` of 2 actors and resize it to 8, 32, 64, 128. Each actor is a Python process
holding ~0.21 GB of its own (Pss; torch's import is 0.14 GB of it): sizes above `--max-actors`, or that would
not fit in free memory (128 actors need ~32 GB with a margin), are skipped and reported as such.

    python bench/simulate.py [--quick] [--seconds 2] [--rounds 3] [--max-actors 128]

With `--scale` it measures only how a pool of HalfCheetah envs scales from zero to N envs stepping (bench/scale.py
says how):

    python bench/simulate.py --scale [--scale-sizes 100,1000,10000,100000] [--scale-workers 2] [--seconds 2]

Throughput figures are measured in `--rounds` rounds (default 3), each round measuring every system once, and
each system's best round is its rate. On a shared VM the speed of the same 2-s window moves by +-20% from one
window to the next (HalfCheetah's limit: 43.4k, 45.5k, 49.9k in three consecutive rounds here), and a slowdown
comes from outside the program measured, so one window per system made the ratios a draw; best-of-N is timeit's
rule. Random actions are uniform in each task's range.
Last line: one JSON object (ratios named `<task>_vs_<baseline>`, latency ratios, pool seconds per actor; with
`--scale`: `scale_<N>_s` seconds from zero to the first step, `scale_<N>_kb_per_env`, `scale_<N>_steps_per_s` for
N = 100, 1k, 10k, 100k, and `scale_100k_s`).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gymnasium
import mujoco
import mujoco.batch
import mujoco.rollout
import numpy as np

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead, as for
# `python -m`, so the benchmark imports what the command line imports (examples/ included).
sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench import scale  # noqa: E402
from bench.scale import ACTOR_MEMORY_GB, SCALE_SIZES, available_gb  # noqa: E402
from rl_core.config.presets import build_control_config  # noqa: E402
from rl_core.envs import BatchedMujocoEnv, get_task  # noqa: E402
from rl_core.envs.task import load_model  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402
from rl_core.runtime.control.env_pool import EnvWorkerPool  # noqa: E402
from rl_core.runtime.local_ray import ensure_ray  # noqa: E402

TASKS = {"halfcheetah": "HalfCheetah-v5", "ant": "Ant-v5", "humanoid": "Humanoid-v5"}
ACTION_BANK = 64  # distinct random action batches, cycled
LIMIT_STEPS = 64  # batch steps recorded for the limit to replay (4,096 env steps at 64 envs)


def random_actions(name: str, num_envs: int, seed: int = 0) -> np.ndarray:
    """(ACTION_BANK, num_envs, action_dim) uniform actions in the task's range."""
    task = get_task(name)
    nu = load_model(task).nu
    return np.random.default_rng(seed).uniform(task.action_low, task.action_high, (ACTION_BANK, num_envs, nu))


def timed_rate(step: Callable[[np.ndarray], object], actions: np.ndarray, seconds: float) -> float:
    """Env steps per second of `step(actions[i])`, cycling the bank, after a warm-up of 10 calls."""
    for a in actions[:10]:
        step(a)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step(actions[calls % len(actions)])
        calls += 1
    return calls * actions.shape[1] / elapsed


@dataclass(frozen=True)
class VisitedSteps:
    """Env steps a batch took, to replay: (steps * N) rollouts of frame_skip substeps each."""

    full_physics: np.ndarray  # (steps * N, nstate) mjSTATE_FULLPHYSICS before each env step
    warmstart: np.ndarray  # (steps * N, nv) qacc_warmstart before it (the solver starts from it)
    controls: np.ndarray  # (steps * N, frame_skip, nu) the action, held for every substep


def record_steps(env: BatchedMujocoEnv, actions: np.ndarray) -> VisitedSteps:
    """Step `env` once per action batch, recording each env's state and action before the step."""
    data = mujoco.MjData(env.model)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    full, warm, controls = [], [], []
    for a in actions:
        state = env.get_state()
        for i in range(env.num_envs):
            data.time, data.qpos[:], data.qvel[:] = (state["physics.time"][i], state["physics.qpos"][i],
                                                      state["physics.qvel"][i])
            if "physics.act" in state:
                data.act[:] = state["physics.act"][i]
            row = np.empty(mujoco.mj_stateSize(env.model, spec))
            mujoco.mj_getState(env.model, data, row, spec)
            full.append(row)
            warm.append(state["physics.qacc_warmstart"][i].copy())
        clipped = np.clip(a, env.task.action_low, env.task.action_high)
        controls.extend(np.repeat(clipped[:, None, :], env.task.frame_skip, axis=1))
        env.step(a)
    return VisitedSteps(np.array(full), np.array(warm), np.array(controls))


def _limit_process(job: tuple[str, VisitedSteps, float]) -> float:
    """One core's raw rate: all the recorded env steps per `mujoco.rollout` call, repeated for `seconds`."""
    name, steps, seconds = job
    model = load_model(get_task(name))
    data = mujoco.MjData(model)
    out = np.empty((len(steps.full_physics), steps.controls.shape[1],
                    mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS)))
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        mujoco.rollout.rollout(model, data, steps.full_physics, steps.controls, initial_warmstart=steps.warmstart,
                               state=out)
        calls += 1
    return calls * len(steps.full_physics) / elapsed


def physical_limit(name: str, steps: VisitedSteps, cores: int, seconds: float) -> float:
    """Sum of the per-process raw rates of `cores` processes stepping at the same time."""
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        return float(sum(pool.map(_limit_process, [(name, steps, seconds)] * cores)))


def ours(name: str, num_envs: int, cores: int, seconds: float) -> tuple[float, BatchedMujocoEnv]:
    """(env steps per second, the batch as the timed steps left it: the limit replays its next steps)."""
    env = BatchedMujocoEnv(get_task(name), num_envs, seed=0, nthread=cores)
    return timed_rate(env.step, random_actions(name, num_envs), seconds), env


def envpool_rate(name: str, num_envs: int, cores: int, seconds: float) -> float | None:
    try:
        import envpool
    except ImportError:
        return None
    env = envpool.make_gymnasium(name, num_envs=num_envs, batch_size=num_envs, num_threads=cores, seed=0)
    env.reset()
    return timed_rate(env.step, random_actions(name, num_envs), seconds)


def gym_rate(name: str, num_envs: int, seconds: float, asynchronous: bool) -> float:
    vector = gymnasium.vector.AsyncVectorEnv if asynchronous else gymnasium.vector.SyncVectorEnv
    env = vector([lambda: gymnasium.make(name)] * num_envs)
    env.reset(seed=0)
    try:
        return timed_rate(env.step, random_actions(name, num_envs).astype(np.float32), seconds)
    finally:
        env.close()


def percentiles(times: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    p50, p99 = np.percentile(np.array(times) * 1e3, [50, 99])
    return float(p50), float(p99)


def latency(name: str, num_envs: int, cores: int, calls: int) -> dict[str, float]:
    """Per-call times of our batch step and of raw batched stepping of the same model, envs and threads."""
    task = get_task(name)
    actions = random_actions(name, num_envs)
    env = BatchedMujocoEnv(task, num_envs, seed=0, nthread=cores)
    raw = mujoco.batch.Batch(load_model(task), nsim=num_envs, nthread=cores, persistent=True)
    ctrl = raw.bind("ctrl")

    def raw_step(a: np.ndarray) -> None:
        ctrl[:] = a
        raw.step(nstep=task.frame_skip)

    result = {}
    for label, step in (("ours", env.step), ("raw", raw_step)):
        for a in actions[:20]:
            step(a)
        times = []
        for i in range(calls):
            start = time.perf_counter()
            step(actions[i % ACTION_BANK])
            times.append(time.perf_counter() - start)
        result[f"{label}_p50_ms"], result[f"{label}_p99_ms"] = percentiles(times)
    return result


def pool_startup(sizes: list[int], max_actors: int) -> dict[str, float | str]:
    """Seconds per actor to start a pool of sizes[0] actors, then to resize it to each later size."""
    ensure_ray(max(sizes) + 2)  # logical CPUs: actors ask for one each
    results: dict[str, float | str] = {}
    with tempfile.TemporaryDirectory(prefix="gymflow-bench-pool-") as store:
        cfg = build_control_config("tiny", run_name="bench-pool", store=f"file://{store}", num_workers=2,
                           envs_per_worker=max(sizes) // 2, num_ranks=1)
        pool = EnvWorkerPool(cfg)
        try:
            for size in sizes:
                free_gb = available_gb() + (pool.num_workers * ACTOR_MEMORY_GB if results else 0.0)  # freed first
                if size > max_actors or size * ACTOR_MEMORY_GB > 0.8 * free_gb:
                    results[str(size)] = (f"skipped: needs ~{size * ACTOR_MEMORY_GB:.0f} GB, {free_gb:.0f} GB free, "
                                          f"--max-actors {max_actors}")
                    continue
                results[str(size)] = round(pool.resize(size) / size, 3)
        finally:
            pool.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="0.5 s per figure, one round, 64 envs only, pool up to 8 actors")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per throughput figure")
    parser.add_argument("--max-actors", type=int, default=128, help="largest pool size to start (~0.25 GB each)")
    parser.add_argument("--async-envs", type=int, help="AsyncVectorEnv processes (default: 4 per core, <= 64)")
    parser.add_argument("--latency-calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure every throughput figure this many times, interleaved, and keep each one's best")
    parser.add_argument("--scale", action="store_true",
                        help="only the scale bench: seconds from zero to the first step of N envs on the pool")
    parser.add_argument("--scale-sizes", default=SCALE_SIZES, help="comma-separated N for --scale")
    parser.add_argument("--scale-workers", type=int, help="env-worker actors for --scale (default: one per core)")
    args = parser.parse_args()
    use_private_temp_dir("gymflow-bench-simulate-")  # removed at exit, after a failure or SIGTERM too
    cores = len(os.sched_getaffinity(0))
    if args.scale:
        scale.run([int(n) for n in args.scale_sizes.split(",")], args.scale_workers, args.seconds)
        return
    seconds = 0.5 if args.quick else args.seconds
    batch_sizes = [64] if args.quick else [64, 256]
    async_envs = args.async_envs or min(64, 4 * cores)
    print(f"cores {cores}; {seconds} s per figure; env steps per second (1 env step = frame_skip physics steps)")
    out: dict[str, object] = {"cores": cores}
    for key, name in TASKS.items():
        rounds: list[dict[str, float]] = []
        for r in range(1 if args.quick else args.rounds):
            figures = {}
            for n in batch_sizes:
                figures[f"ours_{n}"], env = ours(name, n, cores, seconds)
                if n == 64:  # the limit replays this batch's next steps
                    visited = record_steps(env, random_actions(name, n, seed=1)[:LIMIT_STEPS])
            figures["limit"] = physical_limit(name, visited, cores, seconds)
            pool_rate = envpool_rate(name, 64, cores, seconds)
            if pool_rate is not None:
                figures["envpool_64"] = pool_rate
            figures["gym_sync_64"] = gym_rate(name, 64, seconds, asynchronous=False)
            figures[f"gym_async_{async_envs}"] = gym_rate(name, async_envs, seconds, asynchronous=True)
            rounds.append(figures)
            print(f"{name:16s} round {r + 1}: " + "  ".join(f"{k} {v:7.0f}" for k, v in figures.items()), flush=True)
        figures = {k: max(f[k] for f in rounds) for k in rounds[0]}
        pool_rate = figures.get("envpool_64")
        print(f"{name:16s} best:    " + "  ".join(f"{k} {v:7.0f}" for k, v in figures.items()))
        best = figures["ours_64"]
        out[f"{key}_vs_limit"] = round(best / figures["limit"], 3)
        out[f"{key}_vs_envpool"] = round(best / pool_rate, 3) if pool_rate else "envpool not installed"
        out[f"{key}_envpool_vs_limit"] = round(pool_rate / figures["limit"], 3) if pool_rate else None
        out[f"{key}_vs_gym_sync"] = round(best / figures["gym_sync_64"], 3)
        out[f"{key}_steps_per_s"] = {k: round(v) for k, v in figures.items()}
        out[f"{key}_steps_per_s_by_round"] = [{k: round(v) for k, v in f.items()} for f in rounds]
    calls = 500 if args.quick else args.latency_calls
    lat = latency("HalfCheetah-v5", 64, cores, calls)
    print("HalfCheetah 64 envs, one batch step (ms): " + "  ".join(f"{k} {v:.3f}" for k, v in lat.items()))
    out["latency_ms"] = {k: round(v, 4) for k, v in lat.items()}
    out["latency_p99_over_p50"] = round(lat["ours_p99_ms"] / lat["ours_p50_ms"], 3)
    out["batch_step_over_raw"] = round(lat["ours_p50_ms"] / lat["raw_p50_ms"], 3)
    sizes = [2, 8] if args.quick else [2, 8, 32, 64, 128]
    per_actor = pool_startup(sizes, min(args.max_actors, max(sizes)))
    print("EnvWorkerPool start/resize, seconds per actor: " + "  ".join(f"{k}: {v}" for k, v in per_actor.items()))
    measured = [v for v in per_actor.values() if isinstance(v, float)]
    out["pool_seconds_per_actor_by_size"] = per_actor
    out["pool_seconds_per_actor"] = max(measured) if measured else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
