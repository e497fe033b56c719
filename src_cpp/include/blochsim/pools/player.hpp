// The pooled EPG of one problem over a scalar type (double, or duals for
// derivatives), one event at a time: the reference the Jacobians per
// problem and the adjoint (pools/adjoint.hpp) play.
#pragma once

#include "pools.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

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
  // The hard pulse of event e (SPEC §2), at this problem's B1 and B1phase.
  BLOCHSIM_HD PoolRotation<S> rotation(int64_t e) const {
    using std::cos;
    using std::sin;
    const S alpha = q.B1 * seeded<S>(s.flip_rad[e], es.flip);
    const S phi = q.B1phase + seeded<S>(s.phase_rad[e], es.phase);
    return PoolRotation<S>(cos(alpha), sin(alpha), cos(phi), sin(phi));
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
      // (pool_relax's arithmetic on complex numbers: the pools' count is
      // known only at run time here, and an order of the largest size on
      // duals costs more to compile than the loop below)
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
      const PoolRotation<S> R = rotation(e);
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < band; ++k) {
          Cx<S>&a = Fp[j * K + k], &b = Fm[j * K + k], &c = Z[j * K + k];
          R.apply(a.re, a.im, b.re, b.im, c.re, c.im);
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

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
