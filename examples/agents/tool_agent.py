"""A tool agent with OpenAI tool calling: the model calls a price list and a calculator, as many times as it needs,
and this program runs them and hands back their outputs, until the model answers.

    gymflow train-agent --env LookupCalc-v0 --agent examples.agents.tool_agent:run

The program owns the loop and the tools (plain Python functions here; a database or a web service would do, as long
as they answer the same on a rerun). The model writes calls in its own format; gymflow's endpoint hands them over as
`message.tool_calls` and shows the model each `tool` message the way it reads tool output, so the tokens trained on
are exactly the ones sampled. A reply holding text besides its calls is taken as the answer (and scored): the task
asks for one call or one answer per turn.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from rl_core.envs.agent.lookup_calc import calculate, look_up
from rl_core.envs.agent.programs import AgentContext, Result

TOOLS: dict[str, Callable[[str], str | None]] = {"lookup": look_up, "calculator": calculate}
"""Each tool takes its one string argument and answers text, or None for input it cannot use."""


async def run(ctx: AgentContext) -> Result:
    client = ctx.client()  # a stock openai.AsyncOpenAI at this episode's URL
    messages: list[dict] = [{"role": "user", "content": ctx.problem.prompt}]
    called: list[str] = []
    try:
        for _ in range(ctx.env.max_turns):
            reply = await client.chat.completions.create(
                model=ctx.model, messages=messages, tools=list(ctx.tools), stop=list(ctx.stop),
                extra_body={"include_stop_str_in_output": True})
            message = reply.choices[0].message
            if not message.tool_calls or message.content:
                _, reward, _, info = ctx.env.step(message.content or "")
                return Result(float(reward), correct=bool(info.get("correct", False)), info={**info, "called": called})
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}))
            for call in message.tool_calls:
                called.append(call.function.name)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": _run_tool(call.function)})
    finally:
        await client.close()
    return Result(0.0, info={"error": f"no answer within {ctx.env.max_turns} turns", "called": called})


def _run_tool(function) -> str:
    """A call's output, or "error" for a tool this program does not have or arguments it cannot use."""
    tool = TOOLS.get(function.name)
    try:
        arguments = json.loads(function.arguments)
    except ValueError:
        return "error"
    if tool is None or not isinstance(arguments, dict) or len(arguments) != 1:
        return "error"
    return tool(str(next(iter(arguments.values())))) or "error"
