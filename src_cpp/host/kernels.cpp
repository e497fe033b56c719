// The host block kernels for one instruction set.  meson compiles this file
// once per x86-64 level with -march=<level>, -DBLOCHSIM_ISA=<namespace>,
// -DBLOCHSIM_ISA_SUFFIX=<suffix> and -DBLOCHSIM_LANE_WIDTH=<lanes>: the
// kernels run on lane vectors of that level's register width (16 floats
// on AVX-512, 8 on AVX2, 4 on SSE), and the inline namespace keeps each
// build's inline functions apart at link time.
//
// The host entries (host/epg.hpp) count problems in blocks of
// host_block_lanes (16) and size each thread's workspace for one such block; each entry here
// plays its range of those blocks as blocks of the level's own width, in
// the same workspace (every workspace is a count of lane vectors, or for
// PERK proportional to the width, so a narrower block needs no more).
#include <blochsim/epg/adjoint.hpp>
#include <blochsim/epg/epg.hpp>
#include <blochsim/epg/jacobian.hpp>
#include <blochsim/epg/keyed.hpp>
#include <blochsim/host/match.hpp>
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

#ifndef BLOCHSIM_LANE_WIDTH
#define BLOCHSIM_LANE_WIDTH 16
#endif
#if BLOCHSIM_LANE_WIDTH == 16
using Native = vfloat16;
#elif BLOCHSIM_LANE_WIDTH == 8
using Native = vfloat8;
#elif BLOCHSIM_LANE_WIDTH == 4
using Native = vfloat4;
#else
#error "BLOCHSIM_LANE_WIDTH must be 16, 8 or 4"
#endif
static_assert(host_block_lanes % Lanes<Native>::width == 0, "a host block holds whole native blocks");

// Blocks [b0, b1) of host_block_lanes problems of n as native blocks
// [nb0, nb1).
inline void native_blocks(int64_t n, int64_t b0, int64_t b1, int64_t& nb0, int64_t& nb1) {
  constexpr int64_t r = host_block_lanes / Lanes<Native>::width;
  const int64_t last = (n + Lanes<Native>::width - 1) / Lanes<Native>::width;
  nb0 = b0 * r;
  nb1 = b1 * r < last ? b1 * r : last;
}

template <bool Complex>
BLOCHSIM_FORCEINLINE int range(const EventStream& s, const Tissue& t, int64_t hb0, int64_t hb1, void* work,
                               float* out) {
  using V = Native;
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = epg::forward_block<V, Complex>(s, t, b * Lanes<V>::width, static_cast<V*>(work), out);
    if (st != ok) return st;
  }
  return ok;
}
}  // namespace

int BLOCHSIM_CAT(jacobian_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const int* fields,
                                                       int n_dirs, int64_t hb0, int64_t hb1, void* work, float* out,
                                                       float* jac, const float* seeds) {
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  return epg::jacobian_range<Native>(s, t, fields, n_dirs, b0, b1, work, out, jac, seeds);
}

int BLOCHSIM_CAT(adjoint_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const int* fields,
                                                      int n_tdirs, int64_t hb0, int64_t hb1, void* work,
                                                      const float* cot, const int32_t* band, double* rows,
                                                      float* tgrad) {
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  return epg::adjoint_range<Native>(s, t, fields, n_tdirs, b0, b1, work, cot, band, rows, tgrad);
}

int BLOCHSIM_CAT(adjoint2_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, int outer_field,
                                                       int64_t hb0, int64_t hb1, void* work, const float* cot,
                                                       int64_t cot_stride, const int32_t* band, double* rows) {
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  return epg::adjoint2_range<Native>(s, t, outer_field, b0, b1, work, cot, cot_stride, band, rows);
}

int BLOCHSIM_CAT(pooled_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const Pools& p,
                                                     int64_t hb0, int64_t hb1, void* work, float* out) {
  const bool real = pooled_real_path(s, t, p);
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = pooled_block_host<Native, 1>(s, t, p, host_lineshape_table(), b * Lanes<Native>::width,
                                                static_cast<Native*>(work), 1, out, real);
    if (st != ok) return st;
  }
  return ok;
}

int BLOCHSIM_CAT(pooled_jacobian_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const Tissue& t, const Pools& p,
                                                              const PooledJacobianOut& jo, int64_t hb0, int64_t hb1,
                                                              void* work, float* out) {
  using V = Dual<Native, pooled_lane_directions>;
  const bool real = pooled_real_path(s, t, p) && !pooled_dirs_turn(jo);
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = pooled_jacobian_block<V, 1>(s, t, p, host_lineshape_table(), b * Lanes<V>::width,
                                               static_cast<V*>(work), 1, out, real, jo);
    if (st != ok) return st;
  }
  return ok;
}

int BLOCHSIM_CAT(perk_range_, BLOCHSIM_ISA_SUFFIX)(const PerkModel& m, const float* x, const float* g, int64_t n,
                                                   int64_t hb0, int64_t hb1, void* work, float* xbar, float* out) {
  int64_t b0, b1;
  native_blocks(n, hb0, hb1, b0, b1);
  return perk_blocks<Native>(m, x, g, n, b0, b1, work, xbar, out);
}

int BLOCHSIM_CAT(match_range_, BLOCHSIM_ISA_SUFFIX)(const MatchProblem& p, const MatchResult& r, int64_t b0,
                                                    int64_t b1, float* work) {
  return match_blocks<Native>(p, r, b0, b1, work);
}

int BLOCHSIM_CAT(keyed_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const KeyedProgram& k, const Tissue& t,
                                                    int64_t hb0, int64_t hb1, void* work, float* out) {
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  for (int64_t b = b0; b < b1; ++b) {
    const int st = epg::keyed_block<Native>(s, k, t, b * Lanes<Native>::width, static_cast<Native*>(work), out);
    if (st != ok) return st;
  }
  return ok;
}

int BLOCHSIM_CAT(keyed_jacobian_range_, BLOCHSIM_ISA_SUFFIX)(const EventStream& s, const KeyedProgram& k,
                                                             const Tissue& t, const int* fields, int n_dirs,
                                                             int64_t hb0, int64_t hb1, void* work, float* out,
                                                             float* jac, const float* seeds) {
  int64_t b0, b1;
  native_blocks(t.n, hb0, hb1, b0, b1);
  return epg::keyed_jacobian_range<Native>(s, k, t, fields, n_dirs, b0, b1, work, out, jac, seeds);
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
