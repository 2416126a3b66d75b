"""Agent programs on the real endpoint and a real TorchGenerator (the quick preset's model), without Ray: a program
that fails, hangs, never calls the model or calls after its episode ended costs only its own episode; the step-env
runner reproduces the built-in turn loop's trajectories to the bit."""
from __future__ import annotations

import asyncio
import dataclasses

import httpx
import numpy as np
import openai
import pytest

from examples.agents.self_check import run as self_check
from rl_core.algos.grpo.episodes import ROLLOUT_STREAM, EpisodeSpec, run_agent_episodes, sampling_params
from rl_core.algos.grpo.trajectories import TrajectoryBatch
from rl_core.config.presets import build_agent_config
from rl_core.envs.agent import make_agent_env
from rl_core.envs.agent.programs import AgentContext, Result, step_env
from rl_core.generation.torch_generator import TorchGenerator
from rl_core.policies.lm_policy import build_language_model, model_spec, tokenizer_of
from rl_core.runtime.agent.program_rollout import CallLog, ProgramEndpoint, run_programs

COUNTERS = (7, ROLLOUT_STREAM, 0)


@pytest.fixture(scope="module")
def run():
    cfg = build_agent_config("quick", run_name="programs", store="memory://programs")
    model, _ = build_language_model(cfg)
    generator = TorchGenerator(model, version=0)
    endpoint = ProgramEndpoint(cfg, tokenizer_of(cfg), model_spec(cfg).max_position_embeddings)
    yield cfg, (lambda requests: generator.generate(requests, 0)), endpoint
    endpoint.close()


def _specs(cfg, count: int = 6) -> list[EpisodeSpec]:
    seeds = make_agent_env(cfg.env.name).problem_seeds("train", count)
    return [EpisodeSpec(i // 2, i % 2, seed) for i, seed in enumerate(seeds)]


def _programs(cfg, program, endpoint, generate, calls=None, timeout_s: float = 30.0):
    return run_programs(program, _specs(cfg), lambda: make_agent_env(cfg.env.name), endpoint, generate, COUNTERS, 0,
                        "train", timeout_s, calls)


def test_the_step_env_runner_reproduces_the_turn_loops_trajectories(run) -> None:
    cfg, generate, endpoint = run
    tokenizer = tokenizer_of(cfg)
    direct = run_agent_episodes(_specs(cfg), lambda: make_agent_env(cfg.env.name), tokenizer, generate,
                                sampling_params(cfg), COUNTERS, model_spec(cfg).max_position_embeddings, 0)
    programs, metrics = _programs(cfg, step_env, endpoint, generate)
    expected = TrajectoryBatch.from_episodes(direct, tokenizer.pad_id).to_arrays()
    found = TrajectoryBatch.from_episodes(programs, tokenizer.pad_id).to_arrays()
    for name, array in expected.items():
        np.testing.assert_array_equal(found[name], array, err_msg=name)
    assert metrics["failed_programs"] == 0 and metrics["generated_tokens"] == sum(e.generated_tokens for e in direct)


def test_a_client_of_the_programs_own_over_the_socket_gets_the_same_episodes(run) -> None:
    """`ctx.client()` reaches the app in-process; a client built on `ctx.base_url` goes through the server's socket:
    the same app answers, so the same trajectories to the bit."""
    cfg, generate, endpoint = run

    async def own_client(ctx: AgentContext) -> Result:
        async with httpx.AsyncClient() as sockets:  # httpx's own transport: TCP to the server on 127.0.0.1
            return await step_env(dataclasses.replace(ctx, http_client=sockets))

    in_process, _ = _programs(cfg, step_env, endpoint, generate)
    socket, metrics = _programs(cfg, own_client, endpoint, generate)
    assert metrics["failed_programs"] == 0
    assert [(e.segments, e.reward) for e in socket] == [(e.segments, e.reward) for e in in_process]


def test_a_failing_hanging_or_silent_program_costs_only_its_own_episode(run) -> None:
    cfg, generate, endpoint = run
    clean, _ = _programs(cfg, step_env, endpoint, generate)

    async def unruly(ctx: AgentContext) -> Result:
        if ctx.problem.seed == _specs(cfg)[1].problem_seed:
            raise RuntimeError("the agent's own bug")
        if ctx.problem.seed == _specs(cfg)[2].problem_seed:
            await asyncio.sleep(60)
        if ctx.problem.seed == _specs(cfg)[3].problem_seed:
            return Result(1.0, correct=True)  # never calls the model
        return await step_env(ctx)

    episodes, metrics = _programs(cfg, unruly, endpoint, generate, timeout_s=5.0)
    assert metrics["failed_programs"] == 2
    assert episodes[1].reward == 0 and "RuntimeError: the agent's own bug" in episodes[1].info["error"]
    assert episodes[2].reward == 0 and "did not end within 5 s" in episodes[2].info["error"]
    assert episodes[3].segments == [] and episodes[3].info["error"] == "the program never called the model"
    for i in (0, 4, 5):  # the others are untouched
        assert episodes[i].segments == clean[i].segments and episodes[i].reward == clean[i].reward


def test_a_call_after_the_episode_ended_is_refused(run) -> None:
    cfg, generate, endpoint = run
    kept: list[AgentContext] = []

    async def remember(ctx: AgentContext) -> Result:
        kept.append(ctx)
        return await step_env(ctx)

    _programs(cfg, remember, endpoint, generate)
    late = openai.OpenAI(base_url=kept[0].base_url, api_key=kept[0].api_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        late.chat.completions.create(model=kept[0].model, messages=[{"role": "user", "content": "1+1="}])
    wrong = openai.OpenAI(base_url=kept[0].base_url, api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert endpoint.server.base_url_for("x").startswith("http://127.0.0.1:")


def test_a_rollout_whose_generator_failed_resumes_from_the_recorded_calls(run, tmp_path) -> None:
    """The self-check agent calls twice per episode; the generator fails on the second batch. Re-run, every program
    gets its first call answered from the store and only the second generated: the same episodes to the bit."""
    cfg, generate, endpoint = run
    clean, _ = _programs(cfg, self_check, endpoint, generate)
    calls = CallLog(f"file://{tmp_path}/calls", 0)
    answered = []

    def dying(requests):
        if answered:
            raise RuntimeError("the generator died")
        answered.append(len(requests))
        return generate(requests)

    with pytest.raises(RuntimeError, match="the generator died"):
        _programs(cfg, self_check, endpoint, dying, calls)
    resumed, metrics = _programs(cfg, self_check, endpoint, generate, calls)
    assert [(e.segments, e.reward) for e in resumed] == [(e.segments, e.reward) for e in clean]
    assert metrics["replayed_calls"] == answered[0] > 0 and metrics["divergences"] == 0
    assert metrics["generated_tokens"] + metrics["replayed_tokens"] == sum(e.generated_tokens for e in clean)
