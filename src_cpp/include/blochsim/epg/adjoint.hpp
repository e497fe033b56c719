// Reverse mode: the gradient of a real loss of the samples with respect to
// every event's duration, flip, phase and receiver phase (summed over the
// problems, which share the sequence) and to tissue properties (per
// problem), by an adjoint sweep back through the events (SPEC §4).
//
// The loss enters through its cotangent g = dL/dRe s + i dL/dIm s per
// sample, so dL = sum Re(conj(g) ds).  The EPG state x is real-linear in the
// state before each event; with the pairing <lambda, x> = sum over every
// real component of lambda x, the adjoint lambda_e (dL/dx before event e)
// is the transpose of the event's map applied to lambda_{e+1}, plus the
// readout's g M0 e^{i rx} at F+_0 (Giles & Pierce, An introduction to the
// adjoint approach to design, Flow Turbul. Combust. 65:393, 2000).  The
// transposes, per order:
//   - a pulse or interval operator (epg/epg.hpp Op, complex-linear per order)
//     is again an Op: P' = conj P, A' = A, B' = conj C, C' = conj B, no source;
//   - free evolution with diffusion and flow: the same recurrence with
//     conjugate phases and no recovery;
//   - a shift: the opposite shift, with F+_0 <- conj F-_0 read backwards;
//   - a spoil: the transverse adjoint is zeroed.
// The gradient with respect to a parameter p of event e is
// <lambda_{e+1}, d event_e(x_e) / dp> plus the readout's term; the
// derivatives come from playing event e once on dual numbers (dual.hpp)
// seeded in its duration, flip and phase and in the tissue directions.
//
// Memory is bounded by checkpointing (Griewank & Walther, Evaluating
// Derivatives, 2nd ed., SIAM 2008, ch. 12): a first pass keeps the state at
// the start of every C-th event (C = ceil(sqrt(events))), and the sweep
// replays one segment of C events at a time from its checkpoint, so a
// problem holds about 2 sqrt(events) states instead of one per event.
//
// The sweep runs on the complex planes whatever the stream's real-subspace
// verdict (the results agree to float32 round-off).
//
// Second order (forward over reverse): on lanes V = Dual<vector, 1> seeded
// in one tissue field theta, every quantity of the sweep carries its
// derivative along theta, so the event gradients of a cotangent W come out
// with d/dtheta <W, d s/d p> as their tangent: with W = dC/dJ_theta for a
// cost C of the Jacobian column J_theta = d s / d theta, that is the
// gradient of C through J_theta (adjoint2_range).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../dual.hpp"
#include "epg.hpp"
#include "jacobian.hpp"

namespace blochsim {

// Per-event gradient columns: d L / d (duration_s, flip_rad, phase_rad,
// rx_phase_rad) of each event; the flip is the nominal one (before B1).
enum EventGradient : int { grad_duration = 0, grad_flip, grad_phase, grad_rx, event_gradients };

// Dual directions of the per-event pass: duration, flip, phase, then the
// tissue directions.
constexpr int adjoint_event_dirs = 3;

// Dual widths the adjoint is compiled for, given the tissue directions it
// carries as duals (every requested field but M0, which is analytic).
inline int adjoint_width(int tissue_duals) {
  return tissue_duals == 0 ? adjoint_event_dirs : tissue_duals <= 2 ? adjoint_event_dirs + 2
                                                                    : adjoint_event_dirs + tissue_fields - 1;
}

// Events per checkpoint segment: ceil(sqrt(n_events)), at least 1.
BLOCHSIM_HD inline int64_t checkpoint_stride(int64_t n_events) {
  int64_t c = static_cast<int64_t>(std::sqrt(static_cast<double>(n_events)));
  while (c * c < n_events) ++c;
  return c > 0 ? c : 1;
}

// The band (orders that can be non-zero) at the start of each event,
// band[0 .. n_events]; a function of the sequence only.
inline void band_starts(const EventStream& s, int32_t* band) {
  const int K = s.states;
  int b = 1;
  for (int64_t e = 0; e < s.n_events; ++e) {
    band[e] = b;
    const int32_t sb = s.shift_before[e], sa = s.shift_after[e];
    int shifts = sb > 0 ? sb : -sb;
    if (!(s.flags[e] & event_spoil)) shifts += sa > 0 ? sa : -sa;
    b = b + shifts < K ? b + shifts : K;
  }
  band[s.n_events] = b;
}

inline namespace BLOCHSIM_ISA {
namespace epg {

// The adjoint's workspace per problem block, in lane vectors, in two
// parts: the hot one, touched at every step of every event (the state, the
// adjoint and the dual state, 6 K (N + 3)), which the device may hold in
// local memory, and the cold one (the interval table, the checkpoints and
// the segment being walked back).
BLOCHSIM_HD inline int64_t adjoint_hot(int states, int N) { return 6 * static_cast<int64_t>(states) * (N + 3); }

BLOCHSIM_HD inline int64_t adjoint_cold(const EventStream& s, int N) {
  const int64_t plane = 6 * static_cast<int64_t>(s.states);
  const int64_t c = checkpoint_stride(s.n_events);
  const int64_t n_ckpt = (s.n_events + c - 1) / c;
  // the interval table in values and in duals, checkpoints, segment
  return 6 * s.n_intervals * (N + 2) + plane * (n_ckpt + c);
}

// Both parts, on duals of N directions (the hot part first).
BLOCHSIM_HD inline int64_t adjoint_workspace(const EventStream& s, int N) {
  return adjoint_hot(s.states, N) + adjoint_cold(s, N);
}

// One event on complex planes, without fusing: its interval (c, or none),
// shifts before, operator (o, or none), readout (read(f0r, f0i)), spoil or
// shifts after.  band is advanced as play() advances it.
template <class V, class Store, class Read>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void step_event(const EventRecord& ev, bool per_order, int K, Store& st,
                                                 const IvCoef<V>* c, const Op<V>* o, int& band, Read&& read) {
  if (c) {
    if (per_order)
      st.relax_per_order(*c, band);
    else
      st.apply(fuse<V, true>(identity_op<V>(), *c), band);
  }
  const int32_t sb = ev.shift_before, sa = ev.shift_after;
  for (int i = 0; i < (sb > 0 ? sb : -sb); ++i) {
    st.shift_once(sb > 0 ? 1 : -1, band);
    band = band < K ? band + 1 : K;
  }
  if (o) st.apply(*o, band);
  if (ev.flags & event_readout) read(st.f0r(), st.f0i());
  if (ev.flags & event_spoil) {
    st.spoil(band);
  } else {
    for (int i = 0; i < (sa > 0 ? sa : -sa); ++i) {
      st.shift_once(sa > 0 ? 1 : -1, band);
      band = band < K ? band + 1 : K;
    }
  }
}

// The transpose of an Op without its source (see the top of this file).
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> transpose(const Op<V>& o) {
  Op<V> t{};
  t.pr = o.pr;
  t.pi = -o.pi;
  t.ar = o.ar;
  t.ai = o.ai;
  t.br = o.cr;
  t.bi = -o.ci;
  t.cr = o.br;
  t.ci = -o.bi;
  t.ca = o.ca;
  return t;
}

// The transpose of one shift in direction dir, on the adjoint planes a.
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_transpose(PlaneStore<V, true>& a, int dir) {
  const int K = a.K;
  Plane<V>& upr = dir > 0 ? a.fpr : a.fmr;
  Plane<V>& dnr = dir > 0 ? a.fmr : a.fpr;
  Plane<V>& upi = dir > 0 ? a.fpi : a.fmi;
  Plane<V>& dni = dir > 0 ? a.fmi : a.fpi;
  // forward: up_k <- up_{k-1}, dn_k <- dn_{k+1}, then up_0 <- conj(dn_0)
  const V r0 = upr[0], i0 = upi[0];
  upr.shift_down(K);
  upi.shift_down(K);
  dnr.shift_up(K, K);
  dni.shift_up(K, K);
  dnr[0] = V{};
  dni[0] = V{};
  if (K > 1) {
    dnr[1] += r0;
    dni[1] -= i0;
  }
}

// (cos, sin) of the receiver phase of event e.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rx_phase(const EventStream& s, int64_t e, const EventRecord& ev, float& cr,
                                                float& sr) {
  if (has_rf_rows(s)) {
    cr = ev.rf[rft_cos_rx];
    sr = ev.rf[rft_sin_rx];
  } else {
    cr = std::cos(s.rx_phase_rad[e]);
    sr = std::sin(s.rx_phase_rad[e]);
  }
}

// Seeds direction 0 of the value part of every dual of a lane tissue of
// duals of duals with the field f (the outer direction of second order).
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void seed_outer(LaneTissue<Dual<V, N>>& lt, int f) {
  using E = std::remove_reference_t<decltype(lt[0].v.d[0])>;
  for (int g = 0; g < tissue_fields; ++g)
    if (g == f) lt[g].v.d[0] = splat<E>(1.0f);
}

// Adjoint sweep of problems [first, first + width) of t.
//   fields[0 .. n_tdirs): tissue fields whose gradient is wanted, written to
//     tgrad[p * n_tdirs + j] (per SI unit); at most N - 3 of them other
//     than M0.
//   cot: the complex64 interleaved cotangent, sample `slot` of problem p at
//     cot[(p * cot_stride + slot) * 2] (cot_stride = n_samples: a (t.n,
//     n_samples) array; n_dirs * n_samples: one direction of a Jacobian's).
//   band: band_starts() of the stream.
//   acc(e, g): receives, for each event from the last to the first, the
//     lane vectors g[EventGradient] of this block's contributions (lanes
//     past t.n are zero).
// hot, cold: adjoint_hot(s.states, N) and adjoint_cold(s, N) lane vectors.
// outer_field >= 0 (V a Dual<vector, 1>): the tissue is seeded in that field
// at the lanes' level (second order, see the top of this file).
template <class V, int N, class Acc>
BLOCHSIM_HD inline int adjoint_block(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs,
                                     int64_t first, V* hot, V* cold, const float* cot, int64_t cot_stride,
                                     const int32_t* band, Acc& acc, float* tgrad, int outer_field = -1) {
  using LT = Lanes<V>;
  using T = Dual<V, N>;
  constexpr int W = LT::width;
  const int K = s.states;
  const int64_t n = s.n_events;
  const int64_t plane = 6 * static_cast<int64_t>(K);
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  V valid{};
  for (int l = 0; l < W; ++l) LT::set(valid, l, first + l < t.n ? 1.0f : 0.0f);

  LaneTissue<V> lt = gather<V>(t, idx);
  // the tissue with its dual directions seeded (3 + j for the j-th field
  // other than M0)
  LaneTissue<T> ltd = gather<T>(t, idx);
  if constexpr (IsDual<V>::value) {
    if (outer_field >= 0) {
      seed(lt, outer_field, 0);
      seed_outer(ltd, outer_field);
    }
  }
  int dual_of[tissue_fields];
  int m0_dir = -1, nd = 0;
  for (int j = 0; j < n_tdirs; ++j) {
    if (fields[j] == field_M0) {
      m0_dir = j;
      dual_of[j] = -1;
    } else {
      if (adjoint_event_dirs + nd >= N) return bad_shape;
      seed(ltd, fields[j], adjoint_event_dirs + nd);
      dual_of[j] = adjoint_event_dirs + nd++;
    }
  }
  const bool transmit = t.transmit.settings > 0;
  PlayContext<V> cx;
  cx.rf_uniform = !transmit && !t[field_B1].present() && !t[field_B1phase].present();
  cx.per_order = t[field_D].present() || t[field_v].present();
  cx.c0 = 1.0f;
  cx.s0 = 0.0f;
  cx.m0 = lt[field_M0];
  // the field event ev's pulse plays at: its transmit setting's, or the tissue's
  auto field_of = [&](const EventRecord& ev) {
    PulseField<V> pf{lt[field_B1], lt[field_B1phase]};
    if (transmit && (ev.flags & event_rf))
      load_transmit(pf, lt, t, LaneProblems{first, 1}, transmit_setting(ev.flags));
    return pf;
  };

  V* const x = hot;
  V* const lam = hot + plane;
  T* const dual = reinterpret_cast<T*>(hot + 2 * plane);
  // each interval's coefficients on duals (the duration seeded: every event
  // of an interval has the same derivative with respect to its own
  // duration), computed once, not at every event
  T* const ivd = reinterpret_cast<T*>(cold + 6 * s.n_intervals);
  V* const ckpt = cold + 6 * s.n_intervals * (N + 2);
  const int64_t C = checkpoint_stride(n);
  V* const seg = ckpt + plane * ((n + C - 1) / C);
  PlaneStore<V, true> st;  // the state, with the interval table
  st.template init_at<double>(s, lt, x, cold);
  for (int64_t iv = 0; iv < s.n_intervals; ++iv) {
    typename Lanes<T>::template Wide<double> tau(s.duration_s[iv]);
    tau.d[grad_duration] = 1.0;
    store_coef(ivd + 6 * iv, interval_coef_at<T, double>(s, ltd, tau));
  }
  PlaneStore<V, true> a;
  a.bind(lam, K);
  PlaneStore<T, true> sd;
  sd.bind(dual, K);
  for (int64_t i = 0; i < plane; ++i) lam[i] = V{};

  auto forward_event = [&](int64_t e, int& b) {
    const EventRecord ev = load_event(s, e);
    IvCoef<V> c;
    Op<V> o;
    const IvCoef<V>* cp = nullptr;
    const Op<V>* op = nullptr;
    if (ev.interval >= 0) {
      c = st.interval(ev.interval);
      cp = &c;
    }
    if (ev.flags & event_rf) {
      o = pulse_op<V, true>(s, ev, cx.rf_uniform, field_of(ev), 1.0f, 0.0f);
      op = &o;
    } else if (ev.flags & event_inversion) {
      o = inversion_op<V>(lt);
      op = &o;
    }
    step_event<V>(ev, cx.per_order, K, st, cp, op, b, [](const V&, const V&) {});
  };

  // first pass: checkpoints
  {
    int b = 1;
    for (int64_t e = 0; e < n; ++e) {
      if (e % C == 0)
        for (int64_t i = 0; i < plane; ++i) ckpt[plane * (e / C) + i] = x[i];
      forward_event(e, b);
    }
  }

  V tacc[tissue_fields];
  for (int j = 0; j < tissue_fields; ++j) tacc[j] = V{};
  for (int64_t c0 = ((n - 1) / C) * C; n > 0 && c0 >= 0; c0 -= C) {
    const int64_t c1 = c0 + C < n ? c0 + C : n;
    // replay the segment from its checkpoint, keeping each event's start
    for (int64_t i = 0; i < plane; ++i) x[i] = ckpt[plane * (c0 / C) + i];
    int b = band[c0];
    for (int64_t e = c0; e < c1; ++e) {
      for (int64_t i = 0; i < plane; ++i) seg[plane * (e - c0) + i] = x[i];
      if (e + 1 < c1) forward_event(e, b);
    }
    for (int64_t e = c1 - 1; e >= c0; --e) {
      const EventRecord ev = load_event(s, e);
      const V* xe = seg + plane * (e - c0);
      // the event on duals from its starting state
      for (int64_t i = 0; i < plane; ++i) {
        dual[i] = T{};
        dual[i].v = xe[i];
      }
      IvCoef<T> cd;
      Op<T> od;
      const IvCoef<T>* cdp = nullptr;
      const Op<T>* odp = nullptr;
      if (ev.interval >= 0) {
        cd = load_coef(ivd + 6 * ev.interval);
        cdp = &cd;
      }
      // the field this event's pulse plays at (formed once for the dual
      // event and the transposed one)
      const PulseField<V> pf = field_of(ev);
      if (ev.flags & event_rf) {
        // alpha = flip B1 and phi = phase + B1phase through the per-lane
        // pulse, with the flip and the phase seeded
        LaneTissue<T> lp = ltd;
        if (transmit) {
          // the flip direction carries d alpha / d|B| = flip: its lanes
          // are dL/d|B| of the setting (Transmit::gradient), not dL/d flip
          lp[field_B1] = T{};
          lp[field_B1].v = pf.b1 * ev.flip_rad;
          lp[field_B1].d[grad_flip] = splat<V>(ev.flip_rad);
          lp[field_B1phase] = T{};
          lp[field_B1phase].v = pf.b1phase;
        } else {
          lp[field_B1] = ltd[field_B1] * ev.flip_rad;
          lp[field_B1].d[grad_flip] = ltd[field_B1].v;
        }
        lp[field_B1phase].d[grad_phase] = splat<V>(1.0f);
        EventRecord evp = ev;
        evp.flip_rad = 1.0f;
        od = pulse_op<T, true, pulse_lanes>(s, evp, false, lp, 1.0f, 0.0f);
        odp = &od;
      } else if (ev.flags & event_inversion) {
        od = inversion_op<T>(ltd);
        odp = &od;
      }
      T fr{}, fi{};
      int bd = band[e];
      step_event<T>(ev, cx.per_order, K, sd, cdp, odp, bd, [&](const T& r, const T& i) {
        fr = r;
        fi = i;
      });
      // <lambda_{e+1}, d event / d p>
      V g[event_gradients] = {};
      V gt[tissue_fields];
      for (int j = 0; j < tissue_fields; ++j) gt[j] = V{};
      for (int64_t i = 0; i < plane; ++i) {
        for (int q = 0; q < adjoint_event_dirs; ++q) g[q] += lam[i] * dual[i].d[q];
        for (int j = adjoint_event_dirs; j < adjoint_event_dirs + nd; ++j) gt[j - adjoint_event_dirs] += lam[i] * dual[i].d[j];
      }
      // back through the spoil or the shifts after
      if (ev.flags & event_spoil) {
        a.spoil(K);
      } else {
        const int32_t sa = ev.shift_after;
        for (int i = 0; i < (sa > 0 ? sa : -sa); ++i) shift_transpose(a, sa > 0 ? 1 : -1);
      }
      if (ev.flags & event_readout) {
        float cr, sr;
        rx_phase(s, e, ev, cr, sr);
        V gr{}, gi{};
        for (int l = 0; l < W; ++l) {
          const float* gp = cot + (idx[l] * cot_stride + ev.slot) * 2;
          LT::set(gr, l, gp[0]);
          LT::set(gi, l, gp[1]);
        }
        gr *= valid;
        gi *= valid;
        // s' = F+_0 e^{-i rx}; the sample is M0 s'
        const V ur = fr.v * cr + fi.v * sr, ui = fi.v * cr - fr.v * sr;
        for (int q = 0; q < adjoint_event_dirs; ++q) {
          const V dr = fr.d[q] * cr + fi.d[q] * sr, di = fi.d[q] * cr - fr.d[q] * sr;
          g[q] += lt[field_M0] * (gr * dr + gi * di);
        }
        for (int j = 0; j < nd; ++j) {
          const int q = adjoint_event_dirs + j;
          const V dr = fr.d[q] * cr + fi.d[q] * sr, di = fi.d[q] * cr - fr.d[q] * sr;
          gt[j] += lt[field_M0] * (gr * dr + gi * di);
        }
        g[grad_rx] = lt[field_M0] * (gr * ui - gi * ur);
        if (m0_dir >= 0) tacc[m0_dir] += gr * ur + gi * ui;
        // lambda at F+_0 += g M0 e^{i rx}
        a.fpr[0] += lt[field_M0] * (gr * cr - gi * sr);
        a.fpi[0] += lt[field_M0] * (gr * sr + gi * cr);
      }
      for (int j = 0; j < n_tdirs; ++j)
        if (dual_of[j] >= 0) tacc[j] += gt[dual_of[j] - adjoint_event_dirs];
      if (transmit && (ev.flags & event_rf) && t.transmit.gradient) {
        const int64_t gs = transmit_setting(ev.flags);
        for (int l = 0; l < W && first + l < t.n; ++l) {
          float* row = t.transmit.gradient + ((first + l) * t.transmit.settings + gs) * 2;
          row[0] += value_of(LT::get(g[grad_flip], l));
          row[1] += value_of(LT::get(g[grad_phase], l));
        }
      }
      for (int q = 0; q < event_gradients; ++q) g[q] *= valid;
      acc(e, g);
      // back through the operator, the shifts before and the interval
      Op<V> o;
      bool has_op = false;
      if (ev.flags & event_rf) {
        o = pulse_op<V, true>(s, ev, cx.rf_uniform, pf, 1.0f, 0.0f);
        has_op = true;
      } else if (ev.flags & event_inversion) {
        o = inversion_op<V>(lt);
        has_op = true;
      }
      if (has_op) a.apply(transpose(o), K);
      const int32_t sb = ev.shift_before;
      for (int i = 0; i < (sb > 0 ? sb : -sb); ++i) shift_transpose(a, sb > 0 ? 1 : -1);
      if (ev.interval >= 0) {
        IvCoef<V> c = st.interval(ev.interval);
        if (cx.per_order) {
          c.qi = -c.qi;
          c.flow = -c.flow;
          c.rec = V{};
          a.relax_per_order(c, K);
        } else {
          a.apply(transpose(fuse<V, true>(identity_op<V>(), c)), K);
        }
      }
    }
  }
  for (int l = 0; l < W; ++l) {
    if (first + l >= t.n) break;
    for (int j = 0; j < n_tdirs; ++j) tgrad[(first + l) * n_tdirs + j] = value_of(LT::get(tacc[j], l));
  }
  return ok;
}

// Sums each event's lane vectors of gradients, lane by lane in order, into
// rows[e * event_gradients + q] (double): the fixed-order reduction that
// keeps the host's gradients the same at every thread count.
template <class V>
struct LaneSumAccumulator {
  double* rows;
  BLOCHSIM_FORCEINLINE void operator()(int64_t e, const V* g) {
    using LT = Lanes<V>;
    for (int q = 0; q < event_gradients; ++q) {
      double sum = 0.0;
      for (int l = 0; l < LT::width; ++l) sum += LT::get(g[q], l);
      rows[e * event_gradients + q] += sum;
    }
  }
};

// As LaneSumAccumulator for the duals of second order: sums the tangents
// (d/dtheta of each event's gradients).
template <class V>
struct TangentSumAccumulator {
  double* rows;
  BLOCHSIM_FORCEINLINE void operator()(int64_t e, const Dual<V, 1>* g) {
    using LT = Lanes<V>;
    for (int q = 0; q < event_gradients; ++q) {
      double sum = 0.0;
      for (int l = 0; l < LT::width; ++l) sum += LT::get(g[q].d[0], l);
      rows[e * event_gradients + q] += sum;
    }
  }
};

// Second order for blocks [b0, b1) of lane vectors V: d/d field_outer of the
// event gradients of the cotangent cot (row stride cot_stride, as
// adjoint_block; rows as adjoint_range), with a workspace of 2
// adjoint_workspace(s, adjoint_event_dirs) lane vectors.
template <class V>
inline int adjoint2_range(const EventStream& s, const Tissue& t, int outer_field, int64_t b0, int64_t b1,
                          void* work, const float* cot, int64_t cot_stride, const int32_t* band, double* rows) {
  using D = Dual<V, 1>;
  TangentSumAccumulator<V> acc{rows};
  for (int64_t b = b0; b < b1; ++b) {
    D* const hot = static_cast<D*>(work);
    const int st = adjoint_block<D, adjoint_event_dirs>(s, t, nullptr, 0, b * Lanes<V>::width, hot,
                                                        hot + adjoint_hot(s.states, adjoint_event_dirs), cot,
                                                        cot_stride, band, acc, nullptr, outer_field);
    if (st != ok) return st;
  }
  return ok;
}

// The adjoint of blocks [b0, b1) of lane vectors V, their event gradients
// added to rows (n_events, event_gradients), with a workspace of
// adjoint_workspace(s, adjoint_width(...)) lane vectors: the dual width
// picked at run time.  In the ISA namespace, like jacobian_range.
template <class V>
inline int adjoint_range(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, int64_t b0,
                         int64_t b1, void* work, const float* cot, const int32_t* band, double* rows,
                         float* tgrad) {
  LaneSumAccumulator<V> acc{rows};
  auto blocks = [&](auto width) {
    constexpr int N = decltype(width)::value;
    for (int64_t b = b0; b < b1; ++b) {
      V* const hot = static_cast<V*>(work);
      const int st = adjoint_block<V, N>(s, t, fields, n_tdirs, b * Lanes<V>::width, hot,
                                         hot + adjoint_hot(s.states, N), cot, s.n_samples, band, acc, tgrad);
      if (st != ok) return st;
    }
    return static_cast<int>(ok);
  };
  switch (adjoint_width(dual_directions(fields, n_tdirs))) {
    case adjoint_event_dirs: return blocks(std::integral_constant<int, adjoint_event_dirs>{});
    case adjoint_event_dirs + 2: return blocks(std::integral_constant<int, adjoint_event_dirs + 2>{});
    default: return blocks(std::integral_constant<int, adjoint_event_dirs + tissue_fields - 1>{});
  }
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
