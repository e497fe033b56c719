// The pooled EPG of one problem over a scalar type (double, or duals for
// derivatives), one event at a time: the reference the Jacobians per
// problem and the adjoint (pools/adjoint.hpp) play.
#pragma once

#include "play.hpp"
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

  // Order k of every family into o (F+, F- of the liquid pools, Z of the
  // longitudinal families), and back.
  template <int NN, int MM>
  BLOCHSIM_HD void load(int k, PoolOrder<S, NN, MM>& o) const {
    for (int j = 0; j < n; ++j) {
      o.ar[j] = fp()[j * K + k].re;
      o.ai[j] = fp()[j * K + k].im;
      o.br[j] = fm()[j * K + k].re;
      o.bi[j] = fm()[j * K + k].im;
    }
    for (int j = 0; j < m; ++j) {
      o.cr[j] = z()[j * K + k].re;
      o.ci[j] = z()[j * K + k].im;
    }
  }
  template <int NN, int MM>
  BLOCHSIM_HD void store(int k, const PoolOrder<S, NN, MM>& o) {
    for (int j = 0; j < n; ++j) {
      fp()[j * K + k] = {o.ar[j], o.ai[j]};
      fm()[j * K + k] = {o.br[j], o.bi[j]};
    }
    for (int j = 0; j < m; ++j) z()[j * K + k] = {o.cr[j], o.ci[j]};
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

  // The Store of pooled_event (pools/play.hpp).
  BLOCHSIM_HD uint32_t flags(int64_t e) const { return s.flags[e]; }
  BLOCHSIM_HD int32_t shift_before(int64_t e) const { return s.shift_before[e]; }
  BLOCHSIM_HD int32_t shift_after(int64_t e) const { return s.shift_after[e]; }

  struct Step {
    bool relaxes = false, saturates = false, rotates = false;
    int n = 1, m = 1;
    const S* P = nullptr;  // (re, im) pairs
    const S* L = nullptr;
    const S* r = nullptr;
    S decay = S(1.0);
    PoolRotation<S> rot{S(1.0), S(0.0), S(1.0), S(0.0)};
    template <int NN, int MM>
    BLOCHSIM_HD void relax(int k, PoolOrder<S, NN, MM>& o) const {
      PoolOrder<S, NN, MM> x;
      pool_relax<false>(P, L, o, x, k == 0 ? r : nullptr, n, m);
      o = x;
    }
    template <int NN, int MM>
    BLOCHSIM_HD void saturate(PoolOrder<S, NN, MM>& o) const {
      if (n < MM) {  // the semisolid Z follows the n liquid pools' (saturates only with it)
        o.cr[n] = decay * o.cr[n];
        o.ci[n] = decay * o.ci[n];
      }
    }
    template <class F>
    BLOCHSIM_HD void with_turn(F&& f) const {
      f([&](auto& o) { PoolTurn<false>::on(rot, o, n); });
    }
  };
  BLOCHSIM_HD Step step(int64_t e, bool) {
    Step st;
    st.n = n;
    st.m = m;
    const uint32_t f = s.flags[e];
    const int32_t iv = s.interval[e];
    if (iv >= 0) {
      Cx<S>* P;
      S *L, *r;
      interval_ops(iv, P, L, r);
      st.relaxes = true;
      st.P = reinterpret_cast<const S*>(P);
      st.L = L;
      st.r = r;
    }
    if (q.bound && (f & (event_rf | event_saturation))) {
      st.saturates = true;
      st.decay = saturation(e);
    }
    if (f & event_rf) {
      st.rotates = true;
      st.rot = rotation(e);
    }
    return st;
  }
  // f(k, o) on the orders of the band, o sized to the pools at compile
  // time on the host (so that an order's locals hold what the pools need
  // and no more: the host's duals are zeroed and copied whole).  The device
  // keeps one size, the largest: its one-thread pooled Jacobian and adjoint
  // hold their state in local memory anyway, and ten instantiations of
  // every pass raise their register spills (ptxas, sm_90).
  template <class F>
  BLOCHSIM_HD void orders(F&& f) {
#if defined(__CUDA_ARCH__)
    orders_of<max_liquid_pools, max_longitudinal_pools>(f);
#else
    switch (2 * n + (q.bound ? 1 : 0)) {
      case 2: return orders_of<1, 1>(f);
      case 3: return orders_of<1, 2>(f);
      case 4: return orders_of<2, 2>(f);
      case 5: return orders_of<2, 3>(f);
      case 6: return orders_of<3, 3>(f);
      case 7: return orders_of<3, 4>(f);
      case 8: return orders_of<4, 4>(f);
      case 9: return orders_of<4, 5>(f);
      case 10: return orders_of<5, 5>(f);
      default: return orders_of<5, 6>(f);
    }
#endif
  }
  template <int NN, int MM, class F>
  BLOCHSIM_HD void orders_of(F& f) {
    for (int k = 0; k < band; ++k) {
      PoolOrder<S, NN, MM> o;
      load(k, o);
      f(k, o);
      store(k, o);
    }
  }
  BLOCHSIM_HD void drive(int64_t e) {
    Cx<S> *M, *c;
    driven_ops(s.driven[e], M, c);
    const S* Mr = reinterpret_cast<const S*>(M);  // (re, im) pairs
    const S* cr = reinterpret_cast<const S*>(c);
    auto mat = [&](int i) -> const S& { return Mr[i]; };
    auto src = [&](int i) -> const S& { return cr[i]; };
    orders([&](int k, auto& o) { pool_drive(mat, src, k == 0, o, n, q.bound); });
  }
  BLOCHSIM_HD void invert() {
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < band; ++k) z()[j * K + k] = (-q.eta) * z()[j * K + k];
  }
  template <class Sink>
  BLOCHSIM_HD void readout(int64_t e, Sink& sink) const {
    Cx<S> acc = fp()[0];
    for (int j = 1; j < n; ++j) acc = acc + fp()[j * K];
    const double rx = s.rx_phase_rad[e];
    const Cx<S> erx{S(std::cos(rx)), S(-std::sin(rx))};
    sink(s.slot[e], q.M0 * (acc * erx));
  }
  BLOCHSIM_HD void spoil() {
    const Cx<S> czero{S(0.0), S(0.0)};
    for (int64_t l = 0; l < 2 * n * K; ++l) fp()[l] = czero;
  }

  // Plays event e; sink(slot, sample) takes its readout.
  template <class Sink>
  BLOCHSIM_HD void event(int64_t e, Sink&& sink) {
    pooled_event(e, *this, sink);
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
