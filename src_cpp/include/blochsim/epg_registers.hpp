// RegisterStore: the EPG state of one problem spread over a team of
// threads, R consecutive orders per member held in registers.
//
// Member j of a team of T holds orders [j R, (j + 1) R).  A shift moves
// every F+ order up by one and every F- order down by one: inside a member
// that is a move between registers; across members the boundary value goes
// to the neighbour through the Team policy (warp shuffles, shared memory,
// or, on the host, a permutation of the lanes of a vector whose lanes are
// the members).  Member 0 holds order 0 of every family, so F+_0 =
// conj(F-_0) and the order-0 sources stay local to it.
//
// Team policies provide, for lane type V:
//   size                 members per team (compile-time or run-time)
//   from_below(x)        the value x of the member below (0 for member 0)
//   from_above(x)        the value x of the member above (0 for the last)
//   first()              1 in member 0, 0 elsewhere
//   base()               the first order a member holds, as V
//   active(band)         whether a member holds any order below `band`
//   below(r, K)          1 where order base + r < K, else 0
//   advance(s, e, n), record(s, e)
//                        the event records of the stream (EventStream::
//                        records), as play() asks for them
//   band_skips           whether members past the band skip the arithmetic
//                        (worth it only where whole warps fall past it)
#pragma once

#include <cmath>
#include <vector>

#include "epg.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {
namespace epg {

// Host emulation of a team: member j is lane j of the vector V, so the
// device's cross-member logic runs (and is tested) on the CPU.
template <class V, int R>
struct LaneTeam {
  using LT = Lanes<V>;
  static constexpr int width = LT::width;
  static constexpr bool band_skips = false;
  int members() const { return width; }
  V from_below(const V& x) const {
    V y{};
    for (int l = 1; l < width; ++l) LT::set(y, l, LT::get(x, l - 1));
    return y;
  }
  V from_above(const V& x) const {
    V y{};
    for (int l = 0; l + 1 < width; ++l) LT::set(y, l, LT::get(x, l + 1));
    return y;
  }
  V first() const {
    V y{};
    LT::set(y, 0, 1.0f);
    return y;
  }
  V base() const {
    V y{};
    for (int l = 0; l < width; ++l) LT::set(y, l, static_cast<float>(l * R));
    return y;
  }
  bool active(int) const { return true; }
  V below(int r, int K) const {
    V y{};
    for (int l = 0; l < width; ++l) LT::set(y, l, l * R + r < K ? 1.0f : 0.0f);
    return y;
  }
  void advance(const EventStream&, int32_t, int32_t) {}
  EventRecord record(const EventStream& s, int32_t e) const { return s.records[e]; }
};

template <class V, int R, bool Complex, class Team>
struct RegisterStore {
  static constexpr int RI = Complex ? R : 1;
  V pr[R], mr[R], zr[R];
  V pi[RI], mi[RI], zi[RI];
  Team team;
  const EventStream* s;
  const LaneTissue<V>* lt;
  int K;
  bool truncate;  // the team holds orders past K - 1, which shifts must drop
  int32_t cached_iv;
  IvCoef<V> cached;

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void init(const EventStream& stream, const LaneTissue<V>& tissue,
                                             const Team& tm) {
    s = &stream;
    lt = &tissue;
    team = tm;
    K = stream.states;
    truncate = team.members() * R != K;
    cached_iv = -1;
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) pr[r] = mr[r] = zr[r] = V{};
BLOCHSIM_UNROLL
    for (int r = 0; r < RI; ++r) pi[r] = mi[r] = zi[r] = V{};
    zr[0] = team.first();
  }

  // Interval coefficients, computed when the interval changes (the device
  // keeps no per-problem table).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> interval(int32_t iv) {
    if (iv != cached_iv) {
      cached = interval_coef<V, float>(*s, *lt, iv);
      cached_iv = iv;
    }
    return cached;
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(const Op<V>& o, int band) {
    if (team.active(band)) {
BLOCHSIM_UNROLL
      for (int r = 0; r < R; ++r) {
        V d0{}, d1{}, d2{};
        apply_order<V, Complex>(o, pr[r], Complex ? pi[r < RI ? r : 0] : d0, mr[r],
                                Complex ? mi[r < RI ? r : 0] : d1, zr[r], Complex ? zi[r < RI ? r : 0] : d2);
      }
    }
    const V f = team.first();
    pr[0] += f * o.jr;
    mr[0] += f * o.jr;
    zr[0] += f * o.jz;
    if (Complex) {
      pi[0] += f * o.ji;
      mi[0] -= f * o.ji;
    }
  }

  // Events per call of apply_shift_run on the device's fast path (play()
  // takes it for runs of events that each apply an operator and shift once
  // up); 1 turns the fast path off.
#ifndef BLOCHSIM_RUN
#define BLOCHSIM_RUN 4
#endif
  static constexpr int unroll = R % BLOCHSIM_RUN == 0 ? BLOCHSIM_RUN : 1;

  // U events, each: the operator op(u) at every order, the new F+_0 handed
  // to take(u, re, im), then one shift up (dropping orders past K - 1 when
  // Trunc).
  //
  // The shifts move no data inside a member: during the run, logical order
  // l of F+ sits in register (l - u) mod R after u shifts and of F- in
  // (l + u) mod R, so each operator updates the registers in place and a
  // shift only passes the member's boundary orders to its neighbours.  The
  // registers are put back in order once at the end of the run (R moves per
  // family per U events instead of R per event).
  template <int U, bool Trunc, class OpFn, class TakeFn>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply_shift_run(OpFn&& op, TakeFn&& take, int band) {
    static_assert(U >= 1 && U <= R, "a run is at most R events");
    const V f = team.first();
BLOCHSIM_UNROLL
    for (int u = 0; u < U; ++u) {
      const Op<V> o = op(u);
      // the registers of logical order l in this step (C: the imaginary
      // planes, which the real path does not have)
#define BLOCHSIM_P(l) (((l) - u + R) % R)
#define BLOCHSIM_M(l) (((l) + u) % R)
#define BLOCHSIM_C(l) ((l) < RI ? (l) : 0)
      if (!Team::band_skips || team.active(band)) {
BLOCHSIM_UNROLL
        for (int l = 0; l < R; ++l) {
          V d0{}, d1{}, d2{};
          apply_order<V, Complex>(o, pr[BLOCHSIM_P(l)], Complex ? pi[BLOCHSIM_C(BLOCHSIM_P(l))] : d0,
                                  mr[BLOCHSIM_M(l)], Complex ? mi[BLOCHSIM_C(BLOCHSIM_M(l))] : d1, zr[l],
                                  Complex ? zi[BLOCHSIM_C(l)] : d2);
        }
      }
      pr[BLOCHSIM_P(0)] += f * o.jr;
      mr[BLOCHSIM_M(0)] += f * o.jr;
      zr[0] += f * o.jz;
      if (Complex) {
        pi[BLOCHSIM_C(BLOCHSIM_P(0))] += f * o.ji;
        mi[BLOCHSIM_C(BLOCHSIM_M(0))] -= f * o.ji;
      }
      take(u, pr[BLOCHSIM_P(0)], Complex ? pi[BLOCHSIM_C(BLOCHSIM_P(0))] : V{});
      // the shift: the top order of F+ leaves for the member above, whose
      // register becomes logical order 0; the bottom order of F- arrives
      // from the member above
      pr[BLOCHSIM_P(R - 1)] = team.from_below(pr[BLOCHSIM_P(R - 1)]);
      mr[BLOCHSIM_M(0)] = team.from_above(mr[BLOCHSIM_M(0)]);
      if (Complex) {
        pi[BLOCHSIM_C(BLOCHSIM_P(R - 1))] = team.from_below(pi[BLOCHSIM_C(BLOCHSIM_P(R - 1))]);
        mi[BLOCHSIM_C(BLOCHSIM_M(0))] = team.from_above(mi[BLOCHSIM_C(BLOCHSIM_M(0))]);
      }
#undef BLOCHSIM_P
#undef BLOCHSIM_M
      // logical order l now sits in register (l - u - 1) mod R (F+) and
      // (l + u + 1) mod R (F-)
#define BLOCHSIM_P(l) (((l) - u - 1 + 2 * R) % R)
#define BLOCHSIM_M(l) (((l) + u + 1) % R)
      if (Trunc) {
BLOCHSIM_UNROLL
        for (int l = 0; l < R; ++l) {
          pr[BLOCHSIM_P(l)] *= team.below(l, K);
          if (Complex) pi[BLOCHSIM_C(BLOCHSIM_P(l))] *= team.below(l, K);
        }
      }
      // F+_0 = conj(F-_0) in member 0
      pr[BLOCHSIM_P(0)] += f * mr[BLOCHSIM_M(0)];
      if (Complex) pi[BLOCHSIM_C(BLOCHSIM_P(0))] -= f * mi[BLOCHSIM_C(BLOCHSIM_M(0))];
#undef BLOCHSIM_P
#undef BLOCHSIM_M
#undef BLOCHSIM_C
      band = band < K ? band + 1 : K;
    }
    // back in order: logical l from register (l - U) mod R, (l + U) mod R
    if (U % R != 0) {
      reorder<U>(pr, mr);
      if constexpr (Complex) reorder<U>(pi, mi);
    }
  }

  // up[l] <- up[(l - U) mod R], dn[l] <- dn[(l + U) mod R] for arrays of R.
  template <int U>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE static void reorder(V* up, V* dn) {
    V tu[R], td[R];
BLOCHSIM_UNROLL
    for (int l = 0; l < R; ++l) {
      tu[l] = up[(l - U % R + R) % R];
      td[l] = dn[(l + U) % R];
    }
BLOCHSIM_UNROLL
    for (int l = 0; l < R; ++l) {
      up[l] = tu[l];
      dn[l] = td[l];
    }
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax_per_order(const IvCoef<V>& c, int) {
    using LT = Lanes<V>;
    // factors at this member's first order k0, then by recurrence over R
    V g, step, a2, wc, ws, rc, rs;
    const V k0 = team.base();
    for (int l = 0; l < LT::width; ++l) {
      const float dl = LT::get(c.dlog, l), fl = LT::get(c.flow, l), k = LT::get(k0, l);
      LT::set(g, l, std::exp(dl * k * k));
      LT::set(step, l, std::exp(dl * (2.0f * k + 1.0f)));
      LT::set(a2, l, std::exp(2.0f * dl));
      LT::set(wc, l, std::cos(k * fl));
      LT::set(ws, l, std::sin(k * fl));
      LT::set(rc, l, std::cos(fl));
      LT::set(rs, l, std::sin(fl));
    }
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) {
      V d0{}, d1{}, d2{};
      relax_order<V, Complex>(c, g * wc, g * ws, pr[r], Complex ? pi[r < RI ? r : 0] : d0, mr[r],
                              Complex ? mi[r < RI ? r : 0] : d1, zr[r], Complex ? zi[r < RI ? r : 0] : d2);
      const V nc = wc * rc - ws * rs;
      ws = wc * rs + ws * rc;
      wc = nc;
      g *= step;
      step *= a2;
    }
    zr[0] += team.first() * c.rec;
  }

  // Move `up` one order up and `dn` one order down across the team.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void move(V* up, V* dn) {
    const V top = up[R - 1];
    const V bottom = dn[0];
BLOCHSIM_UNROLL
    for (int r = R - 1; r >= 1; --r) up[r] = up[r - 1];
BLOCHSIM_UNROLL
    for (int r = 0; r + 1 < R; ++r) dn[r] = dn[r + 1];
    up[0] = team.from_below(top);
    dn[R - 1] = team.from_above(bottom);
    if (truncate) {
BLOCHSIM_UNROLL
      for (int r = 0; r < R; ++r) up[r] *= team.below(r, K);
    }
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(int dir, int) {
    const V f = team.first();
    if (dir > 0) {
      move(pr, mr);
      pr[0] += f * mr[0];  // F+_0 = conj(F-_0) in member 0
      if (Complex) {
        move(pi, mi);
        pi[0] -= f * mi[0];
      }
    } else {
      move(mr, pr);
      mr[0] += f * pr[0];
      if (Complex) {
        move(mi, pi);
        mi[0] -= f * pi[0];
      }
    }
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void spoil(int) {
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) pr[r] = mr[r] = V{};
BLOCHSIM_UNROLL
    for (int r = 0; r < RI; ++r)
      if (Complex) pi[r] = mi[r] = V{};
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V f0r() const { return pr[0]; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V f0i() const { return Complex ? pi[0] : V{}; }

  // Event records, from the team (which may stage them; play()).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void advance(const EventStream& st, int32_t e, int32_t n) {
    team.advance(st, e, n);
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE EventRecord record(const EventStream& st, int32_t e) const {
    return team.record(st, e);
  }
};

// Host sink of a LaneTeam: the problem's samples are lane 0 (member 0).
template <class V>
struct TeamLaneSink {
  float* out;
  int64_t problem, n_samples;
  void write(int64_t slot, const V& re, const V& im) {
    float* o = out + (problem * n_samples + slot) * 2;
    o[0] = Lanes<V>::get(re, 0);
    o[1] = Lanes<V>::get(im, 0);
  }
};

// Host instantiation of the device's register path for problems [0, n):
// one problem at a time, its orders over the lanes of V (a team of
// Lanes<V>::width members, R orders each).  K must be at most width * R.
template <class V, int R, bool Complex>
inline int forward_registers_host(const EventStream& s, const Tissue& t, float* out) {
  if (s.states > Lanes<V>::width * R) return states_exceed_team;
  // the event records with their run counts, as the device launcher packs them
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  for (int64_t p = 0; p < t.n; ++p) {
    LaneTissue<V> lt;
    {
      // every member sees the problem's tissue
      const LaneTissue<float> one = gather<float>(t, &p);
      lt = {splat<V>(one.T1), splat<V>(one.T2), splat<V>(one.M0), splat<V>(one.B1), splat<V>(one.B1phase),
            splat<V>(one.B0), splat<V>(one.D), splat<V>(one.v), splat<V>(one.eta)};
    }
    RegisterStore<V, R, Complex, LaneTeam<V, R>> st;
    st.init(s, lt, LaneTeam<V, R>{});
    TeamLaneSink<V> sink{out, p, s.n_samples};
    play<V, Complex>(sr, t, lt, st, sink);
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
