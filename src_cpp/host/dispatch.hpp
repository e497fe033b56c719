// Entry points of the host backend as compiled into the Python extension.
#pragma once

#include <blochsim/epg/keyed.hpp>
#include <blochsim/events.hpp>
#include <blochsim/host/interrupt.hpp>
#include <blochsim/match.hpp>
#include <blochsim/noise.hpp>
#include <blochsim/perk.hpp>
#include <blochsim/pools/pools.hpp>

namespace blochsim {

// Problems in one block of the host entries (host::lanes): the unit their
// ranges and workspaces count in, whatever the lane width of the level's
// kernels (a multiple of it).
constexpr int host_block_lanes = 16;

// Forward EPG of every problem of t on `threads` threads; returns a Status.
// The block kernels are built for several x86-64 levels (kernels.cpp) and
// the best one the CPU supports is chosen at the first call.
int host_forward_dispatch(const EventStream& s, const Tissue& t, float* out, int threads) noexcept;

// Signal and tissue Jacobian of every problem of t along the tissue fields
// fields[0 .. n_dirs), direction j seeded with seeds[j] (host::
// jacobian_status); returns a Status.
int host_jacobian_dispatch(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                           float* jac, int threads, const float* seeds) noexcept;

// Reverse mode of every problem of t (host::adjoint_status): the gradient
// of a real loss with cotangent cot with respect to each event's duration,
// flip, phase and receiver phase (ev_grad, summed over problems) and to the
// tissue fields fields[0 .. n_tdirs) per problem (tgrad); returns a Status.
int host_adjoint_dispatch(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot,
                          double* ev_grad, float* tgrad, int threads) noexcept;

// Second order of every problem of t (host::adjoint2_status): d/d field
// outer_field of the event gradients of the cotangent cot; returns a Status.
int host_adjoint2_dispatch(const EventStream& s, const Tissue& t, int outer_field, const float* cot,
                           int64_t cot_stride, double* ev_grad, int threads) noexcept;

// The device's register path run on the host for testing: a team of one
// member with 32 orders (real path) or 16 (complex), of 4 members with
// 16 or 8 orders each (team 4), with a tail past them (team 5), or with 8
// orders each on either path (team 8); returns states_exceed_team when K
// does not fit.
int host_forward_registers(const EventStream& s, const Tissue& t, float* out, int team) noexcept;

// The device's Jacobian register path run on the host for testing, as the
// device plays it: M0 from the unscaled signal, the other directions two a
// pass on a team of 4 members with 8 orders each (4 on the complex path);
// team 4 returns states_exceed_team past 32 (16) states, team 5 keeps the
// orders past them in a tail in memory (the device's tail kernel).
int host_jacobian_registers(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                            float* jac, const float* seeds, int team) noexcept;

// The device's pooled register path (pools/registers.hpp) run on the host
// for testing, a team of 4 members with the device's orders a member
// (pooled_team_orders), for the pools pooled_team_kind names; returns
// states_exceed_team past 4 members' orders and bad_pools for other pools.
int host_pooled_registers(const EventStream& s, const Tissue& t, const Pools& p, float* out) noexcept;

// Signal (and, with n_dirs > 0, Jacobian) of every problem of t with the
// pools of p (host::pooled_status); returns a Status.
int host_pooled_dispatch(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                         const float* seeds, float* out, float* jac, int threads) noexcept;

// Reverse mode with the pools of p (host::pooled_adjoint_status); returns a
// Status.
int host_pooled_adjoint_dispatch(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                 int n_tdirs, const float* cot, double* ev_grad, float* tgrad, int threads,
                                 unsigned mask) noexcept;

// PERK estimates of n voxels from their inputs x (n, m.d), out (n, m.p);
// with a cotangent g (n, m.p), also its pullback xbar (n, m.d)
// (host::perk_status); returns a Status.
int host_perk_dispatch(const PerkModel& m, const float* x, const float* g, int64_t n, float* out, float* xbar,
                       int threads) noexcept;

// The k best atoms of every signal of p (host::match_status on the level's
// lanes); returns a Status.
int host_match_dispatch(const MatchProblem& p, const MatchResult& r, int threads) noexcept;

// z[j] += sigma · (complex normal first + j of k) for j < n, z complex64
// (noise.hpp), on `threads` threads; returns a Status.
int host_noise_add(float* z, int64_t n, int64_t first, double sigma, const NoiseKey& k, int threads) noexcept;

// Name of the instruction set the block kernels run with ("x86-64-v4", ...).
const char* host_isa() noexcept;

// Bytes a host entry allocates beyond its inputs and outputs (entry 0-3:
// host::Entry; 4: pooled_status, 5: pooled_adjoint_status, with p).
double host_workspace_bytes(int entry, const EventStream& s, const Pools* p, int64_t n, int threads, const int* fields,
                            int n_dirs, unsigned mask) noexcept;

// The moment-keyed EPG (epg/keyed.hpp) of every problem of t on `threads`
// threads; returns a Status.
int host_keyed_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out,
                        int threads) noexcept;

// Signal (and, with n_dirs > 0, Jacobian) of every problem of t with the
// pools of p through the moment-keyed EPG (host::keyed_pooled_status);
// returns a Status.
int host_keyed_pooled_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, const Pools& p,
                               const int* fields, int n_dirs, const float* seeds, float* out, float* jac,
                               int threads) noexcept;

// Signal and tissue Jacobian through the moment-keyed EPG (as
// host_jacobian_dispatch); returns a Status.
int host_keyed_jacobian_dispatch(const EventStream& s, const KeyedProgram& k, const Tissue& t, const int* fields,
                                 int n_dirs, float* out, float* jac, int threads, const float* seeds) noexcept;

// Memory available to a new allocation (bytes; host/interrupt.hpp).
double host_available_memory() noexcept;

// Installs the poll for host calls made on this thread; returns the previous one.
Interrupt host_set_interrupt(Interrupt i) noexcept;

namespace kernels {
#define BLOCHSIM_DECLARE_KERNELS(suffix)                                                              \
  int range_real_##suffix(const EventStream&, const Tissue&, int64_t, int64_t, void*, float*);        \
  int range_complex_##suffix(const EventStream&, const Tissue&, int64_t, int64_t, void*, float*);        \
  int jacobian_range_##suffix(const EventStream&, const Tissue&, const int*, int, int64_t, int64_t, void*, \
                              float*, float*, const float*);                                                        \
  int adjoint_range_##suffix(const EventStream&, const Tissue&, const int*, int, int64_t, int64_t, void*,  \
                             const float*, const int32_t*, double*, float*);                       \
  int adjoint2_range_##suffix(const EventStream&, const Tissue&, int, int64_t, int64_t, void*, const float*, \
                              int64_t, const int32_t*, double*);                                         \
  int pooled_range_##suffix(const EventStream&, const Tissue&, const Pools&, int64_t, int64_t, void*, float*); \
  int pooled_jacobian_range_##suffix(const EventStream&, const Tissue&, const Pools&, const PooledJacobianOut&, \
                                     int64_t, int64_t, void*, float*); \
  int perk_range_##suffix(const PerkModel&, const float*, const float*, int64_t, int64_t, int64_t, void*, float*, \
                          float*);                                                                             \
  int match_range_##suffix(const MatchProblem&, const MatchResult&, int64_t, int64_t, float*);        \
  int keyed_range_##suffix(const EventStream&, const KeyedProgram&, const Tissue&, int64_t, int64_t, void*, float*); \
  int keyed_jacobian_range_##suffix(const EventStream&, const KeyedProgram&, const Tissue&, const int*, int, int64_t, \
                                    int64_t, void*, float*, float*, const float*);
BLOCHSIM_DECLARE_KERNELS(default)
BLOCHSIM_DECLARE_KERNELS(v3)
BLOCHSIM_DECLARE_KERNELS(v4)
#undef BLOCHSIM_DECLARE_KERNELS
}  // namespace kernels

}  // namespace blochsim
