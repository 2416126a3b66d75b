"""HalfCheetah on mujoco.batch must be gymnasium's HalfCheetah-v5, and its state must round-trip exactly."""
from __future__ import annotations

import numpy as np
import pytest

from rl_core.envs import BatchedMujocoEnv, get_task

gym = pytest.importorskip("gymnasium")


def test_matches_gymnasium_v5_for_a_full_episode() -> None:
    """Same start state, same actions, 1000 steps: equal observations, rewards, termination and truncation."""
    reference = gym.make("HalfCheetah-v5")
    ref_obs, _ = reference.reset(seed=3)
    env = BatchedMujocoEnv(get_task("HalfCheetah-v5"), num_envs=2, seed=0)
    data = reference.unwrapped.data
    env.qpos[0], env.qvel[0] = data.qpos, data.qvel
    env._batch.forward()
    np.testing.assert_allclose(env.observe()[0], ref_obs, atol=1e-6)
    rng = np.random.default_rng(0)
    for t in range(1000):
        action = rng.uniform(-1, 1, size=(2, 6))
        ref_obs, ref_reward, ref_term, ref_trunc, _ = reference.step(action[0])
        result = env.step(action)
        obs = result.final_obs[0] if (result.terminated[0] or result.truncated[0]) else result.obs[0]
        np.testing.assert_allclose(obs, ref_obs, atol=1e-6, err_msg=f"step {t}")
        assert abs(result.reward[0] - ref_reward) <= 1e-6, f"step {t}"
        assert bool(result.terminated[0]) == ref_term and bool(result.truncated[0]) == ref_trunc, f"step {t}"
    assert ref_trunc and result.truncated[0], "the 1000-step time limit must truncate"


def test_auto_reset_starts_the_next_episode() -> None:
    env = BatchedMujocoEnv(get_task("HalfCheetah-v5"), num_envs=3, seed=1)
    for _ in range(999):
        env.step(np.zeros((3, 6)))
    result = env.step(np.zeros((3, 6)))
    assert result.truncated.all() and len(result.finished_returns) == 3
    assert (env.episode_step == 0).all() and (env.episode_index == 1).all()
    assert not np.allclose(result.obs, result.final_obs)


def test_state_round_trip_is_bit_exact() -> None:
    """Restore a captured state into a new batch; stepping on gives exactly the uninterrupted trajectory."""
    task = get_task("HalfCheetah-v5")
    env = BatchedMujocoEnv(task, num_envs=4, seed=7)
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, size=(1300, 4, 6))
    for a in actions[:400]:
        env.step(a)
    state = env.get_state()
    straight = [env.step(a) for a in actions[400:]]

    restored = BatchedMujocoEnv(task, num_envs=4, seed=7)
    restored.set_state(state)
    resumed = [restored.step(a) for a in actions[400:]]
    for a, b in zip(straight, resumed):  # crosses an auto-reset at step 1000
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.reward, b.reward)
    assert np.array_equal(env.get_state()["physics.qpos"], restored.get_state()["physics.qpos"])


def test_reset_noise_depends_only_on_seed_env_and_episode() -> None:
    task = get_task("HalfCheetah-v5")
    a = BatchedMujocoEnv(task, num_envs=4, seed=5)
    b = BatchedMujocoEnv(task, num_envs=2, seed=5, env_offset=2)
    assert np.array_equal(a.observe()[2:], b.observe())
    c = BatchedMujocoEnv(task, num_envs=4, seed=6)
    assert not np.allclose(a.observe(), c.observe())


def test_restore_rejects_a_state_of_another_shape() -> None:
    task = get_task("HalfCheetah-v5")
    state = BatchedMujocoEnv(task, num_envs=2, seed=0).get_state()
    with pytest.raises(ValueError, match="expected shape"):
        BatchedMujocoEnv(task, num_envs=3, seed=0).set_state(state)


def test_unknown_environment_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="HalfCheetah-v5"):
        get_task("Nope-v0")
