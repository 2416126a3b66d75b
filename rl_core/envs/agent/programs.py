"""The agent-owned contract: an agent is a plain async Python function that owns its loop and calls a stock OpenAI
client; gymflow serves the client's endpoint and records every call token-exact.

    async def run(ctx: AgentContext) -> Result:
        client = ctx.client()  # or openai.AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key)
        reply = await client.chat.completions.create(model=ctx.model, messages=[{"role": "user",
                                                                                 "content": ctx.problem.prompt}])
        _, reward, _, info = ctx.env.step(reply.choices[0].message.content or "")
        return Result(reward, correct=bool(info.get("correct")), info=info)

`--agent module:callable` names it (a class is instantiated once per process, then its `run` is called). The problem
comes from the run's env (`--env`), reset to the episode's problem: `ctx.env.step(text)` scores an answer with the
env's own scorer, so every registered env is a task for programs too.

What a program must do to resume exactly (a rollout that died mid-episode re-runs the program from its start and
answers the calls it already made from the store): its requests may depend only on the problem and on the replies
it got. No wall-clock, no unseeded randomness, no tool whose answer changes between runs. A program that breaks
this still trains: the first request that differs from the record is counted as a divergence and generated anew.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rl_core.envs.agent.contract import AgentEnv, Split


@dataclass(frozen=True)
class Problem:
    """The episode's problem: its seed, its split and the env's prompt for it."""

    seed: int
    split: Split
    prompt: str


@dataclass(frozen=True)
class AgentContext:
    """What a program gets: the problem, the env that scores it, and where its model answers."""

    problem: Problem
    env: AgentEnv
    """The run's env, reset to the problem: `env.step(text)` scores an answer (reward, done, info)."""
    base_url: str
    """This episode's endpoint (`/s/<session>/v1`): `openai.AsyncOpenAI(base_url=ctx.base_url, api_key=...)`."""
    api_key: str
    """The run's random token: the endpoint refuses any other."""
    model: str
    """The model name the endpoint serves (`GET /v1/models`)."""
    stop: tuple[str, ...] = ()
    """The env's stop strings: where a turn of its answer format ends."""
    tools: tuple[dict[str, Any], ...] = ()
    """OpenAI function schemas of the tools the env offers (`env.tools`, if it has them)."""
    http_client: Any = field(default=None, repr=False)
    """The rollout's shared `httpx.AsyncClient` (in-process transport to the endpoint), used by `client()`."""

    def client(self, **options: Any) -> Any:
        """A stock `openai.AsyncOpenAI` aimed at this episode, on the rollout's shared HTTP client, which hands each
        request to the endpoint's app in this process (no socket). A client built on `base_url` works too, through
        the socket, but with a connection pool and TLS context of its own per episode: more CPU than a call.
        Closing it leaves the shared client open."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, http_client=self.http_client,
                                  **{"max_retries": 0, **options})


@dataclass(frozen=True)
class Result:
    """What a program returns: the episode's reward, whether it solved the problem, and anything to log."""

    reward: float
    correct: bool = False
    info: dict[str, Any] = field(default_factory=dict)


AgentProgram = Callable[[AgentContext], Awaitable[Result]]


def load_agent_program(spec: str) -> AgentProgram:
    """The program `module:callable` names: an async function, or a class whose instances have `async run(ctx)`."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"agent {spec!r}: expected module:callable, e.g. examples.agents.self_check:run")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"agent {spec!r}: module {module_name!r} could not be imported ({err}); it must be "
                         "importable from the working directory or an installed package") from err
    target = getattr(module, name, None)
    if target is None:
        raise ValueError(f"agent {spec!r}: module {module_name!r} has no {name!r}")
    if inspect.isclass(target):
        run = getattr(target(), "run", None)
        if run is None or not inspect.iscoroutinefunction(run):
            raise ValueError(f"agent {spec!r}: class {name} needs an `async def run(self, ctx)` method")
        return run
    if not inspect.iscoroutinefunction(target):
        raise ValueError(f"agent {spec!r}: {name} must be an async function `async def {name}(ctx)` (found "
                         f"{type(target).__name__})")
    return target


async def step_env(ctx: AgentContext) -> Result:
    """The built-in step-env runner: the env's own turn loop as a program. The env's observations are user messages,
    the model's replies assistant messages, each turn ending at the env's stop strings, until the env says done."""
    client = ctx.client()
    messages = [{"role": "user", "content": ctx.problem.prompt}]
    reward, info = 0.0, {}
    try:
        for _ in range(ctx.env.max_turns):
            reply = await client.chat.completions.create(  # the env reads its turn with the stop string it ends at
                model=ctx.model, messages=messages, stop=list(ctx.stop) or None,
                extra_body={"include_stop_str_in_output": True})
            action = reply.choices[0].message.content or ""
            observation, step_reward, done, info = ctx.env.step(action)
            reward += float(step_reward)
            if done:
                break
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
        else:
            info = {**info, "error": f"the episode did not end within max_turns={ctx.env.max_turns}"}
    finally:
        await client.close()
    return Result(reward, correct=bool(info.get("correct", False)), info=info)
