"""The key/value caches of LlamaLM's two decoding paths.

`KVCache`: rows that share one length (a prompt's prefill, then its G samples decoded together). `SlotCache`:
continuous batching's slots, each at its own length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rl_core.policies.llama_spec import LlamaSpec


@dataclass
class KVCache:
    """Keys and values of the positions seen so far, preallocated: one (B, kv_heads, capacity, head_dim) pair per
    layer, of which the first `length` positions are filled. Rows share one length (the G samples of a prompt)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0

    @classmethod
    def allocate(cls, spec: LlamaSpec, batch: int, capacity: int, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> KVCache:
        """An empty cache for `batch` rows of up to `capacity` positions."""
        shape = (batch, spec.num_key_value_heads, capacity, spec.head_dim)
        return cls([torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_hidden_layers)],
                   [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_hidden_layers)])

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def repeat_rows(self, n: int) -> KVCache:
        """`n` copies of this one-row cache: a prompt prefilled once, then decoded as n samples."""
        if self.batch != 1:
            raise ValueError(f"KVCache.repeat_rows: expected a one-row cache, found {self.batch} rows")
        return KVCache([k.repeat(n, 1, 1, 1) for k in self.keys], [v.repeat(n, 1, 1, 1) for v in self.values],
                       self.length)


@dataclass
class SlotCache:
    """Keys and values of `slots` independent sequences, each at its own length: the cache of continuous batching,
    where a finished sequence's slot is refilled by a new prompt while the others keep decoding. Per layer one
    (slots, kv_heads, capacity, head_dim) pair; `lengths[s]` positions of slot s are filled. In float32 by default,
    the keys' own precision: the fixed-order attention reads them as a full forward's attention does."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor  # (slots,) int64

    @classmethod
    def allocate(cls, spec: LlamaSpec, slots: int, capacity: int, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> SlotCache:
        """Empty slots of up to `capacity` positions each."""
        shape = (slots, spec.num_key_value_heads, capacity, spec.head_dim)
        return cls([torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_hidden_layers)],
                   [torch.zeros(shape, device=device, dtype=dtype) for _ in range(spec.num_hidden_layers)],
                   torch.zeros(slots, dtype=torch.long, device=device))

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def fill(self, slots: list[int], prefix: KVCache, row: int = 0) -> None:
        """Put row `row` of a prefilled cache (a prompt) into each of `slots`."""
        length = prefix.length
        if length > self.capacity:
            raise ValueError(f"SlotCache.fill: a prefix of {length} positions exceeds the capacity {self.capacity}")
        index = torch.tensor(slots, device=self.lengths.device)
        for mine, theirs in zip(self.keys + self.values, prefix.keys + prefix.values):
            mine[index, :, :length] = theirs[row, :, :length].to(mine.dtype)
        self.lengths[index] = length

    def move(self, source: list[int], target: list[int]) -> None:
        """Copy slots `source` into slots `target` (compaction: the live sequences to the front)."""
        src, dst = torch.tensor(source), torch.tensor(target)
        for tensor in self.keys + self.values:
            tensor[dst] = tensor[src]
        self.lengths[dst] = self.lengths[src]
