// Shared by the MLP kernels (policy_mlp.cpp, ppo_grad.cpp): a tanh that vectorizes and a register-blocked
// linear layer. Included as text by gymflow_kernels.native.cpp_source.
#pragma once

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
