"""`GymflowVecEnv`: stable-baselines3's VecEnv contract on gymflow's batch, as SB3's own checks and PPO use it.

The reference is what an SB3 user has today: `DummyVecEnv` over `gymnasium.make("<Task>-v5")` (a TimeLimit inside),
with each env given our env i's reset noise for each episode (test_gymnasium_equivalence.py's `_reset_reference`).
"""
from __future__ import annotations

import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_checker import check_env
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecCheckNan, VecMonitor, VecNormalize

from rl_core.envs import task_names
from rl_core.envs.sb3 import GymflowVecEnv
from tests.envs.test_gymnasium_equivalence import ATOL, SEED, _reset_reference

SB3_KEYS = {"TimeLimit.truncated", "terminal_observation"}
"""The infos keys of SB3's auto-reset contract."""


class _BatchResetNoise(gymnasium.Wrapper):
    """gymnasium's env in the place of our env `index`: each reset draws the noise our episode of that env draws."""

    def __init__(self, env: gymnasium.Env, index: int) -> None:
        super().__init__(env)
        self.index, self.episode = index, 0

    def reset(self, **_: object) -> tuple[np.ndarray, dict]:
        obs = _reset_reference(self.env, self.index, self.episode)
        self.episode += 1
        return obs, {}


def test_steps_equal_dummy_vec_env_over_gymnasiums_own() -> None:
    """Hopper with a 30-step limit: observations, rewards, dones, terminal observations and TimeLimit.truncated."""
    num_envs, limit = 3, 30
    venv = GymflowVecEnv("Hopper-v5", num_envs, seed=SEED, max_episode_steps=limit)
    reference = DummyVecEnv([lambda i=i: _BatchResetNoise(gymnasium.make("Hopper-v5", max_episode_steps=limit), i)
                             for i in range(num_envs)])
    obs = venv.reset()
    assert isinstance(obs, np.ndarray) and obs.shape == (num_envs, 11)
    np.testing.assert_allclose(obs, reference.reset(), rtol=0, atol=ATOL)
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(300):
        actions = rng.uniform(-1, 1, size=(num_envs, 3)).astype(np.float32)
        obs, rewards, dones, infos = venv.step(actions)
        ref_obs, ref_rewards, ref_dones, ref_infos = reference.step(actions)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=ATOL, err_msg=f"step {t}")
        assert rewards.dtype == ref_rewards.dtype == np.float32
        np.testing.assert_allclose(rewards, ref_rewards, rtol=1e-6, atol=ATOL, err_msg=f"step {t}")
        np.testing.assert_array_equal(dones, ref_dones, err_msg=f"step {t}")
        for info, ref_info in zip(infos, ref_infos):
            assert info.keys() == ref_info.keys() & SB3_KEYS  # gymnasium's envs add their reward terms
            assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
            if "terminal_observation" in info:
                np.testing.assert_allclose(info["terminal_observation"], ref_info["terminal_observation"], rtol=0,
                                           atol=ATOL, err_msg=f"step {t}")
                ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
    assert ends["terminated"] > 0 and ends["truncated"] > 0, ends


def test_seed_applies_at_the_next_reset_and_reset_moves_on() -> None:
    venv = GymflowVecEnv("Hopper-v5", 2)
    assert venv.seed(3) == [3, 4]
    first = venv.reset()
    venv.step(np.ones((2, 3), np.float32))
    venv.seed(3)
    np.testing.assert_array_equal(venv.reset(), first)
    following = venv.reset()
    assert not np.allclose(following, first)


@pytest.mark.filterwarnings("error")  # VecEnv warns about a missing render_mode, VecMonitor about Monitor-wrapped envs
def test_sb3_vec_wrappers_accept_it() -> None:
    """VecMonitor reports the episodes, VecNormalize normalizes, VecCheckNan finds nothing, under random actions."""
    venv = VecCheckNan(VecNormalize(VecMonitor(GymflowVecEnv("InvertedPendulum-v5", 4))), raise_exception=True)
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (4, 4) and obs.dtype == np.float32  # VecNormalize's
    venv.action_space.seed(0)
    episodes = []
    for _ in range(100):
        obs, _, dones, infos = venv.step(np.stack([venv.action_space.sample() for _ in range(4)]))
        episodes += [info["episode"] for info, done in zip(infos, dones) if done]
        assert all(("terminal_observation" in info) == done for info, done in zip(infos, dones))
    assert episodes and all(e["l"] >= 1 for e in episodes)


@pytest.mark.parametrize("name", task_names())
def test_sb3_check_env_accepts_the_single_env(name: str) -> None:
    """SB3's checker on `gymnasium.make("gymflow/<task>")` warns about nothing it does not warn about for
    gymnasium's own env (InvertedPendulum's unnormalized action range)."""
    found = {}
    for env_id in (f"gymflow/{name}", name):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(gymnasium.make(env_id))
        found[env_id] = {str(w.message) for w in caught}
    assert found[f"gymflow/{name}"] <= found[name]


def _trained_policy(seed: int) -> dict[str, torch.Tensor]:
    model = PPO("MlpPolicy", GymflowVecEnv("HalfCheetah-v5", 8), n_steps=128, batch_size=256, n_epochs=2, seed=seed,
                device="cpu")
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's own would leave an empty /tmp/SB3-<time>
    model.learn(total_timesteps=2048)
    assert model.num_timesteps == 2048
    return model.policy.state_dict()


def test_ppo_trains_and_a_seeded_run_repeats() -> None:
    first, again, other = _trained_policy(0), _trained_policy(0), _trained_policy(1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_attributes_are_shared_and_per_env_objects_are_refused() -> None:
    venv = GymflowVecEnv("HalfCheetah-v5", 3)
    assert venv.get_attr("render_mode") == [None] * 3
    assert venv.get_attr("batch", indices=[2]) == [venv.batch]
    assert not venv.has_attr("no_such_attribute")
    assert venv.env_is_wrapped(Monitor) == [False] * 3
    with pytest.raises(NotImplementedError, match="rows of one batch"):
        venv.set_attr("render_mode", "rgb_array")
    with pytest.raises(NotImplementedError, match="rows of one batch"):
        venv.env_method("reset")
    venv.set_options(None)
    venv.set_options([{}, {}, {}])
    with pytest.raises(NotImplementedError, match="reset options"):
        venv.set_options({"qpos": 0})


def test_clear_errors_for_an_unknown_task_and_actions_of_the_wrong_shape() -> None:
    with pytest.raises(KeyError, match="unknown environment 'HalfCheetah-v4'; known: Ant-v5"):
        GymflowVecEnv("HalfCheetah-v4", 2)
    venv = GymflowVecEnv("HalfCheetah-v5", 2)
    venv.reset()
    with pytest.raises(ValueError, match=r"expected actions of shape \(2, 6\) \(num_envs, action_dim\), found \(6,\)"):
        venv.step(np.zeros(6, np.float32))


def test_gymflow_does_not_import_stable_baselines3() -> None:
    """Only SB3 users import rl_core.envs.sb3; gymflow's envs import without SB3."""
    code = "import sys, rl_core.envs; print('stable_baselines3' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
