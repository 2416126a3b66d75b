"""Token-exact trajectories of agent episodes: the token ids the generator produced, never re-tokenized.

An episode is a conversation (the env's observations as user messages, the agent's actions as assistant messages)
held as one or more segments. A segment is a token sequence as the model saw it: a prompt (the conversation so far,
rendered by the tokenizer: bos and the text for a char model, the chat template for a pretrained one), then turns
appended as ids: the agent's completion (loss mask 1, with the behaviour log-prob of every sampled token) and the
ids that render the env's next observation (mask 0: tool output is not the agent's to learn). When rendering the
conversation with the new observation would not extend the ids already held (a template that writes the agent's turn
otherwise than it was sampled, a merge across the boundary), a new segment starts whose prompt is the re-rendered
conversation, so every segment stays exactly what the model was conditioned on.

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

Message = tuple[str, str]
"""(role, text): "user" for the env's observations, "assistant" for the agent's actions."""


class Tokenizer(Protocol):
    """What trajectories need of a tokenizer (`CharTokenizer`, `HFTokenizer`)."""

    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def conversation_ids(self, messages: list[Message]) -> list[int]:
        """The conversation rendered and tokenized, ready for the agent's next turn."""
        ...

    def action_ids(self, text: str) -> list[int]:
        """An assistant turn as the model writes it (for demonstrations)."""
        ...


@dataclass
class Segment:
    """One token sequence the model was conditioned on, with per-token loss mask, behaviour log-prob and turn."""

    tokens: list[int]
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)

    @classmethod
    def start(cls, ids: list[int]) -> Segment:
        """A segment whose prompt is `ids`."""
        return cls(list(ids), [0.0] * len(ids), [0.0] * len(ids), [PROMPT_TURN] * len(ids))

    def append(self, ids: list[int], turn: int, logprobs: list[float] | None = None) -> None:
        """Add ids: a completion with its log-probs (in the loss), or an observation's rendering (not)."""
        self.tokens.extend(ids)
        self.loss_mask.extend([1.0 if logprobs is not None else 0.0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.turns.extend([turn] * len(ids))


def extend_or_restart(segments: list[Segment], tokenizer: Tokenizer, messages: list[Message], turn: int) -> None:
    """After the env answered (its observation the last of `messages`): append the ids that render it to the current
    segment when the re-rendered conversation extends the ids held, else start a new segment from the rendering."""
    rendered = tokenizer.conversation_ids(messages)
    held = segments[-1].tokens
    if rendered[:len(held)] == held:
        segments[-1].append(rendered[len(held):], turn)
    else:
        segments.append(Segment.start(rendered))


@dataclass
class Episode:
    """One episode of one prompt group's sample: its conversation, segments, reward and what the env said."""

    group: int  # prompt group index within the iteration
    sample: int  # sample index within the group
    problem_seed: int
    version: int  # policy version that generated every completion
    messages: list[Message]
    segments: list[Segment]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    finish_reasons: list[str] = field(default_factory=list)

    @classmethod
    def begin(cls, tokenizer: Tokenizer, group: int, sample: int, problem_seed: int, version: int,
              prompt: str) -> Episode:
        messages = [("user", prompt)]
        segment = Segment.start(tokenizer.conversation_ids(messages))
        return cls(group, sample, problem_seed, version, messages, [segment])

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    def act(self, ids: list[int], logprobs: list[float], text: str, turn: int) -> None:
        """The agent's sampled turn: its ids with their behaviour log-probs, and the text the env reads."""
        self.current.append(ids, turn, logprobs)
        self.messages.append(("assistant", text))

    def observe(self, tokenizer: Tokenizer, observation: str, turn: int) -> None:
        """The env's answer, appended exactly or in a new segment (`extend_or_restart`)."""
        self.messages.append(("user", observation))
        extend_or_restart(self.segments, tokenizer, self.messages, turn)

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
