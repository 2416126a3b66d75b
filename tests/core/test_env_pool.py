"""A killed env-worker actor: the step fails with a clear error, and its retry restores the worker exactly."""
from __future__ import annotations

import uuid

import numpy as np
import pytest
import ray

from rl_core.algos.learner import PPOLearner
from rl_core.config import build_config
from rl_core.data import RunLayout, read_tensors, write_tensors
from rl_core.runtime.env_pool import EnvWorkerDied, EnvWorkerPool
from rl_core.runtime.versions import commit_initial, commit_iteration

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("local_ray")]


def _iteration_zero(tmp_path, name: str) -> tuple[EnvWorkerPool, object]:
    cfg = build_config("tiny", run_name=name, store=f"file://{tmp_path}", num_ranks=1)
    commit_initial(cfg, PPOLearner(17, 6, cfg.ppo, cfg.seed).state())
    pool = EnvWorkerPool(cfg)
    parts = pool.simulate(0, 0)
    staged = RunLayout(cfg.run_url).staged_learner(0)
    write_tensors(staged, PPOLearner(17, 6, cfg.ppo, cfg.seed).state())
    commit_iteration(cfg, 0, 0, staged, [p["uri"] for p in parts])
    return pool, cfg


def test_killed_worker_is_replaced_and_restored(tmp_path) -> None:
    pool, _ = _iteration_zero(tmp_path, f"steady-{uuid.uuid4().hex[:6]}")
    steady = [read_tensors(p["uri"])[0] for p in pool.simulate(1, 1)]
    pool.shutdown()

    pool, _ = _iteration_zero(tmp_path, f"killed-{uuid.uuid4().hex[:6]}")
    ray.kill(pool._actor(1), no_restart=True)
    with pytest.raises(EnvWorkerDied, match=r"(?s)env worker 1 .* died.*retry starts a replacement"):
        pool.simulate(1, 1)
    retried = [read_tensors(p["uri"])[0] for p in pool.simulate(1, 1)]
    pool.shutdown()
    for a, b in zip(steady, retried):
        for key in a:
            assert np.array_equal(a[key], b[key]), key
