"""Per-env randomization of mass, friction and damping: off by default, per env, reproducible, restorable."""
from __future__ import annotations

import mujoco
import numpy as np
import pytest

from rl_core.envs import BatchedMujocoEnv, DynamicsRandomization, get_task

SPREAD = (0.7, 1.3)


def _same_start_trajectories(env: BatchedMujocoEnv, steps: int = 30) -> np.ndarray:
    """Put every env in env 0's state, apply the same actions to all; returns the final observations."""
    state = env.get_state()
    env.set_state({k: np.repeat(v[:1], env.num_envs, axis=0) for k, v in state.items()})
    actions = np.random.default_rng(0).uniform(-1, 1, size=(steps, 1, env.action_dim))
    for a in actions:
        result = env.step(np.repeat(a, env.num_envs, axis=0))
    return result.obs


def test_off_by_default_identical_envs_move_identically() -> None:
    env = BatchedMujocoEnv(get_task("HalfCheetah-v5"), 3, seed=0)
    obs = _same_start_trajectories(env)
    assert np.array_equal(obs[0], obs[1]) and np.array_equal(obs[0], obs[2])


@pytest.mark.parametrize("quantity", ["mass", "friction", "damping"])
def test_each_quantity_changes_the_dynamics_per_env(quantity: str) -> None:
    spec = DynamicsRandomization(**{quantity: SPREAD})
    obs = _same_start_trajectories(BatchedMujocoEnv(get_task("HalfCheetah-v5"), 3, seed=0, randomization=spec))
    assert not np.allclose(obs[0], obs[1]) and not np.allclose(obs[1], obs[2])


def test_dynamics_depend_only_on_seed_and_global_env_index() -> None:
    """Envs 2 and 3 of a batch of 4 are envs 0 and 1 of a batch starting at index 2 (how workers split a pool)."""
    spec = DynamicsRandomization.symmetric(0.3)
    task = get_task("Hopper-v5")
    whole = BatchedMujocoEnv(task, 4, seed=2, randomization=spec)
    tail = BatchedMujocoEnv(task, 2, seed=2, env_offset=2, randomization=spec)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(40, 4, whole.action_dim))
    for a in actions:
        expected, result = whole.step(a), tail.step(a[2:])
        assert np.array_equal(expected.obs[2:], result.obs)
    assert np.array_equal(whole.body_mass, BatchedMujocoEnv(task, 4, seed=2, randomization=spec).body_mass)
    assert not np.allclose(whole.body_mass, BatchedMujocoEnv(task, 4, seed=3, randomization=spec).body_mass)
    ratio = whole.body_mass[:, 1:] / BatchedMujocoEnv(task, 1, seed=0).body_mass[0, 1:]  # body 0 is the world
    assert ((0.7 <= ratio) & (ratio <= 1.3)).all() and ratio.std() > 0.1


@pytest.mark.parametrize("name", ["HalfCheetah-v5", "Ant-v5", "Humanoid-v5"])
def test_state_round_trip_stays_bit_exact(name: str) -> None:
    """Ant and Humanoid also exercise the per-env models behind the contact forces and centre of mass."""
    task = get_task(name)
    spec = DynamicsRandomization.symmetric(0.2)
    env = BatchedMujocoEnv(task, 3, seed=7, randomization=spec)
    actions = np.random.default_rng(1).uniform(task.action_low, task.action_high, size=(120, 3, env.action_dim))
    for a in actions[:60]:
        env.step(a)
    state = env.get_state()
    straight = [env.step(a) for a in actions[60:]]
    restored = BatchedMujocoEnv(task, 3, seed=7, randomization=spec)
    restored.set_state(state)
    for t, (a, b) in enumerate(zip(straight, [restored.step(a) for a in actions[60:]])):
        for field in ("obs", "reward", "terminated", "truncated", "final_obs"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), f"{name} step {t}: {field}"


@pytest.mark.parametrize("randomization", [None, DynamicsRandomization.symmetric(0.3)])
def test_episodes_start_from_the_state_reset_data_leaves(randomization: DynamicsRandomization | None) -> None:
    """An episode starts from the stored rows the env writes, not a `Batch.reset` call: each new episode's whole
    integration state (warm start, time, controls, applied forces included) must be what `mj_resetData` with that
    env's own model leaves, plus the task's reset noise, whatever the episode before left behind."""
    task = get_task("Hopper-v5")
    env = BatchedMujocoEnv(task, 3, seed=4, randomization=randomization)
    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    actions = np.random.default_rng(2).uniform(-1, 1, size=(150, 3, env.action_dim))
    resets = 0
    for a in actions:
        result = env.step(a)
        for i in np.flatnonzero(result.terminated | result.truncated):
            model = env._batch.get_model(int(i))
            data = mujoco.MjData(model)
            mujoco.mj_resetData(model, data)
            rng = np.random.default_rng([4, int(i), int(env.episode_index[i])])
            data.qpos[:], data.qvel[:] = task.reset(model.qpos0.copy(), np.zeros(model.nv), rng)
            expected = np.empty(mujoco.mj_stateSize(model, spec))
            mujoco.mj_getState(model, data, expected, spec)
            assert np.array_equal(env._batch.state[i], expected), f"env {i} episode {env.episode_index[i]}"
            resets += 1
    assert resets >= 3, "random actions should end several Hopper episodes"


def test_invalid_ranges_are_refused() -> None:
    with pytest.raises(ValueError, match="mass range must satisfy 0 < low <= high"):
        DynamicsRandomization(mass=(1.2, 0.8))
    with pytest.raises(ValueError, match=r"fraction must be in \[0, 1\)"):
        DynamicsRandomization.symmetric(1.5)
