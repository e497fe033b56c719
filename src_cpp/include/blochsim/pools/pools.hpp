// The pooled EPG (SPEC §3): free water with up to four exchanging pools
// that have transverse states (Bloch–McConnell; McConnell 1958, J Chem Phys
// 28:430) and up to two semisolid pools with longitudinal states only (the
// binary spin bath of EPG-X; Malik, Teixeira & Hajnal 2018, MRM 80:767),
// each optionally with dipolar order (inhomogeneous MT; Varma et al. 2015,
// JMR 260:67).
//
// This header holds the pools' configuration, each problem's values and
// its interval and exact-pulse operators; pools/operators.hpp the
// semisolid saturation and the per-order operators; pools/play.hpp the
// one event that plays them, over a Store: pools/player.hpp one problem in
// double precision (or on duals), pools/lanes.hpp a block of problems on
// vector lanes, pools/registers.hpp one problem on a device team.
//
// One problem is played by one call of pooled_problem<S>, over a scalar
// type S: double for the signal, Dual<double, N> for the signal and its
// derivatives along N tissue directions in the same pass.
//
// Per problem and per distinct interval length τ the kernel forms the exact
// interval operators once, the first time an event uses them:
//   transverse   P = exp(τ A),  A the n × n complex generator of the F+
//                families of the n liquid pools (relaxation, exchange, B0
//                and chemical shift); F− evolves by conj(P);
//   longitudinal L = exp(τ B),  B the m × m real generator of the Z families
//                (PoolLayout: the liquid pools, the semisolid pools, their
//                dipolar orders: relaxation and exchange), and the
//                recovery r = f − L f
//                added to order 0 (f: the equilibrium fractions, which B's
//                detailed balance leaves fixed).
// The exponentials are taken by scaling and squaring with a degree-12
// Taylor polynomial (Moler & Van Loan 2003, SIAM Rev 45:3, method 3), in S,
// so that their derivatives come with them.
//
// Exchange is a star around free water (pool a) by default: pool b, with
// fraction f_b and rate constant k_b, moves magnetisation a → b at k_b f_b
// and b → a at k_b f_a (detailed balance).  A network adds rate constants
// between any two other pools (the pair rates of events.hpp), each with
// detailed balance likewise.  A semisolid pool exchanges longitudinal
// magnetisation only; liquid transverse states feel no semisolid exchange
// (EPG-X).  Dipolar order relaxes to 0 and exchanges nothing; only RF
// couples it to its pool's Z (semisolid_saturation, pool_driven).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../dual.hpp"
#include "../events.hpp"
#include "lineshape.hpp"

namespace blochsim {

constexpr int max_liquid_pools = 1 + max_exchanging_pools;
constexpr int max_semisolid_pools = 2;
// longitudinal families: the liquid pools, the semisolid pools, and the
// dipolar order of each semisolid pool that has a T1D
constexpr int max_longitudinal_pools = max_liquid_pools + 2 * max_semisolid_pools;
// components of one order under an exact rectangular pulse: F+, F-, Z of
// each liquid pool, the other longitudinal families, and a constant 1 for
// recovery
constexpr int max_driven_size = 3 * max_liquid_pools + 2 * max_semisolid_pools + 1;

// Directions of pooled_block_of on duals (a Jacobian pass): pooled_status's
// fields and seeds, and where the derivatives go: jac (t.n, jac_dirs,
// n_samples) complex64 interleaved, this pass's first direction at
// first_dir.
struct PooledJacobianOut {
  const int* fields = nullptr;
  int n_dirs = 0;
  const float* seeds = nullptr;
  float* jac = nullptr;
  int64_t jac_dirs = 0, first_dir = 0;
};

// Directions a host pooled Jacobian pass on lanes carries (more go in
// passes; each pass plays the signal again).
constexpr int pooled_lane_directions = 2;


// The pools of a call: which are on, and their properties per problem (SI:
// fractions, Hz, s).  An exchanging pool's T1_s or T2_s left absent takes
// free water's value.
struct Pools {
  int32_t n_exchanging = 0;  // pools B, C, ... with transverse states (0 .. 4)
  int32_t bound = 0;         // 1: the semisolid pool is on
  int32_t lineshape = lineshape_super_lorentzian;
  int32_t bound2 = 0;        // 1: a second semisolid pool (with the first)
#define BLOCHSIM_POOL_ABSENT(L) BLOCHSIM_POOL_COLUMNS(BLOCHSIM_ABSENT, L)
#define BLOCHSIM_PAIR_ABSENT(a, b) BLOCHSIM_PAIR_FIELD(a, b, BLOCHSIM_ABSENT)
  // the pool fields in their order, tissue_fields <= f < pool_field_count
  Property field[pool_field_count - tissue_fields] = {
      BLOCHSIM_BOUND_FIELDS(BLOCHSIM_ABSENT) BLOCHSIM_EXCHANGING_POOLS(BLOCHSIM_POOL_ABSENT)
          BLOCHSIM_NETWORK_FIELDS(BLOCHSIM_ABSENT) BLOCHSIM_PAIR_RATES(BLOCHSIM_PAIR_ABSENT)};
#undef BLOCHSIM_PAIR_ABSENT
#undef BLOCHSIM_POOL_ABSENT

  // pool field f (tissue_fields <= f < pool_field_count)
  BLOCHSIM_HD Property& operator[](int f) { return field[f - tissue_fields]; }
  BLOCHSIM_HD const Property& operator[](int f) const { return field[f - tissue_fields]; }
  // the pool_columns fields of exchanging pool j (0 = B), by PoolColumn
  BLOCHSIM_HD Property* exchanging(int j) { return field + (field_pool_first - tissue_fields) + pool_columns * j; }
  BLOCHSIM_HD const Property* exchanging(int j) const {
    return field + (field_pool_first - tissue_fields) + pool_columns * j;
  }
};

// The Property of pool field f (tissue_fields <= f < pool_field_count).
inline Property& pool_property(Pools& p, int f) { return p[f]; }

// The longitudinal families of a call's pools: n liquid pools (free water
// first), then nb semisolid pools, then the dipolar order of each
// semisolid pool with a T1D (nd of them): m in all.  network: anything
// beyond the star with one semisolid pool (a second semisolid pool,
// dipolar order, a pair rate), which only the run-time-count players play.
struct PoolLayout {
  int n = 1, nb = 0, nd = 0, m = 1;
  bool network = false;
};
BLOCHSIM_HD inline PoolLayout pool_layout(const Pools& p) {
  PoolLayout l;
  l.n = 1 + p.n_exchanging;
  l.nb = p.bound ? (p.bound2 ? 2 : 1) : 0;
  if (p.bound && p[field_bound_T1D_s].present()) ++l.nd;
  if (p.bound2 && p[field_bound2_T1D_s].present()) ++l.nd;
  l.m = l.n + l.nb + l.nd;
  l.network = p.bound2 != 0 || l.nd > 0;
  for (int j = 0; j < pair_rates; ++j) l.network = l.network || p[field_pair_first + j].present();
  return l;
}
// The longitudinal family of network pool code c (PoolCode), or -1 when
// the pool is off.
BLOCHSIM_HD inline int pool_family(const PoolLayout& l, int c) {
  if (c >= code_B && c <= code_E) return c < l.n ? c : -1;
  const int b = c - code_bound;
  return b < l.nb ? l.n + b : -1;
}

inline namespace BLOCHSIM_ISA {

// A complex number over S.
template <class S>
struct Cx {
  S re, im;
};
template <class S>
BLOCHSIM_HD inline Cx<S> operator+(const Cx<S>& a, const Cx<S>& b) {
  return {a.re + b.re, a.im + b.im};
}
template <class S>
BLOCHSIM_HD inline Cx<S> operator-(const Cx<S>& a, const Cx<S>& b) {
  return {a.re - b.re, a.im - b.im};
}
template <class S>
BLOCHSIM_HD inline Cx<S> operator*(const Cx<S>& a, const Cx<S>& b) {
  return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}
template <class S>
BLOCHSIM_HD inline Cx<S> operator*(const S& a, const Cx<S>& b) {
  return {a * b.re, a * b.im};
}
template <class S>
BLOCHSIM_HD inline Cx<S> operator*(const Cx<S>& a, double b) {
  return {a.re * b, a.im * b};
}
template <class S>
BLOCHSIM_HD inline Cx<S> conj(const Cx<S>& a) {
  return {a.re, -a.im};
}

// g(x) of a lineshape lifted to S: the value, and for a dual the chain rule.
BLOCHSIM_HD inline double lift(double, double g, double) { return g; }
template <int N>
BLOCHSIM_HD inline Dual<double, N> lift(const Dual<double, N>& x, double g, double dg) {
  return chain(x, g, dg);
}

namespace pools_detail {

template <class S>
BLOCHSIM_HD inline double magnitude(const S& x) {
  const double v = value_of(x);
  return v < 0 ? -v : v;
}
template <class S>
BLOCHSIM_HD inline double magnitude(const Cx<S>& x) {
  return magnitude(x.re) + magnitude(x.im);
}
template <class S>
BLOCHSIM_HD inline S scaled(const S& x, double c) {
  return x * c;
}
template <class S>
BLOCHSIM_HD inline Cx<S> scaled(const Cx<S>& x, double c) {
  return x * c;
}
template <class T>
struct One {
  BLOCHSIM_HD static T get() { return T(1.0); }
};
template <class S>
struct One<Cx<S>> {
  BLOCHSIM_HD static Cx<S> get() { return {S(1.0), S(0.0)}; }
};

// The square root of a positive value or dual.  (Not an overload of sqrt
// beside dual.hpp's functions: a sqrt template in the core's namespace
// would hide ::sqrt from the unqualified calls on doubles in device code.)
BLOCHSIM_HD inline double root(double x) {
  using std::sqrt;
  return sqrt(x);
}
template <int N>
BLOCHSIM_HD inline Dual<double, N> root(const Dual<double, N>& x) {
  const double r = root(x.v);
  return chain(x, r, 0.5 / r);
}

// C = A B for n × n row-major matrices.
template <class T>
BLOCHSIM_HD inline void matmul(const T* a, const T* b, T* c, int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      T acc = a[i * n] * b[j];
      for (int l = 1; l < n; ++l) acc = acc + a[i * n + l] * b[l * n + j];
      c[i * n + j] = acc;
    }
}

}  // namespace pools_detail

// E = exp(A) of an n × n row-major matrix (n <= MaxN); scaling until the
// 1-norm is at most 1/2, then Horner's form of the degree-12 Taylor
// polynomial (truncation < 1e-16 relative), then squaring.
template <int MaxN = max_longitudinal_pools, class T>
BLOCHSIM_HD inline void expm(const T* a, int n, T* e) {
  using namespace pools_detail;
  constexpr int M = MaxN * MaxN;
  T x[M], t[M];
  double norm = 0.0;
  for (int j = 0; j < n; ++j) {
    double col = 0.0;
    for (int i = 0; i < n; ++i) col += magnitude(a[i * n + j]);
    norm = col > norm ? col : norm;
  }
  int squarings = 0;
  double scale = 1.0;
  while (norm * scale > 0.5) {
    scale *= 0.5;
    ++squarings;
  }
  const T one = One<T>::get();
  for (int i = 0; i < n * n; ++i) {
    x[i] = scaled(a[i], scale);
    e[i] = (i % (n + 1) == 0) ? one : scaled(one, 0.0);
  }
  for (int q = 12; q >= 1; --q) {  // e <- I + x e / q
    matmul(x, e, t, n);
    for (int i = 0; i < n * n; ++i) e[i] = (i % (n + 1) == 0) ? scaled(t[i], 1.0 / q) + one : scaled(t[i], 1.0 / q);
  }
  for (int s = 0; s < squarings; ++s) {
    matmul(e, e, t, n);
    for (int i = 0; i < n * n; ++i) e[i] = t[i];
  }
}

// One problem's tissue and pool values in S (SI), seeded for derivatives.
// Families as PoolLayout orders them; f and R1 of a dipolar family are 0
// and 1/T1D, and its k is 0 (it exchanges nothing).
template <class S>
struct PoolTissue {
  int n = 1;      // liquid pools: free water and the exchanging pools
  int m = 1;      // longitudinal families (PoolLayout)
  int nb = 0;     // semisolid pools, families n .. n + nb - 1
  bool bound = false;
  int dipolar[max_semisolid_pools] = {-1, -1};  // semisolid pool b's dipolar family, or -1
  int pairs = 0;                                 // pair rates beyond the star
  int pair_a[pair_rates], pair_b[pair_rates];    // their families
  S M0, B1, B1phase, B0, eta, T2b;
  S T2s[max_semisolid_pools];                    // T2 of each semisolid pool (T2s[0] = T2b)
  S f[max_longitudinal_pools], k[max_longitudinal_pools];  // k[0] unused; k[j]: j with free water
  S R1[max_longitudinal_pools], R2[max_liquid_pools], shift[max_liquid_pools];
  S pair_k[pair_rates];
};

// How a value of tissue field `field` enters S: plain for double; for a dual,
// with derivative seeds[j] along each direction j that names the field.
template <class S>
struct Seeder {
  BLOCHSIM_HD static S make(double v, int, const int*, int, const float*) { return S(v); }
};
template <int N>
struct Seeder<Dual<double, N>> {
  BLOCHSIM_HD static Dual<double, N> make(double v, int field, const int* fields, int n_dirs, const float* seeds) {
    Dual<double, N> r(v);
    for (int j = 0; j < n_dirs && j < N; ++j)
      if (fields[j] == field) r.d[j] = seeds ? seeds[j] : 1.0;
    return r;
  }
};

template <class S>
BLOCHSIM_HD inline PoolTissue<S> pool_tissue(const Tissue& t, const Pools& p, int64_t i, const int* fields,
                                             int n_dirs, const float* seeds) {
  auto get = [&](const Property& prop, int field, double fallback_value) {
    const double v = prop.present() ? static_cast<double>(prop.at(i)) : fallback_value;
    return Seeder<S>::make(v, field, fields, n_dirs, seeds);
  };
  PoolTissue<S> q;
  const PoolLayout lay = pool_layout(p);
  q.n = lay.n;
  q.bound = p.bound != 0;
  q.nb = lay.nb;
  q.m = lay.m;
  const S T1 = get(t[field_T1], field_T1, t[field_T1].fallback), T2 = get(t[field_T2], field_T2, t[field_T2].fallback);
  q.M0 = get(t[field_M0], field_M0, t[field_M0].fallback);
  q.B1 = get(t[field_B1], field_B1, t[field_B1].fallback);
  q.B1phase = get(t[field_B1phase], field_B1phase, t[field_B1phase].fallback);
  q.B0 = get(t[field_B0], field_B0, t[field_B0].fallback);
  q.eta = get(t[field_eta], field_eta, t[field_eta].fallback);
  q.R1[0] = S(1.0) / T1;
  q.R2[0] = S(1.0) / T2;
  q.shift[0] = S(0.0);
  S rest = S(1.0);
  for (int j = 0; j < p.n_exchanging; ++j) {
    const int base = field_pool_first + pool_columns * j;
    const Property* c = p.exchanging(j);
    q.f[1 + j] = get(c[pool_fraction], base + pool_fraction, 0.0);
    q.k[1 + j] = get(c[pool_exchange_hz], base + pool_exchange_hz, 0.0);
    q.R1[1 + j] = c[pool_T1_s].present() ? S(1.0) / get(c[pool_T1_s], base + pool_T1_s, 1.0) : q.R1[0];
    q.R2[1 + j] = c[pool_T2_s].present() ? S(1.0) / get(c[pool_T2_s], base + pool_T2_s, 1.0) : q.R2[0];
    q.shift[1 + j] = get(c[pool_shift_hz], base + pool_shift_hz, 0.0);
    rest = rest - q.f[1 + j];
  }
  if (q.bound) {
    q.f[q.n] = get(p[field_bound_fraction], field_bound_fraction, p[field_bound_fraction].fallback);
    q.k[q.n] = get(p[field_bound_exchange_hz], field_bound_exchange_hz, p[field_bound_exchange_hz].fallback);
    q.R1[q.n] = S(1.0) / get(p[field_bound_T1_s], field_bound_T1_s, p[field_bound_T1_s].fallback);
    q.T2b = get(p[field_bound_T2_s], field_bound_T2_s, p[field_bound_T2_s].fallback);
    q.T2s[0] = q.T2b;
    rest = rest - q.f[q.n];
  }
  if (q.nb > 1) {
    const int b = q.n + 1;
    q.f[b] = get(p[field_bound2_fraction], field_bound2_fraction, 0.0);
    q.k[b] = get(p[field_bound2_exchange_hz], field_bound2_exchange_hz, 0.0);
    q.R1[b] = S(1.0) / get(p[field_bound2_T1_s], field_bound2_T1_s, p[field_bound2_T1_s].fallback);
    q.T2s[1] = get(p[field_bound2_T2_s], field_bound2_T2_s, p[field_bound2_T2_s].fallback);
    rest = rest - q.f[b];
  }
  int d = q.n + q.nb;
  for (int b = 0; b < q.nb; ++b) {
    const int field = b == 0 ? field_bound_T1D_s : field_bound2_T1D_s;
    if (!p[field].present()) continue;
    q.dipolar[b] = d;
    q.f[d] = S(0.0);
    q.k[d] = S(0.0);
    q.R1[d] = S(1.0) / get(p[field], field, 1.0);
    ++d;
  }
  for (int j = 0; j < pair_rates; ++j) {
    const Property& prop = p[field_pair_first + j];
    if (!prop.present()) continue;
    q.pair_a[q.pairs] = pool_family(lay, pair_code(j, 0));
    q.pair_b[q.pairs] = pool_family(lay, pair_code(j, 1));
    q.pair_k[q.pairs] = get(prop, field_pair_first + j, 0.0);
    ++q.pairs;
  }
  q.f[0] = rest;
  return q;
}

// The interval operators of one problem for a duration tau (s): P (n × n
// complex, F+), L (m × m) and r (m) as described at the top.
// (Not inlined on the host: it runs once per interval and problem, and each
// pool count's kernel shares one copy; inlined, the exponential's unrolled
// code is compiled again into every kernel.  config.hpp says why the device
// inlines it.)
template <class S>
BLOCHSIM_HD BLOCHSIM_NOINLINE void pool_interval(const PoolTissue<S>& q, const S& tau, Cx<S>* P, S* L, S* r) {
  const int n = q.n, m = q.m;
  Cx<S> a[max_longitudinal_pools * max_longitudinal_pools];
  S b[max_longitudinal_pools * max_longitudinal_pools];
  const S zero = S(0.0);
  for (int i = 0; i < n * n; ++i) a[i] = {zero, zero};
  for (int i = 0; i < m * m; ++i) b[i] = zero;
  const S w = tau * (2.0 * pi);
  for (int j = 0; j < n; ++j) {
    a[j * n + j].re = -(q.R2[j] * tau);
    a[j * n + j].im = -((q.B0 + q.shift[j]) * w);
  }
  for (int j = 0; j < m; ++j) b[j * m + j] = -(q.R1[j] * tau);
  for (int j = 1; j < q.n + q.nb; ++j) {
    const S out_of_free = q.k[j] * q.f[j] * tau, into_free = q.k[j] * q.f[0] * tau;
    b[0] = b[0] - out_of_free;
    b[j * m + j] = b[j * m + j] - into_free;
    b[j * m] = out_of_free;   // free -> j
    b[j] = into_free;         // j -> free
    if (j < n) {
      a[0].re = a[0].re - out_of_free;
      a[j * n + j].re = a[j * n + j].re - into_free;
      a[j * n].re = out_of_free;
      a[j].re = into_free;
    }
  }
  // the pairs beyond the star: a -> b at k f_b, b -> a at k f_a
  for (int j = 0; j < q.pairs; ++j) {
    const int x = q.pair_a[j], y = q.pair_b[j];
    const S out_of_x = q.pair_k[j] * q.f[y] * tau, into_x = q.pair_k[j] * q.f[x] * tau;
    b[x * m + x] = b[x * m + x] - out_of_x;
    b[y * m + y] = b[y * m + y] - into_x;
    b[y * m + x] = b[y * m + x] + out_of_x;
    b[x * m + y] = b[x * m + y] + into_x;
    if (y < n) {
      a[x * n + x].re = a[x * n + x].re - out_of_x;
      a[y * n + y].re = a[y * n + y].re - into_x;
      a[y * n + x].re = a[y * n + x].re + out_of_x;
      a[x * n + y].re = a[x * n + y].re + into_x;
    }
  }
  expm(a, n, P);
  expm(b, m, L);
  for (int i = 0; i < m; ++i) {
    S lf = L[i * m] * q.f[0];
    for (int j = 1; j < m; ++j) lf = lf + L[i * m + j] * q.f[j];
    r[i] = q.f[i] - lf;
  }
}

// Scalars of one problem's pooled state (F+, F-, Z of each liquid pool and
// the other longitudinal families over K orders, complex).
BLOCHSIM_HD inline int64_t pool_state_size(const EventStream& s, const Pools& p) {
  const PoolLayout l = pool_layout(p);
  return (2 * l.n + l.m) * 2 * static_cast<int64_t>(s.states);
}

// Scalars of one problem's operator tables: per distinct interval a flag,
// P, L and r; per distinct exact pulse a flag, M and c.
BLOCHSIM_HD inline int64_t pool_operator_size(const EventStream& s, const Pools& p) {
  const PoolLayout l = pool_layout(p);
  const int64_t n = l.n, m = l.m;
  const int64_t per_interval = 2 * n * n + m * m + m + 1;
  const int64_t d = 2 * n + m;
  const int64_t per_driven = 1 + 2 * d * (d + 1);
  return per_interval * s.n_intervals + per_driven * (s.driven ? s.n_driven : 0);
}

// Scalars per problem of pooled_problem's workspace.
BLOCHSIM_HD inline int64_t pool_workspace(const EventStream& s, const Pools& p) {
  return pool_state_size(s, p) + pool_operator_size(s, p);
}

// Directions of an event's own parameters in a dual pass (reverse mode,
// pools/adjoint.hpp); -1: not seeded.
struct EventSeeds {
  int duration = -1, flip = -1, phase = -1, rf_duration = -1, rf_offset = -1;
};

// v in S, with a unit derivative along direction dir when S is a dual and
// dir >= 0.
template <class S>
BLOCHSIM_HD inline S seeded(double v, int dir) {
  S r(v);
  if constexpr (IsDual<S>::value) {
    if (dir >= 0) r.d[dir] = 1.0;
  }
  return r;
}

// An exact rectangular pulse's duration (s), nominal flip and phase (rad)
// and offset from water (Hz), in S.
template <class S>
struct DrivenPulse {
  S tau, flip, phase, df;
};

// A row of EventStream::driven_table in S, seeded as es says.
template <class S>
BLOCHSIM_HD inline DrivenPulse<S> driven_pulse(const double* row, const EventSeeds& es = EventSeeds{}) {
  return {seeded<S>(row[drv_duration_s], es.rf_duration), seeded<S>(row[drv_flip_rad], es.flip),
          seeded<S>(row[drv_phase_rad], es.phase), seeded<S>(row[drv_offset_hz], es.rf_offset)};
}

// The ratio of a semisolid pool's local dipolar field D (rad/s) to 1/T2:
// D = 1 / (sqrt(15) T2), the super-Lorentzian's (Varma et al. 2015, JMR
// 260:67), for every lineshape.
constexpr double dipolar_field_factor = 0.2581988897471611;  // 1/sqrt(15)

// The operator of an exact rectangular pulse (duration tau, flip alpha,
// phase phi, offset df from water, all nominal) for one problem: the d × d
// matrix M and the order-0 recovery c (d = 2n + m) over the components
// (F+, F-, Z) of each liquid pool and the other longitudinal families (the
// semisolid pools' Z, their dipolar orders).  The Bloch–McConnell equations
// with the RF field are solved in the frame of the pulse (where it is
// static and every pool is off resonance by B0 + shift - df) by the
// exponential of their augmented generator, then taken back to the water
// frame (F+ turned by exp(-2 pi i df tau)).  The RF terms are the hard pulse's rotation per unit
// angle (SPEC §2) at w1 = B1 alpha / tau; a semisolid pool saturates at
// W = pi w1^2 G(df - B0), and with dipolar order (Provotorov's equations,
// as Varma et al. 2015) its Z^b and dipolar order Z^d, scaled to Z's units,
// move by W [[-1, x], [x, -x^2]], x = 2 pi (df - B0) / D.
// (Not inlined on the host, as pool_interval.)
template <class S>
BLOCHSIM_HD BLOCHSIM_NOINLINE void pool_driven(const PoolTissue<S>& q, int lineshape, const LineshapeTable& ls,
                                               const DrivenPulse<S>& pulse, Cx<S>* M, Cx<S>* c) {
  const int n = q.n, d = 2 * n + q.m, D = d + 1;
  const S tau = pulse.tau, df = pulse.df;
  const S zero = S(0.0);
  Cx<S> g[max_driven_size * max_driven_size], e[max_driven_size * max_driven_size];
  for (int i = 0; i < D * D; ++i) g[i] = {zero, zero};
  using std::cos;
  using std::sin;
  const S w1t = q.B1 * pulse.flip;  // w1 tau
  const S phi = q.B1phase + pulse.phase;
  const S cp = cos(phi), sp = sin(phi);
  auto at = [&](int i, int j) -> Cx<S>& { return g[i * D + j]; };
  for (int j = 0; j < n; ++j) {
    const int P = 3 * j, Mi = P + 1, Z = P + 2;
    const S w = (q.B0 + q.shift[j] - df) * (tau * (2.0 * pi));
    const S r2 = q.R2[j] * tau, r1 = q.R1[j] * tau;
    at(P, P) = {-r2, -w};
    at(Mi, Mi) = {-r2, w};
    at(Z, Z).re = -r1;
    at(Z, d).re = r1 * q.f[j];
    // dF+ = -i e^{i phi} w1 Z, dF- = i e^{-i phi} w1 Z,
    // dZ = -(i/2) e^{-i phi} w1 F+ + (i/2) e^{i phi} w1 F-
    at(P, Z) = {sp * w1t, -(cp * w1t)};
    at(Mi, Z) = {sp * w1t, cp * w1t};
    at(Z, P) = {-(sp * w1t) * 0.5, -(cp * w1t) * 0.5};
    at(Z, Mi) = {-(sp * w1t) * 0.5, (cp * w1t) * 0.5};
  }
  for (int j = 1; j < n; ++j)
    for (int comp = 0; comp < 3; ++comp) {
      const int a = comp, b = 3 * j + comp;
      const S out_of_free = q.k[j] * q.f[j] * tau, into_free = q.k[j] * q.f[0] * tau;
      at(a, a).re = at(a, a).re - out_of_free;
      at(b, a).re = at(b, a).re + out_of_free;
      at(b, b).re = at(b, b).re - into_free;
      at(a, b).re = at(a, b).re + into_free;
    }
  for (int b = 0; b < q.nb; ++b) {
    const int B = 3 * n + b, jb = n + b;
    const S x = (df - q.B0) * q.T2s[b] * (2.0 * pi);
    double gv, dg;
    lineshape_eval(lineshape, value_of(x), ls, gv, dg);
    const S W = (S(pi) / tau) * (q.T2s[b] * lift(x, gv, dg)) * (w1t * w1t);  // W tau
    const S r1 = q.R1[jb] * tau;
    const S out_of_free = q.k[jb] * q.f[jb] * tau, into_free = q.k[jb] * q.f[0] * tau;
    at(B, B).re = -(r1 + W + into_free);
    at(B, d).re = r1 * q.f[jb];
    at(2, 2).re = at(2, 2).re - out_of_free;
    at(B, 2).re = out_of_free;
    at(2, B).re = into_free;
    if (q.dipolar[b] >= 0) {
      const int Dd = 2 * n + q.dipolar[b];
      const S xd = x * (1.0 / dipolar_field_factor);
      at(B, Dd).re = W * xd;
      at(Dd, B).re = W * xd;
      at(Dd, Dd).re = -(q.R1[q.dipolar[b]] * tau + W * (xd * xd));
    }
  }
  // the pairs beyond the star (the longitudinal family j >= n is
  // component 2n + j)
  for (int j = 0; j < q.pairs; ++j) {
    const int x = q.pair_a[j], y = q.pair_b[j];
    const S out_of_x = q.pair_k[j] * q.f[y] * tau, into_x = q.pair_k[j] * q.f[x] * tau;
    for (int comp = (y < n ? 0 : 2); comp < 3; ++comp) {
      const int a = x < n ? 3 * x + comp : 2 * n + x, c = y < n ? 3 * y + comp : 2 * n + y;
      at(a, a).re = at(a, a).re - out_of_x;
      at(c, a).re = at(c, a).re + out_of_x;
      at(c, c).re = at(c, c).re - into_x;
      at(a, c).re = at(a, c).re + into_x;
    }
  }
  expm<max_driven_size>(g, D, e);
  // back to the water frame
  const S turn = (df * tau) * (-2.0 * pi);
  const Cx<S> rot{cos(turn), sin(turn)};
  for (int i = 0; i < d; ++i) {
    const int comp = i < 3 * n ? i % 3 : 2;  // the families after the liquid pools: longitudinal
    for (int j = 0; j <= d; ++j) {
      Cx<S> v = e[i * D + j];
      if (comp == 0) v = v * rot;
      if (comp == 1) v = v * conj(rot);
      if (j < d)
        M[i * d + j] = v;
      else
        c[i] = v;
    }
  }
}

// Checks the pool configuration against the stream (host arrays), without
// reading the properties' values: what validate_pools checks of device
// properties, whose values the caller checks.
inline int validate_pool_config(const EventStream& s, const Tissue& t, const Pools& p) {
  if (p.n_exchanging < 0 || p.n_exchanging > max_exchanging_pools || p.lineshape < 0 ||
      p.lineshape >= lineshape_count || (p.bound2 && !p.bound))
    return bad_pools;
  // a T1D or a pair rate of a pool that is off
  if ((!p.bound && p[field_bound_T1D_s].present()) || (!p.bound2 && p[field_bound2_T1D_s].present())) return bad_pools;
  const PoolLayout lay = pool_layout(p);
  for (int j = 0; j < pair_rates; ++j)
    if (p[field_pair_first + j].present() &&
        (pool_family(lay, pair_code(j, 0)) < 0 || pool_family(lay, pair_code(j, 1)) < 0))
      return bad_pools;
  if (t[field_D].present() || t[field_v].present()) return pools_without_motion;
  if (s.n_events > 0 && s.rf_duration_s) {
    for (int64_t e = 0; e < s.n_events; ++e)
      if (!(s.rf_duration_s[e] >= 0.0f)) return bad_pools;
  }
  return ok;
}

// Checks the pool configuration and every problem's fractions (each >= 0,
// their sum <= 1) and rates; kernels assume it passed.
inline int validate_pools(const EventStream& s, const Tissue& t, const Pools& p) {
  const int c = validate_pool_config(s, t, p);
  if (c != ok) return c;
  for (int64_t i = 0; i < t.n; ++i) {
    double sum = 0.0;
    for (int j = 0; j < p.n_exchanging; ++j) {
      const double fj = p.exchanging(j)[pool_fraction].at(i), kj = p.exchanging(j)[pool_exchange_hz].at(i);
      if (!(fj >= 0.0) || !(kj >= 0.0)) return bad_pool_fraction;
      sum += fj;
    }
    if (p.bound) {
      const double fb = p[field_bound_fraction].at(i), kb = p[field_bound_exchange_hz].at(i);
      if (!(fb >= 0.0) || !(kb >= 0.0) || !(p[field_bound_T1_s].at(i) > 0.0) || !(p[field_bound_T2_s].at(i) > 0.0))
        return bad_pool_fraction;
      sum += fb;
    }
    if (p.bound2) {
      const double fb = p[field_bound2_fraction].at(i), kb = p[field_bound2_exchange_hz].at(i);
      if (!(fb >= 0.0) || !(kb >= 0.0) || !(p[field_bound2_T1_s].at(i) > 0.0) || !(p[field_bound2_T2_s].at(i) > 0.0))
        return bad_pool_fraction;
      sum += fb;
    }
    for (int f : {field_bound_T1D_s, field_bound2_T1D_s})
      if (p[f].present() && !(p[f].at(i) > 0.0)) return bad_pool_fraction;
    for (int j = 0; j < pair_rates; ++j)
      if (p[field_pair_first + j].present() && !(p[field_pair_first + j].at(i) >= 0.0)) return bad_pool_fraction;
    if (sum > 1.0 + 1e-6) return bad_pool_fraction;
  }
  return ok;
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
