"""A killed env-worker actor: the step fails with a clear error, and its retry restores the worker exactly."""
from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import ray

from rl_core.algos.base import build_learner
from rl_core.config.presets import build_control_config
from rl_core.data import RunLayout, read_tensors, write_tensors
from rl_core.runtime.commits import commit_initial, commit_iteration
from rl_core.runtime.control.env_pool import EnvWorkerDied, EnvWorkerPool, env_split

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def _iteration_zero(tmp_path, name: str) -> tuple[EnvWorkerPool, object]:
    cfg = build_control_config("tiny", run_name=name, store=f"file://{tmp_path}", num_ranks=1)
    commit_initial(cfg, build_learner(cfg).state())
    pool = EnvWorkerPool(cfg)
    parts = pool.simulate(0, 0)
    staged = RunLayout(cfg.run_url).staged_learner(0)
    write_tensors(staged, build_learner(cfg).state())
    commit_iteration(cfg, 0, 0, staged, [p["uri"] for p in parts])
    return pool, cfg


@pytest.fixture(scope="module")
def steady(tmp_path_factory, local_ray) -> list[dict]:
    """Iteration 1's experience of an undisturbed pool: what every recovered pool must reproduce."""
    pool, _ = _iteration_zero(tmp_path_factory.mktemp("steady"), "steady")
    parts = [read_tensors(p["uri"])[0] for p in pool.simulate(1, 1)]
    pool.shutdown()
    return parts


def _kill_and_wait(actor, timeout_s: float = 60.0) -> None:
    """Kill an actor and return once calls to it fail: `ray.kill` is asynchronous, and a call sent right after
    it can still be served (CI saw a ping answered after the kill)."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=deadline - time.monotonic())
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"actor still answers {timeout_s:.0f} s after ray.kill")


def test_killed_worker_is_replaced_and_restored(tmp_path, steady) -> None:
    pool, _ = _iteration_zero(tmp_path, f"killed-{uuid.uuid4().hex[:6]}")
    _kill_and_wait(pool._actor(1))
    with pytest.raises(EnvWorkerDied, match=r"(?s)env worker 1 .* died.*retry starts a replacement"):
        pool.simulate(1, 1)
    retried = [read_tensors(p["uri"])[0] for p in pool.simulate(1, 1)]
    pool.shutdown()
    for a, b in zip(steady, retried):
        for key in a:
            assert np.array_equal(a[key], b[key]), key


def test_health_check_replaces_a_dead_worker_which_restores_exactly(tmp_path, steady) -> None:
    pool, _ = _iteration_zero(tmp_path, f"health-{uuid.uuid4().hex[:6]}")
    assert pool.health_check() == []
    _kill_and_wait(pool._actor(0))
    assert pool.health_check() == [0]
    replaced = [read_tensors(p["uri"])[0] for p in pool.simulate(1, 1)]
    pool.shutdown()
    for a, b in zip(steady, replaced):
        for key in a:
            assert np.array_equal(a[key], b[key]), key


def test_resize_between_iterations_restores_every_env_from_the_checkpoint(tmp_path) -> None:
    """Two workers of 4 envs, then 3 workers (3, 3, 2 envs), then 1: each split starts from the same env states."""
    pool, cfg = _iteration_zero(tmp_path, f"resize-{uuid.uuid4().hex[:6]}")
    first_obs = {}
    for workers in (2, 3, 1):
        if workers != pool.num_workers:
            assert pool.resize(workers) > 0
        parts = pool.simulate(1, 1)
        assert [read_tensors(p["uri"])[0]["obs"].shape[1] for p in parts] == env_counts(workers)
        first_obs[workers] = np.concatenate([read_tensors(p["uri"])[0]["obs"][0] for p in parts])
    assert np.array_equal(first_obs[2], first_obs[3]) and np.array_equal(first_obs[2], first_obs[1])
    pool.shutdown()


def env_counts(workers: int) -> list[int]:
    """How env_split shares the tiny preset's 8 envs."""
    return {1: [8], 2: [4, 4], 3: [3, 3, 2]}[workers]


def test_env_split_is_contiguous_and_balanced() -> None:
    assert env_split(8, 3) == [(0, 3), (3, 3), (6, 2)]
    assert env_split(64, 2) == [(0, 32), (32, 32)]
    with pytest.raises(ValueError, match="cannot split 8 envs"):
        env_split(8, 9)
