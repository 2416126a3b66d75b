"""A self-check agent: it drafts an answer, shows the model its draft and the problem again, and answers with the
second reply when that one is a well-formed answer, else with the draft. Two model calls per episode, in an order the
program decides: what the step contract (one reply per env turn) cannot express.

    gymflow train-agent --agent examples.agents.self_check:run
"""
from __future__ import annotations

import openai

from rl_core.envs.agent.programs import AgentContext, Result


async def run(ctx: AgentContext) -> Result:
    client = ctx.client()  # a stock openai.AsyncOpenAI at this episode's URL
    try:
        messages = [{"role": "user", "content": ctx.problem.prompt}]
        draft = await _reply(client, ctx, messages)
        messages += [{"role": "assistant", "content": draft}, {"role": "user", "content": ctx.problem.prompt}]
        second = await _reply(client, ctx, messages)
    finally:
        await client.close()
    answer = second if any(second.endswith(stop) for stop in ctx.stop) else draft
    _, reward, _, info = ctx.env.step(answer)
    return Result(float(reward), correct=bool(info.get("correct", False)), info={"drafted": draft, "answered": answer})


async def _reply(client: openai.AsyncOpenAI, ctx: AgentContext, messages: list[dict]) -> str:
    reply = await client.chat.completions.create(model=ctx.model, messages=messages, stop=list(ctx.stop) or None,
                                                 extra_body={"include_stop_str_in_output": True})
    return reply.choices[0].message.content or ""
