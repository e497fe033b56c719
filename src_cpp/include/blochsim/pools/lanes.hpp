// The pooled EPG of a block of problems in the lanes of a vector (16 a
// SIMD vector on the host, one a thread on the device), in single
// precision: the host's pooled forward and its Jacobian on lanes of duals.
#pragma once

#include "play.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

// The shifts of a stream in each direction (a spoil cancels the shifts
// after it, as play() does).
BLOCHSIM_HD inline void stream_shifts(const EventStream& s, int64_t& plus, int64_t& minus) {
  plus = minus = 0;
  for (int64_t e = 0; e < s.n_events; ++e) {
    const int32_t sb = s.shift_before[e], sa = (s.flags[e] & event_spoil) ? 0 : s.shift_after[e];
    plus += (sb > 0 ? sb : 0) + (sa > 0 ? sa : 0);
    minus += (sb < 0 ? -sb : 0) + (sa < 0 ? -sa : 0);
  }
}

// Length of a sliding transverse row of pooled_block: K orders and room to
// slide once per shift of the stream.
BLOCHSIM_HD inline int64_t pool_row_length(const EventStream& s) {
  int64_t plus, minus;
  stream_shifts(s, plus, minus);
  return s.states + plus + minus + 1;
}

// Vector lanes of pooled_block's workspace (V units, per lane vector) for
// the pools of p over the stream s.
inline int64_t pool_block_workspace(const EventStream& s, const Pools& p) {
  const PoolLayout l = pool_layout(p);
  const int64_t n = l.n, m = l.m, d = 2 * n + m;
  const int64_t states = 4 * n * pool_row_length(s) + 2 * m * static_cast<int64_t>(s.states);
  const int64_t per_interval = 1 + 2 * n * n + m * m + m;
  const int64_t per_driven = 1 + 2 * d * (d + 1);
  return states + per_interval * s.n_intervals + per_driven * (s.driven ? s.n_driven : 0) + 8;
}

// The last two distinct saturations a block's lanes formed (a train that
// alternates saturating pulses forms each once), keyed by the event values
// that form them: duration (s), flip (rad), power factor, offset (Hz) and
// dual.  The block's tissue does not change, so an equal key is an equal
// operator.  Least recently used goes first.
template <class Sat>
struct SaturationCache {
  struct Key {
    float duration = -1.0f, flip = 0.0f, power = 0.0f, offset = 0.0f;
    bool dual = false;
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool operator==(const Key& k) const {
      return duration == k.duration && flip == k.flip && power == k.power && offset == k.offset && dual == k.dual;
    }
  };
  // two named entries, not an array: an index known only at run time
  // would keep the whole store in the device's local memory
  Key key0, key1;
  Sat sat0, sat1;
  bool next1 = false;  // the entry put() replaces
  // Copies the entry with key k into out; false when there is none.  (A
  // duration of -1 marks an empty entry; a saturating event's is > 0.)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool get(const Key& k, Sat& out) {
    if (key0 == k) {
      out = sat0;
      next1 = true;
      return true;
    }
    if (key1 == k) {
      out = sat1;
      next1 = false;
      return true;
    }
    return false;
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void put(const Key& k, const Sat& v) {
    if (next1) {
      key1 = k;
      sat1 = v;
    } else {
      key0 = k;
      sat0 = v;
    }
    next1 = !next1;
  }
};

// The forward pooled EPG of problems [first, first + width) of t in the
// lanes of V (16 problems a SIMD vector on the host, one a thread on the
// device), in single precision: pools/play.hpp's event on a Store whose
// per-problem operators are formed per lane in double precision (interval
// exponentials and exact pulses the first time an event uses them, a
// saturation when it is not among the last two formed) and applied to the
// lanes at once.  Lanes past t.n replay the last problem and write
// nothing.  work holds pool_block_workspace(s, p) lane vectors, element i
// at work[i * ws].
//
// The transverse rows slide instead of moving their orders at a shift
// (order k of F+ at element bp + k of its row, of F- at bm + k; a shift
// moves bp and bm by one and writes three elements a row), so a row holds
// pool_row_length(s) elements, and every element outside the K orders a
// row shows is zero.
//
// Real (pooled_real_path): every RF phase is 0 or pi and nothing turns the
// transverse states (no B0, B1phase, chemical shift or exact pulse), so F+
// and F- stay imaginary and Z real (SPEC §1's real subspace): only those
// planes are computed; the others stay zero.  The complex planes are
// framed (pools/play.hpp).
//
// The pool counts are template parameters (N liquid pools, Bound: the
// star's one semisolid pool), so that the loops over pools unroll (Fixed);
// or, for the rarer counts (four liquid pools or more) and every network
// beyond the star (PoolLayout::network), N and M are the most the store
// holds and the counts are read from p at run time (PoolCounts), one
// instantiation for all of them instead of one each.  WS > 0 is the workspace stride at compile
// time, WS = 0 takes it from ws.  ls: the super-Lorentzian table in memory
// the caller can read (host_lineshape_table() on the host).
//
// On lanes of duals (V = Dual<lanes, D>) the same pass carries the
// derivatives along jo's directions (the per-lane operators are formed on
// Dual<double, D>) and writes them to jo.jac.
template <class V_, int N_, bool Bound, int64_t WS, bool Real_, bool Fixed_ = true>
struct PoolLanes : PoolCounts<N_, Fixed_ ? N_ + (Bound ? 1 : 0) : max_longitudinal_pools, Fixed_> {
  using Counts = PoolCounts<N_, Fixed_ ? N_ + (Bound ? 1 : 0) : max_longitudinal_pools, Fixed_>;
  using Counts::m;
  using Counts::n;
  using V = V_;
  using C = V;
  using Scale = V;
  using Sat = typename std::conditional<Fixed_, SingleSaturation<V>, SemisolidSaturation<V>>::type;
  using LT = Lanes<V>;
  using Sc = typename LT::Scalar;                    // one lane's value
  using QS = typename LT::template Wide<double>;  // one lane's value in double precision
  static constexpr int W = LT::width;
  static constexpr int N = N_, M = Counts::m_max, D = 2 * N + M;
  static constexpr bool fixed = Fixed_, real = Real_, framed = !Real_;
  using Order = PoolOrder<V, N, M>;
  using Step = PoolStep<V, V, N, M, Real_, Fixed_>;

  const EventStream& s;
  const Tissue& t;
  const Pools& p;
  const LineshapeTable& ls;
  int64_t first;
  V* work;
  int64_t ws;
  float* out;
  const PooledJacobianOut& jo;
  PoolTissue<QS> q[W];
  V M0{}, eta{};
  bool uniform_rf = true, constant_rf = true, nominal_rf = false;
  int K, band = 1;
  // workspace: F+ (re, im), F- (re, im) of each liquid pool (rows of R
  // elements), Z (re, im) of every longitudinal family (rows of K); then
  // the operators
  int64_t R, bp, bm, fpr, fpi, fmr, fmi, zr, zi, ops, drv;
  // operator scalars of an interval and of an exact pulse (d components)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int64_t per_interval() const { return 1 + 2 * n * n + m * m + m; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int d() const { return 2 * n + m; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int64_t per_driven() const { return 1 + 2 * d() * (d() + 1); }
  // T2b G(offset - B0) per lane for the last pulse offset seen (a dual
  // pulse: the mean of G at +offset and -offset)
  float g_offset = 0.0f;
  bool g_ready = false, g_dual = false;
  QS g_lane[W];
  SaturationCache<Sat> sat_cache;
  V frame_c = V{} + 1.0f, frame_s{};

  BLOCHSIM_HD PoolLanes(const EventStream& s_, const Tissue& t_, const Pools& p_, const LineshapeTable& ls_,
                        int64_t first_, V* work_, int64_t ws_runtime, float* out_, const PooledJacobianOut& jo_)
      : s(s_), t(t_), p(p_), ls(ls_), first(first_), work(work_), ws(WS > 0 ? WS : ws_runtime), out(out_), jo(jo_) {
    for (int l = 0; l < W; ++l) {
      const int64_t i = first + l < t.n ? first + l : t.n - 1;
      q[l] = pool_tissue<QS>(t, p, i, jo.fields, jo.n_dirs, jo.seeds);
    }
    const PoolLayout lay = pool_layout(p);
    Counts::set(lay.n, lay.m);
    K = s.states;
    for (int l = 0; l < W; ++l) {
      LT::set(M0, l, static_cast<Sc>(q[l].M0));
      LT::set(eta, l, static_cast<Sc>(q[l].eta));
      uniform_rf = uniform_rf && value_of(q[l].B1) == value_of(q[0].B1) &&
                   value_of(q[l].B1phase) == value_of(q[0].B1phase);
    }
    // B1 and B1phase carry no derivative (the lanes of a dual share their
    // seeds, so lane 0 stands for all)
    if constexpr (IsDual<QS>::value)
      for (int j = 0; j < jo.n_dirs; ++j) constant_rf = constant_rf && q[0].B1.d[j] == 0.0 && q[0].B1phase.d[j] == 0.0;
    // every lane at B1 = 1 and no transmit phase: the stream's table holds
    // each pulse's cos and sin (formed once per sequence)
    nominal_rf = uniform_rf && constant_rf && value_of(q[0].B1) == 1.0 && value_of(q[0].B1phase) == 0.0 &&
                 s.rf_table != nullptr;
    int64_t n_plus, n_minus;
    stream_shifts(s, n_plus, n_minus);
    R = K + n_plus + n_minus + 1;
    bp = n_plus;  // where order 0 of the F+ and F- rows is
    bm = n_minus;
    fpr = 0;
    fpi = n * R;
    fmr = 2 * n * R;
    fmi = 3 * n * R;
    zr = 4 * n * R;
    zi = 4 * n * R + m * K;
    ops = 4 * n * R + 2 * m * static_cast<int64_t>(K);
    drv = ops + per_interval() * s.n_intervals;
    for (int64_t i = 0; i < ops; ++i) at(i) = V{};
    for (int j = 0; j < m; ++j) {
      V f{};
      for (int l = 0; l < W; ++l) LT::set(f, l, static_cast<Sc>(q[l].f[j]));
      at(zr + j * K) = f;
    }
    for (int64_t v = 0; v < s.n_intervals; ++v) at(ops + v * per_interval()) = V{};
    if (s.driven)
      for (int64_t v = 0; v < s.n_driven; ++v) at(drv + v * per_driven()) = V{};
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V& at(int64_t i) const { return work[i * (WS > 0 ? WS : ws)]; }
  // F+ row j, order k (plus fpr or fpi); F- likewise (plus fmr or fmi)
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int64_t xp(int j, int k) const { return j * R + bp + k; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE int64_t xm(int j, int k) const { return j * R + bm + k; }

  BLOCHSIM_HD uint32_t flags(int64_t e) const { return s.flags[e]; }
  BLOCHSIM_HD int32_t interval_of(int64_t e) const { return s.interval[e]; }
  BLOCHSIM_HD int32_t shift_before(int64_t e) const { return s.shift_before[e]; }
  BLOCHSIM_HD int32_t shift_after(int64_t e) const { return s.shift_after[e]; }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool at_zero(int k) const { return k == 0; }

  // Where the orders are (a copy the passes keep in registers: the
  // store's own members are reloaded after every call the compiler cannot
  // see into).  One order's state in locals; on the real planes only ai, bi
  // and cr.
  struct Rows : Counts {
    using Counts::m;
    using Counts::n;
    V* work;
    int64_t ws, fpr, fpi, fmr, fmi, zr, zi, R, bp, bm;
    int K;
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE V& at(int64_t i) const { return work[i * (WS > 0 ? WS : ws)]; }
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE void load(int k, Order& o) const {
      for (int j = 0; j < n; ++j) {
        if constexpr (!real) {
          o.ar[j] = at(fpr + j * R + bp + k);
          o.br[j] = at(fmr + j * R + bm + k);
        }
        o.ai[j] = at(fpi + j * R + bp + k);
        o.bi[j] = at(fmi + j * R + bm + k);
      }
      for (int j = 0; j < m; ++j) {
        o.cr[j] = at(zr + j * K + k);
        if constexpr (!real) o.ci[j] = at(zi + j * K + k);
      }
    }
    BLOCHSIM_HD BLOCHSIM_FORCEINLINE void store(int k, const Order& o) const {
      for (int j = 0; j < n; ++j) {
        if constexpr (!real) {
          at(fpr + j * R + bp + k) = o.ar[j];
          at(fmr + j * R + bm + k) = o.br[j];
        }
        at(fpi + j * R + bp + k) = o.ai[j];
        at(fmi + j * R + bm + k) = o.bi[j];
      }
      for (int j = 0; j < m; ++j) {
        at(zr + j * K + k) = o.cr[j];
        if constexpr (!real) at(zi + j * K + k) = o.ci[j];
      }
    }
  };
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Rows rows() const {
    return {static_cast<const Counts&>(*this), work, ws, fpr, fpi, fmr, fmi, zr, zi, R, bp, bm, K};
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void load(int k, Order& o) const { rows().load(k, o); }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void each(F&& f) const {
    const Rows r = rows();
    const int b = band;
    for (int k = 0; k < b; ++k) {
      Order o;
      r.load(k, o);
      f(k, o);
      r.store(k, o);
    }
  }
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void transform(F&& f) const {
    const Rows r = rows();
    const int b = band;
    for (int k = 0; k < b; ++k) {
      Order o, x;
      r.load(k, o);
      f(k, o, x);
      r.store(k, x);
    }
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void order_zero(Order& o) const { load(0, o); }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift(int dir) {
    // the row that moves up (F+ for dir > 0) gains order 0 = conj of the
    // other's new order 0 and drops its old order K - 1; the other drops
    // its old order 0 and gains a zero order K - 1 from outside
    if (dir > 0) {
      --bp;
      ++bm;
    } else {
      ++bp;
      --bm;
    }
    for (int j = 0; j < n; ++j)
      for (int part = real ? 1 : 0; part < 2; ++part) {
        const int64_t up = dir > 0 ? (part ? fpi : fpr) + xp(j, 0) : (part ? fmi : fmr) + xm(j, 0);
        const int64_t dn = dir > 0 ? (part ? fmi : fmr) + xm(j, 0) : (part ? fpi : fpr) + xp(j, 0);
        at(up + K) = V{};
        at(dn - 1) = V{};
        at(up) = part ? -at(dn) : at(dn);  // F_up,0 = conj(F_dn,0)
      }
    band = band < K ? band + 1 : K;
  }

  // The interval's operators, formed per lane the first time; copied into
  // the event's locals (the compiler cannot keep them in registers across
  // the stores to the workspace otherwise).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void interval(int32_t iv, Step& step) const {
    const int64_t o = ops + iv * per_interval();
    const int64_t P = o + 1, L = P + 2 * n * n, Rr = L + m * m;
    if (value_of(LT::get(at(o), 0)) == 0.0f) {
      for (int l = 0; l < W; ++l) {
        Cx<QS> Pl[max_liquid_pools * max_liquid_pools];
        QS Ll[max_longitudinal_pools * max_longitudinal_pools], rl[max_longitudinal_pools];
        pool_interval(q[l], QS(s.duration_s[iv]), Pl, Ll, rl);
        for (int i = 0; i < n * n; ++i) {
          LT::set(at(P + 2 * i), l, static_cast<Sc>(Pl[i].re));
          LT::set(at(P + 2 * i + 1), l, static_cast<Sc>(Pl[i].im));
        }
        for (int i = 0; i < m * m; ++i) LT::set(at(L + i), l, static_cast<Sc>(Ll[i]));
        for (int i = 0; i < m; ++i) LT::set(at(Rr + i), l, static_cast<Sc>(rl[i]));
        LT::set(at(o), l, 1.0f);
      }
    }
    if constexpr (!fixed) {
      step.n = n;
      step.m = m;
    }
    for (int i = 0; i < 2 * n * n; ++i) step.P[i] = at(P + i);
    for (int i = 0; i < m * m; ++i) step.L[i] = at(L + i);
    for (int i = 0; i < m; ++i) step.z0[i] = at(Rr + i);
  }

  // The saturation of event e, from the cache when one of the last two
  // formed had the same pulse.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool saturation(int64_t e, Sat& sat) {
    if (!(m > n && s.rf_duration_s != nullptr && (s.flags[e] & (event_rf | event_saturation)) &&
          s.rf_duration_s[e] > 0.0f))
      return false;
    const float offset = s.rf_offset_hz ? s.rf_offset_hz[e] : 0.0f;
    const float power = s.rf_power ? s.rf_power[e] : 1.0f;
    const bool dual = (s.flags[e] & event_dual) != 0;
    const typename SaturationCache<Sat>::Key key{s.rf_duration_s[e], s.flip_rad[e], power, offset, dual};
    if (sat_cache.get(key, sat)) return true;
    form_saturation(e, offset, power, dual, sat);
    sat_cache.put(key, sat);
    return true;
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void form_saturation(int64_t e, float offset, float power, bool dual, Sat& sat) {
    const double tau_rf = s.rf_duration_s[e];
    if constexpr (!fixed) {
      if (q[0].nb > 1 || q[0].dipolar[0] >= 0 || dual) {
        for (int l = 0; l < W; ++l) {
          SemisolidSaturation<QS> one;
          semisolid_saturation(q[l], p.lineshape, ls, QS(tau_rf), q[l].B1 * static_cast<double>(s.flip_rad[e]),
                               static_cast<double>(power), QS(static_cast<double>(offset)), dual, one);
          sat.count = one.count;
          for (int j = 0; j < one.count; ++j) {
            sat.z[j] = one.z[j];
            sat.dz[j] = one.dz[j];
            LT::set(sat.a[j], l, static_cast<Sc>(one.a[j]));
            LT::set(sat.b[j], l, static_cast<Sc>(one.b[j]));
            LT::set(sat.c[j], l, static_cast<Sc>(one.c[j]));
          }
        }
        return;
      }
      sat.count = 1;
      sat.z[0] = n;
      sat.dz[0] = -1;
    }
    if (!g_ready || offset != g_offset || dual != g_dual) {
      for (int l = 0; l < W; ++l) g_lane[l] = saturation_lineshape(p.lineshape, ls, q[l].T2b, q[l].B0, offset, dual);
      g_offset = offset;
      g_dual = dual;
      g_ready = true;
    }
    for (int l = 0; l < W; ++l) {
      const QS a = q[l].B1 * static_cast<double>(s.flip_rad[e]);
      using std::exp;
      const Sc decay = static_cast<Sc>(exp(-(pi * static_cast<double>(power) / tau_rf) * g_lane[l] * (a * a)));
      if constexpr (fixed)
        LT::set(sat.decay, l, decay);
      else
        LT::set(sat.a[0], l, decay);
    }
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pulse(int64_t e, V& ca, V& sa, V& cp, V& sp) const {
    if (nominal_rf) {
      const float* row = s.rf_table + e * rf_table_fields;
      ca = V{} + row[rft_cos];
      sa = V{} + row[rft_sin];
      cp = V{} + row[rft_cos_phase];
      sp = V{} + row[rft_sin_phase];
      return;
    }
    using std::cos;
    using std::sin;
    for (int l = 0; l < (uniform_rf ? 1 : W); ++l) {
      const QS a = q[l].B1 * static_cast<double>(s.flip_rad[e]);
      const QS ph = q[l].B1phase + static_cast<double>(s.phase_rad[e]);
      LT::set(ca, l, static_cast<Sc>(cos(a)));
      LT::set(sa, l, static_cast<Sc>(sin(a)));
      LT::set(cp, l, static_cast<Sc>(cos(ph)));
      LT::set(sp, l, static_cast<Sc>(sin(ph)));
    }
    if (uniform_rf) {
      ca = LT::splat(LT::get(ca, 0));
      sa = LT::splat(LT::get(sa, 0));
      cp = LT::splat(LT::get(cp, 0));
      sp = LT::splat(LT::get(sp, 0));
    }
  }
  // On duals, a pulse that carries no derivative turns the orders with
  // plain lanes, multiplying each dual at a third of a dual product.
  template <class F>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rotations(const V& ca, const V& sa, const V& cp, const V& sp, F&& f) const {
    if constexpr (IsDual<V>::value) {
      using B = decltype(V{}.v);
      if (constant_rf) {
        f(PoolRotation<B>(ca.v, sa.v, cp.v, sp.v));
        return;
      }
    }
    f(PoolRotation<V>(ca, sa, cp, sp));
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE auto driven(int64_t e) const {
    const int32_t id = s.driven[e];
    const int dd = d();
    const int64_t o = drv + id * per_driven(), Mo = o + 1, Co = Mo + 2 * dd * dd;
    if (value_of(LT::get(at(o), 0)) == 0.0f) {
      for (int l = 0; l < W; ++l) {
        Cx<QS> Ml[max_driven_size * max_driven_size], cl[max_driven_size];
        pool_driven(q[l], p.lineshape, ls, driven_pulse<QS>(s.driven_table + id * driven_fields), Ml, cl);
        for (int i = 0; i < dd * dd; ++i) {
          LT::set(at(Mo + 2 * i), l, static_cast<Sc>(Ml[i].re));
          LT::set(at(Mo + 2 * i + 1), l, static_cast<Sc>(Ml[i].im));
        }
        for (int i = 0; i < dd; ++i) {
          LT::set(at(Co + 2 * i), l, static_cast<Sc>(cl[i].re));
          LT::set(at(Co + 2 * i + 1), l, static_cast<Sc>(cl[i].im));
        }
        LT::set(at(o), l, 1.0f);
      }
    }
    const PoolLanes* self = this;
    return [self, Mo, Co](Order& x, bool zero) BLOCHSIM_LAMBDA_INLINE {
      pool_drive<fixed>([&](int i) -> const V& { return self->at(Mo + i); },
                        [&](int i) -> const V& { return self->at(Co + i); }, zero, x, self->n, self->m);
    };
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V inversion() const { return -eta; }

  // M0 (F+) e^{-i rx} of each lane to out (and its derivatives to jo.jac)
  template <class Sink>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void sample(int64_t e, const V& accr, const V& acci, Sink&) const {
    const float cr = s.rf_table ? s.rf_table[e * rf_table_fields + rft_cos_rx]
                                : static_cast<float>(std::cos(static_cast<double>(s.rx_phase_rad[e])));
    const float sr = s.rf_table ? s.rf_table[e * rf_table_fields + rft_sin_rx]
                                : static_cast<float>(std::sin(static_cast<double>(s.rx_phase_rad[e])));
    const V re = M0 * (accr * cr + acci * sr), im = M0 * (acci * cr - accr * sr);
    const int32_t slot = s.slot[e];
    for (int l = 0; l < W; ++l) {
      if (first + l >= t.n) break;
      const Sc vr = LT::get(re, l), vi = LT::get(im, l);
      float* o = out + ((first + l) * s.n_samples + slot) * 2;
      o[0] = value_of(vr);
      o[1] = value_of(vi);
      if constexpr (IsDual<Sc>::value)
        for (int j = 0; j < jo.n_dirs; ++j) {
          float* dj = jo.jac + (((first + l) * jo.jac_dirs + jo.first_dir + j) * s.n_samples + slot) * 2;
          dj[0] = vr.d[j];
          dj[1] = vi.d[j];
        }
    }
  }
};

template <class V, int N, bool Bound, int64_t WS, bool Real = false, bool Fixed = true>
BLOCHSIM_HD inline int pooled_block_of(const EventStream& s, const Tissue& t, const Pools& p,
                                       const LineshapeTable& ls, int64_t first, V* work, int64_t ws_runtime,
                                       float* out, const PooledJacobianOut& jo = PooledJacobianOut{}) {
  PoolLanes<V, N, Bound, WS, Real, Fixed> st(s, t, p, ls, first, work, ws_runtime, out, jo);
  const int none = 0;
  for (int64_t e = 0; e < s.n_events; ++e) pooled_event(s, e, st, none);
  return ok;
}

template <class V, int64_t WS = 0>
BLOCHSIM_HD inline int pooled_block(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                    int64_t first, V* work, int64_t ws, float* out) {
  const int key = pool_layout(p).network ? -1 : 2 * p.n_exchanging + (p.bound ? 1 : 0);
  switch (key) {
    case 0: return pooled_block_of<V, 1, false, WS>(s, t, p, ls, first, work, ws, out);
    case 1: return pooled_block_of<V, 1, true, WS>(s, t, p, ls, first, work, ws, out);
    case 2: return pooled_block_of<V, 2, false, WS>(s, t, p, ls, first, work, ws, out);
    case 3: return pooled_block_of<V, 2, true, WS>(s, t, p, ls, first, work, ws, out);
    case 4: return pooled_block_of<V, 3, false, WS>(s, t, p, ls, first, work, ws, out);
    case 5: return pooled_block_of<V, 3, true, WS>(s, t, p, ls, first, work, ws, out);
    default:
      if (p.n_exchanging < 0 || p.n_exchanging > max_exchanging_pools) return bad_pools;
      return pooled_block_of<V, max_liquid_pools, true, WS, false, false>(s, t, p, ls, first, work, ws, out);
  }
}

// Whether pooled_block_of may play the stream on its real planes: phases 0
// or pi, nothing off-axis (the stream's real-subspace verdict with no common
// phase, and no B0 or B1phase in t), no chemical shift and no exact pulse;
// and the pool counts a real variant is compiled for (the MT pool alone,
// one exchanging pool, and every network at run-time counts: its pair
// exchange, relaxation and saturation are real too).
BLOCHSIM_HD inline bool pooled_real_path(const EventStream& s, const Tissue& t, const Pools& p) {
  if (!s.real_path || s.driven) return false;
  if (t[field_B0].present() || t[field_B0].fallback != 0.0f || t[field_B1phase].present() || t[field_B1phase].fallback != 0.0f)
    return false;
  const double ph = s.common_phase_rad;
  if (std::sin(ph) > 1e-6 || std::sin(ph) < -1e-6) return false;
  for (int j = 0; j < p.n_exchanging; ++j)
    if (p.exchanging(j)[pool_shift_hz].present()) return false;
  if (pool_layout(p).network) return true;
  return (p.n_exchanging == 0 && p.bound) || (p.n_exchanging == 1 && !p.bound);
}

// pooled_block on the real planes when pooled_real_path(s, p), else as
// pooled_block (the host's entry; the device plays the complex planes).
template <class V, int64_t WS = 0>
inline int pooled_block_host(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                             int64_t first, V* work, int64_t ws, float* out, bool real) {
  if (real && pool_layout(p).network)
    return pooled_block_of<V, max_liquid_pools, true, WS, true, false>(s, t, p, ls, first, work, ws, out);
  if (real && p.n_exchanging == 0) return pooled_block_of<V, 1, true, WS, true>(s, t, p, ls, first, work, ws, out);
  if (real) return pooled_block_of<V, 2, false, WS, true>(s, t, p, ls, first, work, ws, out);
  return pooled_block<V, WS>(s, t, p, ls, first, work, ws, out);
}

// Whether pooled_jacobian_block plays these pools: the semisolid pool
// alone, one exchanging pool with or without it, or a network (at run-time
// counts).
BLOCHSIM_HD inline bool pooled_lane_jacobian(const Pools& p) {
  return pool_layout(p).network || p.n_exchanging == 1 || (p.n_exchanging == 0 && p.bound);
}

// Whether a Jacobian pass along jo's directions turns the transverse states
// off the real planes (B1phase, B0, a chemical shift): its derivatives need
// the complex planes even where the values stay real.
BLOCHSIM_HD inline bool pooled_dirs_turn(const PooledJacobianOut& jo) {
  for (int j = 0; j < jo.n_dirs; ++j) {
    const int f = jo.fields[j];
    if (f == field_B1phase || f == field_B0 || (f >= field_pool_first && (f - field_pool_first) % pool_columns == pool_shift_hz))
      return true;
  }
  return false;
}

// A pooled Jacobian pass on lanes of duals (V = Dual<lanes, D>, jo.n_dirs
// <= D): pooled_block_of for the pools of pooled_lane_jacobian (bad_pools
// for others), on the real planes when real.
template <class V, int64_t WS = 0>
inline int pooled_jacobian_block(const EventStream& s, const Tissue& t, const Pools& p, const LineshapeTable& ls,
                                 int64_t first, V* work, int64_t ws, float* out, bool real,
                                 const PooledJacobianOut& jo) {
  if (!pooled_lane_jacobian(p)) return bad_pools;
  if (pool_layout(p).network)
    return real ? pooled_block_of<V, max_liquid_pools, true, WS, true, false>(s, t, p, ls, first, work, ws, out, jo)
                : pooled_block_of<V, max_liquid_pools, true, WS, false, false>(s, t, p, ls, first, work, ws, out, jo);
  if (p.n_exchanging == 0) {
    return real ? pooled_block_of<V, 1, true, WS, true>(s, t, p, ls, first, work, ws, out, jo)
                : pooled_block_of<V, 1, true, WS>(s, t, p, ls, first, work, ws, out, jo);
  }
  if (p.bound) return pooled_block_of<V, 2, true, WS>(s, t, p, ls, first, work, ws, out, jo);
  return real ? pooled_block_of<V, 2, false, WS, true>(s, t, p, ls, first, work, ws, out, jo)
              : pooled_block_of<V, 2, false, WS>(s, t, p, ls, first, work, ws, out, jo);
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
