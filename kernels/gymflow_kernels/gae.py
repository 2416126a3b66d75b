"""GAE (generalized advantage estimation) as a tunable op: the reference loop and its candidates.

Every implementation has the signature
    gae(rewards[T, N], values[T, N], dones[T, N], next_value[N], gamma, lam) -> (advantages[T, N], returns[T, N])
with `dones[t] = 1` when the episode ended with the action taken at step t (terminated or truncated; a truncation
bootstrap is already folded into `rewards` by the caller). GAE targets are constants for the loss, so
implementations may detach their inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import F64, I64, PTR, cpp_source, float32_cpu, load_function
from gymflow_kernels.registry import CandidateUnavailable, Op, candidate, register

TRITON_SOURCE = (Path(__file__).parent / "triton_scan.py").read_text()
"""The Triton kernel's text: hashed into the cache key without importing triton."""


def gae_reference(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE as the paper writes it: one backward pass over time, carrying the running advantage."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = 0
    for t in reversed(range(T)):
        next_v = next_value if t == T - 1 else values[t + 1]
        nonterminal = 1 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        advantages[t] = last
    return advantages, advantages + values


def gae_numpy(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """The same backward loop in numpy: per-step ufunc calls cost far less than per-step torch dispatch.

    The deltas are computed for all steps at once; only the carried advantage needs the loop, written in place.
    """
    r, v, d, nv = (x.detach().cpu().numpy() for x in (rewards, values, dones, next_value))  # views, no copies
    nonterminal = 1 - d
    next_values = np.concatenate([v[1:], nv[None]])
    deltas = r + gamma * next_values * nonterminal - v  # [T, N]
    decay = (gamma * lam) * nonterminal  # [T, N]: how much of A[t+1] flows into A[t]
    adv = np.empty_like(deltas)
    adv[-1] = deltas[-1]
    for t in range(len(adv) - 2, -1, -1):
        np.multiply(decay[t], adv[t + 1], out=adv[t])
        adv[t] += deltas[t]
    advantages = torch.from_numpy(adv).to(rewards.device)
    return advantages, advantages + values


def gae_doubling(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE as a parallel prefix scan (Hillis-Steele): log2(T) vectorized passes instead of T sequential steps.

    Each step is the affine map A_{t+1} -> delta_t + c_t * A_{t+1} with c_t = gamma * lam * (1 - done_t). After the
    pass with stride s, (a_t, c_t) is the composition of the maps of steps t .. t+2s-1, so once 2s >= T, a_t is A_t
    (maps past the last step see A_T = 0).
    """
    a, c = _deltas_and_decays(rewards, values, dones, next_value, gamma, lam)  # [T, N] each, owned here
    advantages = doubling_scan(a, c)
    return advantages, advantages + values


def doubling_scan(a: Tensor, c: Tensor) -> Tensor:
    """Solve A_t = a_t + c_t * A_{t+1} (A_T = 0) along dim 0 in log2(T) passes; overwrites and returns `a`."""
    T, stride = a.shape[0], 1
    while stride < T:
        a[:-stride] += c[:-stride] * a[stride:]  # the product is formed before the in-place add: no aliasing
        c[:-stride] = c[:-stride] * c[stride:]
        c[-stride:] = 0  # windows running past the last step carry nothing in
        stride *= 2
    return a


def gae_blocked(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_value: Tensor,
    gamma: float,
    lam: float,
    block: int = 8,
) -> tuple[Tensor, Tensor]:
    """GAE in closed form per block of time steps, blocks chained by the carried advantage; no per-step loop.

    Within a block A_t = sum_k prod_{j=t}^{k-1} c_j * delta_k with c_j = gamma * lam * (1 - done_j), i.e. a masked
    discount matrix times the deltas (matmul-shaped work, which suits wide batches and accelerators). The advantage
    entering each block from the next one obeys the same recurrence over blocks, so it is solved by the same
    function one level up (depth log_block T).
    """
    if block < 2:
        raise ValueError(f"gae_blocked needs block >= 2 time steps (each level must shrink T), found {block}")
    deltas, decays = _deltas_and_decays(rewards, values, dones, next_value, gamma, lam)
    advantages = blocked_scan(deltas, decays, block)
    return advantages, advantages + values


def blocked_scan(delta: Tensor, decay: Tensor, block: int = 8) -> Tensor:
    """Solve A_t = delta_t + decay_t * A_{t+1} (A_T = 0) along dim 0 of [T, N] tensors, in closed form per block."""
    return _scan(delta.T.contiguous(), decay.T.contiguous(), block).T.contiguous()


def _deltas_and_decays(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """TD errors delta_t and decays c_t = gamma * lam * (1 - done_t), both [T, N] and detached."""
    rewards, values, dones, next_value = (x.detach() for x in (rewards, values, dones, next_value))
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    nonterminal = 1 - dones
    deltas = rewards + gamma * next_values * nonterminal - values
    return deltas, (gamma * lam) * nonterminal


def _scan(delta: Tensor, decay: Tensor, block: int) -> Tensor:
    """Solve A_t = delta_t + decay_t * A_{t+1} with A_T = 0 along the last dim of [M, T] tensors."""
    M, T = delta.shape
    n_blocks = -(-T // block)
    pad = n_blocks * block - T  # padded steps have delta = decay = 0, so they add nothing and pass nothing back
    delta = F.pad(delta, (0, pad)).view(M, n_blocks, block)
    decay = F.pad(decay, (0, pad)).view(M, n_blocks, block)
    local, reach = _solve_blocks(delta, decay)  # A within each block as if it were last; reach = prod of c to its end
    if n_blocks > 1:
        starts = _scan(local[..., 0], reach[..., 0], block)  # [M, n_blocks]: true A at each block's first step
        incoming = F.pad(starts[:, 1:], (0, 1))  # A entering block b from block b + 1 (0 after the last)
        local = local + reach * incoming.unsqueeze(-1)
    return local.reshape(M, n_blocks * block)[:, :T]


def _solve_blocks(delta: Tensor, decay: Tensor) -> tuple[Tensor, Tensor]:
    """Per block [..., B]: (A with nothing after the block, product of decays from each step to the block end).

    W[i, k] = prod_{j=i}^{k-1} c_j for k >= i (0 below the diagonal) is the weight of delta_k in A_i, built as a
    running product along k; an episode end has c_j = 0 and so cuts every weight across it. Column k = B is "just
    after the block": the reach of the advantage carried in from the next block.
    """
    B = delta.shape[-1]
    at_or_below = torch.ones(B, B + 1, dtype=torch.bool, device=delta.device).tril()  # k <= i
    factors = F.pad(decay, (1, 0), value=1.0).unsqueeze(-2)  # [..., 1, B + 1]: factor k is c_{k-1}
    W = torch.where(at_or_below, 1.0, factors).cumprod(-1)  # [..., B(i), B + 1(k)]
    W = W.masked_fill(at_or_below.tril(-1), 0.0)  # k < i: a step never sees earlier deltas
    local = (W @ F.pad(delta, (0, 1)).unsqueeze(-1)).squeeze(-1)  # delta at k = B is 0: nothing carried yet
    return local, W[..., B]


_CPP_SOURCE = cpp_source("gae.cpp")


@candidate(source=_CPP_SOURCE)
def gae_cpp(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """The backward loop in C++ (built once by `load_inline`, cached in the cache dir): no per-step overhead at all."""
    kernel = load_function("gae", _CPP_SOURCE, "gymflow_gae", (PTR,) * 6 + (I64,) * 2 + (F64,) * 2)
    r, v, d, nv = float32_cpu("gae", rewards, values, dones, next_value)
    T, N = r.shape
    if v.shape != r.shape or d.shape != r.shape or nv.shape != (N,):  # C++ would read out of bounds, not raise
        raise ValueError(
            f"gae expects rewards, values, dones of shape [T, N] and next_value of shape [N]; found "
            f"{tuple(r.shape)}, {tuple(v.shape)}, {tuple(d.shape)} and {tuple(nv.shape)}"
        )
    advantages, returns = torch.empty_like(r), torch.empty_like(r)
    kernel(r.data_ptr(), v.data_ptr(), d.data_ptr(), nv.data_ptr(), advantages.data_ptr(), returns.data_ptr(),
           T, N, gamma, lam)
    return advantages, returns


@candidate(devices=("cuda",), source=TRITON_SOURCE)
def gae_triton(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Deltas in torch, the backward recurrence in one Triton kernel (a launch per op, not per time step)."""
    deltas, decays = _deltas_and_decays(rewards.float(), values.float(), dones.float(), next_value.float(), gamma, lam)
    advantages = triton_backward_scan()(deltas, decays).to(rewards.dtype)
    return advantages, advantages + values


def triton_backward_scan() -> Callable[[Tensor, Tensor], Tensor]:
    """`gymflow_kernels.triton_scan.backward_scan`, imported on first use; unavailable without CUDA or triton."""
    if not torch.cuda.is_available():
        raise CandidateUnavailable("Triton candidates need a CUDA device; none is available")
    try:
        from gymflow_kernels.triton_scan import backward_scan  # noqa: PLC0415 - triton is optional (gpu extra)
    except ImportError as exc:
        raise CandidateUnavailable(f"triton is not importable ({exc}); install the gpu extra") from exc
    return backward_scan


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random GAE arguments for shape {"T", "N"}; optional keys make edge cases.

    "dones": "random" (default, each step ends an episode with probability "p_done", default 0.1), "all" or "none";
    "gamma", "lam": discount factors (default 0.99, 0.95).
    """
    T, N = shape["T"], shape["N"]
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=gen)
    values = torch.randn(T, N, generator=gen)
    next_value = torch.randn(N, generator=gen)
    dones = random_dones(shape, (T, N), gen)
    rewards, values, dones, next_value = place(shape, rewards, values, dones, next_value)
    return rewards, values, dones, next_value, shape.get("gamma", 0.99), shape.get("lam", 0.95)


def random_dones(shape: dict, size: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """Episode ends as float 0/1: shape key "dones" is "random" (probability "p_done", default 0.1), "all", "none"."""
    mode = shape.get("dones", "random")
    if mode == "random":
        return (torch.rand(size, generator=gen) < shape.get("p_done", 0.1)).float()
    if mode in ("all", "none"):
        return torch.full(size, 1.0 if mode == "all" else 0.0)
    raise ValueError(f"shape key 'dones' must be 'random', 'all' or 'none', found {mode!r}")


def bucket(inputs: tuple) -> dict:
    """Shape bucket of a GAE call: T and N rounded up to the next power of two."""
    rewards = inputs[0]
    if rewards.dim() != 2:
        raise ValueError(f"GAE expects rewards of shape [T, N], found shape {tuple(rewards.shape)}")
    T, N = rewards.shape
    return {"T": next_pow2(T), "N": next_pow2(N)}


EDGE_CASES: tuple[dict, ...] = (
    {"T": 1, "N": 1},
    {"T": 1, "N": 5, "dones": "all"},
    {"T": 7, "N": 3, "dones": "all"},
    {"T": 33, "N": 5, "dones": "none"},
    {"T": 65, "N": 3, "dones": "none", "gamma": 1.0, "lam": 1.0},
    {"T": 17, "N": 1, "lam": 0.0},
    {"T": 97, "N": 7, "p_done": 0.5},
    {"T": 2048, "N": 3, "p_done": 0.002},  # long horizon with a few episode ends: drift in chained blocks shows here
)

GAE = register(
    Op(
        name="gae",
        reference=gae_reference,
        candidates={"numpy": gae_numpy, "doubling": gae_doubling, "blocked": gae_blocked, "cpp": gae_cpp,
                    "triton": gae_triton, "compile": compiled(gae_doubling)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("T", "N"),
        edge_cases=EDGE_CASES,
        default_shapes=({"T": 128, "N": 64},),  # the quick preset: 128 steps of 2 workers x 32 envs
        calls_per_run=100,  # once per iteration; the quick preset runs 100
    )
)
