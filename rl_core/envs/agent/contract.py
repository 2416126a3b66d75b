"""The contract every agent environment keeps, and the seed scheme that splits its problems into train and held-out.

An agent env is a plain object: `reset(seed)` gives the prompt of problem `seed`, `step(action)` takes the text an
LLM agent wrote and answers with (observation, reward, done, info). The trainer knows nothing else about it.

Seeds are split by parity (train even, held-out odd), so `split_seeds` costs the same for any `start`. A seed is not
enough for an honest held-out set: two seeds can draw the same problem. So every problem also belongs to a split by
a stable hash of its text (`problem_split`), and `draw_problem` draws from the seed's stream until the problem is of
the seed's split: a held-out problem never appears as a training problem, on any machine.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

import numpy as np

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")
HELDOUT_EVERY = 8  # one problem in 8 (by its hash) is held out
MAX_DRAWS = 1000  # a problem space that has no problem of a split after this many draws is too small to split
Problem = TypeVar("Problem")


class AgentEnv(Protocol):
    """One episode at a time of a text task; make another instance for another concurrent episode."""

    name: str
    alphabet: str  # every character an observation or a correct action can contain (for a char tokenizer)
    max_turns: int
    stop: tuple[str, ...]  # an action ends with the first of these: the generator stops sampling there

    def reset(self, seed: int) -> str:
        """Start problem `seed` (the same problem on any machine); returns the prompt."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Observation, reward, done, info; info has "correct" when done and "tool_output" for tool text."""
        ...

    def demonstration(self, seed: int) -> list[str]:
        """The actions of a correct scripted episode of problem `seed`, for the SFT warm start."""
        ...

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds number `start` .. `start + count - 1` of `split`; the two splits never share a seed or a problem."""
        ...


def split_seeds(split: Split, count: int, start: int = 0) -> list[int]:
    """The `count` seeds of `split` from its `start`-th on: train seeds are even, held-out seeds odd."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if count < 0 or start < 0:
        raise ValueError(f"count and start must be >= 0, got count={count}, start={start}")
    offset = SPLITS.index(split)
    return [2 * (start + i) + offset for i in range(count)]


def seed_split(seed: int) -> Split:
    """The split seed `seed` belongs to."""
    if seed < 0:
        raise ValueError(f"problem seeds are >= 0, got {seed}; take them from problem_seeds(split, count)")
    return SPLITS[seed % 2]


def problem_split(text: str) -> Split:
    """The split a problem belongs to, by a hash of its text that is the same on every machine and run."""
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    return "heldout" if digest % HELDOUT_EVERY == 0 else "train"


def draw_problem(
    stream: int, seed: int, draw: Callable[[np.random.Generator], Problem], text: Callable[[Problem], str]
) -> Problem:
    """Problem `seed`: drawn from `default_rng([stream, seed])` until its text is in the seed's split."""
    split = seed_split(seed)
    rng = np.random.default_rng([stream, seed])
    for _ in range(MAX_DRAWS):
        problem = draw(rng)
        if problem_split(text(problem)) == split:
            return problem
    raise ValueError(f"no {split} problem in {MAX_DRAWS} draws of stream {stream:#x}; a problem space needs "
                     f"enough problems that about 1 in {HELDOUT_EVERY} is held out")
