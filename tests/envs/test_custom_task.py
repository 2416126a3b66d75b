"""A task of your own (examples/reaching_arm): registered by importing its module, then usable everywhere by name."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_control_config
from rl_core.envs import Task, get_task, make_batch, register_task


def test_registered_by_importing_its_module_through_the_config() -> None:
    cfg = preflight(build_control_config("tiny", run_name="arm", env_module="examples.reaching_arm",
                                         env="ReachingArm-v0"))
    assert cfg.env.name == "ReachingArm-v0" and get_task("ReachingArm-v0").max_episode_steps == 100


def test_steps_resets_and_round_trips() -> None:
    import examples.reaching_arm as arm

    env = make_batch("ReachingArm-v0", 3, seed=0)
    assert (env.obs_dim, env.action_dim) == (10, 2)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(150, 3, 2))
    for a in actions[:50]:
        result = env.step(a)
    assert (result.reward < 0).all()
    tip_to_target = env.observe()[:, 8:10]
    np.testing.assert_allclose(tip_to_target, arm.fingertip(env) - env.qpos[:, 2:4])
    state = env.get_state()
    straight = [env.step(a) for a in actions[50:]]  # crosses the 100-step time limit
    assert straight[49].truncated.all() and len(straight[49].finished_returns) == 3
    restored = make_batch("ReachingArm-v0", 3, seed=0)
    restored.set_state(state)
    for a, b in zip(straight, (restored.step(a) for a in actions[50:])):
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.reward, b.reward)
    assert isinstance(gymnasium.make_vec("gymflow/ReachingArm-v0", num_envs=2).reset(seed=0)[0], np.ndarray)


def test_an_unimported_task_module_is_named_in_the_error() -> None:
    with pytest.raises(ConfigError, match=r"env.module \(--env-module\): .*'examples.no_such_task' could not be"):
        preflight(build_control_config("tiny", run_name="r", env_module="examples.no_such_task", env="ReachingArm-v0"))


def test_a_name_cannot_be_taken_twice_or_use_the_gym_prefix() -> None:
    task = get_task("HalfCheetah-v5")
    with pytest.raises(ValueError, match="already registered"):
        register_task(Task(**{**task.__dict__, "max_episode_steps": 10}))
    with pytest.raises(ValueError, match="reserved for gymnasium backends"):
        register_task(Task(**{**task.__dict__, "name": "gym:Mine-v0"}))
