"""Lost work on a crash: SIGKILL the main job at random points, resume it, measure what had to be redone.

Each trial starts `python -m flows.tooling.cli train` in its own process group, kills the group (flow, Prefect
API, Ray) at a random moment after training started, then runs the same command again to finish the run.
Work redone = time since the newest durable artifact (a committed version, a completed step's output, an epoch
checkpoint; not the shards of a simulate that had not finished, which reruns in full) at the moment of the kill, in units of one checkpoint interval (the median time between two
committed versions of an uninterrupted run). Every resumed run must end bit-identical to that run.

    python bench/resume.py [--trials 5] [--iterations 12] [--preset quick] [--seed 0]

Last line: one JSON object with `trials`, `max_lost_over_interval`, `all_bit_identical` and per-trial figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recovery import (  # bench/recovery.py: what a rerun reuses
    commit_times,
    kept_outputs,
)

from rl_core.private_temp import use_private_temp_dir
from rl_core.runtime.local_ray import kill_local_ray_of


def command(args: argparse.Namespace, store: Path, name: str) -> list[str]:
    return [sys.executable, "-m", "flows.tooling.cli", "train", "--preset", args.preset, "--iterations",
            str(args.iterations), "--seed", str(args.seed), "--run-name", name, "--store", f"file://{store}"]


def run_to_end(cmd: list[str], env: dict) -> dict:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True)
    if done.returncode != 0:
        raise SystemExit(f"run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.random_seed)
    work = use_private_temp_dir("gymflow-bench-resume-")  # the runs; removed at exit, after a failure or SIGTERM too
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"),
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(work / "prefect" / "results")}
    store = work / "runs"

    started = time.monotonic()
    reference = run_to_end(command(args, store, "reference"), env)
    commits = commit_times(store / "reference")
    interval = statistics.median(b - a for a, b in zip(commits[1:], commits[2:]))
    print(f"reference: {args.iterations} iterations in {time.monotonic() - started:.1f} s, "
          f"checkpoint interval {interval:.2f} s ({reference['env_steps'] // args.iterations} env steps)")
    batch = reference["env_steps"] // args.iterations

    trials = []
    for trial in range(args.trials):
        name = f"trial-{trial}"
        run_dir = store / name
        proc = subprocess.Popen(command(args, store, name), env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (run_dir / "checkpoints" / "versions" / "00000001.commit").exists():
            if proc.poll() is not None:
                raise SystemExit(f"trial {trial}: the run ended before it was killed")
            time.sleep(0.02)
        delay = rng.uniform(0, interval * (args.iterations - 2))
        time.sleep(delay)
        killed_at = time.time()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kill_local_ray_of(proc.pid)  # Ray workers that were starting can outlive the group
        committed = len(commit_times(run_dir)) - 1
        # The iteration in flight keeps its env steps only if every worker's experience shard was written.
        workers = json.loads((run_dir / "run.json").read_text())["config"]["env"]["num_workers"]
        lost_s = max(0.0, killed_at - max(p.stat().st_mtime for p in kept_outputs(run_dir, workers)))
        shards = list((run_dir / "steps" / f"{committed:06d}").glob("experience-*.safetensors"))
        steps_redone = 0 if len(shards) == workers else batch
        resume_start = time.monotonic()
        resumed = run_to_end(command(args, store, name), env)
        result = {"trial": trial, "killed_after_version": committed, "lost_s": round(lost_s, 3),
                  "lost_over_interval": round(lost_s / interval, 3), "env_steps_redone_at_most": steps_redone,
                  "resume_wall_s": round(time.monotonic() - resume_start, 1),
                  "bit_identical": resumed["policy_sha256"] == reference["policy_sha256"]}
        trials.append(result)
        print(f"trial {trial}: killed after v{committed}, redone {lost_s:.2f} s = {lost_s / interval:.2f} "
              f"intervals, <= {steps_redone} env steps, bit-identical: {result['bit_identical']}")
    print(json.dumps({
        "trials": len(trials),
        "checkpoint_interval_s": round(interval, 3),
        "max_lost_over_interval": max(t["lost_over_interval"] for t in trials),
        "all_bit_identical": all(t["bit_identical"] for t in trials),
        "per_trial": trials,
    }))


if __name__ == "__main__":
    main()
