"""Any gymnasium env with Box spaces as a backend of the simulate step (`gym:<id>`), and clear errors otherwise."""
from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from rl_core.algos.preflight import preflight
from rl_core.config.common import ConfigError
from rl_core.config.presets import build_control_config
from rl_core.envs import GymnasiumBatch, make_batch


def test_matches_plain_gymnasium_envs_across_episode_ends() -> None:
    """Same seeds and actions: equal observations, rewards, flags, final observations and returns."""
    batch = make_batch("gym:InvertedPendulum-v5", 2, seed=4, env_offset=3)
    assert isinstance(batch, GymnasiumBatch)
    references = [gymnasium.make("InvertedPendulum-v5") for _ in range(2)]
    seeds = [int(np.random.SeedSequence([4, 3 + i, 0]).generate_state(1)[0]) for i in range(2)]
    obs = np.stack([ref.reset(seed=s)[0] for ref, s in zip(references, seeds)])
    np.testing.assert_array_equal(batch.observe(), obs)
    rng = np.random.default_rng(0)
    returns, ended = np.zeros(2), 0
    for _ in range(100):
        action = rng.uniform(-3, 3, size=(2, 1))
        result = batch.step(action)
        for i, ref in enumerate(references):
            ref_obs, ref_reward, ref_term, ref_trunc, _ = ref.step(action[i].astype(np.float32))
            returns[i] += ref_reward
            assert result.reward[i] == ref_reward and result.terminated[i] == ref_term
            if ref_term or ref_trunc:
                np.testing.assert_array_equal(result.final_obs[i], ref_obs)
                assert returns[i] in result.finished_returns
                ref_obs, _ = ref.reset()  # gymnasium's auto-reset continues the env's generator
                returns[i], ended = 0.0, ended + 1
            np.testing.assert_array_equal(result.obs[i], ref_obs)
    assert ended >= 2


def test_action_bounds_come_from_the_space() -> None:
    batch = make_batch("gym:Pendulum-v1", 2, seed=0)
    assert batch.obs_dim == 3 and batch.action_dim == 1
    np.testing.assert_array_equal(batch.action_high, [2.0])


def test_restore_starts_new_episodes_with_a_warning() -> None:
    batch = make_batch("gym:Pendulum-v1", 2, seed=0)
    for _ in range(3):
        batch.step(np.zeros((2, 1)))
    state = batch.get_state()
    restored = make_batch("gym:Pendulum-v1", 2, seed=0)
    with pytest.warns(UserWarning, match="does not resume bit-exactly"):
        restored.set_state(state)
    assert (restored.episode_index == 1).all() and (restored.episode_step == 0).all()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("gym:CartPole-v1", "action space is Discrete"),
        ("gym:Nope-v3", "gymnasium has no env 'Nope-v3'"),
    ],
)
def test_config_refuses_unusable_gym_envs(env: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"env.name \\(--env\\): .*{message}"):
        preflight(build_control_config("tiny", run_name="r", env=env))


def test_config_refuses_randomizing_a_gym_backend() -> None:
    with pytest.raises(ConfigError, match="randomization applies to native tasks only"):
        build_control_config("tiny", run_name="r", env="gym:Pendulum-v1", randomize_dynamics=0.1)
