// The host backend of PERK's fused map and its pullback (perk.hpp): blocks
// of Lanes<Vec>::width voxels, split into one contiguous range per thread.
#pragma once

#include <cstdint>

#include "../perk.hpp"
#include "epg.hpp"

#if !defined(__CUDA_ARCH__)
namespace blochsim {
namespace host {

// Signature of a function that runs blocks [b0, b1) of `lanes` voxels with
// a workspace of perk_block_workspace<Vec>(m) floats: the map when g is
// nullptr, else the pullback of g.
using PerkRangeFn = int (*)(const PerkModel& m, const float* x, const float* g, int64_t n, int64_t b0, int64_t b1,
                            void* work, float* xbar, float* out);

inline int perk_range(const PerkModel& m, const float* x, const float* g, int64_t n, int64_t b0, int64_t b1,
                      void* work, float* xbar, float* out) {
  return perk_blocks<Vec>(m, x, g, n, b0, b1, work, xbar, out);
}

// PERK estimates of n voxels: x (n, m.d) float32 inputs, out (n, m.p).
// With a cotangent g (n, m.p) of the estimates, also its pullback xbar (n,
// m.d) to the inputs (out may then be nullptr).  Returns a Status.
inline int perk_status(const PerkModel& m, const float* x, const float* g, int64_t n, float* out, float* xbar,
                       int threads, PerkRangeFn fn = &perk_range) noexcept {
  return guarded([&]() -> int {
    const int v = validate_perk(m);
    if (v != ok) return v;
    if (n < 0 || (n > 0 && (!x || (!g && !out) || (g && !xbar)))) return bad_shape;
    if (threads < 1) return bad_threads;
    if (n == 0) return ok;
    const std::size_t work = static_cast<std::size_t>(perk_block_workspace<Vec>(m));
    return run_ranges((n + lanes - 1) / lanes, threads, work,
                      [&](int64_t b0, int64_t b1, float* w) { return fn(m, x, g, n, b0, b1, w, xbar, out); });
  });
}

}  // namespace host
}  // namespace blochsim
#endif
