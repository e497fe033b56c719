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

  // Plays the stream for problem i (its records, EventStream::records, and
  // the arrays the records do not hold): table as pooled_table wrote it
  // (stride between its values), sink.write(slot, re, im) takes each
  // readout (its values meaningful in member 0).  A problem at B1 = 1 with
  // no transmit phase takes each pulse's cos and sin from its record (the
  // stream's rf table, formed once per sequence); others turn their own
  // flip and phase in single precision.  No double-precision function runs
  // per event but the semisolid pool's saturation.
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void play(const EventStream& s, const Tissue& t, const Pools& p,
                                             const LineshapeTable& ls, int64_t i, const float* table, int64_t stride,
                                             const Team& tm, Sink& sink) {
    using std::cos;
    using std::exp;
    using std::sin;
    team = tm;
    K = s.states;
    truncate = team.members() * R != K;
    // the problem's values the event loop reads, out of PoolTissue (whose
    // arrays the device keeps in local memory)
    double B1, B1phase, B0, T2b;
    float M0, eta, frac[m];
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
    constexpr int per_interval = 2 * n * n + m * m + m;
    constexpr int per_driven = 2 * d * (d + 1);
    const bool saturating = Bound && s.rf_duration_s != nullptr;
    float Pv[2 * n * n], Lv[m * m], Rv[m];
    int32_t cached_iv = -1;
    float g_offset = 0.0f;
    bool g_ready = false;
    double g_T2b = 0.0;  // G(2 pi (offset - B0) T2b) T2b at g_offset
    const V first = team.first();
    const bool nominal_rf = B1 == 1.0 && B1phase == 0.0;

    for (int64_t e = 0; e < s.n_events; ++e) {
      const EventRecord& rec = s.records[e];
      const uint32_t f = rec.flags;
      const int32_t iv = rec.interval;
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
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) {
          PoolOrder<V, n, m> o, x;
          load(r, o);
          pool_relax<Real>(Pv, Lv, o, x);
          store(r, x);
        }
BLOCHSIM_UNROLL
        for (int j = 0; j < m; ++j) z[j][0][0] += first * Rv[j];
      }
      for (int c = 0, sb = rec.shift_before; c < (sb > 0 ? sb : -sb); ++c) shift(sb > 0 ? 1 : -1);
      if (saturating && (f & (event_rf | event_saturation)) && s.rf_duration_s[e] > 0.0f) {
        const double tau_rf = s.rf_duration_s[e];
        const float offset = s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0f;
        if (!g_ready || offset != g_offset) {
          double g, dg;
          lineshape_eval(p.lineshape, 2.0 * pi * (offset - B0) * T2b, ls, g, dg);
          g_T2b = static_cast<double>(static_cast<float>(g * T2b));
          g_offset = offset;
          g_ready = true;
        }
        const double power = s.rf_power ? s.rf_power[e] : 1.0;
        const double a = B1 * rec.flip_rad;
        const float decay = exp(static_cast<float>(-(pi * power / tau_rf) * g_T2b * a * a));
BLOCHSIM_UNROLL
        for (int h = 0; h < NP; ++h)
BLOCHSIM_UNROLL
          for (int r = 0; r < R; ++r) z[n][h][r] *= decay;
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
        const PoolRotation<float> rot(ca, sa, cp, sp);
BLOCHSIM_UNROLL
        for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
          for (int r = 0; r < R; ++r) {
            if constexpr (Real) {
              rot.real(fp[j][0][r], fm[j][0][r], z[j][0][r]);
            } else {
              rot.apply(fp[j][0][r], fp[j][1][r], fm[j][0][r], fm[j][1][r], z[j][0][r], z[j][1][r]);
            }
          }
      }
      if constexpr (!Real) {
        if (f & event_driven) {
          // the exact pulse's d × d matrix on the components of every order,
          // its recovery column at order 0
          const float* o = table + (static_cast<int64_t>(s.n_intervals) * per_interval +
                                    static_cast<int64_t>(s.driven[e]) * per_driven) *
                                       stride;
          // the recovery at order 0 only: member 0's first order
          auto mat = [&](int a) { return o[a * stride]; };
          auto src = [&](int a) { return first * o[(2 * d * d + a) * stride]; };
BLOCHSIM_UNROLL
          for (int r = 0; r < R; ++r) {
            PoolOrder<V, n, m> x;
            load(r, x);
            pool_drive(mat, src, r == 0, x);
            store(r, x);
          }
        }
      }
      if (f & event_inversion) {
BLOCHSIM_UNROLL
        for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
          for (int h = 0; h < NP; ++h)
BLOCHSIM_UNROLL
            for (int r = 0; r < R; ++r) z[j][h][r] = -eta * z[j][h][r];
      }
      if (f & event_readout) {
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
      if (f & event_spoil) {
BLOCHSIM_UNROLL
        for (int j = 0; j < n; ++j)
BLOCHSIM_UNROLL
          for (int h = 0; h < NP; ++h)
BLOCHSIM_UNROLL
            for (int r = 0; r < R; ++r) fp[j][h][r] = fm[j][h][r] = V{};
      } else {
        for (int c = 0, sa = rec.shift_after; c < (sa > 0 ? sa : -sa); ++c) shift(sa > 0 ? 1 : -1);
      }
    }
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
