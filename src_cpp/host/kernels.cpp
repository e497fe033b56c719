// The host block kernels for one instruction set.  meson compiles this file
// once per x86-64 level with -march=<level>, -DBLOCHSIM_ISA=<namespace> and
// -DBLOCHSIM_ISA_SUFFIX=<suffix>: the lane vectors of tile.hpp are lowered
// to that level's registers, and the inline namespace keeps each build's
// inline functions apart at link time.
#include <blochsim/epg/adjoint.hpp>
#include <blochsim/epg/epg.hpp>
#include <blochsim/epg/jacobian.hpp>
#include <blochsim/perk.hpp>
#include <blochsim/pools/lanes.hpp>
#include <blochsim/pools/player.hpp>

#include "dispatch.hpp"

#ifndef BLOCHSIM_ISA_SUFFIX
#define BLOCHSIM_ISA_SUFFIX default
#endif
#define BLOCHSIM_CAT2(a, b) a##b
#define BLOCHSIM_CAT(a, b) BLOCHSIM_CAT2(a, b)

namespace blochsim {
namespace kernels {

namespace {
template <bool Complex>
BLOCHSIM_FORCEINLINE int range(const EventStream& s, const Tissue& t, int64_t b0, int64_t b1, void* work,
                               float* out) {
  using V = vfloat16;
  for (int64_t b = b0; b < b1; ++b) {
    const int st = epg::forward_block<V, Complex>(s, t, b * Lanes<V>::width, static_cast<V*>(work), out);
    if (st != ok) return st;
  }
  return ok;
}
}  // namespace

int BLOCHSIM_CAT(jacobian_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const int* fields,
                                                       int n_dirs, int64_t b0, int64_t b1, void* work, float* out,
                                                       float* jac, const float* seeds) {
  return epg::jacobian_range<vfloat16>(s, t, fields, n_dirs, b0, b1, work, out, jac, seeds);
}

int BLOCHSIM_CAT(adjoint_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const int* fields,
                                                      int n_tdirs, int64_t b0, int64_t b1, void* work,
                                                      const float* cot, const int32_t* band, double* rows,
                                                      float* tgrad) {
  return epg::adjoint_range<vfloat16>(s, t, fields, n_tdirs, b0, b1, work, cot, band, rows, tgrad);
}

int BLOCHSIM_CAT(adjoint2_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, int outer_field,
                                                       int64_t b0, int64_t b1, void* work, const float* cot,
                                                       int64_t cot_stride, const int32_t* band, double* rows) {
  return epg::adjoint2_range<vfloat16>(s, t, outer_field, b0, b1, work, cot, cot_stride, band, rows);
}

int BLOCHSIM_CAT(pooled_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const Pools& p,
                                                     int64_t b0, int64_t b1, void* work, float* out) {
  const bool real = pooled_real_path(s, t, p);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = pooled_block_host<vfloat16, 1>(s, t, p, host_lineshape_table(), b * Lanes<vfloat16>::width,
                                                  static_cast<vfloat16*>(work), 1, out, real);
    if (st != ok) return st;
  }
  return ok;
}

int BLOCHSIM_CAT(pooled_jacobian_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const Pools& p,
                                                              const PooledJacobianOut& jo, int64_t b0, int64_t b1,
                                                              void* work, float* out) {
  using V = Dual<vfloat16, pooled_lane_directions>;
  const bool real = pooled_real_path(s, t, p) && !pooled_dirs_turn(jo);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = pooled_jacobian_block<V, 1>(s, t, p, host_lineshape_table(), b * Lanes<V>::width,
                                               static_cast<V*>(work), 1, out, real, jo);
    if (st != ok) return st;
  }
  return ok;
}

int BLOCHSIM_CAT(perk_range_, BLOCHSIM_ISA_SUFFIX)(const PerkModel& m, const float* x, const float* g, int64_t n,
                                                   int64_t b0, int64_t b1, void* work, float* xbar, float* out) {
  return perk_blocks<vfloat16>(m, x, g, n, b0, b1, work, xbar, out);
}

int BLOCHSIM_CAT(range_real_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, int64_t b0,
                                                   int64_t b1, void* work, float* out) {
  return range<false>(s, t, b0, b1, work, out);
}

int BLOCHSIM_CAT(range_complex_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, int64_t b0,
                                                      int64_t b1, void* work, float* out) {
  return range<true>(s, t, b0, b1, work, out);
}

}  // namespace kernels
}  // namespace blochsim
