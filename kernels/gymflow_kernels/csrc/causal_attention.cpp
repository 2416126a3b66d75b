// Causal attention in one fixed order of operations (kernels/gymflow_kernels/causal_attention.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// What every output element is, whatever the call's shapes (so that a query has the same bits alone in a decoding
// step or among a thousand in a full forward, whatever keys lie past the ones it sees):
//   score[j] = sum over d = 0, 1, .., dim - 1 of (q[d] * scale) * k[j][d], one fused multiply-add per d;
//   p[j] = exp(score[j] - max over j < n of score[j]), for the n keys the query sees;
//   total = the p[j] summed in 8 lanes (lane l: the j = l mod 8, in increasing j), then the lanes in a fixed tree;
//   out[d] = (sum over j = 0, 1, .., n - 1 of p[j] * v[j][d], one fused multiply-add per j) / total,
// in double, rounded to float once. Every multiply-add is fused explicitly (fma8, std::fma: rounded once, the same
// bits in a vector lane or alone), never left to the compiler's contraction; the blocks below only choose which sums
// run side by side, never the terms or the order of any one sum. Keys a query does not see enter none of its sums.

// Eight doubles: one AVX-512 register, or two AVX ones (GCC/Clang vector extension, split by the compiler).
typedef double v8d __attribute__((vector_size(64)));
static inline v8d load8(const double* p) { v8d v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void store8(double* p, v8d v) { __builtin_memcpy(p, &v, sizeof v); }
static inline v8d splat8(double x) { return v8d{x, x, x, x, x, x, x, x}; }

// a * b + c in each lane, rounded once (as std::fma).
static inline v8d fma8(v8d a, v8d b, v8d c) {
#if defined(__AVX512F__)
  return reinterpret_cast<v8d>(_mm512_fmadd_pd(reinterpret_cast<__m512d>(a), reinterpret_cast<__m512d>(b),
                                               reinterpret_cast<__m512d>(c)));
#else
  v8d out;
  for (int l = 0; l < 8; ++l) out[l] = std::fma(a[l], b[l], c[l]);
  return out;
#endif
}

// Element strides of a (batch, heads, positions, head_dim) tensor whose head_dim is contiguous.
struct Layout {
  std::int64_t batch, head, pos;
};

// Query rows scored together (each load of a key column serves all of them), and keys per block of their scores: the
// rows x 16 sums stay in registers over the whole head_dim.
constexpr std::int64_t kRows = 4, kKeys = 16;

// The scores of kRows query rows (queries: their q * scale, dim apart) against key blocks [0, blocks) of keys_t
// (keys_t[d * width + j] = k[j][d]), into scores (width apart per row).
static void score_rows(const double* queries, const double* keys_t, double* scores, std::int64_t dim,
                       std::int64_t width, std::int64_t blocks) {
  for (std::int64_t block = 0; block < blocks; ++block) {
    v8d sums[kRows][2] = {};
    for (std::int64_t d = 0; d < dim; ++d) {
      const double* column = keys_t + d * width + block * kKeys;
      const v8d k0 = load8(column), k1 = load8(column + 8);
#pragma GCC unroll 4
      for (std::int64_t r = 0; r < kRows; ++r) {
        const v8d qd = splat8(queries[r * dim + d]);
        sums[r][0] = fma8(qd, k0, sums[r][0]);
        sums[r][1] = fma8(qd, k1, sums[r][1]);
      }
    }
    for (std::int64_t r = 0; r < kRows; ++r) {
      store8(scores + r * width + block * kKeys, sums[r][0]);
      store8(scores + r * width + block * kKeys + 8, sums[r][1]);
    }
  }
}

// y[r][d] += p[r][j] * values[j][d] for j in [begin, end), in increasing j, for R rows: 32 dims at a time (R x 4
// sums in registers across the keys), the dims past the last 32 one by one.
template <int R>
static void weigh_values(const double* const* p, const double* values, double* const* y, std::int64_t dim,
                         std::int64_t begin, std::int64_t end) {
  const std::int64_t wide = dim - dim % 32;
  for (std::int64_t d0 = 0; d0 < wide; d0 += 32) {
    v8d sums[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) sums[r][c] = load8(y[r] + d0 + 8 * c);
    for (std::int64_t j = begin; j < end; ++j) {
      const double* row = values + j * dim + d0;
      const v8d v0 = load8(row), v1 = load8(row + 8), v2 = load8(row + 16), v3 = load8(row + 24);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const v8d pj = splat8(p[r][j]);
        sums[r][0] = fma8(pj, v0, sums[r][0]);
        sums[r][1] = fma8(pj, v1, sums[r][1]);
        sums[r][2] = fma8(pj, v2, sums[r][2]);
        sums[r][3] = fma8(pj, v3, sums[r][3]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) store8(y[r] + d0 + 8 * c, sums[r][c]);
  }
  for (int r = 0; r < R; ++r)
    for (std::int64_t d = wide; d < dim; ++d)
      for (std::int64_t j = begin; j < end; ++j) y[r][d] = std::fma(p[r][j], values[j * dim + d], y[r][d]);
}

// exp(score - max) over a row's n scores, zeros after them up to the next multiple of 8; returns their total.
static double softmax_weights(double* p, std::int64_t n) {
  const double top = *std::max_element(p, p + n);
  for (std::int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - top);
  const std::int64_t padded = (n + 7) / 8 * 8;
  std::fill(p + n, p + padded, 0.0);  // + 0 leaves a lane's sum as it is
  v8d lanes = {};
  for (std::int64_t j = 0; j < padded; j += 8) lanes += load8(p + j);
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// One (batch row, kv head) pair: its `groups` query heads x `steps` queries against keys 0 .. first + steps - 1.
static void attend_pair(const float* q, const float* k, const float* v, float* out, std::int64_t first,
                        std::int64_t steps, std::int64_t groups, std::int64_t dim, Layout ql, Layout kl, Layout vl,
                        Layout ol, double scale) {
  thread_local std::vector<double> keys_t, values, queries, scores, y;  // reused by each calling thread
  const std::int64_t seen = first + steps;  // keys the last query sees
  const std::int64_t width = (seen + kKeys - 1) / kKeys * kKeys;
  keys_t.resize(dim * width);
  values.resize(seen * dim);
  for (std::int64_t j = 0; j < seen; ++j)
    for (std::int64_t d = 0; d < dim; ++d) {
      keys_t[d * width + j] = k[j * kl.pos + d];
      values[j * dim + d] = v[j * vl.pos + d];
    }
  for (std::int64_t d = 0; d < dim; ++d)  // the last block's keys past `seen`: scored, never used
    std::fill(keys_t.begin() + d * width + seen, keys_t.begin() + (d + 1) * width, 0.0);
  const std::int64_t rows = groups * steps;  // row r: query head r / steps of this kv head, query r % steps
  queries.resize(kRows * dim);
  scores.resize(kRows * width);
  y.resize(kRows * dim);
  for (std::int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const std::int64_t live = std::min(kRows, rows - r0);
    std::int64_t n[kRows];
    for (std::int64_t b = 0; b < kRows; ++b) {
      const std::int64_t r = r0 + std::min(b, live - 1);  // past the last row: a copy of it, scored and dropped
      n[b] = first + r % steps + 1;
      const float* row = q + (r / steps) * ql.head + (r % steps) * ql.pos;
      for (std::int64_t d = 0; d < dim; ++d) queries[b * dim + d] = static_cast<double>(row[d]) * scale;
    }
    const std::int64_t most = *std::max_element(n, n + live), least = *std::min_element(n, n + live);
    score_rows(queries.data(), keys_t.data(), scores.data(), dim, width, (most + kKeys - 1) / kKeys);
    double total[kRows];
    const double* p[kRows];
    double* sums[kRows];
    for (std::int64_t b = 0; b < live; ++b) {
      total[b] = softmax_weights(scores.data() + b * width, n[b]);
      p[b] = scores.data() + b * width;
      sums[b] = y.data() + b * dim;
      std::fill(sums[b], sums[b] + dim, 0.0);
    }
    switch (live) {  // the keys every row sees, rows side by side (a decoding step: a kv head's query heads) ...
      case 4: weigh_values<4>(p, values.data(), sums, dim, 0, least); break;
      case 3: weigh_values<3>(p, values.data(), sums, dim, 0, least); break;
      case 2: weigh_values<2>(p, values.data(), sums, dim, 0, least); break;
      default: weigh_values<1>(p, values.data(), sums, dim, 0, least);
    }
    for (std::int64_t b = 0; b < live; ++b)  // ... then each row's own last keys
      weigh_values<1>(p + b, values.data(), sums + b, dim, least, n[b]);
    for (std::int64_t b = 0; b < live; ++b) {
      const std::int64_t r = r0 + b;
      float* o = out + (r / steps) * ol.head + (r % steps) * ol.pos;
      for (std::int64_t d = 0; d < dim; ++d) o[d] = static_cast<float>(sums[b][d] / total[b]);
    }
  }
}

// softmax(q k^T * scale) v of query heads q [batch, heads, steps, dim] over key/value heads k, v [batch, kv_heads,
// >= first[b] + steps, dim] (query head h reads kv head h / (heads / kv_heads)), query i of row b at position
// first[b] + i seeing keys 0 .. first[b] + i; into out [batch, heads, steps, dim]. On the calling thread alone: a
// helper thread (two_halves.h) beside torch's own, which spin between the projections around this call, slowed a
// decoding step more than it sped attention.
extern "C" void gymflow_causal_attention(const float* q, const float* k, const float* v, float* out,
                                         const std::int64_t* first, std::int64_t batch, std::int64_t steps,
                                         std::int64_t heads, std::int64_t kv_heads, std::int64_t dim,
                                         const std::int64_t* strides, double scale) {
  const Layout ql{strides[0], strides[1], strides[2]}, kl{strides[3], strides[4], strides[5]},
      vl{strides[6], strides[7], strides[8]}, ol{strides[9], strides[10], strides[11]};
  const std::int64_t groups = heads / kv_heads;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < kv_heads; ++h)
      attend_pair(q + b * ql.batch + h * groups * ql.head, k + b * kl.batch + h * kl.head,
                  v + b * vl.batch + h * vl.head, out + b * ol.batch + h * groups * ol.head, first[b], steps, groups,
                  dim, ql, kl, vl, ol, scale);
}
