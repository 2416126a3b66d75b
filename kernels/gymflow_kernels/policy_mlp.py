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
from gymflow_kernels.native import I64, PTR, float32_cpu, load_function
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


CPP_LAYERS = r"""
// Nothing here reads floating-point exception flags; without this GCC keeps the clamp in tanh as branches (they
// could trap) and will not vectorize the tanh loop, which then costs as much as both matmuls.
#pragma GCC optimize("no-trapping-math")
#include <algorithm>
#include <cstdint>
#include <vector>

// tanh as a rational function (Eigen's float approximation, a few ulp): vectorizes, where std::tanh is a libm call
// per element that costs more than the whole matmul at these sizes.
static inline float fast_tanh(float x) {
  x = std::min(std::max(x, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = x * x;
  float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = x2 * p + -8.60467152213735e-11f;
  p = x2 * p + 5.12229709037114e-08f;
  p = x2 * p + 1.48572235717979e-05f;
  p = x2 * p + 6.37261928875436e-04f;
  p = x2 * p + 4.89352455891786e-03f;
  float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = x2 * q + 2.26843463243900e-03f;
  q = x2 * q + 4.89352518554385e-03f;
  // No special case near 0 (Eigen returns x for |x| < 4e-4; the rational function is within an ulp or two there).
  return x * p / q;
}

// Sixteen floats: one AVX-512 register, or two AVX ones (GCC/Clang vector extension, split by the compiler where the
// SIMD is narrower). Spelled out because GCC 12 does not vectorize the same blocking written with a 2-D float array
// of accumulators (3x slower, measured).
typedef float v16 __attribute__((vector_size(64)));
static inline v16 load16(const float* p) { v16 v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void store16(float* p, v16 v) { __builtin_memcpy(p, &v, sizeof v); }

// R rows x 16 outputs (from ob) of y = x @ wt + b, wt [in, out] (a weight transposed): the R x 16 sums stay in
// registers across the whole loop over inputs and are stored once. R independent rows keep R chains of
// multiply-adds in flight (one chain waits out each add's latency). x's element (row r, input i) is at
// r * xr + i * xi, so a transposed x is read in place. Each output is the sum over inputs in input order, whatever
// the vector width and R, so every choice below gives the same bits.
template <int R>
static inline void linear_block(const float* __restrict x, std::int64_t xr, std::int64_t xi,
                                const float* __restrict wt, const float* __restrict b, float* __restrict y,
                                std::int64_t in, std::int64_t out, std::int64_t ys, std::int64_t ob) {
  v16 acc[R];
  const v16 bias = load16(b + ob);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = bias;
  for (std::int64_t i = 0; i < in; ++i) {
    const v16 w = load16(wt + i * out + ob);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] += x[r * xr + i * xi] * w;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) store16(y + r * ys + ob, acc[r]);
}

// Rows per block: accumulators that fit the registers with room for the weights (AVX-512 has 32 vector registers,
// AVX 16, in which a v16 is two). On a Zen 5 with AVX-512, 16-wide blocks of 8 rows took ppo_grad's HalfCheetah
// minibatch of 512 in 0.80x the time of 8-wide blocks of 6 (Humanoid's 0.65x), 12 rows the same as 8.
#if defined(__AVX512F__)
constexpr int kBlockRows = 8;
#else
constexpr int kBlockRows = 6;
#endif

// x[in] . w[in] in 8 interleaved partial sums (a vector register), for outputs that do not fill a block of 16.
static inline float dot(const float* __restrict x, const float* __restrict w, std::int64_t in) {
  float part[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= in; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += x[i + k] * w[i + k];
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < in; ++i) sum += x[i] * w[i];
  return sum;
}

// y[B, :full] (row stride ys) = x[B, in] @ wt[in, :full] + b (wt's row stride `out`), `full` a multiple of 16,
// x's element (r, i) at r * xr + i * xi: `linear_block` on `kBlockRows` rows at a time, then on the rows left over.
static void matmul_blocks(const float* __restrict x, std::int64_t xr, std::int64_t xi, const float* __restrict wt,
                          const float* __restrict b, float* __restrict y, std::int64_t B, std::int64_t in,
                          std::int64_t out, std::int64_t ys, std::int64_t full) {
  constexpr std::int64_t K = 16;
  std::int64_t r = 0;
  for (; r + kBlockRows <= B; r += kBlockRows)
    for (std::int64_t ob = 0; ob < full; ob += K)
      linear_block<kBlockRows>(x + r * xr, xr, xi, wt, b, y + r * ys, in, out, ys, ob);
  for (; r + 4 <= B; r += 4)  // the rows left over: four at a time, then one
    for (std::int64_t ob = 0; ob < full; ob += K)
      linear_block<4>(x + r * xr, xr, xi, wt, b, y + r * ys, in, out, ys, ob);
  for (; r < B; ++r)
    for (std::int64_t ob = 0; ob < full; ob += K)
      linear_block<1>(x + r * xr, xr, xi, wt, b, y + r * ys, in, out, ys, ob);
}

// y[B, out] (row stride ys) = x[B, in] @ w[out, in]^T + b, then tanh if asked. Blocks of 16 outputs go through
// `matmul_blocks` on the transposed weight; the outputs left over (an action head, a value) are dot products with
// the weight's rows.
static void linear(const float* __restrict x, const float* __restrict w, const float* __restrict b,
                   float* __restrict y, std::int64_t B, std::int64_t in, std::int64_t out, std::int64_t ys,
                   bool apply_tanh, std::vector<float>& wt) {
  const std::int64_t full = out - out % 16;
  if (full > 0) {
    wt.resize(in * out);
    for (std::int64_t o = 0; o < out; ++o)
      for (std::int64_t i = 0; i < in; ++i) wt[i * out + o] = w[o * in + i];
    matmul_blocks(x, in, 1, wt.data(), b, y, B, in, out, ys, full);
  }
  for (std::int64_t r = 0; r < B; ++r) {
    const float* __restrict xr = x + r * in;
    float* __restrict yr = y + r * ys;
    for (std::int64_t o = full; o < out; ++o) yr[o] = b[o] + dot(xr, w + o * in, in);
    if (apply_tanh)
      for (std::int64_t o = 0; o < out; ++o) yr[o] = fast_tanh(yr[o]);
  }
}
"""
"""C++ shared by the MLP kernels (also `kernels.ppo_grad`): vectorizable tanh and a register-blocked linear layer."""

_CPP_SOURCE = CPP_LAYERS + r"""
// Actor (D -> h[0] -> h[1] -> A) into mean[B, A], critic (D -> h[2] -> h[3] -> 1) into value[B]; p holds the 12
// parameters in the op's order and h the 4 hidden widths.
extern "C" void gymflow_actor_critic(const float* x, const float* const* p, const std::int64_t* h, float* mean,
                                     float* value, std::int64_t B, std::int64_t D, std::int64_t A) {
  std::vector<float> a, c, wt;
  for (int net = 0; net < 2; ++net) {
    const float* const* q = p + 6 * net;
    const std::int64_t h1 = h[2 * net], h2 = h[2 * net + 1], out = net == 0 ? A : 1;
    a.resize(B * h1);
    c.resize(B * h2);
    linear(x, q[0], q[1], a.data(), B, D, h1, h1, true, wt);
    linear(a.data(), q[2], q[3], c.data(), B, h1, h2, h2, true, wt);
    linear(c.data(), q[4], q[5], net == 0 ? mean : value, B, h2, out, out, false, wt);
  }
}
"""


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
