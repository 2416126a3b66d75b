// PPO loss's C++ candidate (`ppo_loss_cpp` in kernels/gymflow_kernels/ppo_loss.py); ppo_grad.cpp includes it.
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).

#include <algorithm>
#include <cmath>
#include <cstdint>

// Max of a and b as torch's autograd differentiates it: the larger one's gradient, half of each on a tie.
static inline float max_grad(float a, float b, float ga, float gb) {
  return a > b ? ga : (a < b ? gb : 0.5f * (ga + gb));
}

// PPO loss, statistics and gradients in one pass over B samples (sums in double). stats: loss, policy loss,
// value loss, entropy, approx_kl, clip_fraction.
extern "C" void gymflow_ppo_loss(const float* nl, const float* ol, const float* adv, const float* v,
                                 const float* ov, const float* ret, const float* ent, std::int64_t B, double clip_d,
                                 double vf, double ec, std::int64_t clip_vloss, float* stats, float* g_nl,
                                 float* g_v, float* g_ent) {
  const float clip = static_cast<float>(clip_d), lo = static_cast<float>(1 - clip_d),
              hi = static_cast<float>(1 + clip_d);
  double pg = 0, verr = 0, entropy = 0, kl = 0, clipped = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    const float log_ratio = nl[i] - ol[i], ratio = std::exp(log_ratio);
    const float a = -adv[i] * ratio, b = -adv[i] * std::min(std::max(ratio, lo), hi);
    pg += std::max(a, b);
    g_nl[i] = max_grad(a, b, a, ratio >= lo && ratio <= hi ? a : 0.0f) / static_cast<float>(B);
    const float diff = v[i] - ret[i];
    float err = diff * diff, g = 2 * diff;
    if (clip_vloss) {
      const float delta = v[i] - ov[i];
      const float vc = ov[i] + std::min(std::max(delta, -clip), clip), err_c = (vc - ret[i]) * (vc - ret[i]);
      g = max_grad(err, err_c, g, delta >= -clip && delta <= clip ? 2 * (vc - ret[i]) : 0.0f);
      err = std::max(err, err_c);
    }
    verr += err;
    g_v[i] = static_cast<float>(0.5 * vf / B) * g;
    g_ent[i] = static_cast<float>(-ec / B);
    entropy += ent[i];
    kl += (ratio - 1) - log_ratio;
    clipped += std::fabs(ratio - 1) > clip ? 1 : 0;
  }
  const double pg_mean = pg / B, v_loss = 0.5 * (verr / B), ent_mean = entropy / B;
  const double values[6] = {pg_mean + vf * v_loss - ec * ent_mean, pg_mean, v_loss, ent_mean, kl / B, clipped / B};
  for (int k = 0; k < 6; ++k) stats[k] = static_cast<float>(values[k]);
}
