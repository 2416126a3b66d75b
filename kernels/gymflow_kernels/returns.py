"""Discounted returns as a tunable op: the reference loop and its candidates.

Every implementation has the signature
    discounted_returns(rewards[T, N], dones[T, N], next_value[N], gamma) -> returns[T, N]
with R_t = r_t + gamma * (1 - done_t) * R_{t+1} and R_T = next_value (the critic's bootstrap; pass zeros for none).
`dones[t] = 1` means the episode ended with the action at t, so nothing flows back across it. These are the value
targets of REINFORCE-style updates and of GAE with lambda = 1; the candidates reuse GAE's scans for that reason.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.gae import EDGE_CASES as GAE_EDGE_CASES
from gymflow_kernels.gae import TRITON_SOURCE, blocked_scan, doubling_scan, random_dones, triton_backward_scan
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import F64, I64, PTR, cpp_source, float32_cpu, load_function
from gymflow_kernels.registry import Op, candidate, register


def returns_reference(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """The textbook backward pass over time, carrying the running return."""
    returns = torch.zeros_like(rewards)
    running = next_value
    for t in reversed(range(rewards.shape[0])):
        running = rewards[t] + gamma * (1 - dones[t]) * running
        returns[t] = running
    return returns


def returns_numpy(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """The same loop in numpy, written in place: a ufunc call costs far less than a torch dispatch."""
    r, d, nv = (x.detach().cpu().numpy() for x in (rewards, dones, next_value))
    decay = gamma * (1 - d)  # [T, N]
    out = np.empty_like(r)
    np.multiply(decay[-1], nv, out=out[-1])
    out[-1] += r[-1]
    for t in range(len(out) - 2, -1, -1):
        np.multiply(decay[t], out[t + 1], out=out[t])
        out[t] += r[t]
    return torch.from_numpy(out).to(rewards.device)


def _bootstrapped(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """(a, c) of the recurrence R_t = a_t + c_t R_{t+1}, R_T = 0: the bootstrap folded into the last reward."""
    rewards, dones, next_value = (x.detach() for x in (rewards, dones, next_value))
    decay = gamma * (1 - dones)
    a = rewards.clone()
    a[-1] += decay[-1] * next_value
    return a, decay


def returns_doubling(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """A parallel prefix scan: log2(T) vectorized passes instead of T sequential steps (see `gae.doubling_scan`)."""
    return doubling_scan(*_bootstrapped(rewards, dones, next_value, gamma))


def returns_blocked(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """Closed form per block of time steps, blocks chained by the carried return (see `gae.blocked_scan`)."""
    return blocked_scan(*_bootstrapped(rewards, dones, next_value, gamma))


_CPP_SOURCE = cpp_source("returns.cpp")


@candidate(source=_CPP_SOURCE)
def returns_cpp(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """The loop in C++ (built on first use, cached on disk): one pass, no per-step dispatch."""
    kernel = load_function("returns", _CPP_SOURCE, "gymflow_returns", (PTR,) * 4 + (I64,) * 2 + (F64,))
    r, d, nv = float32_cpu("discounted_returns", rewards, dones, next_value)
    T, N = r.shape
    if d.shape != r.shape or nv.shape != (N,):  # C++ would read out of bounds, not raise
        raise ValueError(f"discounted_returns expects rewards, dones of shape [T, N] and next_value of shape [N]; "
                         f"found {tuple(r.shape)}, {tuple(d.shape)} and {tuple(nv.shape)}")
    out = torch.empty_like(r)
    kernel(r.data_ptr(), d.data_ptr(), nv.data_ptr(), out.data_ptr(), T, N, gamma)
    return out


@candidate(devices=("cuda",), source=TRITON_SOURCE)
def returns_triton(rewards: Tensor, dones: Tensor, next_value: Tensor, gamma: float) -> Tensor:
    """The backward recurrence in one Triton kernel (shared with GAE)."""
    a, c = _bootstrapped(rewards.float(), dones.float(), next_value.float(), gamma)
    return triton_backward_scan()(a, c).to(rewards.dtype)


def make_inputs(shape: dict, seed: int) -> tuple:
    """Random arguments for shape {"T", "N"}; "dones" ("random" | "all" | "none"), "p_done", "gamma" as for GAE."""
    T, N = shape["T"], shape["N"]
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=gen)
    next_value = torch.randn(N, generator=gen)
    dones = random_dones(shape, (T, N), gen)
    return (*place(shape, rewards, dones, next_value), shape.get("gamma", 0.99))


def bucket(inputs: tuple) -> dict:
    """T and N rounded up to the next power of two."""
    rewards = inputs[0]
    if rewards.dim() != 2:
        raise ValueError(f"discounted_returns expects rewards of shape [T, N], found {tuple(rewards.shape)}")
    return {"T": next_pow2(rewards.shape[0]), "N": next_pow2(rewards.shape[1])}


DISCOUNTED_RETURNS = register(
    Op(
        name="discounted_returns",
        reference=returns_reference,
        candidates={"numpy": returns_numpy, "doubling": returns_doubling, "blocked": returns_blocked,
                    "cpp": returns_cpp, "triton": returns_triton, "compile": compiled(returns_doubling)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("T", "N"),
        edge_cases=tuple({k: v for k, v in edge.items() if k != "lam"} for edge in GAE_EDGE_CASES),
        default_shapes=({"T": 128, "N": 64},),
        calls_per_run=100,
    )
)
