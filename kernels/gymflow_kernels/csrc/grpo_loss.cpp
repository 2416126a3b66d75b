// GRPO loss's C++ candidate (`grpo_loss_cpp` in kernels/gymflow_kernels/grpo_loss.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).

#include <algorithm>
#include <cmath>
#include <cstdint>

// GRPO loss and d loss / d logprobs over [B, T] float32 buffers (sums in double). A token of weight 0 is skipped,
// so whatever it holds (padding, NaN) reaches no output. stats: loss, then kl and clip_fraction as means over the
// tokens of nonzero weight. ref is not read when beta == 0.
extern "C" void gymflow_grpo_loss(const float* lp, const float* old, const float* ref, const float* advantages,
                                  const float* weights, std::int64_t B, std::int64_t T, double eps_d, double beta,
                                  float* stats, float* grad) {
  const float lo = static_cast<float>(1 - eps_d), hi = static_cast<float>(1 + eps_d), eps = static_cast<float>(eps_d);
  double loss = 0, kl_sum = 0;
  std::int64_t tokens = 0, clipped = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const float adv = advantages[b];
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int64_t k = b * T + t;
      const float w = weights[k];
      grad[k] = 0;
      if (w == 0) continue;
      const float ratio = std::exp(lp[k] - old[k]);
      const float a = ratio * adv, c = std::min(std::max(ratio, lo), hi) * adv;
      const float ga = a, gc = ratio >= lo && ratio <= hi ? a : 0.0f;
      float per_token = -std::min(a, c), g = -(a < c ? ga : (a > c ? gc : 0.5f * (ga + gc)));
      if (beta != 0) {
        const float d = ref[k] - lp[k], e = std::exp(d), kl = e - d - 1;
        per_token += static_cast<float>(beta) * kl;
        g += static_cast<float>(beta) * (1 - e);
        kl_sum += kl;
      }
      loss += per_token * w;
      grad[k] = g * w;
      tokens += 1;
      clipped += std::fabs(ratio - 1) > eps ? 1 : 0;
    }
  }
  const double counted = static_cast<double>(std::max<std::int64_t>(tokens, 1));
  stats[0] = static_cast<float>(loss);
  stats[1] = static_cast<float>(kl_sum / counted);
  stats[2] = static_cast<float>(clipped / counted);
}
