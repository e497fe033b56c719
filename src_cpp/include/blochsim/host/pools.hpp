// The host backend of the pooled EPG (pools/pools.hpp): blocks of problems
// on SIMD lanes (the signal, and Jacobians for up to one exchanging pool
// with the semisolid pool, or a network), or one problem at a time in
// double precision (the other Jacobians, the adjoint); problems split into
// one contiguous range per thread.
#pragma once

#include <complex>
#include <cstdint>
#include <vector>

#include "../pools/adjoint.hpp"
#include "../pools/keyed.hpp"
#include "../pools/lanes.hpp"
#include "../pools/player.hpp"
#include "../pools/pools.hpp"
#include "epg.hpp"

#if !defined(__CUDA_ARCH__)
namespace blochsim {
namespace host {

// Directions a pooled Jacobian pass carries (more are done in passes).
constexpr int pooled_pass_directions = 4;


// Signature of a function that plays the forward pooled EPG of blocks
// [b0, b1) of `lanes` problems (pooled_block) with a workspace of
// pool_block_workspace(s, p) lane vectors.
using PooledRangeFn = int (*)(const EventStream& s, const Tissue& t, const Pools& p, int64_t b0, int64_t b1,
                              void* work, float* out);

// Signature of a function that plays a pooled Jacobian pass (jo's
// directions, at most pooled_lane_directions) over blocks [b0, b1) of
// `lanes` problems (pooled_jacobian_block) with a workspace of
// pool_block_workspace(s, p) lane vectors of duals.
using PooledJacobianRangeFn = int (*)(const EventStream& s, const Tissue& t, const Pools& p,
                                      const PooledJacobianOut& jo, int64_t b0, int64_t b1, void* work, float* out);

inline int pooled_range_any(const EventStream& s, const Tissue& t, const Pools& p, int64_t b0, int64_t b1,
                            void* work, float* out) {
  for (int64_t b = b0; b < b1; ++b) {
    const int st = pooled_block_host<Vec, 1>(s, t, p, host_lineshape_table(), b * lanes, static_cast<Vec*>(work), 1,
                                             out, pooled_real_path(s, t, p));
    if (st != ok) return st;
  }
  return ok;
}

namespace pools_detail {

// Scalars of one problem's workspace: pooled_problem's, or with a keyed
// program k keyed_pooled_problem's.
inline int64_t pooled_problem_workspace(const EventStream& s, const Pools& p, const KeyedProgram* k) {
  return k ? keyed_pool_workspace(s, *k, p) : pool_workspace(s, p);
}

// Problems [i0, i1) one at a time over the scalar S (double, or duals
// along fields[0 .. n_dirs)), on EPG orders or on the keyed program k.
template <class S>
inline int pooled_range(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                        const float* seeds, int64_t i0, int64_t i1, float* out, float* jac, int64_t jac_dirs,
                        int64_t first_dir, const KeyedProgram* k = nullptr) {
  std::vector<S> work(static_cast<std::size_t>(pooled_problem_workspace(s, p, k)));
  const LineshapeTable ls = host_lineshape_table();
  const int64_t ns = s.n_samples;
  for (int64_t i = i0; i < i1; ++i) {
    auto sink = [&](int32_t slot, const Cx<S>& v) {
      float* o = out + (i * ns + slot) * 2;
      o[0] = static_cast<float>(value_of(v.re));
      o[1] = static_cast<float>(value_of(v.im));
      if constexpr (IsDual<S>::value) {
        for (int j = 0; j < n_dirs; ++j) {
          float* d = jac + ((i * jac_dirs + first_dir + j) * ns + slot) * 2;
          d[0] = static_cast<float>(v.re.d[j]);
          d[1] = static_cast<float>(v.im.d[j]);
        }
      }
    };
    if (k)
      keyed_pooled_problem<S>(s, *k, t, p, ls, i, fields, n_dirs, seeds, work.data(), sink);
    else
      pooled_problem<S>(s, t, p, ls, i, fields, n_dirs, seeds, work.data(), sink);
  }
  return ok;
}

template <class S>
inline int pooled_pass(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                       const float* seeds, float* out, float* jac, int64_t jac_dirs, int64_t first_dir,
                       int threads, const KeyedProgram* k = nullptr) {
  if (!workspace_fits(static_cast<double>(pooled_problem_workspace(s, p, k)) * sizeof(S) *
                      std::min<int64_t>(threads, t.n)))
    return out_of_memory;
  return run_ranges(t.n, threads, 0, [&](int64_t i0, int64_t i1, float*) {
    return pooled_range<S>(s, t, p, fields, n_dirs, seeds, i0, i1, out, jac, jac_dirs, first_dir, k);
  });
}

// The Jacobian in double precision, pooled_pass_directions a pass.
inline int pooled_double_passes(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                int n_dirs, const float* seeds, float* out, float* jac, int threads,
                                const KeyedProgram* k) {
  for (int first = 0; first < n_dirs; first += pooled_pass_directions) {
    const int nd = n_dirs - first < pooled_pass_directions ? n_dirs - first : pooled_pass_directions;
    const int* f = fields + first;
    const float* sd = seeds ? seeds + first : nullptr;
    int st;
    switch (nd) {
      case 1: st = pooled_pass<Dual<double, 1>>(s, t, p, f, nd, sd, out, jac, n_dirs, first, threads, k); break;
      case 2: st = pooled_pass<Dual<double, 2>>(s, t, p, f, nd, sd, out, jac, n_dirs, first, threads, k); break;
      case 3: st = pooled_pass<Dual<double, 3>>(s, t, p, f, nd, sd, out, jac, n_dirs, first, threads, k); break;
      default: st = pooled_pass<Dual<double, 4>>(s, t, p, f, nd, sd, out, jac, n_dirs, first, threads, k); break;
    }
    if (st != ok) return st;
  }
  return ok;
}

// The checks of a pooled call's stream, tissue, pools and directions.
inline int pooled_checks(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                         const float* jac) {
  const int v = validate(s, t, true);
  if (v != ok) return v;
  const int vp = validate_pools(s, t, p);
  if (vp != ok) return vp;
  if (n_dirs < 0 || (n_dirs > 0 && (!fields || !jac))) return bad_shape;
  for (int j = 0; j < n_dirs; ++j) {
    if (!pooled_direction(fields[j])) return bad_shape;
    for (int l = 0; l < j; ++l)
      if (fields[l] == fields[j]) return bad_shape;
  }
  return ok;
}

}  // namespace pools_detail

// Signal of every problem of t with the pools of p (and, with n_dirs > 0,
// its Jacobian): out as forward_status; jac (t.n, n_dirs, s.n_samples)
// complex64 interleaved, the derivative of each sample with respect to field
// fields[j] (0 .. 8: the Tissue fields; PoolField for the pools) in its SI
// unit, times seeds[j] when seeds is given.  Directions go
// pooled_lane_directions a pass on lanes, pooled_pass_directions a pass in
// double precision.
//
// The signal alone is computed in single precision, 16 problems a SIMD
// vector (pooled_block, through fn); with directions, likewise on lanes of
// duals through jfn for the pools of pooled_lane_jacobian, else in double
// precision one problem at a time (pooled_problem on duals).
inline int pooled_status(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                         const float* seeds, float* out, float* jac, int threads,
                         PooledRangeFn fn = &pooled_range_any, PooledJacobianRangeFn jfn = nullptr) noexcept {
  return guarded([&]() -> int {
    const int v = pools_detail::pooled_checks(s, t, p, fields, n_dirs, jac);
    if (v != ok) return v;
    if (t.n == 0 || s.n_samples == 0) return ok;
    if (n_dirs == 0)
      return run_blocks_with(t, threads, static_cast<std::size_t>(pool_block_workspace(s, p)) * lanes,
                             [&](int64_t b0, int64_t b1, float* work) { return fn(s, t, p, b0, b1, work, out); });
    if (jfn && pooled_lane_jacobian(p)) {
      // single precision on lanes of duals, pooled_lane_directions a pass
      using V = Dual<Vec, pooled_lane_directions>;
      const std::size_t per = static_cast<std::size_t>(pool_block_workspace(s, p)) * sizeof(V) / sizeof(float);
      for (int first = 0; first < n_dirs; first += pooled_lane_directions) {
        PooledJacobianOut jo;
        jo.fields = fields + first;
        jo.n_dirs = n_dirs - first < pooled_lane_directions ? n_dirs - first : pooled_lane_directions;
        jo.seeds = seeds ? seeds + first : nullptr;
        jo.jac = jac;
        jo.jac_dirs = n_dirs;
        jo.first_dir = first;
        const int st = run_blocks_with(t, threads, per, [&](int64_t b0, int64_t b1, float* work) {
          return jfn(s, t, p, jo, b0, b1, work, out);
        });
        if (st != ok) return st;
      }
      return ok;
    }
    return pools_detail::pooled_double_passes(s, t, p, fields, n_dirs, seeds, out, jac, threads, nullptr);
  });
}

// pooled_status on the moment-keyed program k of s (epg/keyed.hpp): every
// problem one at a time in double precision (pools/keyed.hpp), the signal
// alone or with its Jacobian along fields (as pooled_status).
inline int keyed_pooled_status(const EventStream& s, const KeyedProgram& k, const Tissue& t, const Pools& p,
                               const int* fields, int n_dirs, const float* seeds, float* out, float* jac,
                               int threads) noexcept {
  return guarded([&]() -> int {
    int v = pools_detail::pooled_checks(s, t, p, fields, n_dirs, jac);
    if (v == ok) v = validate_keyed(s, k);
    if (v == ok) v = keyed_plays(k, t);
    if (v != ok) return v;
    if (t.n == 0 || s.n_samples == 0) return ok;
    if (n_dirs == 0)
      return pools_detail::pooled_pass<double>(s, t, p, nullptr, 0, nullptr, out, nullptr, 0, 0, threads, &k);
    return pools_detail::pooled_double_passes(s, t, p, fields, n_dirs, seeds, out, jac, threads, &k);
  });
}

// Reverse mode with pools (pools/adjoint.hpp), one problem at a time in
// double precision: given the cotangent cot (t.n, s.n_samples) complex64
// interleaved of a real loss L, writes ev_grad (s.n_events,
// pooled_event_gradients) = dL / d(interval duration_s, flip_rad,
// phase_rad, rx_phase_rad, pulse duration_s, pulse offset_hz) of each event
// summed over the problems, and tgrad (t.n, n_tdirs) = dL / d field
// fields[j] (as pooled_status's fields) per problem, in SI units.  mask
// picks the event parameters computed (pools/adjoint.hpp; the others' and
// the readout phase's columns are always written).  The problems are summed
// in fixed partitions, so the result does not depend on the thread count.
inline int pooled_adjoint_status(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                 int n_tdirs, const float* cot, double* ev_grad, float* tgrad, int threads,
                                 unsigned mask = pooled_all_event_dirs) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t, true);
    if (v != ok) return v;
    const int vp = validate_pools(s, t, p);
    if (vp != ok) return vp;
    if (threads < 1) return bad_threads;
    if (mask > pooled_all_event_dirs) return bad_shape;
    if (n_tdirs < 0 || n_tdirs > pool_field_count || (n_tdirs > 0 && (!fields || (t.n > 0 && !tgrad))))
      return bad_shape;
    for (int j = 0; j < n_tdirs; ++j) {
      if (!pooled_direction(fields[j])) return bad_shape;
      for (int l = 0; l < j; ++l)
        if (fields[l] == fields[j]) return bad_shape;
    }
    const int64_t nev = s.n_events, m = nev * pooled_event_gradients;
    for (int64_t i = 0; i < m; ++i) ev_grad[i] = 0.0;
    if (nev == 0) {
      for (int64_t i = 0; i < t.n * n_tdirs; ++i) tgrad[i] = 0.0f;
      return ok;
    }
    if (t.n == 0) return ok;
    const int64_t parts = std::min(adjoint_partitions, t.n);
    std::vector<double> rows(static_cast<std::size_t>(parts * m), 0.0);
    const LineshapeTable ls = host_lineshape_table();
    const std::size_t per = static_cast<std::size_t>(pooled_adjoint_workspace(s, p, mask, n_tdirs, pooled_adjoint_width));
    const int64_t ns = s.n_samples;
    if (!workspace_fits(static_cast<double>(per) * sizeof(double) * std::min<int64_t>(threads, parts)))
      return out_of_memory;
    Stop halt;
    const int st = run_ranges(
        parts, threads, 0,
        [&](int64_t p0, int64_t p1, float*) {
          std::vector<double> work(per);
          for (int64_t part = p0; part < p1; ++part)
            for (int64_t i = t.n * part / parts; i < t.n * (part + 1) / parts; ++i) {
              if (halt()) return static_cast<int>(interrupted);
              pooled_adjoint_problem<pooled_adjoint_width>(s, t, p, ls, i, mask, fields, n_tdirs, cot + i * ns * 2,
                                                           work.data(), rows.data() + part * m, tgrad + i * n_tdirs);
            }
          return static_cast<int>(ok);
        },
        &halt);
    if (st != ok) return st;
    for (int64_t part = 0; part < parts; ++part)
      for (int64_t i = 0; i < m; ++i) ev_grad[i] += rows[part * m + i];
    return ok;
  });
}

// Bytes pooled_status (n_dirs directions) or, with `adjoint`,
// pooled_adjoint_status (n_dirs tissue directions, event mask) allocates
// beyond its inputs and outputs for n problems on `threads` threads, as
// workspace_bytes.
inline double pooled_workspace_bytes(const EventStream& s, const Pools& p, int64_t n, int threads, int n_dirs,
                                     bool adjoint, unsigned mask = pooled_all_event_dirs) noexcept {
  const double align = 16 * sizeof(float);
  if (adjoint) {
    const int64_t parts = std::min<int64_t>(adjoint_partitions, std::max<int64_t>(n, 1));
    const double nthreads = static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(threads, parts)));
    return nthreads * static_cast<double>(pooled_adjoint_workspace(s, p, mask, n_dirs, pooled_adjoint_width)) *
               sizeof(double) +
           static_cast<double>(parts) * static_cast<double>(s.n_events) * pooled_event_gradients * sizeof(double);
  }
  const int64_t blocks = (n + lanes - 1) / lanes;
  const double block = static_cast<double>(pool_block_workspace(s, p)) * lanes;
  if (n_dirs == 0)
    return static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(threads, blocks))) *
           (block * sizeof(float) + align);
  // on lanes of duals, or one problem at a time in double precision: the larger
  const double lanes_of_duals = static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(threads, blocks))) *
                                (block * sizeof(Dual<Vec, pooled_lane_directions>) / lanes + align);
  const double one_at_a_time = static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(threads, n))) *
                               static_cast<double>(pool_workspace(s, p)) * sizeof(Dual<double, pooled_pass_directions>);
  return std::max(lanes_of_duals, one_at_a_time);
}

}  // namespace host
}  // namespace blochsim
#endif
