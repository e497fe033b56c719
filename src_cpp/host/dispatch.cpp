// Host backend of the extension: picks the block kernels built for the best
// x86-64 level this CPU supports (kernels.cpp, compiled once per level).
#include "dispatch.hpp"

#include <cstdlib>
#include <string>

#include <blochsim/host/epg.hpp>
#include <blochsim/host/keyed.hpp>
#include <blochsim/host/match.hpp>
#include <blochsim/host/perk.hpp>
#include <blochsim/host/pools.hpp>
#include <blochsim/noise.hpp>

namespace blochsim {
static_assert(host::lanes == host_block_lanes, "the host entries and the level kernels count the same blocks");
namespace {

struct Kernels {
  host::RangeFn real;
  host::RangeFn complex;
  host::JacobianRangeFn jacobian;
  host::AdjointRangeFn adjoint;
  host::Adjoint2RangeFn adjoint2;
  host::PooledRangeFn pooled;
  host::PooledJacobianRangeFn pooled_jacobian;
  host::PerkRangeFn perk;
  host::MatchRangeFn match;
  host::KeyedRangeFn keyed;
  int (*keyed_jacobian)(const EventStream&, const KeyedProgram&, const Tissue&, const int*, int, int64_t, int64_t,
                        void*, float*, float*, const float*);
  const char* isa;
};

#define BLOCHSIM_LEVEL(suffix, name)                                                                       \
  Kernels {                                                                                                  \
    &kernels::range_real_##suffix, &kernels::range_complex_##suffix, &kernels::jacobian_range_##suffix,     \
        &kernels::adjoint_range_##suffix, &kernels::adjoint2_range_##suffix, &kernels::pooled_range_##suffix, \
        &kernels::pooled_jacobian_range_##suffix, &kernels::perk_range_##suffix, &kernels::match_range_##suffix, \
        &kernels::keyed_range_##suffix, &kernels::keyed_jacobian_range_##suffix, name                       \
  }

// The kernels of the best level this CPU runs, or of the level
// $BLOCHSIM_HOST_ISA names (x86-64, x86-64-v3, x86-64-v4: to test and time
// each level on one machine).  A level the CPU cannot run, or a name not
// built, leaves the best level's kernels in place and names the refusal in
// isa ("refused: ..."), which the Python layer raises before any call.
Kernels pick() {
  const char* want = std::getenv("BLOCHSIM_HOST_ISA");
  const bool asked = want != nullptr && want[0] != '\0';
#if defined(BLOCHSIM_MULTI_ISA)
  __builtin_cpu_init();
  const bool cpu_v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool cpu_v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  Kernels best = BLOCHSIM_LEVEL(default, "x86-64");
#if defined(BLOCHSIM_HAVE_V3)
  const Kernels k3 = BLOCHSIM_LEVEL(v3, "x86-64-v3");
  if (cpu_v3) best = k3;
#endif
#if defined(BLOCHSIM_HAVE_V4)
  const Kernels k4 = BLOCHSIM_LEVEL(v4, "x86-64-v4");
  if (cpu_v4) best = k4;
#endif
  if (!asked) return best;
  const std::string w(want);
  if (w == "x86-64") return BLOCHSIM_LEVEL(default, "x86-64");
#if defined(BLOCHSIM_HAVE_V3)
  if (w == "x86-64-v3" && cpu_v3) return k3;
#endif
#if defined(BLOCHSIM_HAVE_V4)
  if (w == "x86-64-v4" && cpu_v4) return k4;
#endif
  static std::string why;
  if (w != "x86-64-v3" && w != "x86-64-v4")
    why = "refused: BLOCHSIM_HOST_ISA='" + w + "' is not one of 'x86-64', 'x86-64-v3', 'x86-64-v4'";
  else if ((w == "x86-64-v3" && !cpu_v3) || (w == "x86-64-v4" && !cpu_v4))
    why = "refused: BLOCHSIM_HOST_ISA='" + w + "' names a level this CPU cannot run (it runs " + best.isa + ")";
  else
    why = "refused: BLOCHSIM_HOST_ISA='" + w + "' names a level this build has no kernels for (meson option host-isa)";
  Kernels k = best;
  k.isa = why.c_str();
  return k;
#else
  Kernels k = BLOCHSIM_LEVEL(default, "generic");
  if (asked && std::string(want) != "generic") {
    static std::string why;
    why = "refused: BLOCHSIM_HOST_ISA='" + std::string(want) + "': this build has one level, 'generic'";
    k.isa = why.c_str();
  }
  return k;
#endif
}

const Kernels& chosen() {
  static const Kernels k = pick();
  return k;
}

}  // namespace

int host_forward_dispatch(const EventStream& s, const Tissue& t, float* out, int threads) noexcept {
  const Kernels& k = chosen();
  return host::forward_status(s, t, out, threads, k.real, k.complex);
}

int host_jacobian_dispatch(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                           float* jac, int threads, const float* seeds) noexcept {
  return host::jacobian_status(s, t, fields, n_dirs, out, jac, threads, seeds, chosen().jacobian);
}

int host_adjoint_dispatch(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot,
                          double* ev_grad, float* tgrad, int threads) noexcept {
  return host::adjoint_status(s, t, fields, n_tdirs, cot, ev_grad, tgrad, threads, chosen().adjoint);
}

int host_adjoint2_dispatch(const EventStream& s, const Tissue& t, int outer_field, const float* cot,
                           int64_t cot_stride, double* ev_grad, int threads) noexcept {
  return host::adjoint2_status(s, t, outer_field, cot, cot_stride, ev_grad, threads, chosen().adjoint2);
}

int host_pooled_dispatch(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                         const float* seeds, float* out, float* jac, int threads) noexcept {
  return host::pooled_status(s, t, p, fields, n_dirs, seeds, out, jac, threads, chosen().pooled,
                             chosen().pooled_jacobian);
}

int host_pooled_adjoint_dispatch(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                 int n_tdirs, const float* cot, double* ev_grad, float* tgrad, int threads,
                                 unsigned mask) noexcept {
  return host::pooled_adjoint_status(s, t, p, fields, n_tdirs, cot, ev_grad, tgrad, threads, mask);
}

int host_perk_dispatch(const PerkModel& m, const float* x, const float* g, int64_t n, float* out, float* xbar,
                       int threads) noexcept {
  return host::perk_status(m, x, g, n, out, xbar, threads, chosen().perk);
}

int host_keyed_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out,
                        int threads) noexcept {
  return host::keyed_status(s, k, t, out, threads, chosen().keyed);
}

int host_keyed_pooled_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, const Pools& p,
                               const int* fields, int n_dirs, const float* seeds, float* out, float* jac,
                               int threads) noexcept {
  return host::keyed_pooled_status(s, k, t, p, fields, n_dirs, seeds, out, jac, threads);
}

int host_keyed_jacobian_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, const int* fields,
                                 int n_dirs, float* out, float* jac, int threads, const float* seeds) noexcept {
  return guarded([&]() -> int {
    int v = validate(s, t, false, false);
    if (v == ok) v = validate_keyed(s, k);
    if (v == ok) v = keyed_plays(k, t);
    if (v == ok) v = validate_directions(fields, n_dirs);
    if (v != ok) return v;
    const auto fn = chosen().keyed_jacobian;
    const std::size_t work = static_cast<std::size_t>(keyed_workspace(s, k)) * host::lanes *
                             static_cast<std::size_t>(1 + dual_width(dual_directions(fields, n_dirs)));
    return host::run_blocks_with(t, threads, work, [&](int64_t b0, int64_t b1, void* w) {
      return fn(s, k, t, fields, n_dirs, b0, b1, w, out, jac, seeds);
    });
  });
}

int host_match_dispatch(const MatchProblem& p, const MatchResult& r, int threads) noexcept {
  return host::match_status(p, r, threads, chosen().match);
}

int host_noise_add(float* z, int64_t n, int64_t first, double sigma, const NoiseKey& k, int threads) noexcept {
  return guarded([&]() -> int {
    if (n < 0 || first < 0) return bad_shape;
    constexpr int64_t per = 4096;  // values a range's unit
    return host::run_ranges((n + per - 1) / per, threads, 0, [&](int64_t b0, int64_t b1, float*) {
      const int64_t end = b1 * per < n ? b1 * per : n;
      for (int64_t j = b0 * per; j < end; ++j) noise_add_one(z, j, first, sigma, k);
      return static_cast<int>(ok);
    });
  });
}

const char* host_isa() noexcept { return chosen().isa; }

double host_workspace_bytes(int entry, const EventStream& s, const Pools* p, int64_t n, int threads, const int* fields,
                            int n_dirs, unsigned mask) noexcept {
  if (entry >= 0 && entry <= 3)
    return host::workspace_bytes(static_cast<host::Entry>(entry), s, n, threads, fields, n_dirs);
  if (!p) return 0.0;
  return host::pooled_workspace_bytes(s, *p, n, threads, n_dirs, entry == 5, mask);
}

double host_available_memory() noexcept { return static_cast<double>(available_memory_bytes()); }

Interrupt host_set_interrupt(Interrupt i) noexcept { return set_interrupt(i); }

}  // namespace blochsim
