"""Bias-free linear layers through oneDNN on CPU: faster than torch's default, and the same bits at every batch.

Why faster: on the AMD EPYC measured, oneDNN with the weight prepacked once (into its own blocked layout, not on
every call) is faster than torch's default (MKL's sgemm) at decoding's few rows, and most of all at the LM head, the
widest weight (SmolLM2's 49,152 tokens); at a full forward's many rows oneDNN on the plain weight is still faster.
The figures are on the benchmarks page (docs/benchmarks.md).

What matters as much: oneDNN's result for a row does not depend on how many rows share the call (2 or more: one
row alone takes a matrix-vector path whose sums round differently), nor on the packing, the thread count or the
input's strides (checked bit for bit). MKL's does (rows of calls under 12 rows round differently). So the
generator decoding 16 sequences one token at a time and the trainer recomputing the same tokens as 1,600 rows of a
full forward multiply identically, and the behaviour log-probs equal the trainer's to the bit.

Elsewhere (another device or dtype, a torch without oneDNN) the layer is plain `F.linear`.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def onednn_available() -> bool:
    """Whether this torch runs oneDNN's linear: the private ops `torch.ops.mkldnn._linear_pointwise` (an op of
    torch's own CPU compiler path) on a plain and on a `torch.ops.mkldnn._reorder_linear_weight`-packed weight, and
    the tensor version counter the packed copy is keyed on. Checked once by running them on a 2x2 product; on the
    reference machine tests/test_fast_paths.py fails when this is False."""
    try:
        # Outside inference mode whoever asks first: its tensors have no version counter, and the answer is cached
        # for the whole process (a generator's first call runs under inference mode).
        with torch.inference_mode(False):
            x, weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
            expected = x @ weight.t()  # small integers: exact on every path
            return (bool(torch.backends.mkldnn.is_available()) and isinstance(weight._version, int)
                    and torch.equal(_onednn(x, weight), expected)
                    and torch.equal(_onednn(x, pack_weight(weight)), expected))
    except (AttributeError, RuntimeError):
        return False


def _onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T on oneDNN; `weight` plain (out, in) or prepacked by `pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight reordered once into oneDNN's blocked layout (the batch-size hint changes speed, not values)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)


class _OneDNNLinear(torch.autograd.Function):
    """Forward on oneDNN; backward as plain products (the gradients' values do not need to match anything), the input's
    gradient on oneDNN too where a transposed packed weight is given (faster than MKL's sgemm on the CPUs measured)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                transposed: Callable[[], torch.Tensor] | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.transposed = transposed
        return _onednn(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ weight if ctx.transposed is None else _onednn(grad.contiguous(), ctx.transposed())
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None


def linear_product(x: torch.Tensor, weight: torch.Tensor, packed: Callable[[], torch.Tensor] | None = None,
                   transposed: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """x W^T on oneDNN in float32 on CPU (see the module's docstring), else `F.linear`. With autograd the plain
    weight is used (and `transposed()`, W^T packed, for the input's gradient, where given); without, `packed()` (the
    weight prepacked by `pack_weight`) where given."""
    if not (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and onednn_available()):
        return F.linear(x, weight)
    shape = x.shape
    one_row = x.numel() == shape[-1]
    if one_row:  # one row alone takes another path (other rounding): compute it as the first of two
        x = x.reshape(1, -1).repeat(2, 1)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        y = _OneDNNLinear.apply(x, weight, transposed)
    else:
        y = _onednn(x, weight if packed is None else packed())
    return y[:1].reshape(*shape[:-1], -1) if one_row else y


class Linear(nn.Linear):
    """`nn.Linear` without bias whose product runs on oneDNN on CPU in float32 (see the module's docstring).

    Without autograd (generation, recomputation under no_grad) the weight is used prepacked; the packed copy is
    remade when the weight changes in place (an optimizer step, a weight update: torch's version counter)."""

    _packed: tuple[int, int, torch.Tensor] | None = None  # (weight's data pointer, its version, packed weight)
    _packed_t: tuple[int, int, torch.Tensor] | None = None  # the same of the transposed weight (input gradients)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_product(x, self.weight, self._prepacked, self._prepacked_t)

    def __getstate__(self) -> dict:
        """Without the packed copy: an opaque oneDNN tensor can be neither copied nor pickled (a deepcopy for GRPO's
        reference model, Ray sending a model), and it is remade on first use."""
        state = self.__dict__.copy()
        state.pop("_packed", None)
        state.pop("_packed_t", None)
        return state

    def _prepacked(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)
        if self._packed is None or self._packed[:2] != key:
            self._packed = (*key, pack_weight(self.weight))
        return self._packed[2]

    def _prepacked_t(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)
        if self._packed_t is None or self._packed_t[:2] != key:
            self._packed_t = (*key, pack_weight(self.weight.detach().t().contiguous()))
        return self._packed_t[2]
