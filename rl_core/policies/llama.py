"""A small decoder-only LM with the Llama architecture, in plain torch: just the model.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with parameter names and shapes
those of Hugging Face's `LlamaForCausalLM` state dict (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.
q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so the same weights load in transformers and vLLM.
Saving and loading in HF's directory layout is `rl_core.policies.pretrained`.

Built so that decoding one token at a time and a full forward over the same tokens give the same bits (the
generator's behaviour log-probs equal the trainer's recomputation exactly): the projections run on oneDNN, whose rows
do not depend on the rows sharing a call (`onednn_linear`), and both paths attend through one kernel that computes
every output element by the same operations in the same order whatever the shapes of the call
(`gymflow_kernels.causal_attention`). BLAS cannot promise that: its gemm rounds an element differently with the
call's M and N, a softmax and P @ V sum over as many keys as the call holds, and decoding (one query per row, each
row at its own position) and a full forward (T queries over T keys) call them in different shapes; attention in
float64 rounded back to float32 hid those differences almost always, not always. The kernel runs on CPU in float32;
elsewhere (a GPU, a CPU without a C++ compiler) attention is PyTorch's scaled_dot_product_attention, in float64 on a
CPU and in the model's dtype on a GPU (where float64 is slow and cuBLAS rounds its own way).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from gymflow_kernels.causal_attention import causal_attention, causal_attention_reference, fixed_order_applies
from rl_core.policies.kv_cache import KVCache, SlotCache
from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.lora import LoRALinear, adapter_state, has_lora, load_adapter_state
from rl_core.policies.onednn_linear import Linear


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as HF does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def _linear(in_dim: int, out_dim: int) -> Linear:
    """A bias-free Linear left uninitialized: torch's default init would draw from the global RNG."""
    return nn.utils.skip_init(Linear, in_dim, out_dim, bias=False)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings, reading and extending a layer's cache."""

    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.q_proj = _linear(spec.hidden_size, spec.num_attention_heads * spec.head_dim)
        self.k_proj = _linear(spec.hidden_size, spec.num_key_value_heads * spec.head_dim)
        self.v_proj = _linear(spec.hidden_size, spec.num_key_value_heads * spec.head_dim)
        self.o_proj = _linear(spec.num_attention_heads * spec.head_dim, spec.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None, start: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, hidden) output and this call's (B, kv_heads, T, head_dim) keys and values; `past` (the layer's
        preallocated keys and values) gets them written at positions [start, start + T)."""
        batch, steps, _ = x.shape
        q = self.q_proj(x).view(batch, steps, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, steps, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, steps, -1, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys, values = k, v
        if past is not None:
            past[0][:, :, start:start + steps] = k
            past[1][:, :, start:start + steps] = v
            keys, values = past[0][:, :, :start + steps], past[1][:, :, :start + steps]
        first = torch.full((batch,), start, dtype=torch.long, device=x.device)  # row b's query i: position start + i
        y = _attention(q, keys, values, first)
        return self.o_proj(y.reshape(batch, steps, -1)), k, v

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, 1, hidden) output for one new token per row, row r at its own position `positions[r]`, seeing keys
        0 .. positions[r]; its key and value are written into `keys`/`values` (B, kv_heads, capacity, head_dim) at
        that position. Positions past a row's own (a stale or empty slot) are not read."""
        batch = x.shape[0]
        q = self.q_proj(x).view(batch, 1, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, 1, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, 1, -1, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys[rows, :, positions] = k[:, :, 0].to(keys.dtype)
        values[rows, :, positions] = v[:, :, 0].to(values.dtype)
        return self.o_proj(_attention(q, keys, values, positions).reshape(batch, 1, -1))


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """(B, T, heads, head_dim) attention of queries `q` (B, heads, T, head_dim), row b's query i at position
    first[b] + i seeing keys 0 .. first[b] + i of `keys`/`values` (B, kv_heads, >= that, head_dim): the fixed-order
    kernel where it applies, else scaled_dot_product_attention (see the module's docstring)."""
    if fixed_order_applies(q, keys, values):
        return causal_attention(q, keys, values, first)
    dtype = torch.float64 if q.is_cpu else q.dtype
    y = causal_attention_reference(q.to(dtype), keys.to(dtype), values.to(dtype), first)
    return y.to(q.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.gate_proj = _linear(spec.hidden_size, spec.intermediate_size)
        self.up_proj = _linear(spec.hidden_size, spec.intermediate_size)
        self.down_proj = _linear(spec.intermediate_size, spec.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = MLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None, start: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past, start)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), k, v

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn.decode(self.input_layernorm(x), cos, sin, keys, values, rows, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embeddings, the layers and the final norm: HF's `model.` prefix."""

    def __init__(self, spec: LlamaSpec):
        super().__init__()
        self.embed_tokens = nn.utils.skip_init(nn.Embedding, spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_hidden_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        exponents = torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim
        self.register_buffer("inv_freq", 1.0 / spec.rope_theta ** exponents, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                               list[torch.Tensor]]:
        """(B, T, hidden) final hidden states and each layer's new keys and values."""
        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device, dtype=torch.float32)
        cos, sin = self._rotary(positions)  # (T, head_dim)
        x = self.embed_tokens(input_ids)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x, k, v = layer(x, cos, sin, past, start)
            keys.append(k)
            values.append(v)
        return self.norm(x), keys, values

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the rotary angles at `positions` (..., head_dim), HF's layout: both halves rotate alike."""
        angles = positions[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def decode(self, input_ids: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        """(B, hidden) final hidden state of one new token per slot (`input_ids` (B,) for slots 0 .. B - 1), each at
        its slot's length; the slots' lengths advance by one."""
        batch = input_ids.shape[0]
        positions = cache.lengths[:batch]
        cos, sin = self._rotary(positions.to(torch.float32)[:, None])  # (B, 1, head_dim)
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, 1, head_dim): broadcast over heads
        rows = torch.arange(batch, device=input_ids.device)
        x = self.embed_tokens(input_ids[:, None])
        for i, layer in enumerate(self.layers):  # row r sees its slot's keys 0 .. positions[r], the new one included
            x = layer.decode(x, cos, sin, cache.keys[i][:batch], cache.values[i][:batch], rows, positions)
        cache.lengths[:batch] += 1
        return self.norm(x)[:, 0]


class LlamaLM(nn.Module):
    """The causal LM: `model` (the decoder) and `lm_head`; weights drawn from `seed` without touching torch's
    global RNG, as HF initializes them (normal(0, initializer_range) matrices, unit norms)."""

    def __init__(self, spec: LlamaSpec, seed: int = 0):
        super().__init__()
        self.spec = spec
        self.model = Decoder(spec)
        self.lm_head = _linear(spec.hidden_size, spec.vocab_size)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():  # tied weights appear once
                if param.ndim == 1:
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, spec.initializer_range, generator=generator)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """(B, T, vocab) logits of `input_ids` (B, T), which follow the `cache.length` positions already in `cache`.

        With a cache, the new keys and values are written into it and it is returned, `length` advanced by T; without
        one, a full cache of exactly these T positions is returned (allocate a larger one to decode further).
        """
        if input_ids.ndim != 2:
            raise ValueError(f"LlamaLM: expected input_ids of shape (batch, steps), found {tuple(input_ids.shape)}")
        batch, steps = input_ids.shape
        start = 0 if cache is None else cache.length
        if start + steps > self.spec.max_position_embeddings:
            raise ValueError(f"LlamaLM: positions {start} + {steps} exceed the context of "
                             f"{self.spec.max_position_embeddings} (max_position_embeddings)")
        if cache is not None and (cache.batch != batch or start + steps > cache.capacity):
            raise ValueError(f"LlamaLM: a cache of {cache.batch} rows x {cache.capacity} positions holding {start} "
                             f"cannot take {batch} rows x {steps} more; allocate one with batch={batch} and "
                             f"capacity >= {start + steps}")
        hidden, keys, values = self.model(input_ids, cache)
        logits = self.lm_head(hidden)
        if cache is None:
            return logits, KVCache(keys, values, steps)
        cache.length += steps
        return logits, cache

    def decode(self, input_ids: torch.Tensor, cache: SlotCache) -> torch.Tensor:
        """(B, vocab) logits of one new token in each of slots 0 .. B - 1 (`input_ids` (B,)), every slot at its own
        length: one step of continuous batching."""
        if int(cache.lengths[:input_ids.shape[0]].max()) >= min(cache.capacity, self.spec.max_position_embeddings):
            raise ValueError(f"LlamaLM.decode: a slot is full ({cache.capacity} positions of cache, context "
                             f"{self.spec.max_position_embeddings})")
        return self.lm_head(self.model.decode(input_ids, cache))

    def prefill(self, input_ids: torch.Tensor, prefix: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """(B, vocab) logits of the last position of `input_ids` (B, T), and the cache of every position: what
        generation needs of a prompt. With `prefix` (one row: the start the prompts share, prefilled once), `input_ids`
        are what follows it in each prompt. The LM head, the widest product, runs at the last position alone. A row's
        logits and keys are the bits `forward` gives for the whole prompt: projections do not mix rows, and the
        fixed-order attention of a position reads the same keys in the same order whether they were cached or not."""
        start = 0 if prefix is None else prefix.length
        if input_ids.ndim != 2 or start + input_ids.shape[1] > self.spec.max_position_embeddings:
            raise ValueError(f"LlamaLM.prefill: expected input_ids of shape (batch, steps) fitting the context of "
                             f"{self.spec.max_position_embeddings} after {start} cached positions, found "
                             f"{tuple(input_ids.shape)}")
        if prefix is None:
            hidden, keys, values = self.model(input_ids, None)
            return self.lm_head(hidden[:, -1]), KVCache(keys, values, input_ids.shape[1])
        if prefix.batch != 1:
            raise ValueError(f"LlamaLM.prefill: a shared prefix is one row, found {prefix.batch}")
        cache = KVCache.allocate(self.spec, input_ids.shape[0], start + input_ids.shape[1],
                                 device=input_ids.device, dtype=prefix.keys[0].dtype)
        for mine, shared in zip(cache.keys + cache.values, prefix.keys + prefix.values):
            mine[:, :, :start] = shared[:, :, :start]
        cache.length = start
        hidden, _, _ = self.model(input_ids, cache)
        cache.length += input_ids.shape[1]
        return self.lm_head(hidden[:, -1]), cache

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors HF saves: every parameter by name, without lm_head.weight when it is the tied embedding; a
        projection with a LoRA adapter as its merged weight (`lora.LoRALinear.merged_weight`)."""
        state = {name: tensor for name, tensor in self.state_dict().items() if ".lora_" not in name}
        state.update({f"{name}.weight": module.merged_weight() for name, module in self.named_modules()
                      if isinstance(module, LoRALinear)})
        if self.spec.tie_word_embeddings:
            del state["lm_head.weight"]
        return state

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """What trains, and so what a version holds and a generator loads: the adapters where the model has LoRA
        adapters (the base stays in the model's files), else `hf_state_dict`."""
        return adapter_state(self) if has_lora(self) else self.hf_state_dict()

    def load_policy_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy `tensors` (`policy_state_dict`'s names and shapes) into the model, in place."""
        if has_lora(self):
            load_adapter_state(self, tensors)
        else:
            self.load_hf_state(tensors)

    def load_hf_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy `tensors` (exactly `hf_state_dict`'s names and shapes) into the parameters, in place: a base model's
        weights, loaded before any LoRA adapter is added (an adapter's frozen weight is not its merged one)."""
        if has_lora(self):
            raise ValueError("LlamaLM.load_hf_state: this model has LoRA adapters; load the base weights before "
                             "adding them, and the adapters with load_policy_state")
        own = self.hf_state_dict()
        missing, unexpected = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
        if missing or unexpected:
            tied = " (tied embeddings: lm_head.weight is model.embed_tokens.weight, leave it out)" \
                if "lm_head.weight" in unexpected and self.spec.tie_word_embeddings else ""
            raise ValueError(f"LlamaLM.load_hf_state: missing {missing[:5]}, unexpected {unexpected[:5]}{tied}; "
                             "pass the tensors of a model with this LlamaSpec")
        wrong = [f"{name} {tuple(tensors[name].shape)} (expected {tuple(own[name].shape)})"
                 for name in own if tuple(tensors[name].shape) != tuple(own[name].shape)]
        if wrong:
            raise ValueError(f"LlamaLM.load_hf_state: wrong shapes: {', '.join(wrong[:5])}")
        with torch.no_grad():
            for name, param in own.items():
                param.copy_(tensors[name])
