"""The other direction: an OpenEnv server as an agent env of `train-agent` (`--env openenv:<url>`). gymflow's own
server serves CalcTool-v0; a run on it through OpenEnv's client trains the same weights to the bit as a run on the
local env (the same prompts, rewards and tokens), and a name or setup the run cannot use gets a clear error. An env
of OpenEnv's own server (openenv-core's `create_app`) plays through the same adapter."""
from __future__ import annotations

import pytest
from openenv.core import Action, Environment, Observation, State, create_app

from rl_core.config.common import FieldProblem
from rl_core.envs.agent import make_agent_env, validate_agent_env_name
from rl_core.envs.agent.openenv_task import TOKEN_VARIABLE
from rl_core.runtime.loopback_server import LoopbackServer
from rl_core.runtime.serving import EnvService
from tests.serving.conftest import serve_config

SEED = 7


@pytest.fixture(scope="module")
def served(local_ray: None):
    with EnvService(serve_config(tasks=["CalcTool-v0"], shard_envs=512)) as service:
        yield service


@pytest.fixture
def token(served: EnvService, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_VARIABLE, served.token)
    return served.token


def test_an_episode_through_the_server_is_the_local_envs(served: EnvService, token: str) -> None:
    remote, local = make_agent_env(f"openenv:{served.base_url}?task=CalcTool-v0"), make_agent_env("CalcTool-v0")
    assert (remote.alphabet, remote.max_turns, remote.stop) == (local.alphabet, local.max_turns, local.stop)
    for seed in (0, 3):
        assert remote.reset(seed) == local.reset(seed)
        for action in [*local.demonstration(seed)[:1], "<ans>1</ans>"]:
            assert remote.step(action)[:3] == local.step(action)[:3]
    assert served.sessions.sessions == {} or all(s.num_envs == 0 for s in served.sessions.sessions.values())


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_run_on_the_served_env_trains_the_same_weights_as_on_the_local_one(served, token, tmp_path) -> None:
    from flows.train_agent import train_agent

    settings = {"preset": "tiny", "seed": SEED, "sft_steps": 0, "store": f"file://{tmp_path}/runs"}
    local = train_agent(run_name="local", env="CalcTool-v0", **settings)
    remote = train_agent(run_name="remote", env=f"openenv:{served.base_url}?task=CalcTool-v0", **settings)
    assert remote["policy_sha256"] == local["policy_sha256"]
    assert remote["tokens_generated"] == local["tokens_generated"]


def test_a_name_or_a_run_it_cannot_use_is_refused_clearly(served: EnvService, token: str) -> None:
    from rl_core.algos.grpo.checks import check_agent_run
    from rl_core.config.presets import build_agent_config

    with pytest.raises(ValueError, match=f"leave the token out of the name.*{TOKEN_VARIABLE}"):
        validate_agent_env_name(f"openenv:http://gymflow:secret@127.0.0.1:{served.server.port}")
    with pytest.raises(ValueError, match="expected openenv:<http or ws URL>"):
        validate_agent_env_name("openenv:127.0.0.1")
    name = f"openenv:{served.base_url}?task=CalcTool-v0"
    with pytest.raises(FieldProblem, match="offers no demonstrations.*--sft-steps 0") as refused:
        check_agent_run(build_agent_config("tiny", env=name))
    assert refused.value.field == "sft.steps"
    with pytest.raises(FieldProblem, match="alphabet.*--model-path") as refused:
        check_agent_run(build_agent_config("tiny", env=f"openenv:{served.base_url}", sft_steps=0))
    assert refused.value.field == "env.name"


class SumAction(Action):
    text: str


class SumObservation(Observation):
    prompt: str = ""


class SumEnv(Environment):
    """An OpenEnv environment of OpenEnv's own server (not gymflow's): add two digits, one turn."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self._answer = State(episode_id=None, step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> SumObservation:
        left, right = (seed or 0) % 10, (seed or 0) // 10 % 10
        self._answer, self._state = left + right, State(episode_id=episode_id, step_count=0)
        return SumObservation(prompt=f"{left}+{right}=")

    def step(self, action: SumAction, timeout_s=None, **kwargs) -> SumObservation:
        self._state.step_count += 1
        return SumObservation(prompt="", done=True, reward=float(action.text.strip() == str(self._answer)))

    @property
    def state(self) -> State:
        return self._state


def test_an_env_of_openenvs_own_server_plays_through_the_same_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    with LoopbackServer(create_app(SumEnv, SumAction, SumObservation), name="OpenEnv server") as server:
        env = make_agent_env(f"openenv:http://127.0.0.1:{server.port}?obs_field=prompt&action_field=text&stop=%0A")
        assert (env.alphabet, env.max_turns, env.stop) == ("", 1, ("\n",))
        assert env.reset(47) == "7+4="
        assert env.step("11\n") == ("", 1.0, True, {"correct": True})
        assert env.reset(12) == "2+1=" and env.step("4\n")[1:3] == (0.0, True)
        with pytest.raises(ValueError, match="no text field 'question'.*obs_field"):
            make_agent_env(f"openenv:http://127.0.0.1:{server.port}?obs_field=question").reset(0)
