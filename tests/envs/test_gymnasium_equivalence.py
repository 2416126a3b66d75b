"""Every batched task must be gymnasium's v5 task, step for step, and its batch state must round-trip exactly.

Alignment with gymnasium (what "the same" means here):
- Initial state: identical seeded noise, not copied state. Our env i's episode e draws its reset noise from
  `default_rng([seed, i, e])`; before each reset of the reference env we give it that same generator
  (`unwrapped.np_random`), so both draw the same qpos/qvel and the reset distributions are compared too.
- Auto-reset: our batch resets an env inside the step that ends its episode, returning the last observation in
  `final_obs` and the new episode's first one in `obs` (stable-baselines3 style). The reference is a plain
  `gymnasium.make` env, so when it reports terminated or truncated we reset it ourselves with the next episode's
  generator and compare its reset observation with our `obs`. Terminating tasks therefore go through many
  episodes within the 1000 compared steps per env.
- Truncation: when an episode terminates on the very step that reaches the time limit, gymnasium's TimeLimit
  reports truncated=True as well; we report truncated=False (the limit did not cut the episode short, so no
  value bootstrap), hence the expected flag is `truncated and not terminated`.
- Actions: drawn inside the action range. Out-of-range actions are clipped by our env before the control cost,
  while gymnasium charges the unclipped action (MuJoCo clamps the control either way, so physics agree).
"""
from __future__ import annotations

import numpy as np
import pytest

from rl_core.envs import BatchedMujocoEnv, get_task

gym = pytest.importorskip("gymnasium")

TASKS = [
    "HalfCheetah-v5",
    "Hopper-v5",
    "Walker2d-v5",
    "Ant-v5",
    "Humanoid-v5",
    "Swimmer-v5",
    "InvertedPendulum-v5",
]
TERMINATING = {"Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "InvertedPendulum-v5"}
ATOL = 1e-6
SEED = 11
NUM_ENVS = 2
STEPS = 1000


def _reset_reference(reference: gym.Env, env_index: int, episode: int) -> np.ndarray:
    """Reset `reference` with the generator our env `env_index` uses for `episode`; return its first observation."""
    reference.unwrapped.np_random = np.random.default_rng([SEED, env_index, episode])
    obs, _ = reference.reset()
    return obs


@pytest.mark.parametrize("name", TASKS)
def test_matches_gymnasium_v5(name: str) -> None:
    """Same reset noise, same actions, 1000 steps per env: equal observations, rewards, terminated, truncated."""
    task = get_task(name)
    env = BatchedMujocoEnv(task, num_envs=NUM_ENVS, seed=SEED)
    references = [gym.make(name) for _ in range(NUM_ENVS)]
    episodes = [0] * NUM_ENVS
    first = np.stack([_reset_reference(ref, i, 0) for i, ref in enumerate(references)])
    np.testing.assert_allclose(env.observe(), first, rtol=0, atol=ATOL)
    assert env.obs_dim == references[0].observation_space.shape[0]
    assert env.action_dim == references[0].action_space.shape[0]
    np.testing.assert_allclose(references[0].action_space.low, task.action_low)
    np.testing.assert_allclose(references[0].action_space.high, task.action_high)

    rng = np.random.default_rng(0)
    terminations = 0
    for t in range(STEPS):
        action = rng.uniform(task.action_low, task.action_high, size=(NUM_ENVS, env.action_dim))
        result = env.step(action)
        for i, reference in enumerate(references):
            ref_obs, ref_reward, ref_term, ref_trunc, _ = reference.step(action[i])
            where = f"{name} env {i} step {t} episode {episodes[i]}"
            ended = result.terminated[i] or result.truncated[i]
            obs = result.final_obs[i] if ended else result.obs[i]
            np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=ATOL, err_msg=where)
            assert abs(result.reward[i] - ref_reward) <= ATOL, where
            assert bool(result.terminated[i]) == ref_term, where
            assert bool(result.truncated[i]) == (ref_trunc and not ref_term), where
            if ref_term or ref_trunc:
                terminations += ref_term
                episodes[i] += 1
                reset_obs = _reset_reference(reference, i, episodes[i])
                np.testing.assert_allclose(result.obs[i], reset_obs, rtol=0, atol=ATOL, err_msg=f"{where} reset")
    if name in TERMINATING:
        assert terminations >= NUM_ENVS, f"{name}: random actions should end several episodes early"
    else:
        assert episodes == [1] * NUM_ENVS, f"{name}: only the 1000-step time limit ends an episode"


@pytest.mark.parametrize("name", TASKS)
def test_state_round_trip_is_bit_exact(name: str) -> None:
    """Capture mid-run, restore into a fresh batch: the observation and every later step are bit-identical."""
    task = get_task(name)
    env = BatchedMujocoEnv(task, num_envs=3, seed=7)
    rng = np.random.default_rng(1)
    actions = rng.uniform(task.action_low, task.action_high, size=(300, 3, env.action_dim))
    for a in actions[:100]:
        env.step(a)
    state = env.get_state()
    observed = env.observe()
    straight = [env.step(a) for a in actions[100:]]

    restored = BatchedMujocoEnv(task, num_envs=3, seed=7)
    restored.set_state(state)
    assert np.array_equal(restored.observe(), observed)
    resumed = [restored.step(a) for a in actions[100:]]
    for t, (a, b) in enumerate(zip(straight, resumed)):
        for field in ("obs", "reward", "terminated", "truncated", "final_obs"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), f"{name} step {t}: {field}"
    final_a, final_b = env.get_state(), restored.get_state()
    assert all(np.array_equal(final_a[key], final_b[key]) for key in final_a)


def test_restore_rejects_a_state_missing_derived_fields() -> None:
    """An Ant state without its contact forces cannot continue exactly, so restoring it must fail loudly."""
    task = get_task("Ant-v5")
    state = BatchedMujocoEnv(task, num_envs=2, seed=0).get_state()
    del state["derived.cfrc_ext"]
    with pytest.raises(ValueError, match="derived.cfrc_ext: missing"):
        BatchedMujocoEnv(task, num_envs=2, seed=0).set_state(state)


def test_unknown_task_error_lists_every_task() -> None:
    with pytest.raises(KeyError) as error:
        get_task("Hopper-v4")
    assert all(name in str(error.value) for name in TASKS)
