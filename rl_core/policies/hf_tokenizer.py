"""A Hugging Face tokenizer behind the small interface trajectories use, with the model's own chat template.

An agent episode is a conversation: the env's observations are user messages, the agent's actions assistant
messages. `conversation_ids` renders it as the model expects the next turn (its chat template with the generation
prompt, or plain concatenation after bos for a model without one) and tokenizes the text, special tokens included;
`action_ids` is what an assistant turn the model wrote looks like as ids (its text, then eos where the template ends
turns with it). Trajectories compare these with the ids already sampled to decide whether a turn can be appended
exactly (`rl_core.algos.grpo.trajectories`).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Message = tuple[str, str]
"""(role, text): "user" for the env's observations, "assistant" for the agent's actions."""


class HFTokenizer:
    """Wraps a transformers tokenizer: ids without added specials, decoding without specials, the chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.bos_id = int(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else self.eos_id
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self.eos_id
        self.vocab_size = len(tokenizer)
        self.chat = tokenizer.chat_template is not None

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, special-token text (e.g. `<|im_start|>`) included as those tokens; nothing added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` without special tokens (what an env reads of the agent's turn)."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def conversation_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation ready for the agent's next turn: the chat template with its generation prompt, or bos and
        the messages' texts one after another."""
        if not self.chat:
            return [self.bos_id, *self.encode("".join(text for _, text in messages))]
        rendered = self.tokenizer.apply_chat_template([{"role": role, "content": text} for role, text in messages],
                                                      add_generation_prompt=True, tokenize=False)
        return self.encode(rendered)

    def action_ids(self, text: str) -> list[int]:
        """An assistant turn as the model writes it: its text, then eos when the chat template ends turns with it."""
        return [*self.encode(text), *([self.eos_id] if self.chat else [])]

    def can_write(self, text: str) -> bool:
        """Whether `text` survives encoding and decoding unchanged."""
        return self.decode(self.encode(text)) == text
