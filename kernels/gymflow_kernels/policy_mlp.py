"""Batched inference of the MLP actor-critic (two tanh MLPs, e.g. 64x64): what env workers run every step.

Every implementation has the signature
    policy_mlp_forward(obs[B, D], aw1, ab1, aw2, ab2, aw3, ab3, cw1, cb1, cw2, cb2, cw3, cb3) -> (mean[B, A], value[B])
with nn.Linear's layout (weight [out, in], bias [out]): actor obs -> H1 -> H2 -> A, critic obs -> H1 -> H2 -> 1,
tanh after each hidden layer, as `rl_core.policies.mlp.ActorCritic` builds them. A caller passes
`[p for m in (model.actor, model.critic) for layer in m if isinstance(layer, nn.Linear)
for p in (layer.weight, layer.bias)]`. At rollout batch sizes (tens of envs) the work is tiny and each torch op's
dispatch cost dominates, which is what the candidates attack: fewer, fused calls.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gymflow_kernels.compiled import compiled
from gymflow_kernels.inputs import next_pow2, place
from gymflow_kernels.native import I64, PTR, cpp_source, float32_cpu, load_function
from gymflow_kernels.registry import Op, candidate, register


def policy_mlp_reference(obs: Tensor, *params: Tensor) -> tuple[Tensor, Tensor]:
    """Layer by layer, as nn.Sequential runs it: linear, tanh, linear, tanh, linear; actor then critic."""
    outputs = []
    for w1, b1, w2, b2, w3, b3 in (params[:6], params[6:]):
        x = torch.tanh(F.linear(obs, w1, b1))
        x = torch.tanh(F.linear(x, w2, b2))
        outputs.append(F.linear(x, w3, b3))
    mean, value = outputs
    return mean, value.squeeze(-1)


def policy_mlp_addmm(obs: Tensor, *params: Tensor) -> tuple[Tensor, Tensor]:
    """addmm with the bias fused into the matmul and tanh in place: half the allocations of the reference."""
    outputs = []
    for w1, b1, w2, b2, w3, b3 in (params[:6], params[6:]):
        x = torch.addmm(b1, obs, w1.t()).tanh_()
        x = torch.addmm(b2, x, w2.t()).tanh_()
        outputs.append(torch.addmm(b3, x, w3.t()))
    mean, value = outputs
    return mean, value.squeeze(-1)


def policy_mlp_stacked(obs: Tensor, *params: Tensor) -> tuple[Tensor, Tensor]:
    """Actor and critic side by side: one addmm for both first layers, one baddbmm for both second layers."""
    aw1, ab1, aw2, ab2, aw3, ab3, cw1, cb1, cw2, cb2, cw3, cb3 = params
    h1 = aw1.shape[0]
    if cw1.shape[0] != h1 or cw2.shape != aw2.shape:
        return policy_mlp_addmm(obs, *params)  # stacking needs equal hidden widths
    x = torch.addmm(torch.cat([ab1, cb1]), obs, torch.cat([aw1, cw1]).t()).tanh_()  # [B, 2 * H1]
    x = x.view(-1, 2, h1).transpose(0, 1)  # [2, B, H1]
    w2 = torch.stack([aw2, cw2]).transpose(1, 2)  # [2, H1, H2]
    x = torch.baddbmm(torch.stack([ab2, cb2]).unsqueeze(1), x, w2).tanh_()  # [2, B, H2]
    return torch.addmm(ab3, x[0], aw3.t()), torch.addmm(cb3, x[1], cw3.t()).squeeze(-1)


def policy_mlp_numpy(obs: Tensor, *params: Tensor) -> tuple[Tensor, Tensor]:
    """The same layers in numpy: matmul through BLAS, and about a microsecond per call instead of several."""
    x0, *p = (t.detach().numpy() for t in float32_cpu("policy_mlp_forward", obs, *params))
    outputs = []
    for w1, b1, w2, b2, w3, b3 in (p[:6], p[6:]):
        x = np.tanh(x0 @ w1.T + b1)
        x = np.tanh(x @ w2.T + b2)
        outputs.append(x @ w3.T + b3)
    mean, value = outputs
    return torch.from_numpy(mean), torch.from_numpy(value[:, 0].copy())


_CPP_SOURCE = cpp_source("policy_mlp.cpp")  # includes mlp_layers.h, which ppo_grad.cpp shares


@candidate(source=_CPP_SOURCE)
def policy_mlp_cpp(obs: Tensor, *params: Tensor) -> tuple[Tensor, Tensor]:
    """Both MLPs in one C++ call (built on first use, cached on disk): no per-layer dispatch at all. At rollout
    sizes the Python around the call is a third of the time, so the shape check is done once per set of shapes."""
    kernel = load_function("policy_mlp", _CPP_SOURCE, "gymflow_actor_critic", (PTR,) * 5 + (I64,) * 3)
    x, *p = float32_cpu("policy_mlp_forward", obs, *params)
    B, D = x.shape
    widths, A = mlp_layout(D, tuple(t.shape for t in p))
    mean, value = torch.empty(B, A), torch.empty(B)
    kernel(x.data_ptr(), (ctypes.c_void_p * 12)(*[t.data_ptr() for t in p]), widths, mean.data_ptr(),
           value.data_ptr(), B, D, A)
    return mean, value


@functools.lru_cache(maxsize=64)
def mlp_layout(D: int, shapes: tuple[torch.Size, ...]) -> tuple[ctypes.Array, int]:
    """Hidden widths (as the C array the kernel reads) and action count of parameters with `shapes`, checked to
    chain from obs width D: C++ would read out of bounds, not raise."""
    if len(shapes) != 12:
        raise ValueError(f"policy_mlp_forward takes 12 parameters (actor, then critic), found {len(shapes)}")
    widths = [shapes[0][0], shapes[2][0], shapes[6][0], shapes[8][0]]
    A = shapes[4][0]
    expected = [(widths[0], D), (widths[0],), (widths[1], widths[0]), (widths[1],), (A, widths[1]), (A,),
                (widths[2], D), (widths[2],), (widths[3], widths[2]), (widths[3],), (1, widths[3]), (1,)]
    if [tuple(s) for s in shapes] != expected:
        raise ValueError(f"policy_mlp_forward: parameter shapes {[tuple(s) for s in shapes]} do not chain from "
                         f"obs width {D}; expected {expected}")
    return (ctypes.c_int64 * 4)(*widths), A


def make_inputs(shape: dict, seed: int) -> tuple:
    """Observations [B, D] and the 12 parameters for hidden width H and A actions, scaled like an orthogonal init."""
    B, D, H, A = shape["B"], shape["D"], shape["H"], shape["A"]
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, D, generator=gen) * shape.get("scale", 1.0)
    params = []
    for out_dim in (A, 1):
        for fan_in, fan_out in ((D, H), (H, H), (H, out_dim)):
            weight = torch.randn(fan_out, fan_in, generator=gen) / fan_in**0.5
            params += [weight, 0.1 * torch.randn(fan_out, generator=gen)]
    return place(shape, obs, *params)


def bucket(inputs: tuple) -> dict:
    """Batch rounded up to a power of two; the layer widths exactly (fixed per model)."""
    obs, aw1, _, aw2, _, aw3 = inputs[:6]
    if obs.dim() != 2:
        raise ValueError(f"policy_mlp_forward expects obs of shape [B, D], found {tuple(obs.shape)}")
    return {"B": next_pow2(obs.shape[0]), "D": obs.shape[1], "H": aw1.shape[0], "H2": aw2.shape[0], "A": aw3.shape[0]}


EDGE_CASES: tuple[dict, ...] = (
    {"B": 1, "D": 1, "H": 1, "A": 1},
    {"B": 7, "D": 17, "H": 5, "A": 6},
    {"B": 33, "D": 3, "H": 64, "A": 2, "scale": 30.0},  # saturated tanh
    {"B": 257, "D": 376, "H": 64, "A": 17},  # Humanoid's widths
)

POLICY_MLP_FORWARD = register(
    Op(
        name="policy_mlp_forward",
        reference=policy_mlp_reference,
        candidates={"addmm": policy_mlp_addmm, "stacked": policy_mlp_stacked, "numpy": policy_mlp_numpy,
                    "cpp": policy_mlp_cpp, "compile": compiled(policy_mlp_reference)},
        make_inputs=make_inputs,
        bucket=bucket,
        dims=("B", "D", "H", "A"),
        edge_cases=EDGE_CASES,
        default_shapes=({"B": 32, "D": 17, "H": 64, "A": 6},),  # HalfCheetah, one worker's 32 envs per step
        calls_per_run=12_800,  # one per env step: 128 steps x 100 iterations, in each env worker
    )
)
