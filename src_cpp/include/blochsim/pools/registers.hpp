// The forward pooled EPG of one problem over a team of threads, its state
// in registers: the device's pooled kernel for the pool configurations it
// is compiled for (the semisolid pool, one exchanging pool, both).  The
// host instantiates the same template over the lanes of a vector (the
// members of epg::LaneTeam) to test the cross-member logic without a GPU.
//
// Member j of a team of T holds orders [j R, (j + 1) R) of every family
// (F+, F-, Z of each liquid pool and the semisolid Z), as
// epg::RegisterStore holds the single pool's; a shift passes the boundary
// orders of the transverse families to the neighbouring members.  The
// per-problem operators (each distinct interval's exponentials, each exact
// pulse's matrix) do not depend on the order: they are formed once per
// problem in double precision (pooled_table, a separate pass), stored in
// single precision in a table the team reads, so that the event loop holds
// no exponential code and a team does not form them T times.
#pragma once

#include <cmath>
#include <vector>

#include "../epg/registers.hpp"
#include "play.hpp"
#include "pools.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

// Floats per problem of pooled_table: per distinct interval P (n × n
// complex), L (m × m) and r (m); per distinct exact pulse M (d × d complex)
// and c (d complex).
BLOCHSIM_HD inline int64_t pooled_table_floats(const EventStream& s, const Pools& p) {
  const int64_t n = 1 + p.n_exchanging, m = n + (p.bound ? 1 : 0), d = 3 * n + (p.bound ? 1 : 0);
  return (2 * n * n + m * m + m) * s.n_intervals + (s.driven ? 2 * d * (d + 1) * s.n_driven : 0);
}

// Problem i's operators (pools/pools.hpp pool_interval, pool_driven) in the
// order pooled_table_floats counts, value j at table[j * stride].
BLOCHSIM_HD inline void pooled_table(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                     int64_t i, float* table, int64_t stride) {
  const PoolTissue<double> q = pool_tissue<double>(t, p, i, nullptr, 0, nullptr);
  const int n = q.n, m = q.m, d = 3 * n + (q.bound ? 1 : 0);
  int64_t j = 0;
  auto put = [&](double v) { table[(j++) * stride] = static_cast<float>(v); };
  for (int64_t v = 0; v < s.n_intervals; ++v) {
    Cx<double> P[max_liquid_pools * max_liquid_pools];
    double L[max_longitudinal_pools * max_longitudinal_pools], r[max_longitudinal_pools];
    pool_interval(q, s.duration_s[v], P, L, r);
    for (int a = 0; a < n * n; ++a) {
      put(P[a].re);
      put(P[a].im);
    }
    for (int a = 0; a < m * m; ++a) put(L[a]);
    for (int a = 0; a < m; ++a) put(r[a]);
  }
  if (!s.driven) return;
  for (int64_t v = 0; v < s.n_driven; ++v) {
    Cx<double> M[max_driven_size * max_driven_size], c[max_driven_size];
    pool_driven(q, p.lineshape, ls, driven_pulse<double>(s.driven_table + v * driven_fields), M, c);
    for (int a = 0; a < d * d; ++a) {
      put(M[a].re);
      put(M[a].im);
    }
    for (int a = 0; a < d; ++a) {
      put(c[a].re);
      put(c[a].im);
    }
  }
}

// Orders a member holds for the pool counts N (liquid pools), Bound, on
// the real planes or the complex ones: 48 to 96 state registers a thread
// (as many orders as fit without spilling at sm_90, so that the per-event
// work each member repeats is shared by more orders).
template <int N, bool Bound, bool Real>
BLOCHSIM_HD constexpr int pooled_team_orders() {
  return Real ? 16 : (N == 1 ? 8 : 4);
}

// The state of one problem over a team (members of R orders each) and its
// event loop.  Real: the stream's phases are 0 or pi and nothing turns the
// transverse states (pooled_real_path), so one plane a family is kept: the
// imaginary part of F+ and F-, the real part of Z.  Otherwise plane 0 is
// the real part and plane 1 the imaginary part.
template <class V, int N, bool Bound, int R, bool Real, class Team>
struct PooledTeam {
  static constexpr int n = N, m = N + (Bound ? 1 : 0), d = 3 * N + (Bound ? 1 : 0);
  static constexpr int NP = Real ? 1 : 2;
  V fp[n][NP][R], fm[n][NP][R], z[m][NP][R];
  Team team;
  int K;
  bool truncate;  // the team holds orders past K - 1, which shifts must drop

  // Order r of the member's registers into o, and back: on the real planes
  // plane 0 holds the imaginary part of F+ and F- and the real part of Z.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void load(int r, PoolOrder<V, n, m>& o) const {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (Real) {
        o.ai[j] = fp[j][0][r];
        o.bi[j] = fm[j][0][r];
      } else {
        o.ar[j] = fp[j][0][r];
        o.ai[j] = fp[j][1][r];
        o.br[j] = fm[j][0][r];
        o.bi[j] = fm[j][1][r];
      }
    }
BLOCHSIM_UNROLL
    for (int j = 0; j < m; ++j) {
      o.cr[j] = z[j][0][r];
      if constexpr (!Real) o.ci[j] = z[j][1][r];
    }
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void store(int r, const PoolOrder<V, n, m>& o) {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (Real) {
        fp[j][0][r] = o.ai[j];
        fm[j][0][r] = o.bi[j];
      } else {
        fp[j][0][r] = o.ar[j];
        fp[j][1][r] = o.ai[j];
        fm[j][0][r] = o.br[j];
        fm[j][1][r] = o.bi[j];
      }
    }
BLOCHSIM_UNROLL
    for (int j = 0; j < m; ++j) {
      z[j][0][r] = o.cr[j];
      if constexpr (!Real) z[j][1][r] = o.ci[j];
    }
  }

  // One order of dephasing (dir > 0) or rephasing (dir < 0) of every
  // liquid pool; the row that moves up gains order 0 = conj of the other's.
  // (Each direction names its arrays: a pointer chosen at run time would
  // put them in the device's local memory.)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift(int dir) {
    const V f = team.first();
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if (dir > 0) {
        up_from(fp[j], fm[j], f);
      } else {
        up_from(fm[j], fp[j], f);
      }
    }
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void up_from(V (&up)[NP][R], V (&dn)[NP][R], const V& f) {
BLOCHSIM_UNROLL
    for (int c = 0; c < NP; ++c) epg::team_move<R>(team, up[c], dn[c], truncate, K);
    if constexpr (Real) {
      up[0][0] -= f * dn[0][0];
    } else {
      up[0][0] += f * dn[0][0];
      up[1][0] -= f * dn[1][0];
    }
  }

  // The problem's values the event loop reads (out of PoolTissue, whose
  // arrays the device keeps in local memory), its operator table and what
  // the last events left for the next.
  static constexpr int per_interval = 2 * n * n + m * m + m;
  static constexpr int per_driven = 2 * d * (d + 1);
  const EventStream* s = nullptr;
  const Pools* p = nullptr;
  const LineshapeTable* ls = nullptr;
  const float* table = nullptr;
  int64_t stride = 1;
  double B1 = 1.0, B1phase = 0.0, B0 = 0.0, T2b = 0.0;
  float M0 = 1.0f, eta = 1.0f;
  bool nominal_rf = true, saturating = false;
  float Pv[2 * n * n], Lv[m * m], Rv[m];
  int32_t cached_iv = -1;
  float g_offset = 0.0f;
  bool g_ready = false;
  double g_T2b = 0.0;  // G(2 pi (offset - B0) T2b) T2b at g_offset

  // The Store of pooled_event (pools/play.hpp).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE uint32_t flags(int64_t e) const { return s->records[e].flags; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int32_t shift_before(int64_t e) const { return s->records[e].shift_before; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int32_t shift_after(int64_t e) const { return s->records[e].shift_after; }

  // (The operators are copied into the step, not pointed at: a pointer
  // into the team's members would put all of them in local memory.)
  struct Step {
    bool relaxes = false, saturates = false, rotates = false;
    float P[2 * n * n], L[m * m];
    V r0[m];  // the recovery, in member 0's first order only
    float decay = 1.0f;
    PoolRotation<float> rot{1.0f, 0.0f, 1.0f, 0.0f};
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax(int r, PoolOrder<V, n, m>& o) const {
      PoolOrder<V, n, m> x;
      pool_relax<Real>(P, L, o, x, r == 0 ? r0 : nullptr);
      o = x;
    }
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE void saturate(PoolOrder<V, n, m>& o) const {
      o.cr[n] *= decay;
      if constexpr (!Real) o.ci[n] *= decay;
    }
    template <class F>
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE void with_turn(F&& f) const {
      f([&](PoolOrder<V, n, m>& o) BLOCHSIM_LAMBDA_INLINE { PoolTurn<Real>::on(rot, o, n); });
    }
  };
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Step step(int64_t e, bool) {
    using std::cos;
    using std::exp;
    using std::sin;
    const EventRecord& rec = s->records[e];
    const uint32_t f = rec.flags;
    const int32_t iv = rec.interval;
    Step st;
    if (iv >= 0) {
      if (iv != cached_iv) {
        const float* o = table + static_cast<int64_t>(iv) * per_interval * stride;
BLOCHSIM_UNROLL
        for (int a = 0; a < 2 * n * n; ++a) Pv[a] = o[a * stride];
BLOCHSIM_UNROLL
        for (int a = 0; a < m * m; ++a) Lv[a] = o[(2 * n * n + a) * stride];
BLOCHSIM_UNROLL
        for (int a = 0; a < m; ++a) Rv[a] = o[(2 * n * n + m * m + a) * stride];
        cached_iv = iv;
      }
      st.relaxes = true;
BLOCHSIM_UNROLL
      for (int a = 0; a < 2 * n * n; ++a) st.P[a] = Pv[a];
BLOCHSIM_UNROLL
      for (int a = 0; a < m * m; ++a) st.L[a] = Lv[a];
      const V first = team.first();
BLOCHSIM_UNROLL
      for (int j = 0; j < m; ++j) st.r0[j] = first * Rv[j];
    }
    if (saturating && (f & (event_rf | event_saturation)) && s->rf_duration_s[e] > 0.0f) {
      const double tau_rf = s->rf_duration_s[e];
      const float offset = s->rf_offset_hz ? s->rf_offset_hz[e] : 0.0f;
      if (!g_ready || offset != g_offset) {
        double g, dg;
        lineshape_eval(p->lineshape, 2.0 * pi * (offset - B0) * T2b, *ls, g, dg);
        g_T2b = static_cast<double>(static_cast<float>(g * T2b));
        g_offset = offset;
        g_ready = true;
      }
      const double power = s->rf_power ? s->rf_power[e] : 1.0;
      const double a = B1 * rec.flip_rad;
      st.saturates = true;
      st.decay = exp(static_cast<float>(-(pi * power / tau_rf) * g_T2b * a * a));
    }
    if (f & event_rf) {
      float ca, sa, cp, sp;
      if (nominal_rf) {
        ca = rec.rf[rft_cos];
        sa = rec.rf[rft_sin];
        cp = rec.rf[rft_cos_phase];
        sp = rec.rf[rft_sin_phase];
      } else {
        const float al = static_cast<float>(B1 * static_cast<double>(rec.flip_rad));
        const float ph = static_cast<float>(B1phase + static_cast<double>(rec.phase_rad));
        ca = cos(al);
        sa = sin(al);
        cp = cos(ph);
        sp = sin(ph);
      }
      st.rotates = true;
      st.rot = PoolRotation<float>(ca, sa, cp, sp);
    }
    return st;
  }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void orders(F&& f) {
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) {
      PoolOrder<V, n, m> o;
      load(r, o);
      f(r, o);
      store(r, o);
    }
  }
  // The exact pulse's d × d matrix on the components of every order, its
  // recovery column at order 0 (member 0's first order).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void drive(int64_t e) {
    if constexpr (!Real) {
      const float* o = table + (static_cast<int64_t>(s->n_intervals) * per_interval +
                                static_cast<int64_t>(s->driven[e]) * per_driven) *
                                   stride;
      const V first = team.first();
      auto mat = [&](int a) { return o[a * stride]; };
      auto src = [&](int a) { return first * o[(2 * d * d + a) * stride]; };
      orders([&](int r, PoolOrder<V, n, m>& x) BLOCHSIM_LAMBDA_INLINE { pool_drive(mat, src, r == 0, x); });
    }
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void invert() {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
      for (int h = 0; h < NP; ++h)
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) z[j][h][r] = -eta * z[j][h][r];
  }
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void readout(int64_t e, Sink& sink) const {
    const EventRecord& rec = s->records[e];
    V accr{}, acci{};
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (Real) {
        acci += fp[j][0][0];
      } else {
        accr += fp[j][0][0];
        acci += fp[j][1][0];
      }
    }
    const float cr = rec.rf[rft_cos_rx], sr = rec.rf[rft_sin_rx];
    // M0 (F+) e^{-i rx}
    sink.write(rec.slot, M0 * (accr * cr + acci * sr), M0 * (acci * cr - accr * sr));
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void spoil() {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
      for (int h = 0; h < NP; ++h)
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) fp[j][h][r] = fm[j][h][r] = V{};
  }

  // Plays the stream for problem i (its records, EventStream::records, and
  // the arrays the records do not hold): table as pooled_table wrote it
  // (stride between its values), sink.write(slot, re, im) takes each
  // readout (its values meaningful in member 0).  A problem at B1 = 1 with
  // no transmit phase takes each pulse's cos and sin from its record (the
  // stream's rf table, formed once per sequence); others turn their own
  // flip and phase in single precision.  No double-precision function runs
  // per event but the semisolid pool's saturation.
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void play(const EventStream& s_, const Tissue& t, const Pools& p_,
                                             const LineshapeTable& ls_, int64_t i, const float* table_,
                                             int64_t stride_, const Team& tm, Sink& sink) {
    s = &s_;
    p = &p_;
    ls = &ls_;
    table = table_;
    stride = stride_;
    team = tm;
    K = s_.states;
    truncate = team.members() * R != K;
    float frac[m];
    {
      const PoolTissue<double> q = pool_tissue<double>(t, p_, i, nullptr, 0, nullptr);
      B1 = q.B1;
      B1phase = q.B1phase;
      B0 = q.B0;
      T2b = Bound ? q.T2b : 0.0;
      M0 = static_cast<float>(q.M0);
      eta = static_cast<float>(q.eta);
BLOCHSIM_UNROLL
      for (int j = 0; j < m; ++j) frac[j] = static_cast<float>(q.f[j]);
    }
    nominal_rf = B1 == 1.0 && B1phase == 0.0;
    saturating = Bound && s_.rf_duration_s != nullptr;
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
      for (int c = 0; c < NP; ++c)
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) fp[j][c][r] = fm[j][c][r] = V{};
BLOCHSIM_UNROLL
    for (int j = 0; j < m; ++j) {
BLOCHSIM_UNROLL
      for (int c = 0; c < NP; ++c)
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) z[j][c][r] = V{};
      z[j][0][0] = team.first() * frac[j];
    }
    pooled_play(s_, *this, sink);
  }
};

// Which PooledTeam the pools p play on (0: none; the other configurations
// take pooled_block): 1 the semisolid pool, 2 one exchanging pool, 3 both.
BLOCHSIM_HD inline int pooled_team_kind(const Pools& p) {
  if (p.n_exchanging == 0 && p.bound) return 1;
  if (p.n_exchanging == 1) return p.bound ? 3 : 2;
  return 0;
}

// pooled_team_orders of a pooled_team_kind (real: on the real planes).
BLOCHSIM_HD inline int pooled_team_orders_of(int kind, bool real) {
  if (kind == 1) return real ? pooled_team_orders<1, true, true>() : pooled_team_orders<1, true, false>();
  if (kind == 2) return real ? pooled_team_orders<2, false, true>() : pooled_team_orders<2, false, false>();
  return pooled_team_orders<2, true, false>();
}

// Host instantiation of the device's pooled team for problems [0, t.n): one
// problem at a time, its orders over the lanes of V (members of R orders).
// K must be at most width * R; the pools one pooled_team_kind names.
template <class V, int N, bool Bound, bool Real>
inline int pooled_team_host(const EventStream& s, const Tissue& t, const Pools& p, float* out) {
  constexpr int R = pooled_team_orders<N, Bound, Real>();
  using Team = epg::LaneTeam<V, R>;
  if (s.states > Lanes<V>::width * R) return states_exceed_team;
  // the event records, as the device launcher packs them
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  std::vector<float> table(static_cast<size_t>(pooled_table_floats(s, p)) + 1);
  for (int64_t i = 0; i < t.n; ++i) {
    pooled_table(s, t, p, host_lineshape_table(), i, table.data(), 1);
    PooledTeam<V, N, Bound, R, Real, Team> st;
    epg::TeamLaneSink<V> sink{out, i, s.n_samples};
    st.play(sr, t, p, host_lineshape_table(), i, table.data(), 1, Team{}, sink);
  }
  return ok;
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
