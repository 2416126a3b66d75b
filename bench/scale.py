"""The scale bench: a pool of HalfCheetah envs from zero to N envs stepping, like Tensor Gym's "100 to 100,000 agents
in under 2 minutes". `python bench/simulate.py --scale` runs it (the flag its figures are quoted by), as does
`python bench/scale.py`.

For each N in `--scale-sizes` (100, 1,000, 10,000, 100,000) an `EnvWorkerPool` of `--scale-workers`
env-worker actors (default: one per core) holding N envs between them is brought from zero to its first batch step.
"Zero" is this process with its modules imported and no Ray running: the time counts `ray.init` of a local Ray, the
actors' start (a Python process each, torch, the run config, building N/workers envs each) and one batch step of all
N envs with random actions, and each N starts from zero again (Ray shut down and its processes gone). Files are in the
OS cache: a first run with one env per actor (the baseline) comes before the N. Memory per env is the growth of the
actor processes' Pss (/proc/PID/smaps_rollup) over the baseline's, divided by the envs added; the drop of MemAvailable
from before Ray's start is printed too (all of Ray's processes; other jobs move it). Env steps per second are then
measured over `--seconds` (at least 2 batch steps) of random actions, timed in this process across all actors.
Sizes that would not fit in available memory (~180 KiB per env) are skipped and reported as such.

    python bench/simulate.py --scale [--scale-sizes 100,1000,10000,100000] [--scale-workers 2] [--seconds 2]
    python bench/scale.py [--sizes 100,1000,10000,100000] [--workers 2] [--seconds 2]

Last line: one JSON object with `scale_<N>_s` seconds from zero to the first step,
`scale_<N>_kb_per_env`, `scale_<N>_steps_per_s` for N = 100, 1k, 10k, 100k, and `scale_100k_s`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

# Run as a script, this file's folder comes first on sys.path; the repository root goes there instead (bench/simulate.py
# says why), which leaves it as it is when bench/simulate.py imports this module.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from rl_core.config.presets import build_control_config  # noqa: E402
from rl_core.private_temp import use_private_temp_dir  # noqa: E402
from rl_core.runtime.control.env_pool import EnvWorkerPool  # noqa: E402
from rl_core.runtime.local_ray import actor_cpus, ensure_ray  # noqa: E402

ACTOR_MEMORY_GB = 0.25  # measured Pss of one started env-worker actor is ~0.21 GB (8 actors); keep a margin
ENV_MEMORY_GB = 180 / 2**20  # GiB; measured ~179 KiB per HalfCheetah env, ~167 KiB of it MjData whatever the model
RAY_MEMORY_GB = 1.0  # a local Ray's own processes (~0.8 GB measured)
SCALE_SIZES = "100,1000,10000,100000"


def available_gb() -> float:
    """MemAvailable from /proc/meminfo (Linux): memory new processes can take without swapping."""
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def size_label(n: int) -> str:
    """100, 1k, 10k, 100k: the N in the JSON keys."""
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def pss_mb(pid: int) -> float:
    """Proportional set size of process `pid` (Linux): its own pages plus its share of shared ones."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        fields = dict(line.split(":", 1) for line in rollup if ":" in line)
    return int(fields["Pss"].split()[0]) / 1024


def _worker_pid(worker: object) -> int:
    """Run in an env-worker actor: its process id."""
    return os.getpid()


def _step_randomly(worker: object, steps: int, seed: int) -> float:
    """Run in an env-worker actor: `steps` batch steps of all its envs with uniform random actions; seconds taken."""
    env = worker.env  # type: ignore[attr-defined]
    rng = np.random.default_rng([seed, worker.env_offset])  # type: ignore[attr-defined]
    start = time.perf_counter()
    for _ in range(steps):
        env.step(rng.uniform(env.action_low, env.action_high, (env.num_envs, env.action_dim)))
    return time.perf_counter() - start


def wait_until_gone(pids: list[int], timeout_s: float = 60.0) -> None:
    """Wait until processes `pids` have exited, so the next size starts from zero with their memory back."""
    deadline = time.monotonic() + timeout_s
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def scale_once(num_envs: int, workers: int, seconds: float, store: str) -> dict[str, float]:
    """From zero (no Ray) to the first batch step of `num_envs` HalfCheetahs on `workers` env-worker actors, then
    the actors' Pss and the env steps per second of random actions. Shuts its Ray down before returning."""
    cfg = build_control_config("tiny", run_name=f"bench-scale-{num_envs}", store=store, env="HalfCheetah-v5",
                       num_workers=workers, envs_per_worker=num_envs // workers, num_ranks=1,
                       hyperparameters={"minibatch_size": 16})  # divides every batch; nothing is trained here
    available_before = available_gb()
    start = time.perf_counter()
    ensure_ray(actor_cpus(cfg))
    ray_s = time.perf_counter() - start
    pool, pids = EnvWorkerPool(cfg), []
    try:
        pids = pool.call_each(_worker_pid)  # answers once every actor holds its envs
        ready_s = time.perf_counter() - start
        pool.call_each(_step_randomly, 1, 0)
        first_step_s = time.perf_counter() - start
        result = {"first_step_s": first_step_s, "ray_s": ray_s, "actors_ready_s": ready_s - ray_s,
                  "step_s": first_step_s - ready_s, "actors_pss_mb": sum(pss_mb(pid) for pid in pids),
                  "available_drop_gb": available_before - available_gb()}
        one_step_s = max(pool.call_each(_step_randomly, 1, 1))
        steps = max(2, math.ceil(seconds / one_step_s))
        timer = time.perf_counter()
        pool.call_each(_step_randomly, steps, 2)
        result["steps_per_s"] = num_envs * steps / (time.perf_counter() - timer)
        return result
    finally:
        pool.shutdown()
        ray.shutdown()
        wait_until_gone(pids)


def torch_import_s() -> float:
    """Seconds a fresh Python process takes to import torch, as every env-worker actor does."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def scale(sizes: list[int], workers: int, seconds: float) -> dict[str, object]:
    """`scale_once` for each size after a baseline of one env per actor; the `scale_*` JSON keys."""
    out: dict[str, object] = {"scale_workers": workers, "scale_torch_import_s": round(torch_import_s(), 2)}
    with tempfile.TemporaryDirectory(prefix="gymflow-bench-scale-") as store:
        base = scale_once(workers, workers, 0.0, f"file://{store}")
        out["scale_baseline_actors_pss_mb"] = round(base["actors_pss_mb"])
        print(f"baseline, 1 env on each of {workers} actors: first step {base['first_step_s']:.1f} s from zero, "
              f"actors' Pss {base['actors_pss_mb']:.0f} MB; torch import {out['scale_torch_import_s']} s per actor",
              flush=True)
        for n in sizes:
            key = f"scale_{size_label(n)}"
            need_gb = n * ENV_MEMORY_GB + workers * ACTOR_MEMORY_GB + RAY_MEMORY_GB
            if n % workers or need_gb > 0.95 * available_gb():
                out[f"{key}_s"] = (f"skipped: {n} envs need ~{need_gb:.1f} GB, {available_gb():.1f} GB available"
                                   if n % workers == 0 else f"skipped: {n} envs do not split over {workers} actors")
                print(f"N {n}: {out[f'{key}_s']}", flush=True)
                continue
            r = scale_once(n, workers, seconds, f"file://{store}")
            kb_per_env = (r["actors_pss_mb"] - base["actors_pss_mb"]) * 1024 / (n - workers)
            out[f"{key}_s"] = round(r["first_step_s"], 2)
            out[f"{key}_kb_per_env"] = round(kb_per_env, 1)
            out[f"{key}_steps_per_s"] = round(r["steps_per_s"])
            out[f"{key}_detail"] = {k: round(v, 2) for k, v in r.items()}
            print(f"N {n:>7}: first step {r['first_step_s']:6.1f} s from zero (ray {r['ray_s']:.1f}, actors ready "
                  f"{r['actors_ready_s']:.1f}, step {r['step_s']:.2f}); {kb_per_env:6.1f} KB per env (actors' Pss, "
                  f"{r['actors_pss_mb'] / 1024:.2f} GB; MemAvailable -{r['available_drop_gb']:.2f} GB); "
                  f"{r['steps_per_s']:7.0f} env steps/s", flush=True)
    out.setdefault("scale_100k_s", "not measured: 100000 not in --scale-sizes")
    return out


def run(sizes: list[int], workers: int | None, seconds: float) -> None:
    """`scale` on `workers` actors (default: one per core), printing its figures and, last, its JSON line."""
    cores = len(os.sched_getaffinity(0))
    print(f"cores {cores}; HalfCheetah-v5 envs from zero to their first batch step; {seconds} s of stepping")
    print(json.dumps({"cores": cores, **scale(sizes, workers or cores, seconds)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SCALE_SIZES, help="comma-separated N")
    parser.add_argument("--workers", type=int, help="env-worker actors (default: one per core)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time of the env steps per second")
    args = parser.parse_args()
    use_private_temp_dir("gymflow-bench-scale-")  # removed at exit, after a failure or SIGTERM too
    run([int(n) for n in args.sizes.split(",")], args.workers, args.seconds)


if __name__ == "__main__":
    main()
