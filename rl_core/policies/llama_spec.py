"""The Llama decoder's shape (`LlamaSpec`), apart from the model so the KV caches can size themselves from it."""
from __future__ import annotations

from dataclasses import dataclass

_POSITIVE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "max_position_embeddings")


@dataclass(frozen=True)
class LlamaSpec:
    """The model's shape, with the field names of HF's `LlamaConfig` (bias-free projections, SiLU, default RoPE)."""

    vocab_size: int
    """Number of token ids; equals the tokenizer's vocabulary size."""
    hidden_size: int = 32
    """Width of the residual stream."""
    intermediate_size: int = 64
    """Width of the SwiGLU MLP's gate and up projections."""
    num_hidden_layers: int = 2
    """Number of decoder layers."""
    num_attention_heads: int = 4
    """Query heads; head_dim = hidden_size / num_attention_heads."""
    num_key_value_heads: int | None = None
    """Key/value heads (grouped-query attention); None means one per query head."""
    max_position_embeddings: int = 256
    """The context: the most positions (prompt + completion) one sequence may hold."""
    rms_norm_eps: float = 1e-6
    """Added to the mean square in RMSNorm."""
    rope_theta: float = 10000.0
    """Base wavelength of the rotary embeddings."""
    tie_word_embeddings: bool = False
    """Whether lm_head shares model.embed_tokens' weight (then lm_head.weight is not saved, as HF does)."""
    initializer_range: float = 0.02
    """Standard deviation of the normal init of every matrix."""
    bos_token_id: int | None = 1
    """Beginning-of-sequence id (CharTokenizer's is 1)."""
    eos_token_id: int | None = 2
    """End-of-sequence id (CharTokenizer's is 2)."""
    pad_token_id: int | None = 0
    """Padding id (CharTokenizer's is 0)."""

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        for name in _POSITIVE_FIELDS:
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaSpec.{name} must be >= 1, found {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"LlamaSpec.hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaSpec.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaSpec: head_dim = hidden_size / num_attention_heads = {self.head_dim} must be "
                             "even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads
