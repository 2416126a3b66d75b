// The actor-critic forward's C++ candidate (`policy_mlp_cpp` in kernels/gymflow_kernels/policy_mlp.py).
// Built by gymflow_kernels.native (see its docstring for how csrc/ files become one build).
#include "mlp_layers.h"

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
