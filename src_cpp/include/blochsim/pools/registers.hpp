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

// The state of one problem over a team (members of R orders each): the
// Store of pools/play.hpp's event.  Real: the stream's phases are 0 or pi
// and nothing turns the transverse states (pooled_real_path), so one plane
// a family is kept: the imaginary part of F+ and F-, the real part of Z.
// Otherwise plane 0 is the real part and plane 1 the imaginary part.
template <class V_, int N_, bool Bound, int R, bool Real_, class Team>
struct PooledTeam {
  using V = V_;
  using C = float;
  using Scale = float;
  using Sat = SingleSaturation<float>;
  static constexpr int N = N_, M = N_ + (Bound ? 1 : 0), D = 3 * N_ + (Bound ? 1 : 0);
  static constexpr bool fixed = true, real = Real_, framed = false;
  static constexpr int n = N, m = M, d = D;
  using Order = PoolOrder<V, N, M>;
  using Step = PoolStep<float, V, N, M, Real_, true>;
  static constexpr int NP = Real_ ? 1 : 2;
  static constexpr int per_interval = 2 * n * n + m * m + m;
  static constexpr int per_driven = 2 * d * (d + 1);
  V fp[n][NP][R], fm[n][NP][R], z[m][NP][R];
  Team team;
  int K;
  bool truncate;  // the team holds orders past K - 1, which shifts must drop
  const EventStream* es;
  const Pools* pools;
  const LineshapeTable* lsp;
  const float* table;
  int64_t stride;
  // the problem's values the event loop reads, out of PoolTissue (whose
  // arrays the device keeps in local memory)
  double B1, B1phase, B0, T2b;
  float M0, eta;
  bool nominal_rf, saturating;
  V first;
  // the last interval's operators, and the semisolid lineshape at the last
  // pulse offset seen: G(2 pi (offset - B0) T2b) T2b (a dual pulse: the
  // mean of G at +offset and -offset)
  float Pv[2 * n * n], Lv[m * m], Rv[m];
  int32_t cached_iv;
  float g_offset;
  bool g_ready, g_dual;
  double g_T2b;
  // the record of the event being played, read once an event (a read of
  // the stream's records at each use waits on memory again); with
  // prefetch, while the event before plays.  The complex planes of an
  // exchanging pool leave no registers for the next record (the H100 ran
  // 6 % slower with it, bench/NOTES.md).
  EventRecord rec;
  static constexpr bool prefetch = Real_ || N_ == 1;

  // Order r of the member's registers into o, and back: on the real planes
  // plane 0 holds the imaginary part of F+ and F- and the real part of Z.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void load(int r, Order& o) const {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (real) {
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
      if constexpr (!real) o.ci[j] = z[j][1][r];
    }
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void store(int r, const Order& o) {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (real) {
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
      if constexpr (!real) z[j][1][r] = o.ci[j];
    }
  }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void each(F&& f) {
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) {
      Order o;
      load(r, o);
      f(r, o);
      store(r, o);
    }
  }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void transform(F&& f) {
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) {
      Order o, x;
      load(r, o);
      f(r, o, x);
      store(r, x);
    }
  }
  // order 0 is member 0's first: at_zero(0) holds in every member, whose
  // sources are scaled by team.first() (1 in member 0, else 0)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool at_zero(int r) const { return r == 0; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void order_zero(Order& o) const { load(0, o); }

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
    if constexpr (real) {
      up[0][0] -= f * dn[0][0];
    } else {
      up[0][0] += f * dn[0][0];
      up[1][0] -= f * dn[1][0];
    }
  }

  // (the event asked about is always the one being played: rec)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE uint32_t flags(int64_t) const { return rec.flags; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int32_t interval_of(int64_t) const { return rec.interval; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int32_t shift_before(int64_t) const { return rec.shift_before; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int32_t shift_after(int64_t) const { return rec.shift_after; }

  // The interval's operators from the table (read again only when the
  // interval changes), copied into the event's step.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void interval(int32_t iv, Step& step) {
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
BLOCHSIM_UNROLL
    for (int a = 0; a < 2 * n * n; ++a) step.P[a] = Pv[a];
BLOCHSIM_UNROLL
    for (int a = 0; a < m * m; ++a) step.L[a] = Lv[a];
BLOCHSIM_UNROLL
    for (int a = 0; a < m; ++a) step.z0[a] = first * Rv[a];
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool saturation(int64_t e, Sat& sat) {
    using std::exp;
    const EventStream& s = *es;
    if (!(saturating && (rec.flags & (event_rf | event_saturation)) && s.rf_duration_s[e] > 0.0f))
      return false;
    const double tau_rf = s.rf_duration_s[e];
    const float offset = s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0f;
    const bool dual = (rec.flags & event_dual) != 0;
    if (!g_ready || offset != g_offset || dual != g_dual) {
      g_T2b = static_cast<double>(static_cast<float>(saturation_lineshape(pools->lineshape, *lsp, T2b, B0, offset, dual)));
      g_offset = offset;
      g_dual = dual;
      g_ready = true;
    }
    const double power = s.rf_power ? s.rf_power[e] : 1.0;
    const double a = B1 * rec.flip_rad;
    sat.decay = exp(static_cast<float>(-(pi * power / tau_rf) * g_T2b * a * a));
    return true;
  }
  // A problem at B1 = 1 with no transmit phase takes each pulse's cos and
  // sin from its record (the stream's rf table, formed once per sequence);
  // others turn their own flip and phase in single precision.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pulse(int64_t, float& ca, float& sa, float& cp, float& sp) const {
    using std::cos;
    using std::sin;
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
  }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rotations(float ca, float sa, float cp, float sp, F&& f) const {
    f(PoolRotation<float>(ca, sa, cp, sp));
  }
  // the exact pulse's d × d matrix on the components of every order, its
  // recovery column at order 0 (member 0's first order)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE auto driven(int64_t e) const {
    const float* o = table + (static_cast<int64_t>(es->n_intervals) * per_interval +
                              static_cast<int64_t>(es->driven[e]) * per_driven) *
                                 stride;
    const int64_t st = stride;
    const V f = first;
    return [o, st, f](Order& x, bool zero) BLOCHSIM_LAMBDA_INLINE {
      pool_drive<true>([&](int a) { return o[a * st]; }, [&](int a) { return f * o[(2 * d * d + a) * st]; }, zero,
                       x);
    };
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE float inversion() const { return -eta; }
  // M0 (F+) e^{-i rx} to sink.write(slot, re, im) (meaningful in member 0)
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void sample(int64_t, const V& accr, const V& acci, Sink& sink) const {
    const float cr = rec.rf[rft_cos_rx], sr = rec.rf[rft_sin_rx];
    sink.write(rec.slot, M0 * (accr * cr + acci * sr), M0 * (acci * cr - accr * sr));
  }

  // Plays the stream for problem i (its records, EventStream::records, and
  // the arrays the records do not hold): table as pooled_table wrote it
  // (stride between its values), sink.write(slot, re, im) takes each
  // readout (its values meaningful in member 0).  No double-precision
  // function runs per event but the semisolid pool's saturation.
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void play(const EventStream& s, const Tissue& t, const Pools& p,
                                             const LineshapeTable& ls, int64_t i, const float* table_,
                                             int64_t stride_, const Team& tm, Sink& sink) {
    team = tm;
    K = s.states;
    truncate = team.members() * R != K;
    es = &s;
    pools = &p;
    lsp = &ls;
    table = table_;
    stride = stride_;
    float frac[m];
    {
      const PoolTissue<double> q = pool_tissue<double>(t, p, i, nullptr, 0, nullptr);
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
    saturating = Bound && s.rf_duration_s != nullptr;
    first = team.first();
    cached_iv = -1;
    g_offset = 0.0f;
    g_ready = false;
    g_dual = false;
    g_T2b = 0.0;
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
      z[j][0][0] = first * frac[j];
    }
    // records hold n_events + 1 entries (pack_events)
    EventRecord next = s.records[0];
    for (int64_t e = 0; e < s.n_events; ++e) {
      if constexpr (prefetch) {
        rec = next;
        next = s.records[e + 1];
      } else {
        rec = s.records[e];
      }
      pooled_event(s, e, *this, sink);
    }
  }
};

// Which PooledTeam the pools p play on (0: none; the other configurations
// take pooled_block): 1 the semisolid pool, 2 one exchanging pool, 3 both.
BLOCHSIM_HD inline int pooled_team_kind(const Pools& p) {
  if (pool_layout(p).network) return 0;
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
