// PPO's minibatch gradient's C++ candidate (`ppo_grad_cpp` in kernels/gymflow_kernels/ppo_grad.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).
#include "mlp_layers.h"
#include "ppo_loss.cpp"  // the PPO loss kernel itself: one translation unit
#include "two_halves.h"

#include <cmath>

// dx[B, in] = dz[B, out] @ w[out, in], times the tanh derivative (1 - h^2) of the layer below (h[B, in]). The
// weight is already in the layout `matmul_blocks` reads (inner dimension first); columns past the last block of 16
// are summed one by one.
static void backward_input(const float* __restrict dz, const float* __restrict w, const float* __restrict h,
                           float* __restrict dx, std::int64_t B, std::int64_t in, std::int64_t out,
                           std::vector<float>& zeros) {
  const std::int64_t full = in - in % 16;
  zeros.assign(in, 0.0f);
  matmul_blocks(dz, out, 1, w, zeros.data(), dx, B, out, in, in, full);
  for (std::int64_t r = 0; r < B; ++r) {
    for (std::int64_t i = full; i < in; ++i) {
      float acc = 0;
      for (std::int64_t o = 0; o < out; ++o) acc += dz[r * out + o] * w[o * in + i];
      dx[r * in + i] = acc;
    }
    for (std::int64_t i = 0; i < in; ++i) dx[r * in + i] *= 1 - h[r * in + i] * h[r * in + i];
  }
}

// dw[out, in] = dz^T @ x and db[out] = column sums of dz, over B rows: `matmul_blocks` with the B rows as its inner
// dimension, x [B, in] as its (already transposed) weight and dz read transposed in place.
static void backward_weight(const float* __restrict dz, const float* __restrict x, float* __restrict dw,
                            float* __restrict db, std::int64_t B, std::int64_t in, std::int64_t out,
                            std::vector<float>& zeros) {
  const std::int64_t full = in - in % 16;
  zeros.assign(in, 0.0f);
  matmul_blocks(dz, 1, out, x, zeros.data(), dw, out, B, in, in, full);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t i = full; i < in; ++i) dw[o * in + i] = 0;
  for (std::int64_t r = 0; r < B; ++r)  // the columns left over, and the bias, one row of dz at a time
    for (std::int64_t o = 0; o < out; ++o) {
      const float g = dz[r * out + o];
      for (std::int64_t i = full; i < in; ++i) dw[o * in + i] += g * x[r * in + i];
    }
  for (std::int64_t o = 0; o < out; ++o) db[o] = 0;
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t o = 0; o < out; ++o) db[o] += dz[r * out + o];
}

// One MLP (D -> h1 -> h2 -> out, tanh between): its activations kept for the backward pass. Every buffer is its
// own, so the actor and the critic can run on two threads at once.
struct Mlp {
  const float* const* p;  // w1, b1, w2, b2, w3, b3
  std::int64_t h1, h2, out;
  std::vector<float> a1, a2, y, d2, d1, zeros, wt;

  void forward(const float* x, std::int64_t B, std::int64_t D) {
    a1.resize(B * h1);
    a2.resize(B * h2);
    y.resize(B * out);
    linear(x, p[0], p[1], a1.data(), B, D, h1, h1, true, wt);
    linear(a1.data(), p[2], p[3], a2.data(), B, h1, h2, h2, true, wt);
    linear(a2.data(), p[4], p[5], y.data(), B, h2, out, out, false, wt);
  }

  // Gradients of w1, b1, ..., b3 (contiguous, in that order, at g) from dy[B, out].
  void backward(const float* x, const float* dy, std::int64_t B, std::int64_t D, float* g) {
    d2.resize(B * h2);
    d1.resize(B * h1);
    float* gw1 = g;
    float* gb1 = gw1 + h1 * D;
    float* gw2 = gb1 + h1;
    float* gb2 = gw2 + h2 * h1;
    float* gw3 = gb2 + h2;
    float* gb3 = gw3 + out * h2;
    backward_weight(dy, a2.data(), gw3, gb3, B, h2, out, zeros);
    backward_input(dy, p[4], a2.data(), d2.data(), B, h2, out, zeros);
    backward_weight(d2.data(), a1.data(), gw2, gb2, B, h1, h2, zeros);
    backward_input(d2.data(), p[2], a1.data(), d1.data(), B, h1, h2, zeros);
    backward_weight(d1.data(), x, gw1, gb1, B, D, h1, zeros);
  }

  std::int64_t size(std::int64_t D) const { return h1 * D + h1 + h2 * h1 + h2 + out * h2 + out; }
};

// stats[6] as the ppo_loss kernel writes them; grad[P]: actor, critic, log_std gradients, flattened.
extern "C" void gymflow_ppo_grad(const float* x, const float* act, const float* old_lp, const float* adv,
                                 const float* old_v, const float* ret, const float* const* p, const std::int64_t* h,
                                 std::int64_t B, std::int64_t D, std::int64_t A, double clip, double vf, double ec,
                                 std::int64_t clip_vloss, std::int64_t threads, float* stats, float* grad) {
  // This thread's buffers, named by reference: a lambda run on the helper thread would otherwise see its own.
  thread_local Mlp actor_buffers, critic_buffers;
  thread_local std::vector<float> logprob, entropy, g_lp, g_v_buffer, g_ent, d_mean_buffer;
  Mlp &actor = actor_buffers, &critic = critic_buffers;
  std::vector<float> &g_v = g_v_buffer, &d_mean = d_mean_buffer;
  actor.p = p;
  actor.h1 = h[0], actor.h2 = h[1], actor.out = A;
  critic.p = p + 6;
  critic.h1 = h[2], critic.h2 = h[3], critic.out = 1;
  both(threads, [&] { actor.forward(x, B, D); }, [&] { critic.forward(x, B, D); });

  // Normal(mean, exp(log_std)): log_prob and entropy as torch.distributions computes them, per sample summed over A.
  const float* log_std = p[12];
  const float log_sqrt_2pi = static_cast<float>(std::log(std::sqrt(2 * M_PI)));
  const float ent_const = static_cast<float>(0.5 + 0.5 * std::log(2 * M_PI));
  std::vector<float> var(A), log_scale(A);
  for (std::int64_t a = 0; a < A; ++a) {
    const float scale = std::exp(log_std[a]);
    var[a] = scale * scale;
    log_scale[a] = std::log(scale);
  }
  logprob.resize(B);
  entropy.resize(B);
  d_mean.resize(B * A);  // holds action - mean until the gradient below overwrites it
  for (std::int64_t r = 0; r < B; ++r) {
    float lp = 0, en = 0;
    for (std::int64_t a = 0; a < A; ++a) {
      const float d = d_mean[r * A + a] = act[r * A + a] - actor.y[r * A + a];
      lp += -(d * d) / (2 * var[a]) - log_scale[a] - log_sqrt_2pi;
      en += ent_const + log_scale[a];
    }
    logprob[r] = lp;
    entropy[r] = en;
  }
  g_lp.resize(B);
  g_v.resize(B);
  g_ent.resize(B);
  gymflow_ppo_loss(logprob.data(), old_lp, adv, critic.y.data(), old_v, ret, entropy.data(), B, clip, vf, ec,
                   clip_vloss, stats, g_lp.data(), g_v.data(), g_ent.data());

  // d log_prob / d mean = (action - mean) / var; d / d log_std = (action - mean)^2 / var - 1 (+1 from entropy).
  const std::int64_t actor_size = actor.size(D), critic_size = critic.size(D);
  float* g_log_std = grad + actor_size + critic_size;
  std::vector<double> g_s(A, 0.0);
  for (std::int64_t r = 0; r < B; ++r)
    for (std::int64_t a = 0; a < A; ++a) {
      const float d = d_mean[r * A + a];
      d_mean[r * A + a] = g_lp[r] * d / var[a];
      g_s[a] += g_lp[r] * (d * d / var[a] - 1) + g_ent[r];
    }
  for (std::int64_t a = 0; a < A; ++a) g_log_std[a] = static_cast<float>(g_s[a]);
  both(threads, [&] { actor.backward(x, d_mean.data(), B, D, grad); },
       [&] { critic.backward(x, g_v.data(), B, D, grad + actor_size); });
}
