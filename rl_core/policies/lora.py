"""LoRA (Hu et al., 2021) for the Llama policy: low-rank adapters on chosen projections, the base frozen.

A projection `W` (out x in) computes with `W + (alpha / r) B A`, `A` (r x in) and `B` (out x r) trained and `W` never
changed. Only the adapters train, travel to the generator and go into checkpoints; the base is read from the model's
files once per process.

Why our own module and not PEFT's: the generator and the trainer must compute the same bits (behaviour log-probs
equal to the trainer's recomputation), which the policy gets from running every product on oneDNN, whose rows do
not depend on the rows sharing a call (`onednn_linear`). PEFT wraps `nn.Linear` and runs its adapters as plain
`nn.Linear`s (MKL's sgemm, whose rows round differently at decoding's few rows), so its decoding and its full forward
would disagree in the last bits. Here both sides multiply by the same merged weight, built the same way, so they
agree exactly; decoding costs what the base model's does (one product per projection, not three); and the trainer's
backward computes LoRA's small gradients, never the full weight's.

The adapters carry PEFT's names (`<module>.lora_A.weight`, `<module>.lora_B.weight`) and initialisation (A uniform
in +-1/sqrt(in), as PEFT's kaiming-uniform with a=sqrt(5) gives; B zero: a new adapter changes nothing), drawn from
a seeded generator, never torch's global RNG.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from rl_core.policies.llama_spec import LlamaSpec
from rl_core.policies.onednn_linear import Linear, linear_product, pack_weight

ADAPTER_PARTS = ("lora_A", "lora_B")


class _MergedLoRA(torch.autograd.Function):
    """y = x M^T with M = W + s B A precomputed: the forward one oneDNN product, as the generator's; the backward
    LoRA's own gradients (dB = s g^T (x A^T), dA = s (g B)^T x), never the full (out x in) weight gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, merged: torch.Tensor,  # type: ignore[override]
                scale: float, transposed: Callable[[], torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, a, b)
        ctx.scale, ctx.transposed = scale, transposed
        return linear_product(x, merged)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, a, b = ctx.saved_tensors
        rows_x, rows_g = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_x = linear_product(grad.contiguous(), ctx.transposed()) if ctx.needs_input_grad[0] else None
        grad_a = ((rows_g @ b).t() @ rows_x) * ctx.scale if ctx.needs_input_grad[1] else None
        grad_b = (rows_g.t() @ (rows_x @ a.t())) * ctx.scale if ctx.needs_input_grad[2] else None
        return grad_x, grad_a, grad_b, None, None, None


class LoRALinear(Linear):
    """A frozen bias-free projection plus a trained low-rank update (see the module's docstring).

    Both the generator and the trainer multiply by the merged weight `W + (alpha/r) B A`, built the same way (its
    product on oneDNN, whose result does not depend on the thread count): one product per call, as fast as the base
    model's, and the same bits on both sides. Its prepacked copy (and the trainer's transposed one) is remade when
    the adapters change (their version counters)."""

    def __init__(self, base: Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        out_features, in_features = base.weight.shape
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(base.weight.detach(), requires_grad=False)
        self.register_parameter("bias", None)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        bound = 1.0 / math.sqrt(in_features)
        self.lora_A = nn.Module()
        self.lora_A.weight = nn.Parameter(torch.empty(rank, in_features).uniform_(-bound, bound, generator=generator))
        self.lora_B = nn.Module()
        self.lora_B.weight = nn.Parameter(torch.zeros(out_features, rank))
        self._merged_packed: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._merged_t: tuple[tuple[int, ...], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.lora_A.weight, self.lora_B.weight
        if torch.is_grad_enabled() and (x.requires_grad or a.requires_grad or b.requires_grad):
            packed = self._refresh(transposed=True)  # both copies from one merge: the backward needs the second
            return _MergedLoRA.apply(x, a, b, packed, self.scale, lambda: self._merged_t[1])
        return linear_product(x, self._refresh(transposed=False))

    def merged_weight(self) -> torch.Tensor:
        """`W + (alpha / r) B A`, the B A product on oneDNN: what this layer multiplies by (kept only packed, so the
        model holds one more copy of its weights, not two), and what a reader without adapters (an export) loads."""
        with torch.inference_mode(False), torch.no_grad():  # a tensor autograd may save, whoever asks first
            a, b = self.lora_A.weight.detach(), self.lora_B.weight.detach()
            return self.weight + linear_product(b, a.t().contiguous()) * self.scale

    def _refresh(self, transposed: bool) -> torch.Tensor:
        """The packed merged weight, remade from one merge (with, where asked, its transposed copy for the input's
        gradient) when the adapters changed since it was made."""
        key = self._key()
        stale = self._merged_packed is None or self._merged_packed[0] != key
        stale_t = transposed and (self._merged_t is None or self._merged_t[0] != key)
        if stale or stale_t:
            self._merged_packed = None  # the old copies go before the new ones are made
            if transposed:
                self._merged_t = None
            merged = self.merged_weight()
            self._merged_packed = (key, pack_weight(merged))
            if transposed:
                self._merged_t = (key, pack_weight(merged.t().contiguous()))
        return self._merged_packed[1]

    def _key(self) -> tuple[int, ...]:
        a, b, w = self.lora_A.weight, self.lora_B.weight, self.weight
        return a.data_ptr(), a._version, b.data_ptr(), b._version, w.data_ptr(), w._version

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_merged_packed", None)
        state.pop("_merged_t", None)
        return state


def projection_shapes(spec: LlamaSpec) -> dict[str, tuple[int, int]]:
    """(out, in) of each target projection of a layer of a model of `spec`."""
    heads, kv_heads, hidden = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim, \
        spec.hidden_size
    return {"q_proj": (heads, hidden), "k_proj": (kv_heads, hidden), "v_proj": (kv_heads, hidden),
            "o_proj": (hidden, heads), "gate_proj": (spec.intermediate_size, hidden),
            "up_proj": (spec.intermediate_size, hidden), "down_proj": (hidden, spec.intermediate_size)}


def check_lora(spec: LlamaSpec, rank: int, targets: tuple[str, ...]) -> None:
    """A ValueError naming the problem unless every target is a projection of the model and `rank` fits each."""
    check_lora_targets(spec, targets)
    check_lora_rank(spec, rank, targets)


def check_lora_targets(spec: LlamaSpec, targets: tuple[str, ...]) -> None:
    """A ValueError unless every target is a projection of a layer of `spec`."""
    shapes = projection_shapes(spec)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ValueError(f"{', '.join(unknown)} names no projection of a Llama layer; allowed: {', '.join(shapes)}")


def check_lora_rank(spec: LlamaSpec, rank: int, targets: tuple[str, ...]) -> None:
    """A ValueError unless `rank` fits the width of every target (known targets: `check_lora_targets` first)."""
    shapes = projection_shapes(spec)
    for target in targets:
        width = min(shapes[target])
        if rank > width:
            raise ValueError(f"rank {rank} exceeds the width of {target} {shapes[target]}: pick a rank <= {width}")


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: tuple[str, ...], seed: int) -> nn.Module:
    """`model` with every target projection replaced by a LoRALinear and every other parameter frozen; in place."""
    check_lora(model.spec, rank, targets)
    for param in model.parameters():
        param.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    for name, module in _targets(model, targets):
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(module, rank, alpha, generator))
    return model


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters by PEFT's names (`model.layers.0.self_attn.q_proj.lora_A.weight`, ...)."""
    return {f"{name}.{part}.weight": getattr(module, part).weight
            for name, module in model.named_modules() if isinstance(module, LoRALinear) for part in ADAPTER_PARTS}


def load_adapter_state(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy `tensors` (exactly `adapter_state`'s names and shapes) into the adapters, in place."""
    own = adapter_state(model)
    missing, unexpected = sorted(own.keys() - tensors.keys()), sorted(tensors.keys() - own.keys())
    if missing or unexpected:
        raise ValueError(f"load_adapter_state: missing {missing[:3]}, unexpected {unexpected[:3]}; pass the "
                         "adapters of a run with the same LoRA rank and targets")
    wrong = [f"{n} {tuple(tensors[n].shape)} (expected {tuple(t.shape)})" for n, t in own.items()
             if tuple(tensors[n].shape) != tuple(t.shape)]
    if wrong:
        raise ValueError(f"load_adapter_state: wrong shapes: {', '.join(wrong[:3])}")
    with torch.no_grad():
        for name, param in own.items():
            param.copy_(tensors[name])


def _targets(model: nn.Module, targets: tuple[str, ...]) -> list[tuple[str, Linear]]:
    return [(name, module) for name, module in model.named_modules()
            if name.rpartition(".")[2] in targets and isinstance(module, Linear) and not isinstance(module, LoRALinear)]
