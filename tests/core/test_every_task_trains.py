"""Every registered task (and a gymnasium backend) goes through what one control-flow iteration does.

Collection with the policy, GAE scoring and one PPO epoch, in-process (no Prefect, no Ray), so a task whose
sizes, action range or outputs do not fit the learner fails here in seconds rather than in a flow run.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_core.algos.advantages import score_experience
from rl_core.algos.learner import PPOLearner
from rl_core.algos.ppo import RolloutBatch, ppo_update, summarize_epochs
from rl_core.algos.rollout import collect_rollout
from rl_core.config import PPOConfig
from rl_core.envs import make_batch, task_names
from rl_core.seeding import action_noise

NUM_ENVS, STEPS = 4, 16
CFG = PPOConfig(update_epochs=1, minibatch_size=32)


@pytest.mark.parametrize("name", task_names() + ["gym:Pendulum-v1"])
def test_collect_score_and_update(name: str) -> None:
    env = make_batch(name, NUM_ENVS, seed=0)
    learner = PPOLearner(env.obs_dim, env.action_dim, CFG, seed=0)
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    noise = action_noise(0, 0, 0, NUM_ENVS, STEPS, env.action_dim)
    arrays, info = collect_rollout(env, learner, STEPS, CFG.gamma, np.zeros(NUM_ENVS), noise)
    assert arrays["obs"].shape == (STEPS, NUM_ENVS, env.obs_dim)
    assert arrays["actions"].shape == (STEPS, NUM_ENVS, env.action_dim)
    assert np.isfinite(arrays["rewards"]).all() and info["env_steps"] == STEPS * NUM_ENVS

    scored = score_experience([arrays], 1.0, CFG.gamma, CFG.gae_lambda)
    batch = RolloutBatch.from_scored(scored)
    metrics = summarize_epochs(ppo_update(learner.model, learner.optimizer, batch, CFG, generator_seed=0,
                                          learning_rate=CFG.learning_rate))
    assert np.isfinite(list(metrics.values())).all()
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{name}: the update changed nothing"


def test_actions_are_clipped_to_the_task_range() -> None:
    """Humanoid's torques are bounded at +-0.4: a policy's larger samples reach the physics clipped."""
    env = make_batch("Humanoid-v5", 2, seed=0)
    assert np.allclose(env.action_low, -0.4) and np.allclose(env.action_high, 0.4)
    env.step(np.full((2, env.action_dim), 5.0))
    assert np.allclose(env.get_state()["physics.ctrl"], 0.4)
