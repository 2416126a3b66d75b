"""Token-exact trajectories of agent episodes: the token ids the generator produced, never re-tokenized.

An episode is one or more segments. A segment is a token sequence as the model saw it: a prompt (bos + the env's
first observation), then turns appended as ids: the agent's completion (loss mask 1, with the behaviour log-prob of
every sampled token) and the env's next observation (mask 0: tool output is not the agent's to learn). When an
observation would re-tokenize the text so far differently from the ids already in the segment, a new segment starts
whose prompt is the re-tokenized text, so every segment stays exactly what the model was conditioned on.

`TrajectoryBatch` lays episodes out as arrays (one row per segment, padded) plus JSON meta (env infos, finish
reasons): the format rollout writes to the store and score reads back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

PROMPT_TURN = 0
"""`turns` value of prompt tokens; action k has turn 2k - 1, the observation after it 2k; padding -1."""


class Tokenizer(Protocol):
    """What trajectories need of a tokenizer."""

    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class Segment:
    """One token sequence the model was conditioned on, with per-token loss mask, behaviour log-prob and turn."""

    tokens: list[int]
    text: str  # the text the tokens after bos stand for: re-tokenizing it must give them back
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, tokenizer: Tokenizer, text: str) -> Segment:
        tokens = [tokenizer.bos_id, *tokenizer.encode(text)]
        return cls(tokens, text, [0.0] * len(tokens), [0.0] * len(tokens), [PROMPT_TURN] * len(tokens))

    def append(self, ids: list[int], text: str, turn: int, logprobs: list[float] | None = None) -> None:
        """Add ids (a completion with its log-probs, or an observation without) standing for `text`."""
        self.tokens.extend(ids)
        self.text += text
        self.loss_mask.extend([1.0 if logprobs is not None else 0.0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turns.extend([turn] * len(ids))


@dataclass
class Episode:
    """One episode of one prompt group's sample: its segments, reward and what the env said."""

    group: int  # prompt group index within the iteration
    sample: int  # sample index within the group
    problem_seed: int
    version: int  # policy version that generated every completion
    segments: list[Segment]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    def observe(self, tokenizer: Tokenizer, observation: str, turn: int) -> None:
        """Append the env's observation as ids, or start a new segment when appending would not be exact."""
        segment = self.current
        retokenized = tokenizer.encode(segment.text + observation)
        held = segment.tokens[1:]  # after bos
        if retokenized[:len(held)] == held:
            segment.append(retokenized[len(held):], observation, turn)
        else:
            self.segments.append(Segment.start(tokenizer, segment.text + observation))

    @property
    def generated_tokens(self) -> int:
        return int(sum(sum(s.loss_mask) for s in self.segments))


# Array fields of a TrajectoryBatch: per row (segment) and per episode.
ROW_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "turns", "lengths", "row_episode")
EPISODE_FIELDS = ("episode_group", "episode_sample", "problem_seeds", "rewards", "versions", "correct")


@dataclass(frozen=True)
class TrajectoryBatch:
    """Episodes as arrays: rows are segments (padded to the longest), episodes are indexed by `row_episode`."""

    tokens: np.ndarray  # (R, L) int64, padded with `pad_id`
    loss_mask: np.ndarray  # (R, L) float32: 1 on sampled tokens
    behaviour_logprobs: np.ndarray  # (R, L) float32: log-prob of token t under the sampled distribution, 0 elsewhere
    turns: np.ndarray  # (R, L) int16: PROMPT_TURN, 2k - 1 (action k), 2k (observation k); -1 padding
    lengths: np.ndarray  # (R,) int64
    row_episode: np.ndarray  # (R,) int64: episode index of each row
    episode_group: np.ndarray  # (E,) int64
    episode_sample: np.ndarray  # (E,) int64
    problem_seeds: np.ndarray  # (E,) int64
    rewards: np.ndarray  # (E,) float32
    versions: np.ndarray  # (E,) int64
    correct: np.ndarray  # (E,) bool

    @classmethod
    def from_episodes(cls, episodes: list[Episode], pad_id: int) -> TrajectoryBatch:
        rows = [(e, s) for e, episode in enumerate(episodes) for s in episode.segments]
        width = max((len(s.tokens) for _, s in rows), default=1)
        shape = (len(rows), width)
        tokens = np.full(shape, pad_id, np.int64)
        loss_mask, logprobs = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        turns = np.full(shape, -1, np.int16)
        for r, (_, s) in enumerate(rows):
            n = len(s.tokens)
            tokens[r, :n], loss_mask[r, :n], logprobs[r, :n], turns[r, :n] = s.tokens, s.loss_mask, s.logprobs, s.turns
        return cls(
            tokens, loss_mask, logprobs, turns,
            np.array([len(s.tokens) for _, s in rows], np.int64), np.array([e for e, _ in rows], np.int64),
            np.array([e.group for e in episodes], np.int64), np.array([e.sample for e in episodes], np.int64),
            np.array([e.problem_seed for e in episodes], np.int64),
            np.array([e.reward for e in episodes], np.float32), np.array([e.version for e in episodes], np.int64),
            np.array([bool(e.info.get("correct", False)) for e in episodes], bool),
        )

    @property
    def num_episodes(self) -> int:
        return len(self.rewards)

    @property
    def generated_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ROW_FIELDS + EPISODE_FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> TrajectoryBatch:
        missing = [name for name in ROW_FIELDS + EPISODE_FIELDS if name not in arrays]
        if missing:
            raise ValueError(f"not a trajectory batch: fields {missing} are missing")
        return cls(**{name: arrays[name] for name in ROW_FIELDS + EPISODE_FIELDS})

    @classmethod
    def concatenate(cls, parts: list[TrajectoryBatch], pad_id: int) -> TrajectoryBatch:
        """Parts in order as one batch: rows padded to the longest, episode indices offset."""
        width = max(p.tokens.shape[1] for p in parts)

        def widen(array: np.ndarray, fill: float) -> np.ndarray:
            return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=fill)

        offsets = np.cumsum([0] + [p.num_episodes for p in parts[:-1]])
        return cls(
            np.concatenate([widen(p.tokens, pad_id) for p in parts]),
            np.concatenate([widen(p.loss_mask, 0) for p in parts]),
            np.concatenate([widen(p.behaviour_logprobs, 0) for p in parts]),
            np.concatenate([widen(p.turns, -1) for p in parts]),
            np.concatenate([p.lengths for p in parts]),
            np.concatenate([p.row_episode + o for p, o in zip(parts, offsets)]),
            *(np.concatenate([getattr(p, name) for p in parts]) for name in EPISODE_FIELDS),
        )


def episode_meta(episodes: list[Episode]) -> dict[str, Any]:
    """What the arrays do not hold, as JSON: each episode's env info and finish reasons (values the env gave that
    JSON cannot hold are written as text)."""
    return {"infos": json.loads(json.dumps([e.info for e in episodes], default=str)),
            "finish_reasons": [e.finish_reasons for e in episodes]}
