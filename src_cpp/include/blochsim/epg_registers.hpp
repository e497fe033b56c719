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
//   band_skips           whether members past the band skip the arithmetic
//                        (worth it only where whole warps fall past it)
#pragma once

#include <cmath>

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

  // apply(o), the new F+_0 into (r0, i0), then one shift in direction dir,
  // in one pass: each order's result is assigned straight to the register
  // it shifts into, so the shift costs no register moves.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply_shift(const Op<V>& o, int band, int dir, V& r0, V& i0) {
    if (dir > 0)
      apply_shift_dir<1>(o, band, r0, i0);
    else
      apply_shift_dir<-1>(o, band, r0, i0);
  }

  template <int dir>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply_shift_dir(const Op<V>& o, int band, V& r0, V& i0) {
    V np[R], nm[R], nz[R];
    V npi[RI], nmi[RI], nzi[RI];
    const bool on = !Team::band_skips || team.active(band);
    if (on) {
BLOCHSIM_UNROLL
      for (int r = 0; r < R; ++r) {
        np[r] = pr[r];
        nm[r] = mr[r];
        nz[r] = zr[r];
        V d0{}, d1{}, d2{};
        if (Complex) {
          npi[r < RI ? r : 0] = pi[r < RI ? r : 0];
          nmi[r < RI ? r : 0] = mi[r < RI ? r : 0];
          nzi[r < RI ? r : 0] = zi[r < RI ? r : 0];
        }
        apply_order<V, Complex>(o, np[r], Complex ? npi[r < RI ? r : 0] : d0, nm[r],
                                Complex ? nmi[r < RI ? r : 0] : d1, nz[r], Complex ? nzi[r < RI ? r : 0] : d2);
      }
    } else {
BLOCHSIM_UNROLL
      for (int r = 0; r < R; ++r) {
        np[r] = pr[r];
        nm[r] = mr[r];
        nz[r] = zr[r];
      }
BLOCHSIM_UNROLL
      for (int r = 0; r < RI; ++r) {
        npi[r] = pi[r];
        nmi[r] = mi[r];
        nzi[r] = zi[r];
      }
    }
    const V f = team.first();
    np[0] += f * o.jr;
    nm[0] += f * o.jr;
    nz[0] += f * o.jz;
    if (Complex) {
      npi[0] += f * o.ji;
      nmi[0] -= f * o.ji;
    }
    r0 = np[0];
    i0 = Complex ? npi[0] : V{};
BLOCHSIM_UNROLL
    for (int r = 0; r < R; ++r) zr[r] = nz[r];
    if (Complex) {
BLOCHSIM_UNROLL
      for (int r = 0; r < RI; ++r) zi[r] = nzi[r];
    }
    if (dir > 0) {
      place(np, nm, pr, mr);
      pr[0] += f * mr[0];  // F+_0 = conj(F-_0) in member 0
      if (Complex) {
        place(npi, nmi, pi, mi);
        pi[0] -= f * mi[0];
      }
    } else {
      place(nm, np, mr, pr);
      mr[0] += f * pr[0];
      if (Complex) {
        place(nmi, npi, mi, pi);
        mi[0] -= f * pi[0];
      }
    }
  }

  // up <- new_up one order up, dn <- new_dn one order down, across the team.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void place(const V* new_up, const V* new_dn, V* up, V* dn) {
    up[0] = team.from_below(new_up[R - 1]);
BLOCHSIM_UNROLL
    for (int r = 1; r < R; ++r) up[r] = new_up[r - 1];
BLOCHSIM_UNROLL
    for (int r = 0; r + 1 < R; ++r) dn[r] = new_dn[r + 1];
    dn[R - 1] = team.from_above(new_dn[0]);
    if (truncate) {
BLOCHSIM_UNROLL
      for (int r = 0; r < R; ++r) up[r] *= team.below(r, K);
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
    play<V, Complex>(s, t, lt, st, sink);
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
