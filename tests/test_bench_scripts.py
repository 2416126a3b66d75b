"""Every benchmark under bench/ starts as docs/benchmarks.md runs it (`python bench/<name>.py`): run as a script, its
folder comes first on sys.path, where bench/kernels.py once shadowed the `kernels` package and broke
bench/simulate.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_every_benchmark_script_imports_and_parses_its_arguments() -> None:
    scripts = sorted(s for s in BENCH.glob("*.py") if not s.name.startswith("_"))  # _*.py: a bench's own modules
    assert {s.stem for s in scripts} >= {"checkpoint", "kernels", "ppo", "resume", "simulate"}
    running = {s.name: subprocess.Popen([sys.executable, str(s), "--help"], cwd=BENCH.parent, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in scripts}
    failed = {}
    for name, proc in running.items():
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0 or "usage:" not in out:
            failed[name] = err.strip().splitlines()[-1:] or out[-200:]
    assert not failed, failed


@pytest.mark.slow
def test_simulate_limit_replays_the_env_steps_the_batch_took() -> None:
    """The physical limit is the same physics on the same states: each env step it replays (state, warm start,
    action) ends where the batch's own step ended, bit for bit; only envs the batch reset in between differ."""
    script = """
import json, sys
sys.argv = ["simulate.py"]
sys.path.insert(0, "bench")
import mujoco, mujoco.rollout, numpy as np
import simulate
from rl_core.envs import BatchedMujocoEnv, get_task
env = BatchedMujocoEnv(get_task("Ant-v5"), 16, seed=0, nthread=1)
actions = simulate.random_actions("Ant-v5", 16)
for a in actions[:20]:
    env.step(a)
episodes = int(env.episode_index.sum())
steps = simulate.record_steps(env, actions[:8])
states, _ = mujoco.rollout.rollout(env.model, mujoco.MjData(env.model), steps.full_physics, steps.controls,
                                   initial_warmstart=steps.warmstart)
equal = (states[:-16, -1] == steps.full_physics[16:]).all(axis=1)
print(json.dumps({"equal": int(equal.sum()), "compared": int(equal.size),
                  "resets": int(env.episode_index.sum()) - episodes}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=BENCH.parent, text=True, capture_output=True, check=False,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compared"] == 7 * 16
    assert out["equal"] >= out["compared"] - out["resets"] and out["equal"] > 0.8 * out["compared"], out


@pytest.mark.slow
def test_sweep_bench_runs_its_three_parts_at_their_smallest() -> None:
    """Two members together and in turn, a queue of three through two slots, a fork of a 3-version run: the JSON
    carries every figure, both sides trained the same weights, every queued member completed and verifies."""
    command = [sys.executable, str(BENCH / "sweep.py"), "--members", "2", "--iterations", "1", "--queued", "3",
               "--queue-limit", "2", "--versions", "3", "--params", "1000"]
    proc = subprocess.run(command, cwd=BENCH.parent, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"concurrent_over_sequential", "concurrent_env_steps_per_s", "sequential_env_steps_per_s", "queued_s",
            "fork_bytes_fraction", "fork_s", "copy_s", "ray_start_s", "timed"} <= out.keys()
    assert out["identical_work"] and out["concurrent_env_steps_per_s"] > 0 and out["sequential_env_steps_per_s"] > 0
    assert out["queued_completed"] == 3 and out["queued_all_verified"]
    assert 0 < out["fork_bytes"] < out["fork_run_bytes"]
