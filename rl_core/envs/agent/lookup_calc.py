"""LookupCalc-v0: the price of an item times a quantity, with two tools: a price list and a calculator.

An episode: prompt "$17*56=" (the price of item 17, times 56). The agent looks the price up, `<look>17</look>`, and
sees `<out>374</out>`; multiplies, `<calc>374*56</calc>`, and sees `<out>20944</out>`; answers `<ans>20944</ans>`
(reward 1.0 if exact, else 0.0), within `max_turns` actions. Two tools in one episode, each result feeding the next
call: the task an agent program with OpenAI tool calling is written for (`examples/agents/tool_agent.py`); the step
contract plays it too, turn by turn. A tool call it cannot parse, or an item not on the list, answers
`<out>error</out>` and costs a turn; an action that is neither a call nor an answer ends the episode with 0.

The price list is fixed (`CATALOGUE`, 100 items), so a model could learn some prices by heart; it cannot learn the
products, which is what the calculator is for. The SFT warm start imitates the tool episode for
`SFT_TOOL_FRACTION` of the problems and the bare answer for the rest, as CalcTool's does: after it the model answers
in the right form, mostly wrong, and uses the tools now and then; RL finds that the tools pay.

`TOOLS` are the tools' OpenAI function schemas and `TOOL_FORMAT` how the character model writes their calls and reads
their results, so the OpenAI endpoint turns `<look>17</look>` into a `tool_calls` entry and a `tool` message back into
`<out>374</out>`, with not one token changed.
"""
from __future__ import annotations

import re

import numpy as np

from rl_core.envs.agent.calc_tool import ANSWER, CalcTool, calculator, first_action
from rl_core.envs.agent.contract import draw_problem
from rl_core.envs.agent.tagged_tools import TaggedTool, TaggedTools

STREAM = 0x4C4F4F4B  # "LOOK"
SFT_STREAM = 0x5346544C  # "SFTL": which problems the SFT mix shows with the tools
SFT_TOOL_FRACTION = 0.3
MAX_TURNS = 4  # look up, multiply, answer, and one turn to spare
ITEMS = 100
CATALOGUE: dict[str, int] = {f"{item:02d}": int(price) for item, price in
                             enumerate(np.random.default_rng(STREAM).integers(100, 1000, size=ITEMS))}
"""Item ("00".."99") -> its price, the same on every machine."""
ALPHABET = "".join(sorted(set("0123456789+-*=<>/$" + "calc" + "look" + "out" + "ans" + "error")))
STOP = ("</look>", "</calc>", "</ans>")
TOOL_FORMAT = TaggedTools((TaggedTool("lookup", "item", "<look>", "</look>"),
                           TaggedTool("calculator", "expression", "<calc>", "</calc>")), "<out>", "</out>")
TOOLS: tuple[dict, ...] = (
    {"type": "function", "function": {
        "name": "lookup", "description": "The price of an item on the price list.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string", "description": "two digits"}},
                       "required": ["item"]}}},
    {"type": "function", "function": {
        "name": "calculator", "description": "A op B for whole numbers A and B of up to 6 digits, op one of + - *.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
)
LOOKUP = re.compile(r"[0-9]{2}")


def look_up(item: str) -> str | None:
    """The price of `item` as text, or None when it is not on the list."""
    price = CATALOGUE.get(item) if LOOKUP.fullmatch(item) else None
    return None if price is None else str(price)


def calculate(expression: str) -> str | None:
    """`A op B` worked out, or None when it is not two numbers of up to 6 digits and one of + - *."""
    output = calculator(f"<calc>{expression}</calc>")
    return None if output is None else output[len("<out>"):-len("</out>")]


def draw_order(rng: np.random.Generator) -> tuple[str, int]:
    """An item and a 2-digit quantity."""
    return f"{int(rng.integers(ITEMS)):02d}", int(rng.integers(10, 100))


def order_prompt(order: tuple[str, int]) -> str:
    """The prompt, e.g. "$17*56="."""
    return f"${order[0]}*{order[1]}="


def order_problem(seed: int) -> tuple[str, int]:
    """The item and quantity of problem `seed` (train seeds even, held-out odd; see `contract`)."""
    return draw_problem(STREAM, seed, draw_order, order_prompt)


class LookupCalc(CalcTool):
    """Multi-turn use of two tools: `<look>17</look>` and `<calc>374*56</calc>` (output `<out>N</out>`), then
    `<ans>N</ans>`. Ends, scores and splits problems as CalcTool does."""

    name = "LookupCalc-v0"
    alphabet = ALPHABET
    max_turns = MAX_TURNS
    stop = STOP
    sft_stream = SFT_STREAM
    sft_tool_fraction = SFT_TOOL_FRACTION
    tools = TOOLS
    tool_format = TOOL_FORMAT

    def reset(self, seed: int) -> str:
        """Start problem `seed`; returns its prompt."""
        item, quantity = order_problem(seed)
        self._answer = CATALOGUE[item] * quantity
        self._turn = 0
        self._tool_calls = 0
        return order_prompt((item, quantity))

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Run a tool call (a turn, even when malformed) or score an answer; anything else ends with reward 0."""
        if self._answer is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        text = first_action(action, STOP)
        self._turn += 1
        info: dict = {"turn": self._turn}
        called = TOOL_FORMAT.call(text)
        if called is not None:
            self._tool_calls += 1
            tool, argument = called
            output = look_up(argument) if tool.name == "lookup" else calculate(argument)
            if output is None:
                info["error"] = (f"malformed tool call {text!r}: expected <look>NN</look> with an item 00-99 or "
                                 "<calc>A*B</calc> with A and B of at most 6 digits and one operator of + - *")
            if self._turn < self.max_turns:
                return TOOL_FORMAT.result_text(output or "error"), 0.0, False, {**info, "tool_output": True}
            info["error"] = f"no <ans>N</ans> within {self.max_turns} turns"
            return self._end(0.0, info)
        answer = ANSWER.fullmatch(text)
        if answer is None:
            info["error"] = f"expected a tool call (<look>NN</look>, <calc>A*B</calc>) or an answer <ans>N</ans>, " \
                            f"found {text!r}"
            return self._end(0.0, info)
        return self._end(float(int(answer.group(1)) == self._answer), info)

    def demonstration(self, seed: int) -> list[str]:
        """The tool episode of problem `seed`: look the price up, multiply, answer."""
        item, quantity = order_problem(seed)
        price = CATALOGUE[item]
        return [f"<look>{item}</look>", f"<calc>{price}*{quantity}</calc>", f"<ans>{price * quantity}</ans>"]

    def direct_demonstration(self, seed: int) -> list[str]:
        """The answer of problem `seed` without the tools."""
        item, quantity = order_problem(seed)
        return [f"<ans>{CATALOGUE[item] * quantity}</ans>"]
