// Discounted returns' C++ candidate (`returns_cpp` in kernels/gymflow_kernels/returns.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).

#include <cstdint>

// Backward discounted-return scan over contiguous float32 [T, N] buffers; C entry point for ctypes.
extern "C" void gymflow_returns(const float* r, const float* d, const float* next_value, float* out,
                                std::int64_t T, std::int64_t N, double gamma) {
  const float g = static_cast<float>(gamma);
  for (std::int64_t t = T - 1; t >= 0; --t) {
    const float* next = t == T - 1 ? next_value : out + (t + 1) * N;
    const std::int64_t row = t * N;
    for (std::int64_t n = 0; n < N; ++n) {
      out[row + n] = r[row + n] + g * (1.0f - d[row + n]) * next[n];
    }
  }
}
