// The pooled EPG of one problem over a scalar type (double, or duals for
// derivatives), one event at a time (pools/play.hpp's event, its pool
// counts at run time): the Jacobians per problem and the adjoint
// (pools/adjoint.hpp) play it.
#pragma once

#include "play.hpp"

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
    d = 2 * n + m;
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
  // The semisolid pools' saturation by the pulse of event e, when it
  // saturates them (saturates()).
  BLOCHSIM_HD bool saturation(int64_t e, SemisolidSaturation<S>& sat) const {
    if (!saturates(s, q, e)) return false;
    const S tau_rf = seeded<S>(s.rf_duration_s[e], es.rf_duration);
    const S alpha = q.B1 * seeded<S>(s.flip_rad[e], es.flip);
    const double power = s.rf_power ? s.rf_power[e] : 1.0;
    const S offset = seeded<S>(s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0, es.rf_offset);
    semisolid_saturation(q, p.lineshape, ls, tau_rf, alpha, power, offset, (s.flags[e] & event_dual) != 0, sat);
    return true;
  }
  // The hard pulse of event e (SPEC §2), at this problem's B1 and B1phase.
  BLOCHSIM_HD PoolRotation<S> rotation(int64_t e) const {
    S ca, sa, cp, sp;
    pulse(e, ca, sa, cp, sp);
    return PoolRotation<S>(ca, sa, cp, sp);
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

  // The Store of pools/play.hpp: the pool counts known at run time, the
  // complex planes in the water frame.
  using V = S;
  using C = S;
  using Scale = S;
  using Sat = SemisolidSaturation<S>;
  static constexpr int N = max_liquid_pools, M = max_longitudinal_pools;
  static constexpr bool fixed = false, real = false, framed = false;
  using Order = PoolOrder<S, N, M>;
  using Step = PoolStep<S, S, N, M, false, false>;
  BLOCHSIM_HD uint32_t flags(int64_t e) const { return s.flags[e]; }
  BLOCHSIM_HD int32_t interval_of(int64_t e) const { return s.interval[e]; }
  BLOCHSIM_HD int32_t shift_before(int64_t e) const { return s.shift_before[e]; }
  BLOCHSIM_HD int32_t shift_after(int64_t e) const { return s.shift_after[e]; }
  BLOCHSIM_HD bool at_zero(int k) const { return k == 0; }
  BLOCHSIM_HD void load(int k, Order& o) const {
    for (int j = 0; j < n; ++j) {
      const Cx<S>&a = fp()[j * K + k], &b = fm()[j * K + k];
      o.ar[j] = a.re;
      o.ai[j] = a.im;
      o.br[j] = b.re;
      o.bi[j] = b.im;
    }
    for (int j = 0; j < m; ++j) {
      o.cr[j] = z()[j * K + k].re;
      o.ci[j] = z()[j * K + k].im;
    }
  }
  BLOCHSIM_HD void store(int k, const Order& o) {
    for (int j = 0; j < n; ++j) {
      fp()[j * K + k] = {o.ar[j], o.ai[j]};
      fm()[j * K + k] = {o.br[j], o.bi[j]};
    }
    for (int j = 0; j < m; ++j) z()[j * K + k] = {o.cr[j], o.ci[j]};
  }
  // (the orders are declared once a pass: an order of duals at the largest
  // pool counts costs more to construct than the work on a small one)
  template <class F>
  BLOCHSIM_HD void each(F&& f) {
    Order o;
    for (int k = 0; k < band; ++k) {
      load(k, o);
      f(k, o);
      store(k, o);
    }
  }
  template <class F>
  BLOCHSIM_HD void transform(F&& f) {
    Order o, x;
    for (int k = 0; k < band; ++k) {
      load(k, o);
      f(k, o, x);
      store(k, x);
    }
  }
  BLOCHSIM_HD void order_zero(Order& o) const { load(0, o); }
  BLOCHSIM_HD void interval(int32_t iv, Step& st) {
    Cx<S>* P;
    S *L, *r;
    interval_ops(iv, P, L, r);
    st.n = n;
    st.m = m;
    for (int i = 0; i < n * n; ++i) {
      st.P[2 * i] = P[i].re;
      st.P[2 * i + 1] = P[i].im;
    }
    for (int i = 0; i < m * m; ++i) st.L[i] = L[i];
    for (int i = 0; i < m; ++i) st.z0[i] = r[i];
  }
  BLOCHSIM_HD void pulse(int64_t e, S& ca, S& sa, S& cp, S& sp) const {
    using std::cos;
    using std::sin;
    const S alpha = q.B1 * seeded<S>(s.flip_rad[e], es.flip);
    const S phi = q.B1phase + seeded<S>(s.phase_rad[e], es.phase);
    ca = cos(alpha);
    sa = sin(alpha);
    cp = cos(phi);
    sp = sin(phi);
  }
  template <class F>
  BLOCHSIM_HD void rotations(const S& ca, const S& sa, const S& cp, const S& sp, F&& f) const {
    f(PoolRotation<S>(ca, sa, cp, sp));
  }
  BLOCHSIM_HD auto driven(int64_t e) {
    Cx<S> *Mx, *cx;
    driven_ops(s.driven[e], Mx, cx);
    const S* mat = reinterpret_cast<const S*>(Mx);
    const S* src = reinterpret_cast<const S*>(cx);
    const int nn = n, mm = m;
    return [mat, src, nn, mm](Order& o, bool zero) {
      pool_drive<false>([&](int i) -> const S& { return mat[i]; }, [&](int i) -> const S& { return src[i]; }, zero,
                        o, nn, mm);
    };
  }
  BLOCHSIM_HD S inversion() const { return -q.eta; }
  template <class Sink>
  BLOCHSIM_HD void sample(int64_t e, const S& re, const S& im, Sink& sink) const {
    const double rx = s.rx_phase_rad[e];
    const Cx<S> erx{S(std::cos(rx)), S(-std::sin(rx))};
    sink(s.slot[e], q.M0 * (Cx<S>{re, im} * erx));
  }

  // Plays event e; sink(slot, sample) takes its readout.
  template <class Sink>
  BLOCHSIM_HD void event(int64_t e, Sink&& sink) {
    pooled_event(s, e, *this, sink);
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
