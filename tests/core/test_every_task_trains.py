"""Every registered task (and a gymnasium backend) goes through what one control-flow iteration does.

Collection with the policy, GAE scoring and one PPO epoch, in-process (no Prefect, no Ray), so a task whose
sizes, action range or outputs do not fit the learner fails here in seconds rather than in a flow run.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.algos.base import algorithm_of, build_learner
from rl_core.config.presets import build_control_config
from rl_core.envs import make_batch, task_names

NUM_ENVS, STEPS = 4, 16  # the tiny preset's envs per worker and steps


@pytest.mark.parametrize("name", task_names() + ["gym:Pendulum-v1"])
def test_collect_score_and_update(name: str) -> None:
    """The phase functions the flow's steps call (collect, score, update) on every task."""
    cfg = build_control_config("tiny", run_name="r", env=name, num_workers=1, hyperparameters={"update_epochs": 1})
    algorithm, learner = algorithm_of(cfg), build_learner(cfg)
    env = make_batch(name, NUM_ENVS, seed=0)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    arrays, meta = algorithm.collect(cfg, learner.policy, env, algorithm.initial_carry(NUM_ENVS), 0, 0)
    assert arrays["obs"].shape == (STEPS, NUM_ENVS, env.obs_dim)
    assert arrays["actions"].shape == (STEPS, NUM_ENVS, env.action_dim)
    assert np.isfinite(arrays["rewards"]).all() and meta["env_steps"] == STEPS * NUM_ENVS

    metrics = learner.update(algorithm.score(cfg, [arrays], [meta]), 0)
    assert np.isfinite(list(metrics.values())).all()
    after = learner.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{name}: the update changed nothing"


def test_actions_are_clipped_to_the_task_range() -> None:
    """Humanoid's torques are bounded at +-0.4: a policy's larger samples reach the physics clipped."""
    env = make_batch("Humanoid-v5", 2, seed=0)
    assert np.allclose(env.action_low, -0.4) and np.allclose(env.action_high, 0.4)
    env.step(np.full((2, env.action_dim), 5.0))
    assert np.allclose(env.get_state()["physics.ctrl"], 0.4)
