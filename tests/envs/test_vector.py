"""gymnasium interop: `gymnasium.make_vec("gymflow/<task>")` is our batch behind gymnasium's VectorEnv API."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rl_core.envs import BatchedMujocoEnv, GymflowVectorEnv, get_task, task_names


@pytest.mark.parametrize("name", task_names())
def test_every_task_is_registered_with_a_vector_entry_point(name: str) -> None:
    envs = gymnasium.make_vec(f"gymflow/{name}", num_envs=3)
    assert isinstance(envs, GymflowVectorEnv) and envs.num_envs == 3
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    batch = BatchedMujocoEnv(get_task(name), 3, seed=0)
    assert envs.single_observation_space.shape == (batch.obs_dim,)
    assert envs.observation_space.shape == (3, batch.obs_dim) and envs.action_space.shape == (3, batch.action_dim)
    obs, info = envs.reset(seed=0)
    assert envs.observation_space.contains(obs) and info == {}
    np.testing.assert_array_equal(obs, batch.observe())


def test_steps_equal_the_batch_and_report_final_observations() -> None:
    """InvertedPendulum under random actions ends episodes quickly: final_obs and episode stats at those steps."""
    envs = gymnasium.make_vec("gymflow/InvertedPendulum-v5", num_envs=4)
    batch = BatchedMujocoEnv(get_task("InvertedPendulum-v5"), 4, seed=5)
    envs.reset(seed=5)
    envs.action_space.seed(0)
    ended = 0
    for _ in range(60):
        actions = envs.action_space.sample()
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        expected = batch.step(actions.astype(np.float64))
        np.testing.assert_array_equal(obs, expected.obs)
        np.testing.assert_array_equal(rewards, expected.reward)
        np.testing.assert_array_equal(terminations, expected.terminated)
        np.testing.assert_array_equal(truncations, expected.truncated)
        done = terminations | truncations
        if done.any():
            ended += int(done.sum())
            np.testing.assert_array_equal(infos["_final_obs"], done)
            for i in np.flatnonzero(done):
                np.testing.assert_array_equal(infos["final_obs"][i], expected.final_obs[i])
            np.testing.assert_array_equal(infos["episode"]["r"][done], expected.finished_returns)
            assert (infos["episode"]["l"][done] > 0).all()
        else:
            assert infos == {}
    assert ended > 0


def test_reset_with_a_seed_repeats_and_without_one_moves_on() -> None:
    envs = gymnasium.make_vec("gymflow/Hopper-v5", num_envs=2)
    first, _ = envs.reset(seed=3)
    again, _ = envs.reset(seed=3)
    np.testing.assert_array_equal(first, again)
    following, _ = envs.reset()
    assert not np.allclose(following, first)
    other, _ = envs.reset(seed=4)
    assert not np.allclose(other, first)


def test_max_episode_steps_overrides_the_time_limit() -> None:
    envs = gymnasium.make_vec("gymflow/HalfCheetah-v5", num_envs=2, max_episode_steps=5)
    envs.reset(seed=0)
    truncated = [envs.step(np.zeros((2, 6), np.float32))[3] for _ in range(5)]
    assert not any(t.any() for t in truncated[:4]) and truncated[4].all()
