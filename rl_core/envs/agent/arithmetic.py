"""Arithmetic-v0: one turn, answer a sum, difference or small product of 2-digit numbers ("23+58=" -> "81\n").

The smallest agent env: a prompt, one action, an exact-match reward. It checks that a tokenizer, a generator and
a policy-gradient update fit together before a task needs several turns or tools.
"""
from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rl_core.envs.agent.contract import Split, draw_problem, split_seeds

STREAM = 0x41524954  # "ARIT": leads the seed key, so these draws never coincide with another env's
# The operators both this env and CalcTool-v0's calculator apply: never eval(), only these.
OPERATIONS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
ALPHABET = "0123456789+-*=\n"
INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class ArithmeticProblem:
    """`left operator right`, with 10 <= left, right <= 99, or 2 <= right <= 9 for a product."""

    left: int
    operator: str
    right: int

    @property
    def text(self) -> str:
        """The prompt, e.g. "23+58="."""
        return f"{self.left}{self.operator}{self.right}="

    @property
    def answer(self) -> int:
        """The exact result."""
        return OPERATIONS[self.operator](self.left, self.right)


def draw_arithmetic(rng: np.random.Generator) -> ArithmeticProblem:
    """One problem: +, - and * equally likely; a product's second operand is one digit."""
    op = "+-*"[int(rng.integers(3))]
    left = int(rng.integers(10, 100))
    right = int(rng.integers(2, 10)) if op == "*" else int(rng.integers(10, 100))
    return ArithmeticProblem(left, op, right)


def arithmetic_problem(seed: int) -> ArithmeticProblem:
    """Problem `seed` (train seeds even, held-out odd; see `contract`)."""
    return draw_problem(STREAM, seed, draw_arithmetic, lambda problem: problem.text)


class Arithmetic:
    """Single turn: the action is the integer, ended by a newline (or the end of the text); reward 1 if exact."""

    name = "Arithmetic-v0"
    alphabet = ALPHABET
    max_turns = 1
    stop = ("\n",)

    def __init__(self) -> None:
        self._problem: ArithmeticProblem | None = None

    def reset(self, seed: int) -> str:
        """Start problem `seed`; returns its prompt."""
        self._problem = arithmetic_problem(seed)
        return self._problem.text

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Score the answer: the text before the first newline must be the result, written as `str(int)` writes it."""
        if self._problem is None:
            raise RuntimeError(f"{self.name}: no episode is running; call reset(seed) first")
        answer = action.split("\n", 1)[0]
        expected = str(self._problem.answer)
        self._problem = None
        info: dict = {"correct": answer == expected, "expected": expected}
        if not INTEGER.fullmatch(answer):
            info["error"] = f"expected an integer (digits, maybe a leading '-') ended by a newline, found {answer!r}"
        return "", float(info["correct"]), True, info

    def demonstration(self, seed: int) -> list[str]:
        """The one correct action of problem `seed`."""
        return [f"{arithmetic_problem(seed).answer}\n"]

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split`; train and held-out share neither seeds nor problems."""
        return split_seeds(split, count, start)
