"""A character-level tokenizer over a task's alphabet, plus pad, bos and eos: the vocabulary of the small LM policies.

Ids are deterministic: the special tokens first (pad 0, bos 1, eos 2), then the alphabet's distinct characters in
sorted order, so the same alphabet written in any order gives the same ids. Saved as JSON, never pickled.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
FORMAT = "gymflow-char-tokenizer"
FILE_NAME = "char_tokenizer.json"  # not HF's `tokenizer.json`, which AutoTokenizer would try to parse as its own


class CharTokenizer:
    """One id per character of `alphabet`; specials (pad, bos, eos) have no character and never come from text."""

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, alphabet: str):
        if not alphabet:
            raise ValueError("CharTokenizer: the alphabet is empty; pass the string of every character the task uses")
        self.alphabet = "".join(sorted(set(alphabet)))
        self._ids = {char: len(SPECIAL_TOKENS) + i for i, char in enumerate(self.alphabet)}

    @property
    def vocab_size(self) -> int:
        """Specials plus characters: the model's `vocab_size` must equal it."""
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`'s characters (no bos/eos added: the caller frames its prompt)."""
        try:
            return [self._ids[char] for char in text]
        except KeyError as err:
            raise ValueError(
                f"CharTokenizer.encode: character {err.args[0]!r} at index {text.index(err.args[0])} is not in the "
                f"alphabet {self.alphabet!r}; build the tokenizer from an alphabet that includes it"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`; special tokens are dropped since they stand for no character."""
        chars = []
        for token in ids:
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"CharTokenizer.decode: id {token} is outside the vocabulary [0, {self.vocab_size})")
            if token >= len(SPECIAL_TOKENS):
                chars.append(self.alphabet[token - len(SPECIAL_TOKENS)])
        return "".join(chars)

    def conversation_ids(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """An agent conversation ((role, text) messages) ready for the next turn: bos, then the texts one after
        another (no chat template: the task's own text says whose turn it is)."""
        return [self.bos_id, *self.encode("".join(text for _, text in messages))]

    def action_ids(self, text: str) -> list[int]:
        """An action as the model writes it: its characters (it ends with the env's stop string, not eos)."""
        return self.encode(text)

    def can_write(self, text: str) -> bool:
        """Whether every character of `text` is in the alphabet."""
        return set(text) <= set(self.alphabet)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as JSON to `path`."""
        state = {"format": FORMAT, "special_tokens": list(SPECIAL_TOKENS), "alphabet": self.alphabet}
        Path(path).write_text(json.dumps(state, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        """Read a tokenizer written by `save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"CharTokenizer.load: no tokenizer file at {path}; write one with save()")
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"CharTokenizer.load: {path} is not a {FORMAT} file (found format "
                             f"{state.get('format') if isinstance(state, dict) else type(state).__name__!r})")
        if state.get("special_tokens") != list(SPECIAL_TOKENS):
            raise ValueError(f"CharTokenizer.load: {path} has special tokens {state.get('special_tokens')}, "
                             f"expected {list(SPECIAL_TOKENS)}")
        return cls(state["alphabet"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.alphabet == self.alphabet

    def __hash__(self) -> int:
        return hash(self.alphabet)

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self.alphabet!r})"
