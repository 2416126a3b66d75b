"""CalcTool-v0: multiply a 3-digit by a 2-digit number, with a calculator the agent may call.

An episode: prompt "374*56=", then the agent either answers `<ans>20944</ans>` (reward 1.0 if exact, else 0.0) or
calls the tool, `<calc>374*56</calc>`, and sees `<out>20944</out>` as the next observation, within `max_turns`
actions. The calculator parses two numbers and one of + - * (never eval); a call it cannot parse answers
`<out>error</out>` and costs a turn. An action that is neither a call nor an answer ends the episode with 0.

Which demonstrations the SFT warm start imitates (`sft_demonstration`): the answer alone (`direct_demonstration`)
for most problems and the tool episode (`demonstration`) for some (`SFT_TOOL_FRACTION`). A tiny model cannot
multiply these in its head, so after SFT it writes answers in the right form that are mostly wrong, and calls the
tool only now and then: RL has a large reward gap to close by discovering that the tool pays. SFT on the tool
episode alone would leave RL nothing to find; SFT that never shows the tool would leave it nothing to sample; and
too few tool episodes teach the call but not the copying of its output (with 1 in 10, a 2-layer 64-wide model after
600 steps of 64 called the tool in 9 of 100 held-out problems and copied the output right in none; with 3 in 10 it
called it in 29 and copied right in 22).
"""
from __future__ import annotations

import re

import numpy as np

from rl_core.envs.agent.arithmetic import OPERATIONS
from rl_core.envs.agent.contract import Split, draw_problem, split_seeds

STREAM = 0x43414C43  # "CALC"
SFT_STREAM = 0x53465443  # "SFTC": which problems the SFT mix shows with the tool
SFT_TOOL_FRACTION = 0.3
MAX_TURNS = 3
ERROR_OUTPUT = "<out>error</out>"
ALPHABET = "".join(sorted(set("0123456789+-*=<>/" + "calc" + "out" + "ans" + "error")))
CALL = re.compile(r"<calc>([0-9]{1,6})([-+*])([0-9]{1,6})</calc>")  # bounded operands: the tool output stays short
ANSWER = re.compile(r"<ans>(-?[0-9]{1,12})</ans>")
STOP = ("</calc>", "</ans>")


def draw_product(rng: np.random.Generator) -> tuple[int, int]:
    """A 3-digit and a 2-digit factor."""
    return int(rng.integers(100, 1000)), int(rng.integers(10, 100))


def product_prompt(factors: tuple[int, int]) -> str:
    """The prompt, e.g. "374*56="."""
    return f"{factors[0]}*{factors[1]}="


def calc_problem(seed: int) -> tuple[int, int]:
    """The factors of problem `seed` (train seeds even, held-out odd; see `contract`)."""
    return draw_problem(STREAM, seed, draw_product, product_prompt)


def first_action(text: str, stop: tuple[str, ...] = STOP) -> str:
    """`text` up to and including the first of the closing tags `stop`, where the generator is meant to stop."""
    ends = [text.index(tag) + len(tag) for tag in stop if tag in text]
    return text[:min(ends)] if ends else text


def calculator(call: str) -> str | None:
    """The output text of a tool call, or None when `call` is not `<calc>A op B</calc>` with op one of + - *."""
    match = CALL.fullmatch(call)
    if match is None:
        return None
    left, op, right = match.groups()
    return f"<out>{OPERATIONS[op](int(left), int(right))}</out>"


class CalcTool:
    """Multi-turn tool use: call `<calc>A*B</calc>` (output `<out>N</out>`) and answer `<ans>N</ans>`."""

    name = "CalcTool-v0"
    alphabet = ALPHABET
    max_turns = MAX_TURNS
    stop = STOP
    sft_stream = SFT_STREAM
    sft_tool_fraction = SFT_TOOL_FRACTION

    def __init__(self) -> None:
        self._answer: int | None = None
        self._turn = 0
        self._tool_calls = 0

    def reset(self, seed: int) -> str:
        """Start problem `seed`; returns its prompt."""
        factors = calc_problem(seed)
        self._answer = factors[0] * factors[1]
        self._turn = 0
        self._tool_calls = 0
        return product_prompt(factors)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Run a tool call (a turn, even when malformed) or score an answer; anything else ends with reward 0."""
        if self._answer is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        text = first_action(action)
        self._turn += 1
        info: dict = {"turn": self._turn}
        if text.startswith("<calc>"):
            self._tool_calls += 1
            output = calculator(text)
            if output is None:
                info["error"] = (f"malformed tool call {text!r}: expected <calc>A*B</calc> with A and B of at most "
                                 "6 digits and one operator of + - *")
            if self._turn < self.max_turns:
                return output or ERROR_OUTPUT, 0.0, False, {**info, "tool_output": True}
            info["error"] = f"no <ans>N</ans> within {self.max_turns} turns"
            return self._end(0.0, info)
        answer = ANSWER.fullmatch(text)
        if answer is None:
            info["error"] = f"expected a tool call <calc>A*B</calc> or an answer <ans>N</ans>, found {text!r}"
            return self._end(0.0, info)
        return self._end(float(int(answer.group(1)) == self._answer), info)

    def _end(self, reward: float, info: dict) -> tuple[str, float, bool, dict]:
        """The last step of an episode."""
        info.update(correct=reward == 1.0, expected=str(self._answer), tool_calls=self._tool_calls)
        self._answer = None
        return "", reward, True, info

    def demonstration(self, seed: int) -> list[str]:
        """The tool episode of problem `seed`: call the calculator, then answer with its output."""
        left, right = calc_problem(seed)
        return [f"<calc>{left}*{right}</calc>", f"<ans>{left * right}</ans>"]

    def direct_demonstration(self, seed: int) -> list[str]:
        """The answer of problem `seed` without the tool."""
        left, right = calc_problem(seed)
        return [f"<ans>{left * right}</ans>"]

    def sft_demonstration(self, seed: int) -> list[str]:
        """What the SFT warm start imitates: the tool episode for a `sft_tool_fraction` of seeds, else the answer."""
        with_tool = np.random.default_rng([self.sft_stream, seed]).random() < self.sft_tool_fraction
        return self.demonstration(seed) if with_tool else self.direct_demonstration(seed)

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split`; train and held-out share neither seeds nor problems."""
        return split_seeds(split, count, start)
