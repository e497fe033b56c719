// The EPG forward kernel (SPEC §1-2), one source for host and device.
//
// play() walks the event stream for one problem, or for a block of them held
// side by side in a lane type V (tile.hpp), and hands every state update to
// a Store: the policy that decides where the orders of the state live.
//   - PlaneStore (this file): all orders in memory as (orders,) of V; the
//     host runs it (as SlidingPlaneStore) with V = 16 problems per SIMD
//     vector, and the adjoint with the planes in memory on either side.
//   - RegisterStore (epg/registers.hpp): the orders spread over a team of
//     threads, R orders per thread in registers, shifted across the team by
//     warp shuffles or shared memory.
// The per-order arithmetic below is shared by every store, so host and
// device compute the same expressions.
//
// Complex = false is the real subspace: when every RF phase is phi0 or
// phi0 + pi and nothing off-axis is on, the embedding
//     F+_k = -i e^{i phi0} f+_k,   F-_k = i e^{-i phi0} f-_k,   Z_k = z_k
// with real f+, f-, z is closed under every operator, so three real planes
// replace six (the host decides this once per sequence).
//
// Only orders below `band` can be non-zero: the state starts at Z_0 = 1 and
// each shift of one order widens the band by one.  The band depends on the
// sequence only, so it is the same for every problem of a launch.
#pragma once

#include <cmath>
#include <type_traits>

#include "../events.hpp"
#include "../tile.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {
namespace epg {

// Tissue values of the problems of one lane vector, indexed by field
// (lt[field_T1]).
template <class V>
struct LaneTissue {
  V field[tissue_fields];

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V& operator[](int f) { return field[f]; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE const V& operator[](int f) const { return field[f]; }
};

template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LaneTissue<V> gather(const Tissue& t, const int64_t* idx) {
  using LT = Lanes<V>;
  LaneTissue<V> lt;
  for (int l = 0; l < LT::width; ++l)
    for (int f = 0; f < tissue_fields; ++f) LT::set(lt[f], l, t[f].at(idx[l]));
  return lt;
}

// The lane tissue of one problem's values, every lane alike.
template <class V, class One, class Splat>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LaneTissue<V> splat_tissue(const LaneTissue<One>& one, Splat splat) {
  LaneTissue<V> lt;
  for (int f = 0; f < tissue_fields; ++f) lt[f] = splat(one[f]);
  return lt;
}

// Free evolution over one interval, washout folded in:
//   F+ <- q F+,  F- <- conj(q) F-,  Z <- e1 Z,  Z_0 += rec,
// q = keep e^{-tau/T2} e^{-2 pi i B0 tau}, e1 = keep e^{-tau/T1},
// rec = keep (1 - e^{-tau/T1}) + (1 - keep), keep = 1 - washout fraction;
// and, for diffusion and flow, order k further multiplied by
// e^{dlog k^2} e^{-i k flow} (conjugate phase on F-).
template <class V>
struct IvCoef {
  V qr, qi, e1, rec, dlog, flow;
};

// An IvCoef as 6 consecutive lane vectors of a table, in the order of its
// fields, and back.
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void store_coef(V* r, const IvCoef<V>& c) {
  r[0] = c.qr;
  r[1] = c.qi;
  r[2] = c.e1;
  r[3] = c.rec;
  r[4] = c.dlog;
  r[5] = c.flow;
}
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> load_coef(const V* r) {
  return {r[0], r[1], r[2], r[3], r[4], r[5]};
}

template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> identity_interval() {
  return {splat<V>(1.0f), V{}, splat<V>(1.0f), V{}, V{}, V{}};
}

// M is the precision of the exponentials (double on the host, float on the
// device, where they are evaluated per event).  Tau is M, or a dual of M
// when the duration itself is differentiated (epg/adjoint.hpp).
template <class V, class M, class Tau>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> interval_coef_at(const EventStream& s, const LaneTissue<V>& lt,
                                                             const Tau& tau) {
  using LT = Lanes<V>;
  using S = typename LT::Scalar;
  using W = typename LT::template Wide<M>;  // M, or its dual on a dual lane type
  using std::cos;
  using std::exp;
  using std::expm1;
  using std::fabs;
  using std::sin;
  // the protocol's constants, then the tissue's values (which may carry
  // derivatives)
  const M dk = static_cast<M>(s.dk_rad_per_m);
  const M voxel = static_cast<M>(s.voxel_size_m);
  IvCoef<V> c;
  for (int l = 0; l < LT::width; ++l) {
    const W T1 = static_cast<W>(LT::get(lt[field_T1], l)), T2 = static_cast<W>(LT::get(lt[field_T2], l));
    const W v = static_cast<W>(LT::get(lt[field_v], l)), D = static_cast<W>(LT::get(lt[field_D], l));
    const W theta = static_cast<M>(2.0 * pi) * static_cast<W>(LT::get(lt[field_B0], l)) * tau;
    W w = voxel > M(0) ? fabs(v) * tau / voxel : W(M(0));
    w = value_of(w) < M(1) ? w : W(M(1));
    const W keep = M(1) - w;
    const W e2 = keep * exp(-tau / T2);
    LT::set(c.qr, l, static_cast<S>(e2 * cos(theta)));
    LT::set(c.qi, l, static_cast<S>(-e2 * sin(theta)));
    LT::set(c.e1, l, static_cast<S>(keep * exp(-tau / T1)));
    LT::set(c.rec, l, static_cast<S>(-keep * expm1(-tau / T1) + w));
    LT::set(c.dlog, l, static_cast<S>(-D * dk * dk * tau));
    LT::set(c.flow, l, static_cast<S>(dk * v * tau));
  }
  return c;
}

// The coefficients of interval iv of the stream's duration table.
template <class V, class M>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> interval_coef(const EventStream& s, const LaneTissue<V>& lt,
                                                          int64_t iv) {
  return interval_coef_at<V, M>(s, lt, static_cast<M>(s.duration_s[iv]));
}

// A linear event operator at every order k, plus a source at order 0:
//   F+' = P F+ + A F- + B Z              (+ J at k = 0)
//   F-' = conj(A) F+ + conj(P) F- + conj(B) Z   (+ conj(J))
//   Z'  = C F+ + conj(C) F- + ca Z       (+ jz)
// A hard pulse is P = cos^2(a/2), A = e^{2i phi} sin^2(a/2),
// B = -i e^{i phi} sin a, C = -(i/2) e^{-i phi} sin a, ca = cos a (SPEC §2);
// an inversion is P = 1, ca = -eta.  An interval before the pulse is folded in
// (fuse), so relaxation and rotation cost one pass over the orders.  On the
// real path only the real parts are used: f+' = P f+ + A f- + B z,
// f-' = A f+ + P f- + B z, z' = C (f+ + f-) + ca z.
template <class V>
struct Op {
  V pr, pi, ar, ai, br, bi, cr, ci, ca, jr, ji, jz;
};

template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> identity_op() {
  Op<V> o{};
  o.pr = splat<V>(1.0f);
  o.ca = splat<V>(1.0f);
  return o;
}

// Whether the stream carries each pulse's rotation at B1 = 1 and each
// receiver phase (EventStream::rf_table or the rows of its records).
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool has_rf_rows(const EventStream& s) {
  return s.records != nullptr || s.rf_table != nullptr;
}

// The fields of event e, loaded together so that the event loop can fetch
// the next event while it computes the current one: the stream's record if
// it has records (four 16-byte loads on the device), else gathered from its
// arrays with no fast run (run = 0) and rf the rf_table row or zeros.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE EventRecord load_event(const EventStream& s, int64_t e) {
  if (s.records) return s.records[e];
  EventRecord r;
  r.interval = s.interval[e];
  r.shift_before = s.shift_before[e];
  r.shift_after = s.shift_after[e];
  r.slot = s.slot[e];
  r.run = 0;
  r.flags = record_flags(s, e);
  r.flip_rad = s.flip_rad[e];
  r.phase_rad = s.phase_rad[e];
  if (s.rf_table) {
    const float* row = s.rf_table + e * rf_table_fields;
BLOCHSIM_UNROLL
    for (int i = 0; i < rf_table_fields; ++i) r.rf[i] = row[i];
  } else {
BLOCHSIM_UNROLL
    for (int i = 0; i < rf_table_fields; ++i) r.rf[i] = 0.0f;
  }
  return r;
}

// Where pulse_op takes a pulse's rotation from.
enum PulseFrom : int {
  pulse_decided = 0,  // decided at run time (rows when uniform and the stream has them)
  pulse_rows = 1,     // uniform over the lanes, from the stream's rows
  pulse_lanes = 2,    // per lane, from flip_rad B1 and phase_rad + B1phase
};

// The transmit field the pulses play at, per lane: B1 (a scale of the
// nominal flip) and B1phase (rad).
template <class V>
struct PulseField {
  V b1, b1phase;
};

// The pulse of event e for every lane at the field pf (B1 scales the flip,
// B1phase adds to the phase).  With `uniform` (no per-problem B1 or
// B1phase) the rotation is the same for every lane and comes from the
// stream's rows if any.  (c0, s0) = (cos, sin) of the stream's common phase
// (real path).  From (a PulseFrom) fixes at compile time where the
// rotation comes from.
template <class V, bool Complex, int From = pulse_decided>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> pulse_op(const EventStream& s, const EventRecord& ev, bool uniform,
                                                const PulseField<V>& pf, float c0, float s0) {
  using LT = Lanes<V>;
  using S = typename LT::Scalar;
  using std::cos;
  using std::sin;
  Op<V> o{};
  if (From == pulse_rows) uniform = true;
  if (From == pulse_lanes) uniform = false;
  const bool rows = From == pulse_rows || (From == pulse_decided && uniform && has_rf_rows(s));
  const int n = uniform ? 1 : LT::width;
  for (int l = 0; l < n; ++l) {
    S c2, s2, sa, ca, cp, sp;
    if (rows) {
      const float* r = ev.rf;
      c2 = r[rft_cos2_half];
      s2 = r[rft_sin2_half];
      sa = r[rft_sin];
      ca = r[rft_cos];
      cp = r[rft_cos_phase];
      sp = r[rft_sin_phase];
    } else {
      const S alpha = ev.flip_rad * LT::get(pf.b1, l);
      const S phi = ev.phase_rad + LT::get(pf.b1phase, l);
      const S ch = cos(0.5f * alpha), sh = sin(0.5f * alpha);
      c2 = ch * ch;
      s2 = sh * sh;
      sa = 2.0f * sh * ch;
      ca = c2 - s2;
      cp = cos(phi);
      sp = sin(phi);
    }
    S v[12] = {c2, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, ca, 0.0f, 0.0f, 0.0f};
    if (Complex) {
      v[2] = (cp * cp - sp * sp) * s2;  // A = e^{2i phi} s2
      v[3] = 2.0f * sp * cp * s2;
      v[4] = sa * sp;                   // B = -i e^{i phi} sa
      v[5] = -sa * cp;
      v[6] = -0.5f * sa * sp;           // C = -(i/2) e^{-i phi} sa
      v[7] = -0.5f * sa * cp;
    } else {
      // phi = phi0 or phi0 + pi: sigma = cos(phi - phi0) = +-1
      const float sigma = value_of(cp * c0 + sp * s0) >= 0.0f ? 1.0f : -1.0f;
      v[2] = -s2;
      v[4] = sigma * sa;
      v[6] = -0.5f * sigma * sa;
    }
    if (uniform) {
      o = Op<V>{LT::splat(v[0]), LT::splat(v[1]), LT::splat(v[2]), LT::splat(v[3]), LT::splat(v[4]),
                LT::splat(v[5]), LT::splat(v[6]), LT::splat(v[7]), LT::splat(v[8]), V{}, V{}, V{}};
    } else {
      LT::set(o.pr, l, v[0]);
      LT::set(o.ar, l, v[2]);
      LT::set(o.ai, l, v[3]);
      LT::set(o.br, l, v[4]);
      LT::set(o.bi, l, v[5]);
      LT::set(o.cr, l, v[6]);
      LT::set(o.ci, l, v[7]);
      LT::set(o.ca, l, v[8]);
    }
  }
  return o;
}

// The pulse at the tissue's B1 and B1phase.
template <class V, bool Complex, int From = pulse_decided>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> pulse_op(const EventStream& s, const EventRecord& ev, bool uniform,
                                                const LaneTissue<V>& lt, float c0, float s0) {
  return pulse_op<V, Complex, From>(s, ev, uniform, PulseField<V>{lt[field_B1], lt[field_B1phase]}, c0, s0);
}

template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> inversion_op(const LaneTissue<V>& lt) {
  Op<V> o{};
  o.pr = splat<V>(1.0f);
  o.ca = -lt[field_eta];
  return o;
}

// The operator `o` applied after the interval `c`: o (E x + rec e_Z0).
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<V> fuse(const Op<V>& o, const IvCoef<V>& c) {
  Op<V> f;
  if (Complex) {
    f.pr = o.pr * c.qr - o.pi * c.qi;  // P q
    f.pi = o.pr * c.qi + o.pi * c.qr;
    f.ar = o.ar * c.qr + o.ai * c.qi;  // A conj(q)
    f.ai = o.ai * c.qr - o.ar * c.qi;
    f.cr = o.cr * c.qr - o.ci * c.qi;  // C q
    f.ci = o.cr * c.qi + o.ci * c.qr;
    f.bi = o.bi * c.e1;
    f.ji = o.bi * c.rec;
  } else {
    f.pr = o.pr * c.qr;
    f.ar = o.ar * c.qr;
    f.cr = o.cr * c.qr;
    f.pi = f.ai = f.ci = f.bi = f.ji = V{};
  }
  f.br = o.br * c.e1;
  f.ca = o.ca * c.e1;
  f.jr = o.br * c.rec;  // the recovery at Z_0, rotated by the pulse
  f.jz = o.ca * c.rec;
  return f;
}

// One order under an Op (without the order-0 source), written as chains of
// multiply-adds (7 per order on the real path, 34 on the complex path).
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply_order(const Op<V>& o, V& fpr, V& fpi, V& fmr, V& fmi, V& zr,
                                                  V& zi) {
  if (Complex) {
    const V pr = fpr, pi_ = fpi, mr = fmr, mi = fmi, ar = zr, ai = zi;
    fpr = o.pr * pr + (o.ar * mr + (o.br * ar - (o.pi * pi_ + (o.ai * mi + o.bi * ai))));
    fpi = o.pr * pi_ + (o.ar * mi + (o.br * ai + (o.pi * pr + (o.ai * mr + o.bi * ar))));
    fmr = o.pr * mr + (o.ar * pr + (o.br * ar + (o.pi * mi + (o.ai * pi_ + o.bi * ai))));
    fmi = o.pr * mi + (o.ar * pi_ + (o.br * ai - (o.pi * mr + (o.ai * pr + o.bi * ar))));
    zr = o.ca * ar + (o.cr * (pr + mr) + o.ci * (mi - pi_));
    zi = o.ca * ai + (o.cr * (pi_ + mi) + o.ci * (pr - mr));
  } else {
    // f+' = P f+ + A f- + B z = (P - A) f+ + u with u = A (f+ + f-) + B z
    // shared by both families: 7 instructions per order
    const V p = fpr, m = fmr, z = zr;
    const V sum = p + m;
    const V u = o.ar * sum + o.br * z;
    const V d = o.pr - o.ar;  // the same for every order: computed once per event
    fpr = d * p + u;
    fmr = d * m + u;
    zr = o.cr * sum + o.ca * z;
  }
}

// The event loop's view of an operator (apply_order and the order-0 source
// for Op; epg/jacobian.hpp overloads both for its split duals, whose order
// update has a variant for operators with pulse derivatives, Pulse, that
// the stores pick once per event: a branch inside the order loop would cut
// the device's straight-line schedule into pieces).
template <bool Complex, bool Pulse = false, class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void order_update(const Op<V>& o, V& fpr, V& fpi, V& fmr, V& fmi, V& zr,
                                                   V& zi) {
  apply_order<V, Complex>(o, fpr, fpi, fmr, fmi, zr, zi);
}
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE constexpr bool has_pulse(const Op<V>&) {
  return false;
}

// f(std::true_type) where operator o carries pulse derivatives, else
// f(std::false_type).
template <class O, class F>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void with_pulse(const O& o, F&& f) {
  if (has_pulse(o))
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The order-0 source of o, times f (1, or on a register team 1 in the
// member that holds order 0 and 0 elsewhere).
template <bool Complex, class V, class F>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void add_source(const Op<V>& o, const F& f, V& fpr, V& fpi, V& fmr, V& fmi,
                                                 V& zr) {
  fpr += f * o.jr;
  fmr += f * o.jr;
  zr += f * o.jz;
  if (Complex) {
    fpi += f * o.ji;
    fmi -= f * o.ji;
  }
}

// One order under free evolution with order-dependent factors: multiplier
// g e^{-i k flow} (g = e^{dlog k^2}) on top of q and e1, given (gc, gs) =
// g (cos k flow, sin k flow).
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax_order(const IvCoef<V>& c, const V& gc, const V& gs, V& fpr,
                                                  V& fpi, V& fmr, V& fmi, V& zr, V& zi) {
  if (Complex) {
    // F+ multiplier q (gc - i gs); F- its conjugate; Z e1 (gc - i gs).
    const V mr = c.qr * gc + c.qi * gs;
    const V mi = c.qi * gc - c.qr * gs;
    const V zmr = c.e1 * gc, zmi = -c.e1 * gs;
    const V pr = fpr, pi_ = fpi, qr = fmr, qi = fmi, ar = zr, ai = zi;
    fpr = mr * pr - mi * pi_;
    fpi = mr * pi_ + mi * pr;
    fmr = mr * qr + mi * qi;
    fmi = mr * qi - mi * qr;
    zr = zmr * ar - zmi * ai;
    zi = zmr * ai + zmi * ar;
  } else {
    fpr *= c.qr * gc;
    fmr *= c.qr * gc;
    zr *= c.e1 * gc;
  }
}

// The operator an event applies, as a store hands it to play(): a pulse (or
// inversion) o alone, or after the interval c.  epg/jacobian.hpp's SplitStore
// replaces these for its duals.
template <class V, bool Complex>
struct FusedOps {
  using OpT = Op<V>;
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE OpT as_op(const Op<V>& o) const { return o; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE OpT fused(const Op<V>& o, const IvCoef<V>& c) const {
    return fuse<V, Complex>(o, c);
  }
};

// --------------------------------------------------------------------------
// PlaneStore: every order in memory, (orders,) of V per real component.

template <class V, bool Complex>
struct PlaneStore : FusedOps<V, Complex> {
  Plane<V> fpr, fmr, zr, fpi, fmi, zi;
  V* ivt;  // (n_intervals, 6) tabulated IvCoef, in the order of its fields
  int K;

  // Workspace of one store, in units of V.
  BLOCHSIM_HD static int64_t workspace(const EventStream& s) {
    return (Complex ? 6 : 3) * static_cast<int64_t>(s.states) + 6 * s.n_intervals;
  }

  // Points the planes at work: (Complex ? 6 : 3) K lane vectors, in the
  // order Re F+, Re F-, Re Z, Im F+, Im F-, Im Z.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void bind(V* work, int K_) {
    K = K_;
    fpr.p = work;
    fmr.p = work + K;
    zr.p = work + 2 * K;
    // the imaginary planes exist on the complex path only
    fpi.p = Complex ? work + 3 * K : work;
    fmi.p = Complex ? work + 4 * K : work;
    zi.p = Complex ? work + 5 * K : work;
    ivt = nullptr;
  }

  template <class M>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void init(const EventStream& s, const LaneTissue<V>& lt, V* work) {
    init_at<M>(s, lt, work, work + (Complex ? 6 : 3) * s.states);
  }

  // As init, with the planes at `planes` and the interval table (6
  // n_intervals lane vectors) at `table`.
  template <class M>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void init_at(const EventStream& s, const LaneTissue<V>& lt, V* planes,
                                                V* table) {
    bind(planes, s.states);
    V* const work = planes;
    ivt = table;
    for (int64_t i = 0; i < (Complex ? 6 : 3) * static_cast<int64_t>(K); ++i) work[i] = V{};
    zr[0] = splat<V>(1.0f);
    for (int64_t i = 0; i < s.n_intervals; ++i) store_coef(ivt + 6 * i, interval_coef<V, M>(s, lt, i));
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<V> interval(int64_t iv) const { return load_coef(ivt + 6 * iv); }

  template <class O>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(const O& o, int band) {
    V dummy{};
    with_pulse(o, [&](auto pulse) {
      for (int k = 0; k < band; ++k) {
        order_update<Complex, decltype(pulse)::value>(o, fpr[k], Complex ? fpi[k] : dummy, fmr[k],
                                                      Complex ? fmi[k] : dummy, zr[k], Complex ? zi[k] : dummy);
      }
    });
    add_source<Complex>(o, splat<V>(1.0f), fpr[0], Complex ? fpi[0] : dummy, fmr[0], Complex ? fmi[0] : dummy,
                        zr[0]);
  }

  // Free evolution with diffusion and flow.  The factors e^{dlog k^2} and
  // e^{-i k flow} advance by recurrences in double, so that 2048 orders
  // keep float32 accuracy.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax_per_order(const IvCoef<V>& c, int band) {
    using LT = Lanes<V>;
    using D = typename LT::Double;
    using SD = typename LT::template Wide<double>;
    using std::cos;
    using std::exp;
    using std::sin;
    D g = splatd<D>(1.0), step, a2, wc = splatd<D>(1.0), ws = D{}, rc, rs;
    for (int l = 0; l < LT::width; ++l) {
      const SD dl = static_cast<SD>(LT::get(c.dlog, l)), fl = static_cast<SD>(LT::get(c.flow, l));
      LT::setd(step, l, exp(dl));
      LT::setd(a2, l, exp(2.0 * dl));
      LT::setd(rc, l, cos(fl));
      LT::setd(rs, l, sin(fl));
    }
    for (int k = 0; k < band; ++k) {
      V dummy{};
      relax_order<V, Complex>(c, LT::narrow(g * wc), LT::narrow(g * ws), fpr[k], Complex ? fpi[k] : dummy,
                              fmr[k], Complex ? fmi[k] : dummy, zr[k], Complex ? zi[k] : dummy);
      const D nc = wc * rc - ws * rs;  // (wc - i ws) e^{-i flow}
      ws = wc * rs + ws * rc;
      wc = nc;
      g *= step;
      step *= a2;
    }
    zr[0] += c.rec;
  }

  // One shift of every transverse order (dir = +1: F+ up, F- down), keeping
  // F-_0 = conj(F+_0); orders pushed past K-1 are dropped.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(int dir, int band) {
    Plane<V>& upr = dir > 0 ? fpr : fmr;
    Plane<V>& dnr = dir > 0 ? fmr : fpr;
    upr.shift_up(band, K);
    dnr.shift_down(band);
    upr[0] = dnr[0];
    if (Complex) {
      Plane<V>& upi = dir > 0 ? fpi : fmi;
      Plane<V>& dni = dir > 0 ? fmi : fpi;
      upi.shift_up(band, K);
      dni.shift_down(band);
      upi[0] = -dni[0];
    }
  }

  static constexpr int unroll = 1;  // no fast path (play())

  // Event records straight from the stream.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void advance(const EventStream&, int32_t, int32_t) {}
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE EventRecord record(const EventStream& s, int32_t e) const {
    return load_event(s, e);
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void spoil(int band) {
    fpr.zero(0, band);
    fmr.zero(0, band);
    if (Complex) {
      fpi.zero(0, band);
      fmi.zero(0, band);
    }
  }

  // F+_0 of the problems in the lanes (the readout's source).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V f0r() const { return fpr[0]; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V f0i() const { return Complex ? fpi[0] : V{}; }
};

// A PlaneStore whose transverse planes shift by moving their windows, not
// their rows: each of F+ and F- lives in a region of K + 2H rows, and a
// shift up moves the F+ window down one row (its row k is then the old row
// k - 1) and the F- window up one row.  The rows move only when a window
// reaches the end of its region: then the K rows go back to the middle,
// once per H shifts, where a PlaneStore moves band rows at every shift (a
// fifth of the host's forward kernel and a third of its Jacobian on dual
// rows, bench/NOTES.md v0.8).  The host's forward and Jacobian blocks play
// on it; the adjoint keeps the PlaneStore, whose contiguous planes it
// checkpoints.
//
// Rows that slide into a window at the top must be zero (the orders at and
// above band are): the regions start zeroed, a row that leaves at the top
// is non-zero only once band has reached K (and then every down shift
// zeroes row K - 1), and a recentring zeroes the rows above the window.
// Rows that slide in at the bottom become row 0 of an up-shifted family,
// which the shift sets.
template <class V, bool Complex, int Unroll = 1>
struct SlidingPlaneStore : PlaneStore<V, Complex> {
  using Base = PlaneStore<V, Complex>;
  // Unroll > 1 (the real path): play()'s runs of simple events are played
  // Unroll at a time in one sweep over the orders (pipelined_run)
  static constexpr int unroll = Unroll;
  static constexpr bool pipelined = Unroll > 1;
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool fast_ok(int) const { return true; }
  int H = 0;                   // headroom on each side of a window
  int off_p = 0, off_m = 0;    // the windows' first rows in their regions (F+, F-)
  V* region[4] = {};           // Re F+, Re F-, Im F+, Im F- (K + 2H rows each)

  BLOCHSIM_HD static int headroom(int K) { return K / 4 > 32 ? K / 4 : 32; }

  // Workspace of one store, in units of V.
  BLOCHSIM_HD static int64_t workspace(const EventStream& s) {
    const int64_t K = s.states, rows = K + 2 * headroom(s.states);
    return (Complex ? 4 : 2) * rows + (Complex ? 2 : 1) * K + 6 * s.n_intervals;
  }

  // Work: the regions of Re F+, Re F-, the plane of Re Z, (complex path)
  // the regions of Im F+, Im F-, the plane of Im Z, then the interval table.
  template <class M>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void init(const EventStream& s, const LaneTissue<V>& lt, V* work) {
    const int K = s.states;
    H = headroom(K);
    const int64_t rows = K + 2 * static_cast<int64_t>(H);
    const int64_t used = workspace(s) - 6 * s.n_intervals;
    for (int64_t i = 0; i < used; ++i) work[i] = V{};
    region[0] = work;
    region[1] = work + rows;
    V* const z = work + 2 * rows;
    region[2] = Complex ? z + K : region[0];
    region[3] = Complex ? z + K + rows : region[1];
    V* const zim = Complex ? z + K + 2 * rows : z;
    this->K = K;
    off_p = off_m = H;
    this->fpr.p = region[0] + H;
    this->fmr.p = region[1] + H;
    this->fpi.p = region[2] + H;
    this->fmi.p = region[3] + H;
    this->zr.p = z;
    this->zi.p = zim;
    this->ivt = work + used;
    this->zr[0] = splat<V>(1.0f);
    for (int64_t i = 0; i < s.n_intervals; ++i) store_coef(this->ivt + 6 * i, interval_coef<V, M>(s, lt, i));
  }

  // Moves family f's window (0: F+, 1: F-) by step rows (-1 or +1),
  // recentring it first where it would leave its region.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void slide(int f, int step) {
    int& off = f == 0 ? off_p : off_m;
    if (off + step < 0 || off + step > 2 * H) recentre(f);
    off += step;
    point(f);
  }
  // Moves family f's window back to the middle of its region.
  BLOCHSIM_HD void recentre(int f) {
    int& off = f == 0 ? off_p : off_m;
    const int K = this->K;
    for (int c = 0; c < (Complex ? 2 : 1); ++c) {
      V* const r = region[f + 2 * c];
      if (off > H)
        for (int k = 0; k < K; ++k) r[H + k] = r[off + k];
      else
        for (int k = K - 1; k >= 0; --k) r[H + k] = r[off + k];
      for (int k = H + K; k < K + 2 * H; ++k) r[k] = V{};
    }
    off = H;
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void point(int f) {
    const int off = f == 0 ? off_p : off_m;
    (f == 0 ? this->fpr : this->fmr).p = region[f] + off;
    (f == 0 ? this->fpi : this->fmi).p = region[f + 2] + off;
  }

  // U events, each the operator o[u] at every order (its source at order 0)
  // then one shift up, in one sweep over the orders of the real planes: a
  // pipeline of U stages where stage u turns the state after u events at
  // order m = j - u into the state after u + 1 events at order m - 1, which
  // stage u + 1 takes at the same step j (the shift up moves F+ from m - 2
  // and F- from m: each stage keeps two orders of F+ and one of Z).  The
  // planes are read once and written once for all U events, instead of
  // once per event.  band is the band before the run; f0 takes F+_0 after
  // each operator (the readouts).  Orders at or above band are read as
  // zero; orders pushed past K - 1 are dropped.
  template <int U, class O>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pipelined_run(const O (&o)[U], int band, V (&f0)[U]) {
    static_assert(!Complex, "the pipelined sweep plays the real planes");
    const int K = this->K;
    const int out_band = band + U < K ? band + U : K;
    if (off_p < U) recentre(0);
    if (off_m + U > 2 * H) recentre(1);
    V* const fp = region[0] + off_p;
    V* const fm = region[1] + off_m;
    V* const z = this->zr.p;
    V hp1[U], hp2[U], hz[U];  // per stage: F+ at m - 1 and m - 2, Z at m - 1
BLOCHSIM_UNROLL
    for (int u = 0; u < U; ++u) hp1[u] = hp2[u] = hz[u] = V{};
    const V zero{}, one = splat<V>(1.0f);
    // step j; Steady: every stage at an order >= 2 whose input is below
    // band (no source, no order 0, nothing dropped): no test in the body
    auto step = [&](int j, auto steady) BLOCHSIM_LAMBDA_INLINE {
      constexpr bool Steady = decltype(steady)::value;
      V p = zero, m = zero, c = zero, unused{};  // the state after 0 events at order j
      if (Steady || j < band) {
        p = fp[j];
        m = fm[j];
        c = z[j];
      }
      bool live = true;  // (p, m, c) hold a state at an order >= 0
BLOCHSIM_UNROLL
      for (int u = 0; u < U; ++u) {
        const int k = j - u;
        if (!Steady && !live) break;
        order_update<false>(o[u], p, unused, m, unused, c, unused);
        if (!Steady && k == 0) {
          add_source<false>(o[u], one, p, unused, m, unused, c);
          f0[u] = p;
        }
        // the state after u + 1 events at order k - 1 (F+_0 = conj F-_0 = F-_0 on the real planes)
        const V np = !Steady && k == 1 ? m : hp2[u], nz = hz[u];
        hp2[u] = hp1[u];
        hp1[u] = p;
        hz[u] = c;
        live = Steady || k >= 1;
        if (!Steady && k - 1 >= K) {
          p = m = c = zero;
        } else {
          p = np;
          c = nz;
        }
      }
      const int k = j - U;  // the state after U events at order k
      if (Steady || (live && k >= 0)) {
        fp[k - U] = p;
        fm[k + U] = m;
        z[k] = c;
      }
    };
    const int steady_end = band > U + 1 ? band : U + 1;
    int j = 0;
    for (; j < U + 1 && j < out_band + U; ++j) step(j, std::false_type{});
    for (; j < steady_end; ++j) step(j, std::true_type{});
    for (; j < out_band + U; ++j) step(j, std::false_type{});
    off_p -= U;
    off_m += U;
    point(0);
    point(1);
  }

  // One shift of every transverse order (dir = +1: F+ up, F- down), keeping
  // F-_0 = conj(F+_0); orders pushed past K-1 are dropped.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(int dir, int band) {
    const int up = dir > 0 ? 0 : 1;
    slide(up, -1);
    slide(1 - up, 1);
    Plane<V>& upr = dir > 0 ? this->fpr : this->fmr;
    Plane<V>& dnr = dir > 0 ? this->fmr : this->fpr;
    dnr[band - 1] = V{};  // the old row band: zero, or past K - 1
    upr[0] = dnr[0];
    if (Complex) {
      Plane<V>& upi = dir > 0 ? this->fpi : this->fmi;
      Plane<V>& dni = dir > 0 ? this->fmi : this->fpi;
      dni[band - 1] = V{};
      upi[0] = -dni[0];
    }
  }
};

// --------------------------------------------------------------------------
// The event loop, shared by every store.  Sink::write(slot, re, im) receives
// M0 F+_0 e^{-i rx} of each readout.  The store also hands out the event
// records: advance(s, e, n) before events e .. e + n - 1 are read (every
// thread of a device block calls it at the same events, so a store may
// stage records in shared memory there), record(s, e) to read one.

// Per-call constants of the event loop.
template <class V>
struct PlayContext {
  bool rf_uniform;  // no per-problem B1 or B1phase: one rotation per pulse
  bool per_order;   // diffusion or flow: relaxation differs between orders
  float c0, s0;     // cos, sin of the stream's common phase (real path)
  V m0;
};

// The operator of event e (its pulse or inversion, with the interval
// before it folded in when nothing comes between them); false when the
// event applies none.  An interval that cannot be folded (per-order
// relaxation, or a shift before the pulse) is applied here.
template <class V, bool Complex, class Store>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool event_op(const EventStream& s, const EventRecord& ev,
                                               const LaneTissue<V>& lt, const PulseField<V>& pf,
                                               const PlayContext<V>& cx, Store& st, int band,
                                               typename Store::OpT& o) {
  const uint32_t f = ev.flags;
  Op<V> p = identity_op<V>();
  bool apply = (f & (event_rf | event_inversion)) != 0;
  if (f & event_rf)
    p = pulse_op<V, Complex>(s, ev, cx.rf_uniform, pf, cx.c0, cx.s0);
  else if (f & event_inversion)
    p = inversion_op<V>(lt);
  if (ev.interval >= 0 && !cx.per_order && ev.shift_before == 0) {
    o = st.fused(p, st.interval(ev.interval));  // relaxation and the pulse in one pass
    return true;
  }
  if (ev.interval >= 0) {
    const IvCoef<V> c = st.interval(ev.interval);
    if (cx.per_order)
      st.relax_per_order(c, band);
    else
      st.apply(st.fused(identity_op<V>(), c), band);
  }
  o = st.as_op(p);
  return apply;
}

// The readout of event e from F+_0 = (f0r, f0i): M0 F+_0 e^{-i rx}, or on
// the real path M0 (-i e^{i phi0}) f+_0 e^{-i rx}.
// Rows = true promises that the record carries the receiver phase.
template <class V, bool Complex, bool Rows = false, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void take_readout(const EventStream& s, int64_t e, const EventRecord& ev,
                                                    const PlayContext<V>& cx, const V& f0r, const V& f0i,
                                                    Sink& sink) {
  float cr, sr;
  if (Rows || has_rf_rows(s)) {
    cr = ev.rf[rft_cos_rx];
    sr = ev.rf[rft_sin_rx];
  } else {
    cr = std::cos(s.rx_phase_rad[e]);
    sr = std::sin(s.rx_phase_rad[e]);
  }
  if (Complex) {
    sink.write(ev.slot, cx.m0 * (f0r * cr + f0i * sr), cx.m0 * (f0i * cr - f0r * sr));
  } else {
    const float pr = cx.s0 * cr - cx.c0 * sr;      // Re(-i e^{i(phi0 - rx)})
    const float pim = -(cx.c0 * cr + cx.s0 * sr);  // Im(-i e^{i(phi0 - rx)})
    const V a = cx.m0 * f0r;
    sink.write(ev.slot, a * pr, a * pim);
  }
}

// Events [e, e + Store::unroll) of play(): a run of simple events (a pulse
// after the run's interval, a readout in all of them or in none, one shift
// up; EventRecord::run), with ev the record of event e; on return ev holds
// the record of the event after them.  The interval coefficients are taken
// once for the run and each event's record is fetched one step ahead, so
// the run is one stretch of code with no branch.  From is where the pulses
// come from (pulse_rows or pulse_lanes); Trunc whether the store must drop
// orders pushed past K - 1.
template <class V, bool Complex, int From, bool Trunc, class Store, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void fast_run(const EventStream& s, const PulseField<V>& pf,
                                               const PlayContext<V>& cx, Store& st, Sink& sink, int32_t e,
                                               int band, EventRecord& ev) {
  // the identity interval folds in exactly (x 1, sources 0)
  const IvCoef<V> c = ev.interval >= 0 ? st.interval(ev.interval) : identity_interval<V>();
  const bool readout = (ev.flags & event_readout) != 0;
  EventRecord next;
  auto op = [&](int u) {
    next = st.record(s, e + u + 1);  // fast runs come from records, which end with a sentinel
    return st.fused(pulse_op<V, Complex, From>(s, ev, cx.rf_uniform, pf, cx.c0, cx.s0), c);
  };
  auto take = [&](int u, const V& r, const V& i) {
    if (readout) take_readout<V, Complex, true>(s, e + u, ev, cx, r, i, sink);
    ev = next;
  };
  st.template apply_shift_run<Store::unroll, Trunc>(op, take, band);
}

// As fast_run for a store that plays a run's events in one sweep over the
// real planes (SlidingPlaneStore::pipelined_run): the events' operators
// first, then the sweep, then their readouts.
template <class V, bool Complex, int From, class Store, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pipelined_fast_run(const EventStream& s, const PulseField<V>& pf,
                                                         const PlayContext<V>& cx, Store& st, Sink& sink,
                                                         int32_t e, int band, EventRecord& ev) {
  constexpr int U = Store::unroll;
  const IvCoef<V> c = ev.interval >= 0 ? st.interval(ev.interval) : identity_interval<V>();
  EventRecord evs[U + 1];
  evs[0] = ev;
  typename Store::OpT o[U];
BLOCHSIM_UNROLL
  for (int u = 0; u < U; ++u) {
    o[u] = st.fused(pulse_op<V, Complex, From>(s, evs[u], cx.rf_uniform, pf, cx.c0, cx.s0), c);
    evs[u + 1] = st.record(s, e + u + 1);  // fast runs come from records, which end with a sentinel
  }
  V f0[U] = {};
  st.template pipelined_run<U>(o, band, f0);
  if (ev.flags & event_readout) {
BLOCHSIM_UNROLL
    for (int u = 0; u < U; ++u) take_readout<V, Complex, true>(s, e + u, evs[u], cx, f0[u], V{}, sink);
  }
  ev = evs[U];
}

template <class S, class = void>
struct PipelinedStore : std::false_type {};
template <class S>
struct PipelinedStore<S, std::void_t<decltype(S::pipelined)>> : std::bool_constant<S::pipelined> {};

// The problems of a lane vector: lane l plays problem first + l step (the
// last problem past t.n); step 0 for a team, whose members share one.
struct LaneProblems {
  int64_t first = 0;
  int step = 1;
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int64_t at(int l, int64_t n) const {
    const int64_t i = first + l * step;
    return i < n ? i : n - 1;
  }
};

// The value of a lane scalar: a float, or a dual's value part.
template <class S>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void set_value(S& x, float v) {
  if constexpr (std::is_arithmetic_v<S>)
    x = v;
  else
    x.v = v;
}

// Transmit setting g of the lanes' problems (Tissue::transmit) into pf.
// On duals the directions seeded along B1 and B1phase (as `seeded` holds
// them) move setting t.transmit.seeded only.
template <class V>
BLOCHSIM_HD void load_transmit(PulseField<V>& pf, const LaneTissue<V>& seeded, const Tissue& t,
                               const LaneProblems& lanes, int g) {
  using LT = Lanes<V>;
  using S = typename LT::Scalar;
  const bool moves = g == t.transmit.seeded;
  for (int l = 0; l < LT::width; ++l) {
    const int64_t i = lanes.at(l, t.n);
    S m = moves ? LT::get(seeded[field_B1], l) : S(0.0f);
    S p = moves ? LT::get(seeded[field_B1phase], l) : S(0.0f);
    float magnitude, phase;
    t.transmit.field(i, g, magnitude, phase);
    set_value(m, magnitude);
    set_value(p, phase);
    LT::set(pf.b1, l, m);
    LT::set(pf.b1phase, l, p);
  }
}

// Plays the stream for the lanes' problems (`lanes`: which they are, for
// the per-pulse transmit settings of t.transmit).
template <class V, bool Complex, class Store, class Sink>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void play(const EventStream& s, const Tissue& t, const LaneTissue<V>& lt,
                                           Store& st, Sink& sink, LaneProblems lanes = {}) {
  const bool transmit = t.transmit.settings > 0;
  PulseField<V> pf{lt[field_B1], lt[field_B1phase]};
  int setting = -1;  // the transmit setting in pf
  PlayContext<V> cx;
  cx.rf_uniform = !transmit && !t[field_B1].present() && !t[field_B1phase].present();
  cx.per_order = t[field_D].present() || t[field_v].present();
  cx.c0 = std::cos(s.common_phase_rad);
  cx.s0 = std::sin(s.common_phase_rad);
  cx.m0 = lt[field_M0];
  constexpr int U = Store::unroll;
  const int K = s.states;
  // event indices fit in 32 bits (validate()), which saves registers
  const int32_t n = static_cast<int32_t>(s.n_events);
  int band = 1;
  if (n <= 0) return;
  st.advance(s, 0, 1);
  EventRecord ev = st.record(s, 0);
  for (int32_t e = 0; e < n;) {
    // the records of events e .. e + U are at hand (the store may stage them)
    st.advance(s, e, U + 1);
    if (transmit && (ev.flags & event_rf) && transmit_setting(ev.flags) != setting) {
      // a run of events keeps one setting (pack_events)
      setting = transmit_setting(ev.flags);
      load_transmit(pf, lt, t, lanes, setting);
    }
    if constexpr (U > 1) {
      // U events of one operator and one shift up each, the shifts done by
      // renaming registers (RegisterStore::apply_shift_run); the run counts
      // come with the records (pack_events)
      if (!cx.per_order && ev.run >= U && st.fast_ok(band)) {
        const bool rows = cx.rf_uniform;  // the records carry the rows
        if constexpr (PipelinedStore<Store>::value) {
          if (rows)
            pipelined_fast_run<V, Complex, pulse_rows>(s, pf, cx, st, sink, e, band, ev);
          else
            pipelined_fast_run<V, Complex, pulse_lanes>(s, pf, cx, st, sink, e, band, ev);
        } else if (rows && st.truncate)
          fast_run<V, Complex, pulse_rows, true>(s, pf, cx, st, sink, e, band, ev);
        else if (rows)
          fast_run<V, Complex, pulse_rows, false>(s, pf, cx, st, sink, e, band, ev);
        else if (st.truncate)
          fast_run<V, Complex, pulse_lanes, true>(s, pf, cx, st, sink, e, band, ev);
        else
          fast_run<V, Complex, pulse_lanes, false>(s, pf, cx, st, sink, e, band, ev);
        e += U;
        band = band + U < K ? band + U : K;
        continue;
      }
    }
    // the next event's fields are in flight while this one computes
    const EventRecord next = st.record(s, e + 1 < n ? e + 1 : e);
    const uint32_t f = ev.flags;
    typename Store::OpT o;
    const bool apply = event_op<V, Complex>(s, ev, lt, pf, cx, st, band, o);
    const int32_t sb = ev.shift_before, sa = ev.shift_after;
    for (int i = 0; i < (sb > 0 ? sb : -sb); ++i) {
      st.shift_once(sb > 0 ? 1 : -1, band);
      band = band < K ? band + 1 : K;
    }
    if (apply) st.apply(o, band);
    if (f & event_readout) take_readout<V, Complex>(s, e, ev, cx, st.f0r(), st.f0i(), sink);
    if (f & event_spoil) {
      st.spoil(band);
    } else {
      for (int i = 0; i < (sa > 0 ? sa : -sa); ++i) {
        st.shift_once(sa > 0 ? 1 : -1, band);
        band = band < K ? band + 1 : K;
      }
    }
    ev = next;
    ++e;
  }
}

// Writes the samples of a lane vector of problems [first, first + width)
// into the interleaved complex64 output, skipping lanes past n: staged a
// tile of readouts at a time (SampleTile); flush() after the last event
// writes what is left.
template <class V>
struct LaneSink {
  float* out;
  int64_t first, n, n_samples;
  SampleTile<V> tile{};

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void write(int64_t slot, const V& re, const V& im) {
    if (tile.push(slot, re, im)) flush();
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void flush() { tile.flush(out + 2 * first * n_samples, 2 * n_samples, n - first); }
};

// Problem indices of a lane vector starting at `first`; lanes past t.n
// replay the last problem (and write nothing), so every problem goes through
// the same instructions wherever it lands.
template <int W>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void lane_indices(int64_t first, int64_t n, int64_t* idx) {
  for (int l = 0; l < W; ++l) idx[l] = first + l < n ? first + l : n - 1;
}

// Play the stream for problems [first, first + width) of t with all orders
// in `work` (SlidingPlaneStore<V, Complex>::workspace(s) lane vectors).
template <class V, bool Complex, class M = double>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int forward_block(const EventStream& s, const Tissue& t, int64_t first,
                                                   V* work, float* out) {
  constexpr int W = Lanes<V>::width;
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  const LaneTissue<V> lt = gather<V>(t, idx);
  SlidingPlaneStore<V, Complex, Complex ? 1 : 2> st;
  st.template init<M>(s, lt, work);
  LaneSink<V> sink{out, first, t.n, s.n_samples};
  play<V, Complex>(s, t, lt, st, sink, LaneProblems{first, 1});
  sink.flush();
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
