"""`gymnasium.make("gymflow/<task>")`: one env that gymnasium's checker accepts and that steps as gymnasium's own.

Alignment with gymnasium's `<Task>-v5` is test_gymnasium_equivalence.py's (its `_reset_reference` gives the reference
env our env 0's reset noise for each episode). Both envs come from `gymnasium.make`, so both sit in gymnasium's own
`TimeLimit`: terminated and truncated are compared as they are, with no adjustment at the time limit.
"""
from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_core.envs import get_task, task_names
from rl_core.envs.single import GymflowEnv
from tests.envs.test_gymnasium_equivalence import ATOL, SEED, _reset_reference


def _check_env_warnings(env: gymnasium.Env, skip_render_check: bool = False) -> set[str]:
    """The messages of the warnings gymnasium's `check_env` gives for `env`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=skip_render_check)
    return {str(w.message) for w in caught}


@pytest.mark.parametrize("name", task_names())
def test_make_gives_gymnasiums_spaces_time_limit_and_check_env_verdict(name: str) -> None:
    """check_env warns about nothing it does not also warn about for gymnasium's own env (the unbounded observation
    space, InvertedPendulum's unnormalized action range)."""
    env = gymnasium.make(f"gymflow/{name}")
    reference = gymnasium.make(name)
    assert isinstance(env.unwrapped, GymflowEnv)
    assert env.observation_space == reference.observation_space
    assert env.action_space == reference.action_space
    assert env.spec.max_episode_steps == reference.spec.max_episode_steps == get_task(name).max_episode_steps
    assert isinstance(env, gymnasium.wrappers.TimeLimit)
    # the reference's render check would open a window; ours declares no render modes, so it has nothing to render
    assert _check_env_warnings(env.unwrapped) <= _check_env_warnings(reference.unwrapped, skip_render_check=True)


@pytest.mark.filterwarnings("error")  # gymnasium's PassiveEnvChecker warns on what it finds wrong
@pytest.mark.parametrize(("name", "max_episode_steps", "steps"), [
    ("HalfCheetah-v5", None, 1100),  # the registered 1000-step limit, once
    ("Hopper-v5", 40, 600),  # terminations and truncations, often
    ("Ant-v5", 30, 300),  # contact forces in the observation
])
def test_steps_equal_gymnasiums_own(name: str, max_episode_steps: int | None, steps: int) -> None:
    """Same reset noise, same actions: equal observations, rewards, terminated and truncated, across episodes."""
    env = gymnasium.make(f"gymflow/{name}", max_episode_steps=max_episode_steps)
    reference = gymnasium.make(name, max_episode_steps=max_episode_steps)
    obs, info = env.reset(seed=SEED)
    episode = 0
    np.testing.assert_allclose(obs, _reset_reference(reference, 0, episode), rtol=0, atol=ATOL)
    assert info == {}
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        action = rng.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(action)
        ref_obs, ref_reward, ref_terminated, ref_truncated, _ = reference.step(action)
        where = f"{name} step {t} episode {episode}"
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=ATOL, err_msg=where)
        assert abs(reward - ref_reward) <= ATOL, where
        assert (terminated, truncated) == (ref_terminated, ref_truncated), where
        if terminated or truncated:
            ends["terminated"] += terminated
            ends["truncated"] += truncated
            episode += 1
            obs, _ = env.reset()
            np.testing.assert_allclose(obs, _reset_reference(reference, 0, episode), rtol=0, atol=ATOL,
                                       err_msg=f"{where} reset")
    assert ends["truncated"] > 0 and (ends["terminated"] > 0 or name == "HalfCheetah-v5"), ends


def _trajectory(env: gymnasium.Env, actions: np.ndarray) -> np.ndarray:
    """The observations of `actions` from where `env` is, one row a step."""
    return np.stack([env.step(a)[0] for a in actions])


def test_reset_with_a_seed_repeats_and_without_one_moves_on() -> None:
    env = gymnasium.make("gymflow/Hopper-v5")
    actions = np.random.default_rng(1).uniform(-1, 1, size=(5, 3)).astype(np.float32)
    first, _ = env.reset(seed=3)
    first_steps = _trajectory(env, actions)
    again, _ = env.reset(seed=3)
    assert np.array_equal(again, first) and np.array_equal(_trajectory(env, actions), first_steps)
    following, _ = env.reset()
    assert not np.allclose(following, first)
    other, _ = env.reset(seed=4)
    assert not np.allclose(other, first)


def test_the_time_limit_is_gymnasiums_wrapper() -> None:
    """make's max_episode_steps sets it; max_episode_steps=-1 leaves it out, and the env itself never truncates."""
    limited = gymnasium.make("gymflow/HalfCheetah-v5", max_episode_steps=5)
    limited.reset(seed=0)
    truncated = [limited.step(np.zeros(6, np.float32))[3] for _ in range(5)]
    assert truncated == [False] * 4 + [True]
    unlimited = gymnasium.make("gymflow/HalfCheetah-v5", max_episode_steps=-1)
    assert not isinstance(unlimited, gymnasium.wrappers.TimeLimit)
    unlimited.reset(seed=0)
    assert not any(unlimited.step(np.zeros(6, np.float32))[3] for _ in range(1001))


def test_an_unknown_task_names_the_nearest_one() -> None:
    with pytest.raises(gymnasium.error.NameNotFound, match="Did you mean: `HalfCheetah`"):
        gymnasium.make("gymflow/Halfcheetah-v5")


def test_an_action_of_the_wrong_shape_says_which_shape() -> None:
    env = gymnasium.make("gymflow/HalfCheetah-v5")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected an action of shape \(6,\), found \(3,\)"):
        env.step(np.zeros(3, np.float32))


def test_stepping_after_termination_needs_a_reset() -> None:
    """After a terminated episode the batch holds the next one already; stepping on would silently play it."""
    env = gymnasium.make("gymflow/InvertedPendulum-v5")
    env.reset(seed=0)
    terminated = False
    while not terminated:
        terminated = env.step(np.full(1, 3.0, np.float32))[2]
    with pytest.raises(gymnasium.error.ResetNeeded, match="call reset"):
        env.step(np.zeros(1, np.float32))


def test_reset_options_are_refused() -> None:
    env = gymnasium.make("gymflow/HalfCheetah-v5")
    with pytest.raises(ValueError, match="reset options"):
        env.reset(options={"qpos": 0})
