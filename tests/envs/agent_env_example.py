"""A user's agent env module (imported by tests/envs/test_agent_envs.py as --env-module would import it)."""
from __future__ import annotations

from rl_core.envs.agent import Split, register_agent_env, split_seeds


class Echo:
    """Repeat the prompt's word: the smallest env that keeps the contract."""

    name = "Echo-v0"
    alphabet = "abc\n"
    max_turns = 1
    stop = ("\n",)

    def __init__(self) -> None:
        self._word = ""

    def reset(self, seed: int) -> str:
        """The word of problem `seed`."""
        self._word = "abc"[seed % 3] * 2
        return self._word

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Reward 1 for the word itself."""
        correct = action.split("\n", 1)[0] == self._word
        return "", float(correct), True, {"correct": correct}

    def demonstration(self, seed: int) -> list[str]:
        """The word, then a newline."""
        return ["abc"[seed % 3] * 2 + "\n"]

    def problem_seeds(self, split: Split, count: int, start: int = 0) -> list[int]:
        """Seeds of `split`."""
        return split_seeds(split, count, start)


register_agent_env(Echo, Echo.name)
