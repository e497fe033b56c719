// The pooled EPG's event, written once for every player of it: the
// one-problem player in double precision or on duals (pools/player.hpp:
// per-problem Jacobians, the adjoint's sweeps), blocks of problems on
// vector lanes (pools/lanes.hpp: the host's forward and lane Jacobians, the
// device's one-thread kernel) and one problem over a device team
// (pools/registers.hpp), as epg::play serves the single pool.
//
// A player is a Store: where the orders live and how the per-problem
// operators are formed.  pooled_event asks it for
//   types    V (a state element), C (an operator coefficient), Scale (a
//            per-problem factor: the inversion efficiency), Sat (the
//            semisolid saturation: SingleSaturation<Scale> for the star's
//            one pool, SemisolidSaturation<Scale> for any), Order
//            (PoolOrder<V, N, M>), Step (PoolStep<C, V, N, M, Real, Fixed>);
//   flags    N, M (the most pools an order holds), fixed (n = N and m = M
//            at compile time: unrolled loops, registers on the device),
//            real (the real planes of pooled_real_path), framed (the
//            complex planes held in the frame of the last common pulse,
//            below);
//   n, m     the liquid pools and longitudinal families of the problem;
//   the event's fields  flags(e), interval_of(e), shift_before(e),
//            shift_after(e);
//   orders   each(f): f(k, order) over the orders the store plays
//            (loaded, changed, stored back); transform(f): f(k, in, out)
//            likewise, out stored (f writes all of it); at_zero(k):
//            whether k is order 0 (its sources apply); shift(dir);
//            order_zero(o);
//   operators  interval(iv, step), saturation(e, sat) (false without
//            one), pulse(e, cos a, sin a, cos phi, sin phi),
//            rotations(ca, sa, cp, sp, f) (calls f with the pulse's
//            PoolRotation: a store may pick a cheaper coefficient type),
//            driven(e) (the exact pulse of e as a callable on (order,
//            at order 0)), inversion() (-eta);
//   readout  sample(e, re, im, sink) (F+ summed over the pools at order 0).
#pragma once

#include "operators.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

// A compile-time bool that converts to one (a flag folded away inside a
// pass).
template <bool B>
struct Constant {
  static constexpr bool value = B;
  BLOCHSIM_HD constexpr operator bool() const { return B; }
};

// One event's interval operators in the player's locals (P: n × n complex
// as (re, im) pairs, L: m × m, z0: the recovery r scaled to the store's
// order 0), applied to one order by pool_relax.
template <class C, class V, int N, int M, bool Real, bool Fixed>
struct PoolStep {
  C P[2 * N * N], L[M * M];
  V z0[M];
  int n = N, m = M;

  // x = o after the interval (zero: o is order 0, which gains the recovery)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax(const PoolOrder<V, N, M>& o, PoolOrder<V, N, M>& x, bool zero) const {
    pool_relax<Real, Fixed>(P, L, o, x, zero ? z0 : static_cast<const V*>(nullptr), n, m);
  }
  // P times e^{i t} (t given by its cos c and sin s): the frame's step
  // folded into the interval (it commutes with P).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void turn(const C& c, const C& s) {
    each_index<N * N, Fixed>(n * n, [&](int i) BLOCHSIM_LAMBDA_INLINE {
      const C pr = P[2 * i], pim = P[2 * i + 1];
      P[2 * i] = pr * c - pim * s;
      P[2 * i + 1] = pr * s + pim * c;
    });
  }
};

// Plays event e of the stream on the store st; st.sample passes the
// readout to sink.
//
// The interval, the semisolid saturation and the hard pulse act on each
// order in turn: one pass over the orders when no shift comes between the
// interval and the pulse, else a pass for the interval, the shifts, and a
// pass for the rest.
//
// A framed store holds the complex planes in the frame of the last common
// event's pulse phase theta (F+ stored times e^{-i theta}, F- times
// e^{i theta}; Z and the shifts are unchanged by it).  The interval's P
// commutes with the frame, so the common event (an interval, then a pulse,
// nothing between) folds the step from theta to its own phase phi into P
// (a coefficient a problem) and turns the orders by the cheaper in-phase
// pulse.  Other pulses turn by phi - theta; readouts add theta to the
// receiver; exact pulses leave the frame first.
template <class St, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pooled_event([[maybe_unused]] const EventStream& s, int64_t e, St& st, Sink&& sink) {
  using V = typename St::V;
  using C = typename St::C;
  using Order = typename St::Order;
  constexpr bool Real = St::real, Fixed = St::fixed;
  constexpr int N = St::N, M = St::M;
  const int n = Fixed ? N : st.n;
  const int m = Fixed ? M : st.m;
  const bool bound = m > n;
  const uint32_t f = st.flags(e);
  const int32_t iv = st.interval_of(e);
  typename St::Step step;
  if (iv >= 0) st.interval(iv, step);
  typename St::Sat saturation{};
  const bool sat = bound && st.saturation(e, saturation);
  const bool rf = (f & event_rf) != 0;
  C ca = C{} + 1.0f, sa{}, cp = C{} + 1.0f, sp{};
  if (rf) st.pulse(e, ca, sa, cp, sp);
  const int32_t sb = st.shift_before(e);
  const bool common = sb == 0 && iv >= 0 && rf && !sat;
  if constexpr (St::framed) {
    if (rf) {
      // e^{i (theta - phi)}
      const C rc = st.frame_c * cp + st.frame_s * sp, rs = st.frame_s * cp - st.frame_c * sp;
      if (common) {
        step.turn(rc, rs);
        st.frame_c = cp;
        st.frame_s = sp;
        cp = C{} + 1.0f;
        sp = C{};
      } else {
        cp = rc;
        sp = C{} - rs;
      }
    }
  }

  st.rotations(ca, sa, cp, sp, [&](const auto& rot) BLOCHSIM_LAMBDA_INLINE {
    // the saturation and the pulse on one order; the common event's pass
    // calls it with constants (Constant<true>: a compile-time true), so
    // that its body has no branches between the orders
    auto finish = [&](Order& o, auto saturate, auto turn, auto in_phase) BLOCHSIM_LAMBDA_INLINE {
      if (saturate) saturation.template apply<Real>(o, n);
      if (turn)
        each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
          if constexpr (Real) {
            rot.real(o.ai[j], o.bi[j], o.cr[j]);
          } else if constexpr (decltype(in_phase)::value) {
            rot.in_phase(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
          } else {
            rot.apply(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
          }
        });
    };
    constexpr Constant<true> yes{};
    constexpr Constant<false> no{};
    // the interval (into a second order: no copy back), or a copy, then
    // the rest
    auto pass = [&](bool relax, bool saturate, bool turn) BLOCHSIM_LAMBDA_INLINE {
      st.transform([&](int k, const Order& o, Order& x) BLOCHSIM_LAMBDA_INLINE {
        if (relax)
          step.relax(o, x, st.at_zero(k));
        else
          pool_copy<Fixed>(o, x, n, m);
        finish(x, saturate, turn, no);
      });
    };
    if (common) {
      st.transform([&](int k, const Order& o, Order& x) BLOCHSIM_LAMBDA_INLINE {
        step.relax(o, x, st.at_zero(k));
        finish(x, no, yes, Constant<St::framed>{});
      });
    } else if (sb == 0) {
      if (iv >= 0 || sat || rf) pass(iv >= 0, sat, rf);
    } else {
      if (iv >= 0) pass(true, false, false);
      for (int c = 0; c < (sb > 0 ? sb : -sb); ++c) st.shift(sb > 0 ? 1 : -1);
      if (sat || rf) pass(false, sat, rf);
    }
  });

  if constexpr (!Real) {
    if (f & event_driven) {
      if constexpr (St::framed) {
        // leave the frame: F+ times e^{i theta}, F- times e^{-i theta}
        const C c = st.frame_c, sn = st.frame_s;
        st.each([&](int, Order& o) BLOCHSIM_LAMBDA_INLINE {
          each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
            const V a = o.ar[j], b = o.ai[j], x = o.br[j], y = o.bi[j];
            o.ar[j] = a * c - b * sn;
            o.ai[j] = b * c + a * sn;
            o.br[j] = x * c + y * sn;
            o.bi[j] = y * c - x * sn;
          });
        });
        st.frame_c = C{} + 1.0f;
        st.frame_s = C{};
      }
      const auto drive = st.driven(e);
      st.each([&](int k, Order& o) BLOCHSIM_LAMBDA_INLINE { drive(o, st.at_zero(k)); });
    }
  }
  if (f & event_inversion) {
    const typename St::Scale minus_eta = st.inversion();
    st.each([&](int, Order& o) BLOCHSIM_LAMBDA_INLINE {
      each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
        o.cr[j] = o.cr[j] * minus_eta;
        if constexpr (!Real) o.ci[j] = o.ci[j] * minus_eta;
      });
    });
  }
  if (f & event_readout) {
    Order o;
    st.order_zero(o);
    V re{}, im{};
    each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
      if constexpr (!Real) re += o.ar[j];
      im += o.ai[j];
    });
    if constexpr (St::framed) {  // out of the frame
      const V a = re;
      re = a * st.frame_c - im * st.frame_s;
      im = im * st.frame_c + a * st.frame_s;
    }
    st.sample(e, re, im, sink);
  }
  if (f & event_spoil) {
    st.each([&](int, Order& o) BLOCHSIM_LAMBDA_INLINE {
      each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
        if constexpr (!Real) {
          o.ar[j] = V{};
          o.br[j] = V{};
        }
        o.ai[j] = V{};
        o.bi[j] = V{};
      });
    });
  } else {
    const int32_t sa_ = st.shift_after(e);
    for (int c = 0; c < (sa_ > 0 ? sa_ : -sa_); ++c) st.shift(sa_ > 0 ? 1 : -1);
  }
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
