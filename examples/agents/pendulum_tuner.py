"""A pendulum tuner: the agent writes PD gains, runs them through a simulation tool (the env's evaluator: our batched
MuJoCo envs, on the Ray simulation workers in a flow with `--num-workers`), shows the model how long the pole stayed
up and asks for a revised plan, simulates that one too and answers with the better of the two. Two model calls per
episode with simulations in between, in a loop the program owns: what the one-turn step contract of PendulumGains-v0
(one plan, scored, done) cannot express.

    gymflow train-agent --env PendulumGains-v0 --agent examples.agents.pendulum_tuner:run

The reward is the score of the better plan, as a tuner keeps the best gains it measured. Not the second plan's
alone: the SFT warm start imitates the env's one-turn demonstrations (a prompt, then a plan), so a warm-started model
seldom writes a well-formed plan after the feedback (the tiny model of the flow test: 2 episodes in 32). The second
plan's score alone would then be 0 in nearly every group, and GRPO learns nothing from a group of equal rewards. With
the better of the two, the first plan carries the signal from the start and the revision is rewarded when it improves
on it. The cost: a revision that does worse is not penalized.

The feedback is a user message in the chat, "up=0.45:" (the fraction of the episode the pole stayed up) or "no
plan:". It must use only characters of the env's alphabet, because the model cannot read any other (a test checks
every score). It is kept short so the revised plan fits the default 96-token context after the prompt and the first
plan.
"""
from __future__ import annotations

import asyncio

import openai

from rl_core.envs.agent.pendulum_gains import PendulumGains, parse_plan
from rl_core.envs.agent.programs import AgentContext, Result


async def run(ctx: AgentContext) -> Result:
    if not isinstance(ctx.env, PendulumGains):
        raise TypeError(f"pendulum_tuner plays PendulumGains-v0 (--env PendulumGains-v0), not {ctx.env.name}")
    client = ctx.client()  # a stock openai.AsyncOpenAI at this episode's URL
    try:
        messages = [{"role": "user", "content": ctx.problem.prompt}]
        first = await _reply(client, ctx, messages)
        first_up = await simulate(ctx.env, first, ctx.problem.seed)
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": feedback(first_up)}]
        second = await _reply(client, ctx, messages)
    finally:
        await client.close()
    second_up = await simulate(ctx.env, second, ctx.problem.seed)
    reward = max(first_up or 0.0, second_up or 0.0)  # a revision must do strictly better to be the answer
    answered = "second" if (second_up or 0.0) > (first_up or 0.0) else "first"
    return Result(reward, correct=reward == 1.0, info={"first": first, "first_up": first_up, "second": second,
                                                       "second_up": second_up, "answered": answered})


async def simulate(env: PendulumGains, action: str, seed: int) -> float | None:
    """The tool: the fraction of the episode the plan kept the pole up, or None when `action` is no plan. The
    evaluator blocks on the simulation (a Ray call in a flow), so it runs in a thread: the event loop goes on serving
    the other episodes' calls meanwhile. Deterministic (the problem's exact start state), as resuming needs."""
    try:
        plan = parse_plan(action)
    except ValueError:
        return None
    return (await asyncio.to_thread(env.evaluator, [plan], [seed]))[0]


def feedback(up: float | None) -> str:
    """What the model reads after its first plan: its score, or that it wrote no plan (module docstring)."""
    return "no plan:" if up is None else f"up={up:.2f}:"


async def _reply(client: openai.AsyncOpenAI, ctx: AgentContext, messages: list[dict]) -> str:
    reply = await client.chat.completions.create(model=ctx.model, messages=messages, stop=list(ctx.stop) or None,
                                                 extra_body={"include_stop_str_in_output": True})
    return reply.choices[0].message.content or ""
