// The pooled EPG (SPEC §3): free water with up to four exchanging pools
// that have transverse states (Bloch–McConnell; McConnell 1958, J Chem Phys
// 28:430) and a semisolid pool with longitudinal states only (the binary
// spin bath of EPG-X; Malik, Teixeira & Hajnal 2018, MRM 80:767).
//
// One problem is played by one call of pooled_problem<S>, over a scalar
// type S: double for the signal, Dual<double, N> for the signal and its
// derivatives along N tissue directions in the same pass.
//
// Per problem and per distinct interval length τ the kernel forms the exact
// interval operators once, the first time an event uses them:
//   transverse   P = exp(τ A),  A the n × n complex generator of the F+
//                families of the n liquid pools (relaxation, exchange with
//                free water, B0 and chemical shift); F− evolves by conj(P);
//   longitudinal L = exp(τ B),  B the m × m real generator of the Z families
//                (n liquid pools and the semisolid pool: relaxation and
//                exchange with free water), and the recovery r = f − L f
//                added to order 0 (f: the equilibrium fractions, which B's
//                detailed balance leaves fixed).
// The exponentials are taken by scaling and squaring with a degree-12
// Taylor polynomial (Moler & Van Loan 2003, SIAM Rev 45:3, method 3), in S,
// so that their derivatives come with them.
//
// Exchange is a star around free water (pool a): pool b, with fraction f_b
// and rate constant k_b, moves magnetisation a → b at k_b f_b and b → a at
// k_b f_a (detailed balance).  The semisolid pool exchanges longitudinal
// magnetisation only; free water's transverse states feel no semisolid
// exchange (EPG-X).
#pragma once

#include <cmath>
#include <cstdint>

#include "../dual.hpp"
#include "../events.hpp"
#include "lineshape.hpp"

namespace blochsim {

constexpr int max_liquid_pools = 1 + max_exchanging_pools;
constexpr int max_longitudinal_pools = max_liquid_pools + 1;
// components of one order under an exact rectangular pulse: F+, F-, Z of
// each liquid pool, the semisolid Z, and a constant 1 for recovery
constexpr int max_driven_size = 3 * max_liquid_pools + 2;

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
  Property bound_fraction{nullptr, 0, field_table[field_bound_fraction].fallback};
  Property bound_exchange_hz{nullptr, 0, field_table[field_bound_exchange_hz].fallback};
  Property bound_T1_s{nullptr, 0, field_table[field_bound_T1_s].fallback};
  Property bound_T2_s{nullptr, 0, field_table[field_bound_T2_s].fallback};
  Property pool[max_exchanging_pools][pool_columns] = {};
};

// The Property of pool field f (tissue_fields <= f < pool_field_count).
inline Property& pool_property(Pools& p, int f) {
  switch (f) {
    case field_bound_fraction: return p.bound_fraction;
    case field_bound_exchange_hz: return p.bound_exchange_hz;
    case field_bound_T1_s: return p.bound_T1_s;
    case field_bound_T2_s: return p.bound_T2_s;
    default: return p.pool[(f - field_pool_first) / pool_columns][(f - field_pool_first) % pool_columns];
  }
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
template <class S>
struct PoolTissue {
  int n = 1;      // liquid pools: free water and the exchanging pools
  int m = 1;      // longitudinal families: the liquid pools, then the semisolid pool if on
  bool bound = false;
  S M0, B1, B1phase, B0, eta, T2b;
  S f[max_longitudinal_pools], k[max_longitudinal_pools];  // k[0] unused
  S R1[max_longitudinal_pools], R2[max_liquid_pools], shift[max_liquid_pools];
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
  q.n = 1 + p.n_exchanging;
  q.bound = p.bound != 0;
  q.m = q.n + (q.bound ? 1 : 0);
  const S T1 = get(t.T1_s, field_T1, t.T1_s.fallback), T2 = get(t.T2_s, field_T2, t.T2_s.fallback);
  q.M0 = get(t.M0, field_M0, t.M0.fallback);
  q.B1 = get(t.B1, field_B1, t.B1.fallback);
  q.B1phase = get(t.B1phase_rad, field_B1phase, t.B1phase_rad.fallback);
  q.B0 = get(t.B0_hz, field_B0, t.B0_hz.fallback);
  q.eta = get(t.inv_efficiency, field_eta, t.inv_efficiency.fallback);
  q.R1[0] = S(1.0) / T1;
  q.R2[0] = S(1.0) / T2;
  q.shift[0] = S(0.0);
  S rest = S(1.0);
  for (int j = 0; j < p.n_exchanging; ++j) {
    const int base = field_pool_first + pool_columns * j;
    const Property* c = p.pool[j];
    q.f[1 + j] = get(c[pool_fraction], base + pool_fraction, 0.0);
    q.k[1 + j] = get(c[pool_exchange_hz], base + pool_exchange_hz, 0.0);
    q.R1[1 + j] = c[pool_T1_s].present() ? S(1.0) / get(c[pool_T1_s], base + pool_T1_s, 1.0) : q.R1[0];
    q.R2[1 + j] = c[pool_T2_s].present() ? S(1.0) / get(c[pool_T2_s], base + pool_T2_s, 1.0) : q.R2[0];
    q.shift[1 + j] = get(c[pool_shift_hz], base + pool_shift_hz, 0.0);
    rest = rest - q.f[1 + j];
  }
  if (q.bound) {
    q.f[q.n] = get(p.bound_fraction, field_bound_fraction, p.bound_fraction.fallback);
    q.k[q.n] = get(p.bound_exchange_hz, field_bound_exchange_hz, p.bound_exchange_hz.fallback);
    q.R1[q.n] = S(1.0) / get(p.bound_T1_s, field_bound_T1_s, p.bound_T1_s.fallback);
    q.T2b = get(p.bound_T2_s, field_bound_T2_s, p.bound_T2_s.fallback);
    rest = rest - q.f[q.n];
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
  for (int j = 1; j < m; ++j) {
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
  expm(a, n, P);
  expm(b, m, L);
  for (int i = 0; i < m; ++i) {
    S lf = L[i * m] * q.f[0];
    for (int j = 1; j < m; ++j) lf = lf + L[i * m + j] * q.f[j];
    r[i] = q.f[i] - lf;
  }
}

// Scalars of one problem's pooled state (F+, F-, Z of each liquid pool and
// the semisolid Z over K orders, complex).
BLOCHSIM_HD inline int64_t pool_state_size(const EventStream& s, const Pools& p) {
  const int64_t n = 1 + p.n_exchanging;
  return (3 * n + (p.bound ? 1 : 0)) * 2 * static_cast<int64_t>(s.states);
}

// Scalars of one problem's operator tables: per distinct interval a flag,
// P, L and r; per distinct exact pulse a flag, M and c.
BLOCHSIM_HD inline int64_t pool_operator_size(const EventStream& s, const Pools& p) {
  const int64_t n = 1 + p.n_exchanging, m = n + (p.bound ? 1 : 0);
  const int64_t per_interval = 2 * n * n + m * m + m + 1;
  const int64_t d = 3 * n + (p.bound ? 1 : 0);
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

// The operator of an exact rectangular pulse (duration tau, flip alpha,
// phase phi, offset df from water, all nominal) for one problem: the d × d
// matrix M and the order-0 recovery c (d = 3n + 1 with a semisolid pool,
// 3n without) over the components (F+, F-, Z) of each liquid pool and the
// semisolid Z.  The Bloch–McConnell equations with the RF field are solved
// in the frame of the pulse (where it is static and every pool is off
// resonance by B0 + shift - df) by the exponential of their augmented
// generator, then taken back to the water frame (F+ turned by
// exp(-2 pi i df tau)).  The RF terms are the hard pulse's rotation per unit
// angle (SPEC §2) at w1 = B1 alpha / tau; the semisolid pool saturates at
// W = pi w1^2 G(df - B0).
// (Not inlined on the host, as pool_interval.)
template <class S>
BLOCHSIM_HD BLOCHSIM_NOINLINE void pool_driven(const PoolTissue<S>& q, int lineshape, const LineshapeTable& ls,
                                               const DrivenPulse<S>& pulse, Cx<S>* M, Cx<S>* c) {
  const int n = q.n, d = 3 * n + (q.bound ? 1 : 0), D = d + 1;
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
  if (q.bound) {
    const int B = 3 * n;
    const S x = (df - q.B0) * q.T2b * (2.0 * pi);
    double gv, dg;
    lineshape_eval(lineshape, value_of(x), ls, gv, dg);
    const S W = (S(pi) / tau) * (q.T2b * lift(x, gv, dg)) * (w1t * w1t);  // W tau
    const S r1 = q.R1[n] * tau;
    const S out_of_free = q.k[n] * q.f[n] * tau, into_free = q.k[n] * q.f[0] * tau;
    at(B, B).re = -(r1 + W + into_free);
    at(B, d).re = r1 * q.f[n];
    at(2, 2).re = at(2, 2).re - out_of_free;
    at(B, 2).re = out_of_free;
    at(2, B).re = into_free;
  }
  expm<max_driven_size>(g, D, e);
  // back to the water frame
  const S turn = (df * tau) * (-2.0 * pi);
  const Cx<S> rot{cos(turn), sin(turn)};
  for (int i = 0; i < d; ++i) {
    const int comp = i < 3 * n ? i % 3 : 2;
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

// One problem's pooled EPG over the scalar type S, one event at a time:
// the state (F+, F-, Z of each liquid pool, then the semisolid Z; row
// j K + k of a complex array) and the operators per distinct interval and
// per exact pulse, formed the first time an event uses them.  es seeds the
// event's own parameters (reverse mode); ops points at
// pool_operator_size(s, p) values of S, x at pool_state_size(s, p).
template <class S>
struct PoolPlayer {
  const EventStream& s;
  const Pools& p;
  const LineshapeTable& ls;
  PoolTissue<S> q;
  Cx<S>* x;
  S* ops;
  EventSeeds es;
  int n, m, K, d;
  int64_t per_interval, per_driven;
  int band = 1;  // orders [band, K) are zero

  BLOCHSIM_HD PoolPlayer(const EventStream& s_, const Pools& p_, const LineshapeTable& ls_, const PoolTissue<S>& q_,
                         Cx<S>* x_, S* ops_)
      : s(s_), p(p_), ls(ls_), q(q_), x(x_), ops(ops_) {
    n = q.n;
    m = q.m;
    K = s.states;
    d = 3 * n + (q.bound ? 1 : 0);
    per_interval = 2 * n * n + m * m + m + 1;
    per_driven = 1 + 2 * d * (d + 1);
  }
  BLOCHSIM_HD Cx<S>* fp() const { return x; }
  BLOCHSIM_HD Cx<S>* fm() const { return x + n * K; }
  BLOCHSIM_HD Cx<S>* z() const { return x + 2 * n * K; }
  BLOCHSIM_HD int64_t size() const { return static_cast<int64_t>(2 * n + m) * K; }

  // Marks every operator as not yet formed.
  BLOCHSIM_HD void forget_operators() {
    for (int64_t v = 0; v < s.n_intervals; ++v) ops[v * per_interval] = S(0.0);
    if (s.driven)
      for (int64_t v = 0; v < s.n_driven; ++v) ops[per_interval * s.n_intervals + v * per_driven] = S(0.0);
  }
  // Equilibrium: each pool's Z_0 at its fraction.
  BLOCHSIM_HD void equilibrium() {
    const S zero = S(0.0);
    for (int64_t l = 0; l < size(); ++l) x[l] = {zero, zero};
    for (int j = 0; j < m; ++j) z()[j * K].re = q.f[j];
    band = 1;
  }
  // The interval operators of interval iv: P (n × n), L (m × m), r (m).
  BLOCHSIM_HD void interval_ops(int32_t iv, Cx<S>*& P, S*& L, S*& r) {
    S* o = ops + iv * per_interval;
    P = reinterpret_cast<Cx<S>*>(o + 1);
    L = o + 1 + 2 * n * n;
    r = L + m * m;
    if (value_of(o[0]) == 0.0) {
      pool_interval(q, seeded<S>(s.duration_s[iv], es.duration), P, L, r);
      o[0] = S(1.0);
    }
  }
  // The exact pulse of driven row id: M (d × d) and its order-0 source c.
  BLOCHSIM_HD void driven_ops(int32_t id, Cx<S>*& M, Cx<S>*& c) {
    S* o = ops + per_interval * s.n_intervals + id * per_driven;
    M = reinterpret_cast<Cx<S>*>(o + 1);
    c = M + d * d;
    if (value_of(o[0]) == 0.0) {
      pool_driven(q, p.lineshape, ls, driven_pulse<S>(s.driven_table + id * driven_fields, es), M, c);
      o[0] = S(1.0);
    }
  }
  // The semisolid pool's decay under the pulse of event e (1 without one):
  // exp(-pi G(df) (B1 alpha)^2 p / tau_rf), df the pulse's offset from this
  // voxel's water resonance.
  BLOCHSIM_HD S saturation(int64_t e) const {
    if (!(q.bound && s.rf_duration_s != nullptr) || !(s.flags[e] & (event_rf | event_saturation)) ||
        !(s.rf_duration_s[e] > 0.0f))
      return S(1.0);
    const S tau_rf = seeded<S>(s.rf_duration_s[e], es.rf_duration);
    const S alpha = q.B1 * seeded<S>(s.flip_rad[e], es.flip);
    const double power = s.rf_power ? s.rf_power[e] : 1.0;
    const S offset = seeded<S>(s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0, es.rf_offset);
    const S xg = (offset - q.B0) * q.T2b * (2.0 * pi);
    double g, dg;
    lineshape_eval(p.lineshape, value_of(xg), ls, g, dg);
    using std::exp;
    return exp(-((pi * power) / tau_rf) * (q.T2b * lift(xg, g, dg)) * (alpha * alpha));
  }
  // The hard pulse of event e per pool, as its coefficients: F+' = c2 a +
  // s2 e2 b + u c, F-' = s2 conj(e2) a + c2 b + conj(u) c, Z' = -conj(u) a / 2
  // - u b / 2 + ca c (a, b, c: F+, F-, Z; SPEC §2).
  struct Rotation {
    S c2, s2, ca;
    Cx<S> e2, u;
  };
  BLOCHSIM_HD Rotation rotation(int64_t e) const {
    using std::cos;
    using std::sin;
    const S alpha = q.B1 * seeded<S>(s.flip_rad[e], es.flip);
    const S phi = q.B1phase + seeded<S>(s.phase_rad[e], es.phase);
    Rotation R;
    R.ca = cos(alpha);
    const S sa = sin(alpha);
    R.c2 = (S(1.0) + R.ca) * 0.5;
    R.s2 = (S(1.0) - R.ca) * 0.5;
    const Cx<S> e1{cos(phi), sin(phi)};
    R.e2 = e1 * e1;
    R.u = {e1.im * sa, -(e1.re * sa)};  // -i e^{i phi} sin(alpha)
    return R;
  }

  BLOCHSIM_HD void shift(int dir) {
    const Cx<S> czero{S(0.0), S(0.0)};
    for (int j = 0; j < n; ++j) {
      Cx<S>* up = (dir > 0 ? fp() : fm()) + j * K;
      Cx<S>* dn = (dir > 0 ? fm() : fp()) + j * K;
      const int top = band < K ? band : K - 1;
      for (int k = top; k >= 1; --k) up[k] = up[k - 1];
      for (int k = 0; k + 1 < band; ++k) dn[k] = dn[k + 1];
      dn[band - 1] = czero;
      up[0] = conj(dn[0]);
    }
    band = band < K ? band + 1 : K;
  }

  // Plays event e; sink(slot, sample) takes its readout.
  template <class Sink>
  BLOCHSIM_HD void event(int64_t e, Sink&& sink) {
    const uint32_t f = s.flags[e];
    const int32_t iv = s.interval[e];
    Cx<S>* const Fp = fp();
    Cx<S>* const Fm = fm();
    Cx<S>* const Z = z();
    const Cx<S> czero{S(0.0), S(0.0)};
    if (iv >= 0) {
      Cx<S>* P;
      S *L, *r;
      interval_ops(iv, P, L, r);
      for (int k = 0; k < band; ++k) {
        Cx<S> a[max_liquid_pools], b[max_liquid_pools], c[max_longitudinal_pools];
        for (int j = 0; j < n; ++j) {
          a[j] = Fp[j * K + k];
          b[j] = Fm[j * K + k];
        }
        for (int j = 0; j < m; ++j) c[j] = Z[j * K + k];
        for (int j = 0; j < n; ++j) {
          Cx<S> u = P[j * n] * a[0], v = conj(P[j * n]) * b[0];
          for (int l = 1; l < n; ++l) {
            u = u + P[j * n + l] * a[l];
            v = v + conj(P[j * n + l]) * b[l];
          }
          Fp[j * K + k] = u;
          Fm[j * K + k] = v;
        }
        for (int j = 0; j < m; ++j) {
          Cx<S> u = L[j * m] * c[0];
          for (int l = 1; l < m; ++l) u = u + L[j * m + l] * c[l];
          if (k == 0) u.re = u.re + r[j];
          Z[j * K + k] = u;
        }
      }
    }
    for (int sb = s.shift_before[e], c = 0; c < (sb > 0 ? sb : -sb); ++c) shift(sb > 0 ? 1 : -1);
    if (q.bound && (f & (event_rf | event_saturation))) {
      const S decay = saturation(e);
      Cx<S>* zb = Z + n * K;
      for (int k = 0; k < band; ++k) zb[k] = decay * zb[k];
    }
    if (f & event_rf) {
      const Rotation R = rotation(e);
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) {
          const Cx<S> a = Fp[j * K + k], b = Fm[j * K + k], c = Z[j * K + k];
          Fp[j * K + k] = R.c2 * a + R.s2 * (R.e2 * b) + R.u * c;
          Fm[j * K + k] = R.c2 * b + R.s2 * (conj(R.e2) * a) + conj(R.u) * c;
          Z[j * K + k] = R.ca * c - (conj(R.u) * a + R.u * b) * 0.5;
        }
    }
    if (f & event_driven) {
      Cx<S> *M, *c;
      driven_ops(s.driven[e], M, c);
      for (int k = 0; k < band; ++k) {
        Cx<S> v[max_driven_size];
        for (int j = 0; j < n; ++j) {
          v[3 * j] = Fp[j * K + k];
          v[3 * j + 1] = Fm[j * K + k];
          v[3 * j + 2] = Z[j * K + k];
        }
        if (q.bound) v[3 * n] = Z[n * K + k];
        for (int i = 0; i < d; ++i) {
          Cx<S> u = k == 0 ? c[i] : czero;
          for (int l = 0; l < d; ++l) u = u + M[i * d + l] * v[l];
          const int j = i < 3 * n ? i / 3 : n;
          const int comp = i < 3 * n ? i % 3 : 2;
          (comp == 0 ? Fp : comp == 1 ? Fm : Z)[j * K + k] = u;
        }
      }
    }
    if (f & event_inversion)
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) Z[j * K + k] = (-q.eta) * Z[j * K + k];
    if (f & event_readout) {
      Cx<S> acc = Fp[0];
      for (int j = 1; j < n; ++j) acc = acc + Fp[j * K];
      const double rx = s.rx_phase_rad[e];
      const Cx<S> erx{S(std::cos(rx)), S(-std::sin(rx))};
      sink(s.slot[e], q.M0 * (acc * erx));
    }
    if (f & event_spoil) {
      for (int64_t l = 0; l < 2 * n * K; ++l) Fp[l] = czero;
    } else {
      for (int sa = s.shift_after[e], c = 0; c < (sa > 0 ? sa : -sa); ++c) shift(sa > 0 ? 1 : -1);
    }
  }
};

// Plays the stream for problem i; sink(slot, Cx<S> sample) takes each
// readout.  work holds pool_workspace(s, p) values of S; ls is the
// super-Lorentzian table (host_lineshape_table() on the host).
template <class S, class Sink>
BLOCHSIM_HD inline void pooled_problem(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                       int64_t i, const int* fields, int n_dirs, const float* seeds, S* work,
                                       Sink&& sink) {
  PoolPlayer<S> pl(s, p, ls, pool_tissue<S>(t, p, i, fields, n_dirs, seeds), reinterpret_cast<Cx<S>*>(work),
                   work + pool_state_size(s, p));
  pl.forget_operators();
  pl.equilibrium();
  for (int64_t e = 0; e < s.n_events; ++e) pl.event(e, sink);
}

// The shifts of a stream in each direction (a spoil cancels the shifts
// after it, as play() does).
BLOCHSIM_HD inline void stream_shifts(const EventStream& s, int64_t& plus, int64_t& minus) {
  plus = minus = 0;
  for (int64_t e = 0; e < s.n_events; ++e) {
    const int32_t sb = s.shift_before[e], sa = (s.flags[e] & event_spoil) ? 0 : s.shift_after[e];
    plus += (sb > 0 ? sb : 0) + (sa > 0 ? sa : 0);
    minus += (sb < 0 ? -sb : 0) + (sa < 0 ? -sa : 0);
  }
}

// Length of a sliding transverse row of pooled_block: K orders and room to
// slide once per shift of the stream.
BLOCHSIM_HD inline int64_t pool_row_length(const EventStream& s) {
  int64_t plus, minus;
  stream_shifts(s, plus, minus);
  return s.states + plus + minus + 1;
}

// Vector lanes of pooled_block's workspace (V units, per lane vector) for
// the pools of p over the stream s.
inline int64_t pool_block_workspace(const EventStream& s, const Pools& p) {
  const int64_t n = 1 + p.n_exchanging, m = n + (p.bound ? 1 : 0), d = 3 * n + (p.bound ? 1 : 0);
  const int64_t states = 4 * n * pool_row_length(s) + 2 * m * static_cast<int64_t>(s.states);
  const int64_t per_interval = 1 + 2 * n * n + m * m + m;
  const int64_t per_driven = 1 + 2 * d * (d + 1);
  return states + per_interval * s.n_intervals + per_driven * (s.driven ? s.n_driven : 0) + 8;
}

// A hard pulse (SPEC §2) on one order of one liquid pool, from the cos and
// sin of its effective flip a and phase phi (C: scalars, or lanes of
// problems).  Real: the real planes of pooled_real_path (phi 0 or pi), where
// F+ and F- are imaginary (ai, bi) and Z real (zr); otherwise every part.
template <class C>
struct PoolRotation {
  C ca, c2, s2, e2r, e2i, mr, mi;  // m = -i e^{i phi} sin(a) = mr + i mi, e2 = e^{2 i phi}
  BLOCHSIM_HD PoolRotation(const C& cos_a, const C& sin_a, const C& cos_phi, const C& sin_phi)
      : ca(cos_a),
        c2((1.0f + cos_a) * 0.5f),
        s2((1.0f - cos_a) * 0.5f),
        e2r(cos_phi * cos_phi - sin_phi * sin_phi),
        e2i(2.0f * cos_phi * sin_phi),
        mr(sin_phi * sin_a),
        mi(-(cos_phi * sin_a)) {}
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void real(V& ai, V& bi, V& zr) const {
    // e2 = 1 and m = i mi
    const V a = ai, b = bi, z = zr;
    ai = c2 * a + s2 * b + mi * z;
    bi = c2 * b + s2 * a - mi * z;
    zr = ca * z - 0.5f * (mi * (a - b));
  }
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(V& ar, V& ai, V& br, V& bi, V& zr, V& zi) const {
    const V a = ar, b = ai, c = br, d = bi, x = zr, y = zi;
    // F+' = c2 F+ + s2 e2 F- + m Z; F-' = c2 F- + s2 conj(e2) F+ + conj(m) Z
    ar = c2 * a + s2 * (e2r * c - e2i * d) + (mr * x - mi * y);
    ai = c2 * b + s2 * (e2r * d + e2i * c) + (mr * y + mi * x);
    br = c2 * c + s2 * (e2r * a + e2i * b) + (mr * x + mi * y);
    bi = c2 * d + s2 * (e2r * b - e2i * a) + (mr * y - mi * x);
    // Z' = cos(a) Z - (conj(m) F+ + m F-) / 2
    zr = ca * x - 0.5f * ((mr * a + mi * b) + (mr * c - mi * d));
    zi = ca * y - 0.5f * ((mr * b - mi * a) + (mr * d + mi * c));
  }
  // apply() of a pulse at phase 0 (e2 = 1, m = i mi) on every part
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void in_phase(V& ar, V& ai, V& br, V& bi, V& zr, V& zi) const {
    const V a = ar, b = ai, c = br, d = bi, x = zr, y = zi;
    ar = c2 * a + s2 * c - mi * y;
    ai = c2 * b + s2 * d + mi * x;
    br = c2 * c + s2 * a + mi * y;
    bi = c2 * d + s2 * b - mi * x;
    zr = ca * x - 0.5f * (mi * (b - d));
    zi = ca * y + 0.5f * (mi * (a - c));
  }
};


// The forward pooled EPG of problems [first, first + width) of t in the
// lanes of V (16 problems a SIMD vector on the host, one a thread on the
// device), in single precision: the same physics as pooled_problem, with
// every per-problem operator (interval exponentials, exact pulses, the
// semisolid saturation) formed per lane in double precision the first time
// an event uses it and applied to the lanes at once.  Lanes past t.n
// replay the last problem and write nothing.  work holds
// pool_block_workspace(s, p) lane vectors, element i at work[i * ws].
//
// The transverse rows slide instead of moving their orders at a shift
// (order k of F+ at element bp + k of its row, of F- at bm + k; a shift
// moves bp and bm by one and writes three elements a row), so a row holds
// pool_row_length(s) elements, and every element outside the K orders a
// row shows is zero.
//
// Real (pooled_real_path): every RF phase is 0 or pi and nothing turns the
// transverse states (no B0, B1phase, chemical shift or exact pulse), so F+
// and F- stay imaginary and Z real (SPEC §1's real subspace): only those
// planes are computed; the others stay zero.
//
// The pool counts are template parameters (N liquid pools, Bound), so that
// the loops over pools unroll; WS > 0 is the workspace stride at compile
// time, WS = 0 takes it from ws.  ls: the super-Lorentzian table in memory
// the caller can read (host_lineshape_table() on the host).
//
// On lanes of duals (V = Dual<lanes, D>) the same pass carries the
// derivatives along jo's directions (the per-lane operators are formed on
// Dual<double, D>) and writes them to jo.jac.
template <class V, int N, bool Bound, int64_t WS, bool Real = false>
BLOCHSIM_HD inline int pooled_block_of(const EventStream& s, const Tissue& t, const Pools& p,
                                       const LineshapeTable& ls, int64_t first, V* work, int64_t ws_runtime,
                                       float* out, const PooledJacobianOut& jo = PooledJacobianOut{}) {
  using LT = Lanes<V>;
  using Sc = typename LT::Scalar;                    // one lane's value
  using QS = typename LT::template Wide<double>;  // one lane's value in double precision
  constexpr int W = LT::width;
  constexpr int n = N, m = N + (Bound ? 1 : 0), d = 3 * N + (Bound ? 1 : 0);
  constexpr bool bound = Bound;
  const int64_t ws = WS > 0 ? WS : ws_runtime;
  int64_t idx[W];
  for (int l = 0; l < W; ++l) idx[l] = first + l < t.n ? first + l : t.n - 1;
  PoolTissue<QS> q[W];
  for (int l = 0; l < W; ++l) q[l] = pool_tissue<QS>(t, p, idx[l], jo.fields, jo.n_dirs, jo.seeds);
  const int K = s.states;
  V M0{}, eta{};
  bool uniform_rf = true;
  for (int l = 0; l < W; ++l) {
    LT::set(M0, l, static_cast<Sc>(q[l].M0));
    LT::set(eta, l, static_cast<Sc>(q[l].eta));
    uniform_rf = uniform_rf && value_of(q[l].B1) == value_of(q[0].B1) &&
                 value_of(q[l].B1phase) == value_of(q[0].B1phase);
  }
  // B1 and B1phase carry no derivative (the lanes of a dual share their
  // seeds, so lane 0 stands for all)
  bool constant_rf = true;
  if constexpr (IsDual<QS>::value)
    for (int j = 0; j < jo.n_dirs; ++j) constant_rf = constant_rf && q[0].B1.d[j] == 0.0 && q[0].B1phase.d[j] == 0.0;
  // every lane at B1 = 1 and no transmit phase: the stream's table holds
  // each pulse's cos and sin (formed once per sequence)
  const bool nominal_rf = uniform_rf && constant_rf && value_of(q[0].B1) == 1.0 && value_of(q[0].B1phase) == 0.0 &&
                          s.rf_table != nullptr;
  // workspace: F+ (re, im), F- (re, im) of each liquid pool (rows of R
  // elements), Z (re, im) of every longitudinal family (rows of K); then
  // the operators
  auto at = [&](int64_t i) -> V& { return work[i * ws]; };
  int64_t n_plus, n_minus;
  stream_shifts(s, n_plus, n_minus);
  const int64_t R = K + n_plus + n_minus + 1;
  int64_t bp = n_plus, bm = n_minus;  // where order 0 of the F+ and F- rows is
  const int64_t fpr = 0, fpi = n * R, fmr = 2 * n * R, fmi = 3 * n * R;
  const int64_t zr = 4 * n * R, zi = 4 * n * R + m * K;
  const int64_t ops = 4 * n * R + 2 * m * static_cast<int64_t>(K);
  const int64_t per_interval = 1 + 2 * n * n + m * m + m;
  const int64_t drv = ops + per_interval * s.n_intervals;
  const int64_t per_driven = 1 + 2 * d * (d + 1);
  for (int64_t i = 0; i < ops; ++i) at(i) = V{};
  for (int j = 0; j < m; ++j) {
    V f{};
    for (int l = 0; l < W; ++l) LT::set(f, l, static_cast<Sc>(q[l].f[j]));
    at(zr + j * K) = f;
  }
  for (int64_t v = 0; v < s.n_intervals; ++v) at(ops + v * per_interval) = V{};
  if (s.driven)
    for (int64_t v = 0; v < s.n_driven; ++v) at(drv + v * per_driven) = V{};
  const bool saturating = bound && s.rf_duration_s != nullptr;
  // T2b G(offset - B0) per lane for the last pulse offset seen
  float g_offset = 0.0f;
  bool g_ready = false;
  QS g_lane[W];
  int band = 1;
  V frame_c = V{} + 1.0f, frame_s{};  // the complex planes' frame (below)

  // F+ row j, order k (plus fpr or fpi); F- likewise (plus fmr or fmi)
  auto xp = [&](int j, int k) { return j * R + bp + k; };
  auto xm = [&](int j, int k) { return j * R + bm + k; };
  auto shift = [&](int dir) {
    // the row that moves up (F+ for dir > 0) gains order 0 = conj of the
    // other's new order 0 and drops its old order K - 1; the other drops
    // its old order 0 and gains a zero order K - 1 from outside
    if (dir > 0) {
      --bp;
      ++bm;
    } else {
      ++bp;
      --bm;
    }
    for (int j = 0; j < n; ++j)
      for (int part = Real ? 1 : 0; part < 2; ++part) {
        const int64_t up = dir > 0 ? (part ? fpi : fpr) + xp(j, 0) : (part ? fmi : fmr) + xm(j, 0);
        const int64_t dn = dir > 0 ? (part ? fmi : fmr) + xm(j, 0) : (part ? fpi : fpr) + xp(j, 0);
        at(up + K) = V{};
        at(dn - 1) = V{};
        at(up) = part ? -at(dn) : at(dn);  // F_up,0 = conj(F_dn,0)
      }
    band = band < K ? band + 1 : K;
  };

  for (int64_t e = 0; e < s.n_events; ++e) {
    const uint32_t f = s.flags[e];
    const int32_t iv = s.interval[e];
    // The event's operators first (interval, semisolid saturation, RF),
    // then one pass over the orders that applies them in turn when no
    // shift comes between the interval and the pulse.
    V Pv[2 * n * n], Lv[m * m], Rv[m];
    if (iv >= 0) {
      const int64_t o = ops + iv * per_interval;
      const int64_t P = o + 1, L = P + 2 * n * n, R = L + m * m;
      if (value_of(LT::get(at(o), 0)) == 0.0f) {
        for (int l = 0; l < W; ++l) {
          Cx<QS> Pl[max_liquid_pools * max_liquid_pools];
          QS Ll[max_longitudinal_pools * max_longitudinal_pools], rl[max_longitudinal_pools];
          pool_interval(q[l], QS(s.duration_s[iv]), Pl, Ll, rl);
          for (int i = 0; i < n * n; ++i) {
            LT::set(at(P + 2 * i), l, static_cast<Sc>(Pl[i].re));
            LT::set(at(P + 2 * i + 1), l, static_cast<Sc>(Pl[i].im));
          }
          for (int i = 0; i < m * m; ++i) LT::set(at(L + i), l, static_cast<Sc>(Ll[i]));
          for (int i = 0; i < m; ++i) LT::set(at(R + i), l, static_cast<Sc>(rl[i]));
          LT::set(at(o), l, 1.0f);
        }
      }
      // the operator in locals: the compiler cannot keep it in registers
      // across the stores to the workspace otherwise
      for (int i = 0; i < 2 * n * n; ++i) Pv[i] = at(P + i);
      for (int i = 0; i < m * m; ++i) Lv[i] = at(L + i);
      for (int i = 0; i < m; ++i) Rv[i] = at(R + i);
    }
    const bool sat = (f & (event_rf | event_saturation)) && saturating && s.rf_duration_s[e] > 0.0f;
    V decay{};
    if (sat) {
      const double tau_rf = s.rf_duration_s[e];
      const float offset = s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0f;
      if (!g_ready || offset != g_offset) {
        for (int l = 0; l < W; ++l) {
          double g, dg;
          const QS xg = (QS(offset) - q[l].B0) * q[l].T2b * (2.0 * pi);
          lineshape_eval(p.lineshape, value_of(xg), ls, g, dg);
          g_lane[l] = q[l].T2b * lift(xg, g, dg);
        }
        g_offset = offset;
        g_ready = true;
      }
      const double power = s.rf_power ? s.rf_power[e] : 1.0;
      for (int l = 0; l < W; ++l) {
        const QS a = q[l].B1 * static_cast<double>(s.flip_rad[e]);
        using std::exp;
        LT::set(decay, l, static_cast<Sc>(exp(-(pi * power / tau_rf) * g_lane[l] * (a * a))));
      }
    }
    const bool rf = (f & event_rf) != 0;
    V ca{}, sa{}, cp{}, sp{};
    if (rf && nominal_rf) {
      const float* row = s.rf_table + e * rf_table_fields;
      ca = V{} + row[rft_cos];
      sa = V{} + row[rft_sin];
      cp = V{} + row[rft_cos_phase];
      sp = V{} + row[rft_sin_phase];
    } else if (rf) {
      using std::cos;
      using std::sin;
      for (int l = 0; l < (uniform_rf ? 1 : W); ++l) {
        const QS a = q[l].B1 * static_cast<double>(s.flip_rad[e]);
        const QS ph = q[l].B1phase + static_cast<double>(s.phase_rad[e]);
        LT::set(ca, l, static_cast<Sc>(cos(a)));
        LT::set(sa, l, static_cast<Sc>(sin(a)));
        LT::set(cp, l, static_cast<Sc>(cos(ph)));
        LT::set(sp, l, static_cast<Sc>(sin(ph)));
      }
      if (uniform_rf) {
        ca = LT::splat(LT::get(ca, 0));
        sa = LT::splat(LT::get(sa, 0));
        cp = LT::splat(LT::get(cp, 0));
        sp = LT::splat(LT::get(sp, 0));
      }
    }
    const int32_t sb = s.shift_before[e];
    const bool common = sb == 0 && iv >= 0 && rf && !sat;
    // The complex planes hold the state in the frame of the last common
    // event's pulse phase theta (F+ stored times e^{-i theta}, F- times
    // e^{i theta}; Z and the shifts are unchanged by it).  The interval's
    // P commutes with the frame, so the common event folds the step from
    // theta to its own phase phi into P (a scalar a lane) and turns the
    // orders by the cheaper in-phase pulse.  Other pulses turn by phi -
    // theta; readouts add theta to the receiver; exact pulses leave the
    // frame first.
    V rel_c{}, rel_s{};  // e^{i (theta - phi)}
    if (!Real && rf) {
      rel_c = frame_c * cp + frame_s * sp;
      rel_s = frame_s * cp - frame_c * sp;
    }
    const bool in_phase = !Real && common;
    if (in_phase) {
      for (int i = 0; i < n * n; ++i) {
        const V pr = Pv[2 * i], pim = Pv[2 * i + 1];
        Pv[2 * i] = pr * rel_c - pim * rel_s;
        Pv[2 * i + 1] = pr * rel_s + pim * rel_c;
      }
      frame_c = cp;
      frame_s = sp;
    }
    const PoolRotation<V> rot = in_phase       ? PoolRotation<V>(ca, sa, V{} + 1.0f, V{})
                                : Real || !rf ? PoolRotation<V>(ca, sa, cp, sp)
                                              : PoolRotation<V>(ca, sa, rel_c, V{} - rel_s);

    // One order's state in locals: F+ (ar, ai) and F- (br, bi) of each
    // liquid pool, Z (cr, ci) of each longitudinal family; on the real
    // planes only ai, bi and cr.  The common event loads an order once,
    // relaxes and turns it in registers and stores it once.
    struct Order {
      V ar[n], ai[n], br[n], bi[n], cr[m], ci[m];
    };
    auto load = [&](int k, Order& o) BLOCHSIM_LAMBDA_INLINE {
      for (int j = 0; j < n; ++j) {
        if constexpr (!Real) {
          o.ar[j] = at(fpr + xp(j, k));
          o.br[j] = at(fmr + xm(j, k));
        }
        o.ai[j] = at(fpi + xp(j, k));
        o.bi[j] = at(fmi + xm(j, k));
      }
      for (int j = 0; j < m; ++j) {
        o.cr[j] = at(zr + j * K + k);
        if constexpr (!Real) o.ci[j] = at(zi + j * K + k);
      }
    };
    auto store = [&](int k, const Order& o) BLOCHSIM_LAMBDA_INLINE {
      for (int j = 0; j < n; ++j) {
        if constexpr (!Real) {
          at(fpr + xp(j, k)) = o.ar[j];
          at(fmr + xm(j, k)) = o.br[j];
        }
        at(fpi + xp(j, k)) = o.ai[j];
        at(fmi + xm(j, k)) = o.bi[j];
      }
      for (int j = 0; j < m; ++j) {
        at(zr + j * K + k) = o.cr[j];
        if constexpr (!Real) at(zi + j * K + k) = o.ci[j];
      }
    };
    // x = the interval's operators on o (x is not o)
    auto relax = [&](int k, const Order& o, Order& x) BLOCHSIM_LAMBDA_INLINE {
      for (int j = 0; j < n; ++j) {
        if constexpr (Real) {
          // P is real here: imaginary F+ and F- by P
          V xi{}, yi{};
          for (int l = 0; l < n; ++l) {
            xi += Pv[2 * (j * n + l)] * o.ai[l];
            yi += Pv[2 * (j * n + l)] * o.bi[l];
          }
          x.ai[j] = xi;
          x.bi[j] = yi;
        } else {
          V xr{}, xi{}, yr{}, yi{};
          for (int l = 0; l < n; ++l) {
            const V pr = Pv[2 * (j * n + l)], pi_ = Pv[2 * (j * n + l) + 1];
            xr += pr * o.ar[l] - pi_ * o.ai[l];
            xi += pr * o.ai[l] + pi_ * o.ar[l];
            // F- evolves by conj(P)
            yr += pr * o.br[l] + pi_ * o.bi[l];
            yi += pr * o.bi[l] - pi_ * o.br[l];
          }
          x.ar[j] = xr;
          x.ai[j] = xi;
          x.br[j] = yr;
          x.bi[j] = yi;
        }
      }
      for (int j = 0; j < m; ++j) {
        V xr = k == 0 ? Rv[j] : V{}, xi{};
        for (int l = 0; l < m; ++l) {
          const V c = Lv[j * m + l];
          xr += c * o.cr[l];
          if constexpr (!Real) xi += c * o.ci[l];
        }
        x.cr[j] = xr;
        if constexpr (!Real) x.ci[j] = xi;
      }
    };
    auto turn = [&](Order& o, const auto& r) BLOCHSIM_LAMBDA_INLINE {  // the common event's pulse r
      for (int j = 0; j < n; ++j) {
        if constexpr (Real) {
          r.real(o.ai[j], o.bi[j], o.cr[j]);
        } else {
          r.in_phase(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
        }
      }
    };
    auto common_pass = [&](const auto& r) BLOCHSIM_LAMBDA_INLINE {
      for (int k = 0; k < band; ++k) {
        Order o, x;
        load(k, o);
        relax(k, o, x);
        turn(x, r);
        store(k, x);
      }
    };
    auto interval_at = [&](int k) BLOCHSIM_LAMBDA_INLINE {
      Order o, x;
      load(k, o);
      relax(k, o, x);
      store(k, x);
    };
    auto saturate_at = [&](int k) BLOCHSIM_LAMBDA_INLINE {
      at(zr + n * K + k) *= decay;
      if constexpr (!Real) at(zi + n * K + k) *= decay;
    };
    auto rotate_at = [&](int k) BLOCHSIM_LAMBDA_INLINE {
      for (int j = 0; j < n; ++j) {
        if constexpr (Real) {
          rot.real(at(fpi + xp(j, k)), at(fmi + xm(j, k)), at(zr + j * K + k));
        } else {
          rot.apply(at(fpr + xp(j, k)), at(fpi + xp(j, k)), at(fmr + xm(j, k)), at(fmi + xm(j, k)),
                    at(zr + j * K + k), at(zi + j * K + k));
        }
      }
    };
    if (common) {
      // the common event, without branches between the orders
      if constexpr (IsDual<V>::value) {
        if (constant_rf) {
          // the pulse carries no derivative: its coefficients as plain
          // lanes, multiplying each dual at a third of a dual product
          using B = decltype(V{}.v);
          const PoolRotation<B> plain = in_phase ? PoolRotation<B>(ca.v, sa.v, B{} + 1.0f, B{})
                                                 : PoolRotation<B>(ca.v, sa.v, cp.v, sp.v);
          common_pass(plain);
        } else {
          common_pass(rot);
        }
      } else {
        common_pass(rot);
      }
    } else if (sb == 0) {
      for (int k = 0; k < band; ++k) {
        if (iv >= 0) interval_at(k);
        if (sat) saturate_at(k);
        if (rf) rotate_at(k);
      }
    } else {
      if (iv >= 0)
        for (int k = 0; k < band; ++k) interval_at(k);
      for (int c = 0; c < (sb > 0 ? sb : -sb); ++c) shift(sb > 0 ? 1 : -1);
      for (int k = 0; k < band; ++k) {
        if (sat) saturate_at(k);
        if (rf) rotate_at(k);
      }
    }
    if (!Real && (f & event_driven)) {
      // leave the frame: F+ times e^{i theta}, F- times e^{-i theta}
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) {
          V& ar = at(fpr + xp(j, k));
          V& ai = at(fpi + xp(j, k));
          V& br = at(fmr + xm(j, k));
          V& bi = at(fmi + xm(j, k));
          const V a = ar, b = ai, c = br, d = bi;
          ar = a * frame_c - b * frame_s;
          ai = b * frame_c + a * frame_s;
          br = c * frame_c + d * frame_s;
          bi = d * frame_c - c * frame_s;
        }
      frame_c = V{} + 1.0f;
      frame_s = V{};
      const int32_t id = s.driven[e];
      const int64_t o = drv + id * per_driven, Mo = o + 1, Co = Mo + 2 * d * d;
      if (value_of(LT::get(at(o), 0)) == 0.0f) {
        for (int l = 0; l < W; ++l) {
          Cx<QS> Ml[max_driven_size * max_driven_size], cl[max_driven_size];
          pool_driven(q[l], p.lineshape, ls, driven_pulse<QS>(s.driven_table + id * driven_fields), Ml, cl);
          for (int i = 0; i < d * d; ++i) {
            LT::set(at(Mo + 2 * i), l, static_cast<Sc>(Ml[i].re));
            LT::set(at(Mo + 2 * i + 1), l, static_cast<Sc>(Ml[i].im));
          }
          for (int i = 0; i < d; ++i) {
            LT::set(at(Co + 2 * i), l, static_cast<Sc>(cl[i].re));
            LT::set(at(Co + 2 * i + 1), l, static_cast<Sc>(cl[i].im));
          }
          LT::set(at(o), l, 1.0f);
        }
      }
      auto row = [&](int i) -> int64_t {  // the workspace row of component i at order 0 (real part)
        const int j = i < 3 * n ? i / 3 : n, comp = i < 3 * n ? i % 3 : 2;
        return comp == 0 ? fpr + xp(j, 0) : comp == 1 ? fmr + xm(j, 0) : zr + j * K;
      };
      auto imag = [&](int i) -> int64_t {
        const int j = i < 3 * n ? i / 3 : n, comp = i < 3 * n ? i % 3 : 2;
        return comp == 0 ? fpi + xp(j, 0) : comp == 1 ? fmi + xm(j, 0) : zi + j * K;
      };
      for (int k = 0; k < band; ++k) {
        V vr[d], vi[d];
        for (int i = 0; i < d; ++i) {
          vr[i] = at(row(i) + k);
          vi[i] = at(imag(i) + k);
        }
        for (int i = 0; i < d; ++i) {
          V xr = k == 0 ? at(Co + 2 * i) : V{}, xi = k == 0 ? at(Co + 2 * i + 1) : V{};
          for (int l = 0; l < d; ++l) {
            const V a = at(Mo + 2 * (i * d + l)), b = at(Mo + 2 * (i * d + l) + 1);
            xr += a * vr[l] - b * vi[l];
            xi += a * vi[l] + b * vr[l];
          }
          at(row(i) + k) = xr;
          at(imag(i) + k) = xi;
        }
      }
    }
    if (f & event_inversion)
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) {
          at(zr + j * K + k) = -eta * at(zr + j * K + k);
          if constexpr (!Real) at(zi + j * K + k) = -eta * at(zi + j * K + k);
        }
    if (f & event_readout) {
      V accr = at(fpr + xp(0, 0)), acci = at(fpi + xp(0, 0));
      for (int j = 1; j < n; ++j) {
        accr += at(fpr + xp(j, 0));
        acci += at(fpi + xp(j, 0));
      }
      if constexpr (!Real) {  // out of the frame
        const V a = accr;
        accr = a * frame_c - acci * frame_s;
        acci = acci * frame_c + a * frame_s;
      }
      const float cr = s.rf_table ? s.rf_table[e * rf_table_fields + rft_cos_rx]
                                  : static_cast<float>(std::cos(static_cast<double>(s.rx_phase_rad[e])));
      const float sr = s.rf_table ? s.rf_table[e * rf_table_fields + rft_sin_rx]
                                  : static_cast<float>(std::sin(static_cast<double>(s.rx_phase_rad[e])));
      // M0 (F+) e^{-i rx}
      const V re = M0 * (accr * cr + acci * sr), im = M0 * (acci * cr - accr * sr);
      const int32_t slot = s.slot[e];
      for (int l = 0; l < W; ++l) {
        if (first + l >= t.n) break;
        const Sc vr = LT::get(re, l), vi = LT::get(im, l);
        float* o = out + ((first + l) * s.n_samples + slot) * 2;
        o[0] = value_of(vr);
        o[1] = value_of(vi);
        if constexpr (IsDual<Sc>::value)
          for (int j = 0; j < jo.n_dirs; ++j) {
            float* dj = jo.jac + (((first + l) * jo.jac_dirs + jo.first_dir + j) * s.n_samples + slot) * 2;
            dj[0] = vr.d[j];
            dj[1] = vi.d[j];
          }
      }
    }
    if (f & event_spoil) {
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) {
          if constexpr (!Real) {
            at(fpr + xp(j, k)) = V{};
            at(fmr + xm(j, k)) = V{};
          }
          at(fpi + xp(j, k)) = V{};
          at(fmi + xm(j, k)) = V{};
        }
    } else {
      for (int sa = s.shift_after[e], c = 0; c < (sa > 0 ? sa : -sa); ++c) shift(sa > 0 ? 1 : -1);
    }
  }
  return ok;
}

template <class V, int64_t WS = 0>
BLOCHSIM_HD inline int pooled_block(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                    int64_t first, V* work, int64_t ws, float* out) {
  const int key = 2 * p.n_exchanging + (p.bound ? 1 : 0);
  switch (key) {
    case 0: return pooled_block_of<V, 1, false, WS>(s, t, p, ls, first, work, ws, out);
    case 1: return pooled_block_of<V, 1, true, WS>(s, t, p, ls, first, work, ws, out);
    case 2: return pooled_block_of<V, 2, false, WS>(s, t, p, ls, first, work, ws, out);
    case 3: return pooled_block_of<V, 2, true, WS>(s, t, p, ls, first, work, ws, out);
    case 4: return pooled_block_of<V, 3, false, WS>(s, t, p, ls, first, work, ws, out);
    case 5: return pooled_block_of<V, 3, true, WS>(s, t, p, ls, first, work, ws, out);
    case 6: return pooled_block_of<V, 4, false, WS>(s, t, p, ls, first, work, ws, out);
    case 7: return pooled_block_of<V, 4, true, WS>(s, t, p, ls, first, work, ws, out);
    case 8: return pooled_block_of<V, 5, false, WS>(s, t, p, ls, first, work, ws, out);
    case 9: return pooled_block_of<V, 5, true, WS>(s, t, p, ls, first, work, ws, out);
    default: return bad_pools;
  }
}

// Whether pooled_block_of may play the stream on its real planes: phases 0
// or pi, nothing off-axis (the stream's real-subspace verdict with no common
// phase, and no B0 or B1phase in t), no chemical shift and no exact pulse;
// and the pool counts the real variant is compiled for (the MT pool alone,
// one exchanging pool).
BLOCHSIM_HD inline bool pooled_real_path(const EventStream& s, const Tissue& t, const Pools& p) {
  if (!s.real_path || s.driven) return false;
  if (t.B0_hz.present() || t.B0_hz.fallback != 0.0f || t.B1phase_rad.present() || t.B1phase_rad.fallback != 0.0f)
    return false;
  const double ph = s.common_phase_rad;
  if (std::sin(ph) > 1e-6 || std::sin(ph) < -1e-6) return false;
  for (int j = 0; j < p.n_exchanging; ++j)
    if (p.pool[j][pool_shift_hz].present()) return false;
  return (p.n_exchanging == 0 && p.bound) || (p.n_exchanging == 1 && !p.bound);
}

// pooled_block on the real planes when pooled_real_path(s, p), else as
// pooled_block (the host's entry; the device plays the complex planes).
template <class V, int64_t WS = 0>
inline int pooled_block_host(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                             int64_t first, V* work, int64_t ws, float* out, bool real) {
  if (real && p.n_exchanging == 0) return pooled_block_of<V, 1, true, WS, true>(s, t, p, ls, first, work, ws, out);
  if (real) return pooled_block_of<V, 2, false, WS, true>(s, t, p, ls, first, work, ws, out);
  return pooled_block<V, WS>(s, t, p, ls, first, work, ws, out);
}

// Whether pooled_jacobian_block plays these pools: the semisolid pool
// alone, or one exchanging pool with or without it.
BLOCHSIM_HD inline bool pooled_lane_jacobian(const Pools& p) {
  return p.n_exchanging == 1 || (p.n_exchanging == 0 && p.bound);
}

// Whether a Jacobian pass along jo's directions turns the transverse states
// off the real planes (B1phase, B0, a chemical shift): its derivatives need
// the complex planes even where the values stay real.
BLOCHSIM_HD inline bool pooled_dirs_turn(const PooledJacobianOut& jo) {
  for (int j = 0; j < jo.n_dirs; ++j) {
    const int f = jo.fields[j];
    if (f == field_B1phase || f == field_B0 || (f >= field_pool_first && (f - field_pool_first) % pool_columns == pool_shift_hz))
      return true;
  }
  return false;
}

// A pooled Jacobian pass on lanes of duals (V = Dual<lanes, D>, jo.n_dirs
// <= D): pooled_block_of for the pools of pooled_lane_jacobian (bad_pools
// for others), on the real planes when real.
template <class V, int64_t WS = 0>
inline int pooled_jacobian_block(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                 int64_t first, V* work, int64_t ws, float* out, bool real,
                                 const PooledJacobianOut& jo) {
  if (!pooled_lane_jacobian(p)) return bad_pools;
  if (p.n_exchanging == 0) {
    return real ? pooled_block_of<V, 1, true, WS, true>(s, t, p, ls, first, work, ws, out, jo)
                : pooled_block_of<V, 1, true, WS>(s, t, p, ls, first, work, ws, out, jo);
  }
  if (p.bound) return pooled_block_of<V, 2, true, WS>(s, t, p, ls, first, work, ws, out, jo);
  return real ? pooled_block_of<V, 2, false, WS, true>(s, t, p, ls, first, work, ws, out, jo)
              : pooled_block_of<V, 2, false, WS>(s, t, p, ls, first, work, ws, out, jo);
}

// Checks the pool configuration against the stream (host arrays), without
// reading the properties' values: what validate_pools checks of device
// properties, whose values the caller checks.
inline int validate_pool_config(const EventStream& s, const Tissue& t, const Pools& p) {
  if (p.n_exchanging < 0 || p.n_exchanging > max_exchanging_pools || p.lineshape < 0 ||
      p.lineshape >= lineshape_count)
    return bad_pools;
  if (t.D_m2_s.present() || t.v_m_s.present()) return pools_without_motion;
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
      const double fj = p.pool[j][pool_fraction].at(i), kj = p.pool[j][pool_exchange_hz].at(i);
      if (!(fj >= 0.0) || !(kj >= 0.0)) return bad_pool_fraction;
      sum += fj;
    }
    if (p.bound) {
      const double fb = p.bound_fraction.at(i), kb = p.bound_exchange_hz.at(i);
      if (!(fb >= 0.0) || !(kb >= 0.0) || !(p.bound_T1_s.at(i) > 0.0) || !(p.bound_T2_s.at(i) > 0.0))
        return bad_pool_fraction;
      sum += fb;
    }
    if (sum > 1.0 + 1e-6) return bad_pool_fraction;
  }
  return ok;
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
