// GAE's C++ candidate (`gae_cpp` in kernels/gymflow_kernels/gae.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).

#include <cstdint>
#include <vector>

// Fused backward GAE scan over contiguous float32 [T, N] buffers. A plain C entry point called through ctypes:
// the build needs no torch or pybind11 headers, so it takes well under a second instead of about a minute.
extern "C" void gymflow_gae(const float* r, const float* v, const float* d, const float* next_value,
                            float* adv, float* ret, std::int64_t T, std::int64_t N, double gamma, double lam) {
  const float g = static_cast<float>(gamma);
  const float gl = static_cast<float>(gamma * lam);
  const std::vector<float> zeros(N, 0.0f);
  for (std::int64_t t = T - 1; t >= 0; --t) {
    const float* next_v = t == T - 1 ? next_value : v + (t + 1) * N;
    const float* last = t == T - 1 ? zeros.data() : adv + (t + 1) * N;
    const std::int64_t row = t * N;
    for (std::int64_t n = 0; n < N; ++n) {
      const float nonterminal = 1.0f - d[row + n];
      const float delta = r[row + n] + g * next_v[n] * nonterminal - v[row + n];
      adv[row + n] = delta + gl * nonterminal * last[n];
      ret[row + n] = adv[row + n] + v[row + n];
    }
  }
}
