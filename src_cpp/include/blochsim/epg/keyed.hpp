// The moment-keyed EPG: for sequences whose gradient moments one EPG order
// cannot hold (several axes that dephase independently, moments with no
// common unit), each state is keyed by its gradient moment vector k (the
// discrete EPG of the literature: Weigel, J. Magn. Reson. Imaging 41, 2015,
// §"Arbitrary gradients"; the phase graph of Endres et al., Magn. Reson.
// Med. 2023, keys states the same way).
//
// The states held are slots, one per key k of a half-space (k = 0 first),
// each the triple (F+(k), F-(k), Z(k)) with F-(k) = conj(F+(-k)), as the
// one-order kernel holds its orders (epg.hpp), so that relaxation, pulses,
// inversions and readouts are the same per-slot arithmetic (interval_coef,
// pulse_op, apply_order, take_readout).  Where the one-order kernel shifts
// its orders, a keyed program applies a map: the state after it is a sparse
// sum of components of the state before it (a moment moves F+(k) to
// F+(k + m), which lands in the F- of slot -(k + m), conjugated, when
// k + m leaves the half-space; keys that meet are summed; a spoil keeps the
// Z of each slot).  The keys, their merging within the voxel's tolerance
// and the pruning of states below a bound are decided once per sequence on
// the host (blochsim/sequence/keyed.py); the same maps serve every problem.
#pragma once

#include <cstdint>

#include <type_traits>

#include "../dual.hpp"
#include "../events.hpp"
#include "epg.hpp"
#include "jacobian.hpp"

namespace blochsim {

// The maps of a keyed program over an EventStream of n_events: map 2e is
// applied after event e's interval and before its pulse (its shift
// before), map 2e + 1 after its readout (its shift after, or spoil).  A map
// writes `slots[m]` slots; entry j adds component src[j] of the state
// before the map into component dst[j] of the state after it.  Components
// are numbered as the workspace holds them: 6 s + c for slot s, with c = 0,
// 1 the real and imaginary parts of F+, 2, 3 of F-, 4, 5 of Z; an entry
// names the real part (c even), and moves the imaginary part with it.  A
// negative source -1 - i takes component i conjugated.  A destination with
// its lowest bit set (c + 1) is written, not added to: a component's first
// entry; every component a map reaches is written before anything is
// added to it, and reach[] says which: per map with slots, one byte a slot
// (bit 0 F+, bit 1 F-, bit 2 Z), the maps' bytes in order.  A component a
// map does not reach is zero and is not stored (a pulse and a readout
// take it as zero; no map reads it); the origin's Z is always reached.
// slots[m] = -1: the map is the identity (no entries).
struct KeyedProgram {
  int64_t n_events = 0;
  int32_t max_slots = 1;               // the most slots any map writes (and 1)
  const int32_t* slots = nullptr;      // (2 n_events,)
  const int64_t* first = nullptr;      // (2 n_events + 1,) map m's entries: [first[m], first[m + 1])
  const int32_t* dst = nullptr;        // (entries,)
  const int32_t* src = nullptr;        // (entries,)
  int64_t n_reach = 0;                 // the slots of every map with slots, summed
  const uint8_t* reach = nullptr;      // (n_reach,)
  // Optional, for diffusion: the squared wavenumber |2 pi k|^2 ((rad/m)^2)
  // of each slot after map m at k2[k2_first[m] + slot] (n_k2 values in
  // all); null: no problem diffuses (a tissue with D is refused).
  int64_t n_k2 = 0;
  const double* k2 = nullptr;
  const int64_t* k2_first = nullptr;  // (2 n_events,)
};

// Checks a program against its stream: sizes, and every entry within the
// slots before and after its map.  Returns a Status.
inline int validate_keyed(const EventStream& s, const KeyedProgram& k) {
  if (k.n_events != s.n_events || k.max_slots < 1) return bad_shape;
  if (k.n_events == 0) return ok;
  if (!k.slots || !k.first || k.first[0] != 0) return bad_shape;
  int64_t before = 1, reached = 0;
  for (int64_t m = 0; m < 2 * k.n_events; ++m) {
    const int64_t a = k.first[m], b = k.first[m + 1];
    if (b < a) return bad_shape;
    if (k.slots[m] < 0) {
      if (b != a) return bad_shape;
      continue;
    }
    if (!k.reach || reached + k.slots[m] > k.n_reach || !(k.reach[reached] & 4)) return bad_shape;
    reached += k.slots[m];
    if (k.slots[m] < 1 || k.slots[m] > k.max_slots) return bad_shape;
    if (k.k2 && (!k.k2_first || k.k2_first[m] < 0 || k.k2_first[m] + k.slots[m] > k.n_k2)) return bad_shape;
    if (b > a && (!k.dst || !k.src)) return bad_shape;
    for (int64_t j = a; j < b; ++j) {
      const int64_t d = k.dst[j] & ~int64_t{1};
      if (d < 0 || d >= 6 * static_cast<int64_t>(k.slots[m])) return bad_shape;
      const int64_t r = k.src[j] < 0 ? -1 - static_cast<int64_t>(k.src[j]) : k.src[j];
      if (r % 2 != 0 || r >= 6 * before) return bad_shape;
    }
    before = k.slots[m];
  }
  return reached == k.n_reach ? ok : bad_shape;
}

// Whether the program can play tissue t (diffusion needs the slots'
// wavenumbers).
inline int keyed_plays(const KeyedProgram& k, const Tissue& t) {
  return t[field_D].present() && !k.k2 ? bad_shape : ok;
}

// Lane vectors a block's workspace holds: two states of max_slots slots,
// then the stream's interval coefficients (6 a distinct interval).
inline int64_t keyed_workspace(const EventStream& s, const KeyedProgram& k) {
  return 12 * static_cast<int64_t>(k.max_slots) + 6 * s.n_intervals;
}

inline namespace BLOCHSIM_ISA {
namespace epg {

// A keyed state's components strided in memory (the device's layout: one
// thread a problem, component c of every problem's state in a row, so that
// a warp's reads are coalesced).
template <class V>
struct StridedBuffer {
  V* p;
  int64_t stride;
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V& operator[](int64_t i) const { return p[i * stride]; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE StridedBuffer operator+(int64_t i) const { return {p + i * stride, stride}; }
};

// Play a keyed program for the lane vector V of problems whose tissue is
// lt (V may be a dual: its tangents are carried through), the state in two
// buffers a and b of 6 max_slots components each (V* or StridedBuffer<V>),
// each readout handed to sink.write(slot, re, im).  M is the precision of
// the interval exponentials; ivt, when not null, holds them for every
// interval of the stream (6 lane vectors each, store_coef's layout), else
// they are computed when the interval changes.  Flow is not played (the Python layer refuses
// it first); pools play through pools/keyed.hpp.
template <class V, class M, class Buf, class Sink>
BLOCHSIM_HD void keyed_play(const EventStream& s, const KeyedProgram& k, const Tissue& t, const LaneTissue<V>& lt,
                            Buf a, Buf b, Sink& sink, const V* ivt = nullptr) {
  PlayContext<V> cx;
  cx.rf_uniform = !t[field_B1].present() && !t[field_B1phase].present();
  cx.per_order = false;
  cx.c0 = 1.0f;
  cx.s0 = 0.0f;
  cx.m0 = lt[field_M0];
  int64_t n = 1;
  for (int i = 0; i < 6; ++i) a[i] = V{};
  a[4] = splat<V>(1.0f);  // Z(0) = 1: equilibrium
  const bool diffuses = t[field_D].present();
  IvCoef<V> cached{};
  int64_t cached_iv = -1;
  // the components the state holds: every one (null), or the last map's
  // reach (bit 0 F+, 1 F-, 2 Z a slot); reach: the next map's
  const uint8_t* mask = nullptr;
  const uint8_t* reach = k.reach;
  const double* k2 = nullptr;  // the slots' |2 pi k|^2 (slot 0 alone: k = 0 needs none)
  // Map m from a into b, which becomes the state; with c, the interval's
  // relaxation applied to each component as the map reads it (q F+,
  // conj(q) F-, E1 Z) and the recovery added to the origin's Z after (the
  // builder keeps the origin's Z after every interval), one pass instead
  // of two.
  auto map = [&](int64_t m, const IvCoef<V>* c) {
    const int64_t nn = k.slots[m];
    if (nn < 0) return;
    if (diffuses) k2 = k.k2 + k.k2_first[m];
    const int64_t j0 = k.first[m], j1 = k.first[m + 1];
    if (c) {
      // per source (F+, F-, Z) and whether it is conjugated: the moved
      // (re, im) = (ca re + cb im, cc im + cd re)
      V ca[6], cb[6], cc[6], cd[6];
      const V cr[3] = {c->qr, c->qr, c->e1}, ci[3] = {c->qi, V{} - c->qi, V{}};
      for (int q = 0; q < 3; ++q) {
        ca[2 * q] = ca[2 * q + 1] = cr[q];
        cb[2 * q] = cb[2 * q + 1] = V{} - ci[q];
        cc[2 * q] = cr[q];
        cd[2 * q] = ci[q];
        cc[2 * q + 1] = V{} - cr[q];
        cd[2 * q + 1] = V{} - ci[q];
      }
      for (int64_t j = j0; j < j1; ++j) {
        const int32_t d = k.dst[j], r = k.src[j];
        const int32_t w = d & ~1;
        const int32_t from = r >= 0 ? r : -1 - r;
        const int q = from % 6 + (r < 0);
        const V re = a[from], im = a[from + 1];
        const V x = ca[q] * re + cb[q] * im, y = cc[q] * im + cd[q] * re;
        if (d & 1) {
          b[w] = x;
          b[w + 1] = y;
        } else {
          b[w] = b[w] + x;
          b[w + 1] = b[w + 1] + y;
        }
      }
      b[4] = b[4] + c->rec;
    } else {
      for (int64_t j = j0; j < j1; ++j) {
        const int32_t d = k.dst[j], r = k.src[j];
        const int32_t w = d & ~1;
        const int32_t from = r >= 0 ? r : -1 - r;
        const V x = a[from], y = r >= 0 ? a[from + 1] : V{} - a[from + 1];
        if (d & 1) {
          b[w] = x;
          b[w + 1] = y;
        } else {
          b[w] = b[w] + x;
          b[w + 1] = b[w + 1] + y;
        }
      }
    }
    const Buf spare = a;
    a = b;
    b = spare;
    n = nn;
    mask = reach;
    reach += nn;
  };
  // An interval's relaxation is pending until the next pass over the slots
  // (a map, or a pulse's loop) applies it as it reads them (intervals
  // before that compose); a readout before that reads the origin relaxed.
  // Relaxation commutes with the maps (q on F+, conj(q) on F-, e1 on Z,
  // the origin's Z kept).
  auto relax = [&](const IvCoef<V>& c, int64_t iv) {
    for (int64_t j = 0; j < n; ++j) {
      const Buf x = a + 6 * j;
      const V pr = x[0], pi_ = x[1], mr = x[2], mi = x[3];
      x[0] = c.qr * pr - c.qi * pi_;  // q F+
      x[1] = c.qr * pi_ + c.qi * pr;
      x[2] = c.qr * mr + c.qi * mi;  // conj(q) F-
      x[3] = c.qr * mi - c.qi * mr;
      x[4] = c.e1 * x[4];
      x[5] = c.e1 * x[5];
    }
    if (diffuses && k2) {
      // each slot (and its Z) loses e^{-D |2 pi k|^2 tau} over the interval
      using LT = Lanes<V>;
      using S = typename LT::Scalar;
      using Wd = typename LT::template Wide<M>;  // M, or its dual on a dual lane type
      const M tau = static_cast<M>(s.duration_s[iv]);
      for (int64_t j = 1; j < n; ++j) {
        V g;
        for (int l = 0; l < LT::width; ++l) {
          using std::exp;
          const Wd Dl = static_cast<Wd>(LT::get(lt[field_D], l));
          LT::set(g, l, static_cast<S>(exp(-Dl * (tau * static_cast<M>(k2[j])))));
        }
        const Buf x = a + 6 * j;
        for (int i = 0; i < 6; ++i) x[i] = g * x[i];
      }
    }
    a[4] = a[4] + c.rec;
  };
  // the relaxation pending: the intervals since the last pass, composed
  IvCoef<V> pend{};
  bool pending = false;
  for (int64_t e = 0; e < s.n_events; ++e) {
    const EventRecord ev = load_event(s, e);
    if (ev.interval >= 0) {
      if (ev.interval != cached_iv) {
        cached = ivt ? load_coef(ivt + 6 * ev.interval) : interval_coef<V, M>(s, lt, ev.interval);
        cached_iv = ev.interval;
      }
      if (diffuses) {
        // a slot's diffusion needs its wavenumber before the map: at once
        relax(cached, cached_iv);
      } else if (pending) {
        // q1 then q2 is q1 q2; Z0 = e1_2 (e1_1 Z0 + rec_1) + rec_2
        const V qr = pend.qr * cached.qr - pend.qi * cached.qi, qi = pend.qr * cached.qi + pend.qi * cached.qr;
        pend.qr = qr;
        pend.qi = qi;
        pend.rec = cached.e1 * pend.rec + cached.rec;
        pend.e1 = pend.e1 * cached.e1;
      } else {
        pend = cached;
        pending = true;
      }
    }
    if (k.slots[2 * e] >= 0) {
      map(2 * e, pending ? &pend : nullptr);
      pending = false;
    }
    if (ev.flags & (event_rf | event_inversion)) {
      const Op<V> o =
          (ev.flags & event_rf) ? pulse_op<V, true>(s, ev, cx.rf_uniform, lt, 1.0f, 0.0f) : inversion_op<V>(lt);
      const IvCoef<V>& c = pend;
      for (int64_t j = 0; j < n; ++j) {
        const Buf x = a + 6 * j;
        V fpr = x[0], fpi = x[1], fmr = x[2], fmi = x[3], zr = x[4], zi = x[5];
        if (mask) {
          const uint8_t r = mask[j];
          if (!(r & 1)) fpr = fpi = V{};
          if (!(r & 2)) fmr = fmi = V{};
          if (!(r & 4)) zr = zi = V{};
        }
        if (pending) {
          const V pr = fpr, mr = fmr;
          fpr = c.qr * pr - c.qi * fpi;
          fpi = c.qr * fpi + c.qi * pr;
          fmr = c.qr * mr + c.qi * fmi;
          fmi = c.qr * fmi - c.qi * mr;
          zr = c.e1 * zr;
          zi = c.e1 * zi;
          if (j == 0) zr = zr + c.rec;
        }
        apply_order<V, true>(o, fpr, fpi, fmr, fmi, zr, zi);
        x[0] = fpr;
        x[1] = fpi;
        x[2] = fmr;
        x[3] = fmi;
        x[4] = zr;
        x[5] = zi;
      }
      pending = false;
      mask = nullptr;
    }
    if (ev.flags & event_readout) {
      V f0r = a[0], f0i = a[1];
      if (mask && !(mask[0] & 1)) f0r = f0i = V{};
      if (pending) {
        const V r = f0r;
        f0r = pend.qr * r - pend.qi * f0i;
        f0i = pend.qr * f0i + pend.qi * r;
      }
      take_readout<V, true>(s, e, ev, cx, f0r, f0i, sink);
    }
    if (k.slots[2 * e + 1] >= 0) {
      map(2 * e + 1, pending ? &pend : nullptr);
      pending = false;
    }
  }
}

// The host's block: problems [first, first + width) of t with
// keyed_workspace(k) lane vectors in `work`.
template <class V, class M = double>
BLOCHSIM_HD int keyed_block(const EventStream& s, const KeyedProgram& k, const Tissue& t, int64_t first, V* work,
                            float* out) {
  constexpr int W = Lanes<V>::width;
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  const LaneTissue<V> lt = gather<V>(t, idx);
  LaneSink<V> sink{out, first, t.n, s.n_samples};
  V* const ivt = work + 12 * static_cast<int64_t>(k.max_slots);
  for (int64_t i = 0; i < s.n_intervals; ++i) store_coef(ivt + 6 * i, interval_coef<V, M>(s, lt, i));
  keyed_play<V, M, V*>(s, k, t, lt, work, work + 6 * static_cast<int64_t>(k.max_slots), sink, ivt);
  sink.flush();
  return ok;
}

// The device's thread: problem `first` of t, its state in strided buffers.
template <class M>
BLOCHSIM_HD void keyed_thread(const EventStream& s, const KeyedProgram& k, const Tissue& t, int64_t first,
                              StridedBuffer<float> a, StridedBuffer<float> b, float* out) {
  int64_t idx[1] = {first};
  const LaneTissue<float> lt = gather<float>(t, idx);
  LaneSink<float> sink{out, first, t.n, s.n_samples};
  keyed_play<float, M>(s, k, t, lt, a, b, sink);
  sink.flush();
}

// Signal and tissue Jacobian of problems [first, first + width) of t along
// fields[0 .. n_dirs) (dual_directions <= N; M0 from the unscaled signal, as
// jacobian_block) into columns [first_dir, first_dir + n_dirs) of jac's
// jac_dirs, the state and the interval table on duals in `work`
// (keyed_workspace dual lane vectors): jac as host_jacobian_dispatch.
template <class V, int N>
BLOCHSIM_HD int keyed_jacobian_block(const EventStream& s, const KeyedProgram& k, const Tissue& t,
                                     const int* fields, int n_dirs, int64_t first, Dual<V, N>* work, float* out,
                                     float* jac, const float* seeds, int jac_dirs, int first_dir) {
  using T = Dual<V, N>;
  const DirectionSlots ds(fields, n_dirs, seeds);
  V m0;
  const LaneTissue<T> lt = seeded_lanes<V, N>(t, first, ds, m0);
  JacobianSink<V, N> sink{out, jac, first, t.n, s.n_samples, n_dirs,
                          ds.m0_col, ds.slot, m0, ds.m0_seed, jac_dirs, first_dir};
  T* const ivt = work + 12 * static_cast<int64_t>(k.max_slots);
  for (int64_t i = 0; i < s.n_intervals; ++i) store_coef(ivt + 6 * i, interval_coef<T, double>(s, lt, i));
  keyed_play<T, double, T*>(s, k, t, lt, work, work + 6 * static_cast<int64_t>(k.max_slots), sink, ivt);
  sink.flush();
  return ok;
}

// The Jacobian of blocks [b0, b1) of lane vectors V, the dual width picked
// at run time, in passes (as jacobian_range).
template <class V>
inline int keyed_jacobian_range(const EventStream& s, const KeyedProgram& k, const Tissue& t, const int* fields,
                                int n_dirs, int64_t b0, int64_t b1, void* work, float* out, float* jac,
                                const float* seeds) {
  return jacobian_passes(fields, n_dirs, [&](int a, int b, auto width) {
    constexpr int N = decltype(width)::value;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int st = keyed_jacobian_block<V, N>(s, k, t, fields + a, b - a, blk * Lanes<V>::width,
                                                static_cast<Dual<V, N>*>(work), out, jac, seeds ? seeds + a : nullptr,
                                                n_dirs, a);
      if (st != ok) return st;
    }
    return static_cast<int>(ok);
  });
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
