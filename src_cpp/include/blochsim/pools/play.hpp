// The pooled EPG's event loop, written once for every player of it, as
// epg::play is for the single pool: the order of an event's parts (SPEC §2:
// the interval, the shifts before, the semisolid pool's saturation and the
// hard pulse, an exact pulse, an inversion, the readout, then the spoil or
// the shifts after) and which of them go over the orders in one pass.  The
// physics of each part on one order is pools.hpp's (pool_relax,
// PoolRotation, pool_drive); a Store keeps the orders and forms the
// event's operators:
//   - PoolPlayer (pools/player.hpp): one problem over a scalar (double, or
//     duals for the Jacobian and the adjoint), its orders in memory;
//   - LaneStore (pools/lanes.hpp): a block of problems in the lanes of a
//     vector, sliding rows in memory (the host, and one device thread a
//     problem);
//   - PooledTeam (pools/registers.hpp): one problem over a team of device
//     threads, its orders in registers.
//
// A Store provides flags(e), shift_before(e), shift_after(e); step(e, fused)
// (the event's operators, a Step below); orders(f), which calls f(k, o) for
// every order k it holds, o the order in locals (PoolOrder), written back
// after; shift(dir), drive(e), invert(), readout(e, sink) and spoil().
//
// A Step holds what the event does before its exact pulse: relaxes (an
// interval), saturates (the semisolid pool's saturation), rotates (a hard
// pulse), and
//   relax(k, o)       o after the interval (the recovery at order 0)
//   saturate(o)       the semisolid Z of o times the decay
//   with_turn(f)      calls f(turn), turn(o) the hard pulse on o; the Store
//                     picks the form (real planes, in phase, any phase)
//                     once for the event, outside the loop over the orders.
#pragma once

#include "pools.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

// The hard pulse r on the liquid pools of one order: on the real planes,
// at phase 0 in the store's frame (InPhase), or at any phase.
template <bool Real, bool InPhase = false>
struct PoolTurn {
  template <class R, class O>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE static void on(const R& r, O& o, int n) {
BLOCHSIM_UNROLL
    for (int j = 0; j < n; ++j) {
      if constexpr (Real) {
        r.real(o.ai[j], o.bi[j], o.cr[j]);
      } else if constexpr (InPhase) {
        r.in_phase(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
      } else {
        r.apply(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
      }
    }
  }
};

// Event e of the stream on the Store st; sink takes its readout.
template <class Store, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pooled_event(int64_t e, Store& st, Sink& sink) {
  const uint32_t f = st.flags(e);
  const int32_t sb = st.shift_before(e);
  const auto step = st.step(e, sb == 0);
  if (sb == 0) {
    if (step.relaxes && step.rotates && !step.saturates) {
      // the common event: relaxation and pulse in one pass, without branches
      step.with_turn([&](const auto& turn) BLOCHSIM_LAMBDA_INLINE {
        st.orders([&](int k, auto& o) BLOCHSIM_LAMBDA_INLINE {
          step.relax(k, o);
          turn(o);
        });
      });
    } else if (step.relaxes || step.saturates || step.rotates) {
      step.with_turn([&](const auto& turn) BLOCHSIM_LAMBDA_INLINE {
        st.orders([&](int k, auto& o) BLOCHSIM_LAMBDA_INLINE {
          if (step.relaxes) step.relax(k, o);
          if (step.saturates) step.saturate(o);
          if (step.rotates) turn(o);
        });
      });
    }
  } else {
    if (step.relaxes) st.orders([&](int k, auto& o) BLOCHSIM_LAMBDA_INLINE { step.relax(k, o); });
    for (int c = 0; c < (sb > 0 ? sb : -sb); ++c) st.shift(sb > 0 ? 1 : -1);
    if (step.saturates || step.rotates) {
      step.with_turn([&](const auto& turn) BLOCHSIM_LAMBDA_INLINE {
        st.orders([&](int, auto& o) BLOCHSIM_LAMBDA_INLINE {
          if (step.saturates) step.saturate(o);
          if (step.rotates) turn(o);
        });
      });
    }
  }
  if (f & event_driven) st.drive(e);
  if (f & event_inversion) st.invert();
  if (f & event_readout) st.readout(e, sink);
  if (f & event_spoil) {
    st.spoil();
  } else {
    const int32_t sa = st.shift_after(e);
    for (int c = 0; c < (sa > 0 ? sa : -sa); ++c) st.shift(sa > 0 ? 1 : -1);
  }
}

// Every event of the stream on st.
template <class Store, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pooled_play(const EventStream& s, Store& st, Sink& sink) {
  for (int64_t e = 0; e < s.n_events; ++e) pooled_event(e, st, sink);
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
