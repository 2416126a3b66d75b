"""The env service speaks OpenEnv's protocol to OpenEnv's own client class, and a batch session computes exactly what
the same envs compute in process (`make_batch`), however its envs are split over the env hosts."""
from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from openenv.core import GenericEnvClient

from rl_core.envs import make_batch
from rl_core.envs.agent import make_agent_env
from rl_core.runtime.serving import BatchClient, EnvService
from rl_core.runtime.serving.messages import (
    BatchTextObservation,
    BatchVectorObservation,
    TextObservation,
    VectorObservation,
)

pytestmark = pytest.mark.slow


def test_an_openenv_client_plays_a_single_env_episode(service: EnvService) -> None:
    local = make_batch("HalfCheetah-v5", 1, seed=3)
    actions = np.random.default_rng(0).uniform(-1, 1, (5, local.action_dim))
    with GenericEnvClient(base_url=service.client_url).sync() as env:
        first = env.reset(seed=3, episode_id="ep-1")
        assert first.observation["obs"] == local.observe()[0].tolist() and not first.done
        for action in actions:
            result = env.step({"action": action.tolist()})
            expected = local.step(action[None])
            assert result.observation["obs"] == expected.obs[0].tolist()
            assert result.reward == expected.reward[0] and result.done is False
            VectorObservation.model_validate({**result.observation, "reward": result.reward, "done": result.done})
        assert env.state() == {"episode_id": "ep-1", "step_count": 5, "task": "HalfCheetah-v5", "num_envs": 1,
                               "envs_done": 0}


def test_a_single_env_episode_ends_and_the_next_step_needs_a_reset(service: EnvService) -> None:
    with GenericEnvClient(base_url=service.client_url).sync() as env:
        env.reset(task="InvertedPendulum-v5", seed=0)
        for steps in range(1, 200):
            result = env.step({"action": [3.0]})  # full force one way: the pole falls within a few dozen steps
            if result.done:
                break
        assert result.done and result.observation["terminated"] and steps < 200
        with pytest.raises(RuntimeError, match="step after the episode's end.*reset.*SESSION_ERROR"):
            env.step({"action": [0.0]})
        assert env.reset().done is False
        assert env.step({"action": [0.0]}).done is False


def test_a_batch_session_computes_what_make_batch_computes_over_two_hosts(service: EnvService) -> None:
    """100 envs with shard_envs 32: split over both hosts; episodes end (the pendulum falls under random pushes)."""
    n, seed = 100, 5
    local = make_batch("InvertedPendulum-v5", n, seed)
    actions = np.random.default_rng(1).uniform(-3, 3, (30, n, local.action_dim))

    async def play() -> int:
        ended = 0
        async with BatchClient(service.base_url, service.token) as env:
            first = await env.reset(task="InvertedPendulum-v5", num_envs=n, seed=seed)
            np.testing.assert_array_equal(first["observation"]["obs"], local.observe())
            assert first["reward"] is None and first["done"] is False
            assert sorted(service.pool.held_envs()) == [50, 50]
            for action in actions:
                got, want = (await env.step(action))["observation"], local.step(action)
                done = np.flatnonzero(want.terminated | want.truncated)
                np.testing.assert_array_equal(got["obs"], want.obs)
                np.testing.assert_array_equal(got["rewards"], want.reward)
                np.testing.assert_array_equal(got["terminated"], want.terminated)
                np.testing.assert_array_equal(got["ended"], done)
                np.testing.assert_array_equal(got["final_obs"], want.final_obs[done])
                np.testing.assert_array_equal(got["episode_returns"], want.finished_returns)
                ended += done.size
        return ended

    assert asyncio.run(play()) > 0


def test_a_batch_session_over_json_matches_the_binary_frames(service: EnvService, http: httpx.Client) -> None:
    n = 8
    local = make_batch("HalfCheetah-v5", n, seed=2)
    opened = http.post("/reset", json={"num_envs": n, "seed": 2}).json()
    assert opened["observation"]["obs"] == local.observe().tolist()
    action = np.random.default_rng(2).uniform(-1, 1, (n, local.action_dim))
    answer = http.post("/step", json={"action": {"actions": action.tolist()}, "session_id": opened["session_id"]})
    BatchVectorObservation.model_validate({**answer.json()["observation"], "reward": None, "done": False})
    assert answer.json()["observation"]["obs"] == local.step(action).obs.tolist()
    state = http.get("/state", params={"session_id": opened["session_id"]}).json()
    assert state["num_envs"] == n and state["step_count"] == 1


@pytest.mark.parametrize("task", ["Arithmetic-v0", "CalcTool-v0", "LookupCalc-v0", "PendulumGains-v0"])
def test_an_agent_env_plays_its_demonstration_through_an_openenv_client(service: EnvService, task: str) -> None:
    seed = 4
    local = make_agent_env(task)
    with GenericEnvClient(base_url=service.client_url).sync() as env:
        first = env.reset(task=task, seed=seed)
        assert first.observation == {"text": local.reset(seed), "info": {}}
        for text in local.demonstration(seed):
            result = env.step({"text": text})
            answer, reward, done, _ = local.step(text)
            TextObservation.model_validate({**result.observation, "reward": result.reward, "done": result.done})
            assert (result.observation["text"], result.reward, result.done) == (answer, reward, done)
        assert result.done and result.reward == 1.0
        assert env.state()["envs_done"] == 1


def test_a_batch_of_agent_envs_steps_texts_and_takes_null_for_ended_episodes(http: httpx.Client) -> None:
    """CalcTool's demonstrations differ in length, so some episodes end before others."""
    seeds, local = [10, 11, 12], [make_agent_env("CalcTool-v0") for _ in range(3)]
    opened = http.post("/reset", json={"task": "CalcTool-v0", "num_envs": 3, "seed": 10}).json()
    assert opened["observation"]["texts"] == [env.reset(s) for env, s in zip(local, seeds, strict=True)]
    plans = [env.demonstration(s) for env, s in zip(local, seeds, strict=True)]
    done = [False] * 3
    for turn in range(max(map(len, plans))):
        texts = [None if done[i] else plans[i][turn] for i in range(3)]
        answer = http.post("/step", json={"action": {"texts": texts}, "session_id": opened["session_id"]})
        assert answer.status_code == 200, answer.text
        BatchTextObservation.model_validate({**answer.json()["observation"], "reward": None, "done": False})
        done = answer.json()["observation"]["dones"]
    assert all(done) and answer.json()["done"] is True
    assert http.post("/step", json={"action": {"texts": ["1\n", None, None]},
                                    "session_id": opened["session_id"]}).status_code == 409
