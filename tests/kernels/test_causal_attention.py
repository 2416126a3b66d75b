"""The fixed-order causal attention kernel: the reference's values and gradients within rounding, and what the
generator's log-prob parity rests on, to the bit: a query's output does not depend on what else the call holds (the
other rows, the queries before it, keys past those it sees, the thread count, the tensors' strides)."""

from __future__ import annotations

import pytest
import torch

from gymflow_kernels.causal_attention import causal_attention, causal_attention_problem, causal_attention_reference


@pytest.fixture(autouse=True)
def kernel_built() -> None:
    problem = causal_attention_problem()
    if problem is not None:  # on the reference machine tests/test_fast_paths.py fails instead
        pytest.skip(f"the fixed-order attention kernel cannot run here: {problem}")


def attention_inputs(batch: int, heads: int, kv_heads: int, steps: int, keys: int, dim: int, seed: int,
                     scale: float = 1.0, shared: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [batch, heads, steps, dim], k and v [batch, kv_heads, keys, dim]; `scale` sharpens the softmax, `shared`
    adds that multiple of one unit direction to every query and key (scores with a large common part)."""
    gen = torch.Generator().manual_seed(seed)
    direction = torch.randn(dim, generator=gen)
    direction = shared * direction / direction.norm()
    q = torch.randn(batch, heads, steps, dim, generator=gen) * scale + direction
    k = torch.randn(batch, kv_heads, keys, dim, generator=gen) * scale + direction
    return q, k, torch.randn(batch, kv_heads, keys, dim, generator=gen)


SHAPES = [  # batch, heads, kv_heads, steps, first (per row), dim, scale
    (1, 1, 1, 1, [0], 1, 1.0),  # one key, one query: the output is that value
    (2, 4, 4, 5, [0, 0], 8, 1.0),
    (3, 6, 2, 7, [0, 3, 11], 16, 1.0),  # grouped-query, rows at their own positions
    (2, 9, 3, 33, [0, 0], 64, 1.0),  # SmolLM2's heads, a full forward
    (5, 9, 3, 1, [0, 17, 2, 40, 9], 64, 3.0),  # a decoding step, sharp softmax
    (1, 2, 1, 3, [30], 20, 10.0),  # almost one-hot
]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}x{s[1]}/{s[2]}x{s[3]}x{s[5]}" for s in SHAPES])
def test_the_reference_within_float32_rounding(shape: tuple) -> None:
    batch, heads, kv_heads, steps, first, dim, scale = shape
    first = torch.tensor(first)
    q, k, v = attention_inputs(batch, heads, kv_heads, steps, int(first.max()) + steps + 3, dim, 0, scale)
    out = causal_attention(q, k, v, first)
    assert out.shape == (batch, steps, heads, dim) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), causal_attention_reference(q.double(), k.double(), v.double(), first),
                               rtol=1e-6, atol=1e-6)


def test_a_query_has_the_same_bits_whatever_else_the_call_holds() -> None:
    batch, heads, kv_heads, steps, dim = 5, 9, 3, 23, 64
    first = torch.tensor([0, 4, 0, 9, 1])
    keys = int(first.max()) + steps
    q, k, v = attention_inputs(batch, heads, kv_heads, steps, keys + 6, dim, 1)
    k[:, :, keys:], v[:, :, keys:] = float("nan"), float("nan")  # stale slots past every query: never read
    full = causal_attention(q, k, v, first)
    for b in range(batch):
        for i in range(steps):  # decoding: one query, its row alone, its keys and nothing after them
            seen = int(first[b]) + i + 1
            row = slice(b, b + 1)
            step = causal_attention(q[row, :, i:i + 1], k[row, :, :seen], v[row, :, :seen], first[row] + i)
            assert torch.equal(step[0, 0], full[b, i]), (b, i)
    for cut in (1, 7, 22):  # a prefill in two chunks, the second after the first's keys
        later = causal_attention(q[:, :, cut:], k, v, first + cut)
        assert torch.equal(later, full[:, cut:])
    order = torch.tensor([3, 0, 4])  # other rows beside it, in another order
    assert torch.equal(causal_attention(q[order], k[order], v[order], first[order]), full[order])


def test_threads_and_strides_do_not_change_the_bits() -> None:
    batch, heads, kv_heads, steps, dim = 4, 6, 2, 19, 32
    first = torch.tensor([0, 2, 5, 1])
    q, k, v = attention_inputs(batch, heads, kv_heads, steps, 30, dim, 2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = causal_attention(q, k, v, first)
        torch.set_num_threads(2)
        two = causal_attention(q, k, v, first)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    # As a model's projections hand them over: (B, T, heads, D) memory seen as (B, heads, T, D); keys in a wider cache.
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)
    cache = torch.zeros(batch, kv_heads, 64, dim * 2)
    cache[:, :, :30, :dim] = k
    assert torch.equal(causal_attention(q_t, cache[:, :, :, :dim], v, first), one)


def test_where_blas_rounded_decoding_and_a_full_forward_apart_the_kernel_does_not() -> None:
    """Inputs (SmolLM2's heads) where float64 attention through BLAS, rounded to float32, gave a decoding step (one
    query, its row's keys) other bits than the full forward: found by trying seeds, with torch 2's MKL on the
    reference machine."""
    batch, heads, kv_heads, steps, dim = 8, 9, 3, 40, 64
    q, k, v = attention_inputs(batch, heads, kv_heads, steps, steps, dim, seed=21, shared=30.0)
    first = torch.zeros(batch, dtype=torch.long)
    full = causal_attention(q, k, v, first)
    for i in range(steps):
        step = causal_attention(q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1], first + i)
        assert torch.equal(step[:, 0], full[:, i]), i


def test_gradients_are_the_references_and_within_float32_of_the_float64_attention_before() -> None:
    first = torch.tensor([0, 6])
    q, k, v = (x.requires_grad_() for x in attention_inputs(2, 6, 2, 9, 15, 16, 3))
    grad_out = torch.randn(2, 9, 6, 16, generator=torch.Generator().manual_seed(4))
    ours = torch.autograd.grad(causal_attention(q, k, v, first), (q, k, v), grad_out)
    reference = torch.autograd.grad(causal_attention_reference(q, k, v, first), (q, k, v), grad_out)
    before = torch.autograd.grad(causal_attention_reference(q.double(), k.double(), v.double(), first).float(),
                                 (q, k, v), grad_out)  # the float64 attention LlamaLM ran before the kernel
    for mine, theirs, old in zip(ours, reference, before):
        assert torch.equal(mine, theirs)
        torch.testing.assert_close(mine, old, rtol=1e-5, atol=1e-6)
    only_q = torch.autograd.grad(causal_attention(q, k.detach(), v.detach(), first), q, grad_out)[0]
    assert torch.equal(only_q, ours[0])


def test_what_the_kernel_would_read_out_of_bounds_is_refused() -> None:
    q, k, v = attention_inputs(2, 4, 2, 3, 5, 8, 5)
    with pytest.raises(ValueError, match="need keys up to 6"):
        causal_attention(q, k, v, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="Hkv dividing H"):
        causal_attention(q[:, :3], k, v, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="first"):
        causal_attention(q, k, v, torch.tensor([0, 0], dtype=torch.int32))
    with pytest.raises(TypeError, match="float32 CPU"):
        causal_attention(q.double(), k.double(), v.double(), torch.tensor([0, 0]))
