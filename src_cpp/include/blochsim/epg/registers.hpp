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

#include <algorithm>
#include <cmath>
#include <type_traits>
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
  // the tail of a TailStore: its elements are one lane's values (a float,
  // or a dual of floats)
  using E = typename LT::Scalar;
  V load(const E* p) const {
    V y;
    for (int l = 0; l < width; ++l) LT::set(y, l, p[l]);
    return y;
  }
  void store(E* p, const V& x) const {
    for (int l = 0; l < width; ++l) p[l] = LT::get(x, l);
  }
  void put_top(E* p, const V& x) const { *p = LT::get(x, width - 1); }
  V take_top(const E* p) const {
    V y{};
    LT::set(y, width - 1, *p);
    return y;
  }
  void sync() const {}
  V below_tail(int k0, int K) const {
    V y{};
    for (int l = 0; l < width; ++l) LT::set(y, l, k0 + l < K ? 1.0f : 0.0f);
    return y;
  }
};

// Moves `up` (R orders a member) one order up and `dn` one order down
// across the team; with truncate, drops what moves up past order K - 1.
template <int R, class V, class Team>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void team_move(const Team& team, V* up, V* dn, bool truncate, int K) {
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

template <class V, int R, bool Complex, class Team>
struct RegisterStore : FusedOps<V, Complex> {
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
  // keeps no per-problem table), in double like the host's table: a train
  // of thousands of equal intervals multiplies their rounding error.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> interval(int32_t iv) {
    if (iv != cached_iv) {
      cached = interval_coef<V, double>(*s, *lt, iv);
      cached_iv = iv;
    }
    return cached;
  }

  template <class O>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(const O& o, int band) {
    V d0{}, d1{}, d2{};
    if (team.active(band)) {
      with_pulse(o, [&](auto pulse) {
BLOCHSIM_UNROLL
        for (int r = 0; r < R; ++r) {
          order_update<Complex, decltype(pulse)::value>(o, pr[r], Complex ? pi[r < RI ? r : 0] : d0, mr[r],
                                                        Complex ? mi[r < RI ? r : 0] : d1, zr[r],
                                                        Complex ? zi[r < RI ? r : 0] : d2);
        }
      });
    }
    add_source<Complex>(o, team.first(), pr[0], Complex ? pi[0] : d0, mr[0], Complex ? mi[0] : d1, zr[0]);
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
      const auto o = op(u);
      // the registers of logical order l in this step (C: the imaginary
      // planes, which the real path does not have)
#define BLOCHSIM_P(l) (((l) - u + R) % R)
#define BLOCHSIM_M(l) (((l) + u) % R)
#define BLOCHSIM_C(l) ((l) < RI ? (l) : 0)
      if (!Team::band_skips || team.active(band)) {
        with_pulse(o, [&](auto pulse) {
BLOCHSIM_UNROLL
          for (int l = 0; l < R; ++l) {
            V d0{}, d1{}, d2{};
            order_update<Complex, decltype(pulse)::value>(
                o, pr[BLOCHSIM_P(l)], Complex ? pi[BLOCHSIM_C(BLOCHSIM_P(l))] : d0, mr[BLOCHSIM_M(l)],
                Complex ? mi[BLOCHSIM_C(BLOCHSIM_M(l))] : d1, zr[l], Complex ? zi[BLOCHSIM_C(l)] : d2);
          }
        });
      }
      {
        V d0{}, d1{};
        add_source<Complex>(o, f, pr[BLOCHSIM_P(0)], Complex ? pi[BLOCHSIM_C(BLOCHSIM_P(0))] : d0,
                            mr[BLOCHSIM_M(0)], Complex ? mi[BLOCHSIM_C(BLOCHSIM_M(0))] : d1, zr[0]);
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
    using S = typename LT::Scalar;
    using std::cos;
    using std::exp;
    using std::sin;
    // factors at this member's first order k0, then by recurrence over R
    V g, step, a2, wc, ws, rc, rs;
    const V k0 = team.base();
    for (int l = 0; l < LT::width; ++l) {
      const S dl = LT::get(c.dlog, l), fl = LT::get(c.flow, l);
      const float k = value_of(LT::get(k0, l));
      LT::set(g, l, exp(dl * (k * k)));
      LT::set(step, l, exp(dl * (2.0f * k + 1.0f)));
      LT::set(a2, l, exp(2.0f * dl));
      LT::set(wc, l, cos(k * fl));
      LT::set(ws, l, sin(k * fl));
      LT::set(rc, l, cos(fl));
      LT::set(rs, l, sin(fl));
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
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void move(V* up, V* dn) { team_move<R>(team, up, dn, truncate, K); }

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

  // Whether play() may take a fast run at this band (TailStore limits it).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool fast_ok(int) const { return true; }

  // Event records, from the team (which may stage them; play()).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void advance(const EventStream& st, int32_t e, int32_t n) {
    team.advance(st, e, n);
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE EventRecord record(const EventStream& st, int32_t e) const {
    return team.record(st, e);
  }
};

// TailStore: a RegisterStore whose team holds orders [0, Kr) in registers
// (Kr = members R) and the orders [Kr, K) beyond in memory, the tail, which
// the members update together: member j takes tail orders Kr + i T + j,
// i = 0, 1, ... (rows of T orders, so that the members' accesses to a row
// are contiguous).  An element of the tail is one member's value
// (Lanes<V>::Scalar: a float, or a dual of floats for the Jacobian).  The
// tail's F+ and F- planes are double-buffered: a shift reads one buffer and
// writes the other.  Between the two parts, the
// register team's top member writes its top order into a ghost cell before
// the tail (index -1) and takes the tail's first order when F- moves down.
//
// While the band is below Kr the tail is zero and stays so, and play() runs
// the register part's fast runs (fast_ok()); past it, every event goes the
// general way.  Team policies used with a tail also provide
//   load(p), store(p, x)  a row of the tail: member j's element p[j] (of
//                        type Lanes<V>::Scalar)
//   put_top(p, x)         *p = the top member's x
//   take_top(p)           *p in the top member, 0 elsewhere
//   below_tail(k0, K)     1 where member j's order k0 + j < K, else 0
//   sync()                a barrier of the team
template <class V, int R, bool Complex, class Team>
struct TailStore : RegisterStore<V, R, Complex, Team> {
  using Base = RegisterStore<V, R, Complex, Team>;
  using E = typename Lanes<V>::Scalar;        // an element of the tail
  static constexpr int NP = Complex ? 2 : 1;  // real and imaginary parts
  E* fp[2][NP];  // F+ (buffer, part), each with a ghost cell at -1; buffer 0 is current
  E* fm[2][NP];
  E* z[NP];
  int Kr, T, rows;

  // Rows of the tail for K orders over a team of T members of R orders.
  BLOCHSIM_HD static int tail_rows(int K, int T) { return K > T * R ? (K - T * R + T - 1) / T : 0; }

  // Elements of one tail plane: the rows, a row of zeros on each side (the
  // ghost cell and the F- reads past the last row).
  BLOCHSIM_HD static int64_t plane_floats(int K, int T) { return (tail_rows(K, T) + 2) * static_cast<int64_t>(T); }
  BLOCHSIM_HD static int64_t workspace(int K, int T) { return 5 * NP * plane_floats(K, T); }

  // `work`: workspace(K, T) elements, zero.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void init(const EventStream& stream, const LaneTissue<V>& tissue,
                                             const Team& tm, E* work) {
    Base::init(stream, tissue, tm);
    T = tm.members();
    Kr = T * R;
    Base::truncate = this->K < Kr;  // else the registers hold orders below Kr <= K
    rows = tail_rows(this->K, T);
    const int64_t L = plane_floats(this->K, T);
    int n = 0;
    auto plane = [&]() { return work + (n++) * L + T; };
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < NP; ++c) {
        fp[b][c] = plane();
        fm[b][c] = plane();
      }
    for (int c = 0; c < NP; ++c) z[c] = plane();
  }

  // Rows of the tail holding orders below `band`.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int rows_below(int band) const {
    const int r = band > Kr ? (band - Kr + T - 1) / T : 0;
    return r < rows ? r : rows;
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool fast_ok(int band) const {
    return rows == 0 || band + Base::unroll <= Kr;
  }

  // f(off, f+, Im f+, f-, Im f-, z, Im z) on every tail row below the band,
  // its values loaded before and stored after (off: the row's first element).
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void each_row(int band, F&& f) {
    const Team& tm = this->team;
    for (int i = 0, n = rows_below(band); i < n; ++i) {
      const int off = i * T;
      V a = tm.load(fp[0][0] + off), b = tm.load(fm[0][0] + off), c = tm.load(z[0] + off);
      V ai{}, bi{}, ci{};
      if (Complex) {
        ai = tm.load(fp[0][NP - 1] + off);
        bi = tm.load(fm[0][NP - 1] + off);
        ci = tm.load(z[NP - 1] + off);
      }
      f(off, a, ai, b, bi, c, ci);
      tm.store(fp[0][0] + off, a);
      tm.store(fm[0][0] + off, b);
      tm.store(z[0] + off, c);
      if (Complex) {
        tm.store(fp[0][NP - 1] + off, ai);
        tm.store(fm[0][NP - 1] + off, bi);
        tm.store(z[NP - 1] + off, ci);
      }
    }
  }

  template <class O>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(const O& o, int band) {
    Base::apply(o, band);
    with_pulse(o, [&](auto pulse) {
      each_row(band, [&](int, V& a, V& ai, V& b, V& bi, V& c, V& ci) {
        order_update<Complex, decltype(pulse)::value>(o, a, ai, b, bi, c, ci);
      });
    });
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax_per_order(const IvCoef<V>& c, int band) {
    using LT = Lanes<V>;
    using S = typename LT::Scalar;
    using std::cos;
    using std::exp;
    using std::sin;
    Base::relax_per_order(c, band);
    const V j = this->team.base() * (1.0f / R);  // member index
    each_row(band, [&](int off, V& a, V& ai, V& b, V& bi, V& zz, V& ci) {
      V gc, gs;
      for (int l = 0; l < LT::width; ++l) {
        const float k = static_cast<float>(Kr + off) + value_of(LT::get(j, l));
        const S g = exp(LT::get(c.dlog, l) * k * k), ph = k * LT::get(c.flow, l);
        LT::set(gc, l, g * cos(ph));
        LT::set(gs, l, g * sin(ph));
      }
      relax_order<V, Complex>(c, gc, gs, a, ai, b, bi, zz, ci);
    });
  }

  // One shift (dir = +1: F+ up, F- down) of both parts: the tail's rows go
  // from buffer 0 to buffer 1 (then the buffers swap), the register top's
  // order leaves through the ghost cell and the tail's first order comes
  // down into it.  The register arrays are named, never pointed to, so that
  // they stay in registers.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(int dir, int band) {
    const Team& tm = this->team;
    const bool upward = dir > 0;
    V head[NP];
    tm.sync();  // the tail's last update is complete
    for (int c = 0; c < NP; ++c) {
      const V top = upward ? (c == 0 ? this->pr[R - 1] : this->pi[Base::RI - 1])
                           : (c == 0 ? this->mr[R - 1] : this->mi[Base::RI - 1]);
      tm.put_top((upward ? fp[0][c] : fm[0][c]) - 1, top);
      head[c] = tm.take_top(upward ? fm[0][c] : fp[0][c]);
    }
    tm.sync();  // the ghost cells are written
    const int n = rows_below(band + 1);
    for (int c = 0; c < NP; ++c) {
      const E* up = upward ? fp[0][c] : fm[0][c];
      const E* dn = upward ? fm[0][c] : fp[0][c];
      E* upn = upward ? fp[1][c] : fm[1][c];
      E* dnn = upward ? fm[1][c] : fp[1][c];
      for (int i = 0; i < n; ++i) {
        const int off = i * T;
        // orders past K - 1 are dropped
        tm.store(upn + off, tm.load(up + off - 1) * tm.below_tail(Kr + off, this->K));
        tm.store(dnn + off, tm.load(dn + off + 1));
      }
    }
    for (int c = 0; c < NP; ++c) {
      E* s0 = fp[0][c];
      fp[0][c] = fp[1][c];
      fp[1][c] = s0;
      E* s1 = fm[0][c];
      fm[0][c] = fm[1][c];
      fm[1][c] = s1;
    }
    Base::shift_once(dir, band);
    // the register top takes the tail's first order (the team gave it 0)
    if (upward) {
      this->mr[R - 1] += head[0];
      if (Complex) this->mi[Base::RI - 1] += head[NP - 1];
    } else {
      this->pr[R - 1] += head[0];
      if (Complex) this->pi[Base::RI - 1] += head[NP - 1];
    }
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void spoil(int band) {
    Base::spoil(band);
    const Team& tm = this->team;
    for (int i = 0, n = rows_below(band); i < n; ++i)
      for (int c = 0; c < NP; ++c) {
        tm.store(fp[0][c] + i * T, V{});
        tm.store(fm[0][c] + i * T, V{});
      }
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
// Lanes<V>::width members, R orders each).  Without Tail, K must be at most
// width * R; with it (TailStore, the tail kernel's store) any K.
template <class V, int R, bool Complex, bool Tail = false>
inline int forward_registers_host(const EventStream& s, const Tissue& t, float* out) {
  using Team = LaneTeam<V, R>;
  using Store = std::conditional_t<Tail, TailStore<V, R, Complex, Team>, RegisterStore<V, R, Complex, Team>>;
  constexpr int T = Lanes<V>::width;
  if (!Tail && s.states > T * R) return states_exceed_team;
  // the event records with their run counts, as the device launcher packs them
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  std::vector<float> work;
  if constexpr (Tail) work.resize(static_cast<size_t>(Store::workspace(s.states, T)));
  for (int64_t p = 0; p < t.n; ++p) {
    // every member sees the problem's tissue
    const LaneTissue<float> one = gather<float>(t, &p);
    const LaneTissue<V> lt = splat_tissue<V>(one, [](float x) { return splat<V>(x); });
    Store st;
    if constexpr (Tail) {
      std::fill(work.begin(), work.end(), 0.0f);
      st.init(sr, lt, Team{}, work.data());
    } else {
      st.init(sr, lt, Team{});
    }
    TeamLaneSink<V> sink{out, p, s.n_samples};
    play<V, Complex>(sr, t, lt, st, sink, LaneProblems{p, 0});
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
