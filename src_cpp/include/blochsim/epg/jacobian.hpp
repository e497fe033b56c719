// Forward-mode tissue Jacobians: the EPG event loop of epg/epg.hpp played on
// multi-direction dual numbers (dual.hpp), so that one pass gives every
// sample and its derivative with respect to up to N tissue properties.
//
// Directions are tissue fields (TissueField, the order of Tissue and of
// LaneTissue); each direction's derivative is with respect to the field in
// its SI unit.  Jacobian layout: jac[((i * n_dirs + j) * n_samples + slot) *
// 2 + {0, 1}] = (Re, Im) of d sample / d field_j of problem i, complex64
// interleaved.
#pragma once

#include <type_traits>
#include <vector>

#include "../dual.hpp"
#include "epg.hpp"
#include "registers.hpp"

namespace blochsim {

// The most directions one pass of the host's Jacobian kernels carries:
// more are played in passes (jacobian_passes).  Wider duals cost more per
// direction on the host's lanes than a second pass (bench/NOTES.md: five
// directions at once 0.68 s, as passes of four and one 0.54 s), and each
// width is a whole compiled player.
constexpr int max_dual_width = 4;

// Directions a dual of the Jacobian kernels carries for n_dirs requested
// ones, in its widest pass (the kernels are compiled for these widths; the
// spare directions are left unseeded).
inline int dual_width(int n_dirs) { return n_dirs <= 1 ? 1 : n_dirs <= 2 ? 2 : max_dual_width; }

// The directions among fields[0 .. n_dirs) that the host's duals carry: all
// but M0, which only scales the readouts, so that d S / d M0 = S / M0 comes
// from the unscaled signal at no cost (host jacobian_block).
inline int dual_directions(const int* fields, int n_dirs) {
  int n = 0;
  for (int j = 0; j < n_dirs; ++j) n += fields[j] != field_M0;
  return n;
}

// Calls f(a, b, width) for consecutive passes [a, b) of fields[0 .. n_dirs),
// each carrying at most max_dual_width dual directions (M0 rides along
// free), width the pass's dual_width as a std::integral_constant.
template <class F>
inline int jacobian_passes(const int* fields, int n_dirs, F&& f) {
  int a = 0;
  while (a < n_dirs) {
    int b = a, duals = 0;
    while (b < n_dirs && (fields[b] == field_M0 || duals < max_dual_width)) duals += fields[b++] != field_M0;
    const int w = dual_width(duals);
    const int st = w == 1   ? f(a, b, std::integral_constant<int, 1>{})
                   : w == 2 ? f(a, b, std::integral_constant<int, 2>{})
                            : f(a, b, std::integral_constant<int, max_dual_width>{});
    if (st != ok) return st;
    a = b;
  }
  return ok;
}

// Checks Jacobian directions: 1 to tissue_fields distinct tissue fields.
inline int validate_directions(const int* fields, int n_dirs) {
  if (n_dirs < 1 || n_dirs > tissue_fields) return bad_shape;
  for (int j = 0; j < n_dirs; ++j) {
    if (fields[j] < 0 || fields[j] >= tissue_fields) return bad_shape;
    for (int i = 0; i < j; ++i)
      if (fields[i] == fields[j]) return bad_shape;
  }
  return ok;
}

inline namespace BLOCHSIM_ISA {
namespace epg {

// Tangents in split form.  An event's fused operator is O = O_p E: the
// pulse O_p after the interval's free evolution E = diag(q, conj q, e1)
// (plus the recovery at Z_0).  Tissue enters E through q and e1 only, and
// dE = E diag(g, conj g, g_z) with g = dq / q, g_z = de1 / e1, so the
// tangent of direction j is carried as
//     t' = O (t + diag(g_j, conj g_j, g_z,j) x) + dO_p,j E x  (+ source'),
// one application of the value's operator to a pre-scaled tangent instead
// of the dual product of every coefficient with every state component (7
// multiply-adds a direction per order on the real path, plus two or three
// for the scaling, where the dual product costs 13).  The pulse term is
// there only when a direction moves the pulses (B1, B1phase, inversion
// efficiency).  Directions that act through per-order factors (D, v) go
// through relax_per_order on the duals as before.
template <class B, int N>
struct SplitOp {
  Op<B> v;                  // the operator's values, with its source
  Op<B> d[N];               // per direction: dO_p E, and the source's derivative (jr, ji, jz)
  // per direction: Re, Im d log q and d log e1 of the interval, copied out
  // of a LogDerivatives (held in the op itself, not as a member struct: that
  // ran 6 % slower on the host)
  B gfr[N], gfi[N], gz[N];
  bool pulse;               // whether the d[j] have non-zero coefficients
  unsigned q_dirs, e1_dirs;  // bit j: whether q (e1) may depend on direction j
};

// Whether any of fields[0 .. n) moves a pulse or an inversion.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool moves_pulses(const int* fields, int n) {
  for (int j = 0; j < n; ++j)
    if (fields[j] == field_B1 || fields[j] == field_B1phase || fields[j] == field_eta) return true;
  return false;
}

// The directions among fields[0 .. n) that q = e^{-tau/T2 - 2 pi i B0 tau}
// (times the washout's keep) can depend on (bit j for fields[j]), and
// those that e1 can depend on.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE unsigned q_directions(const int* fields, int n) {
  unsigned b = 0;
  for (int j = 0; j < n; ++j)
    if (fields[j] == field_T2 || fields[j] == field_B0 || fields[j] == field_v) b |= 1u << j;
  return b;
}
BLOCHSIM_HD BLOCHSIM_FORCEINLINE unsigned e1_directions(const int* fields, int n) {
  unsigned b = 0;
  for (int j = 0; j < n; ++j)
    if (fields[j] == field_T1 || fields[j] == field_v) b |= 1u << j;
  return b;
}

template <class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Op<B> op_part(const Op<Dual<B, N>>& o, int j) {
  auto at = [j](const Dual<B, N>& x) { return j < 0 ? x.v : x.d[j]; };
  return {at(o.pr), at(o.pi), at(o.ar), at(o.ai), at(o.br), at(o.bi),
          at(o.cr), at(o.ci), at(o.ca), at(o.jr), at(o.ji), at(o.jz)};
}

// num / den, and 0 where den is 0 (a factor that underflowed carries no
// derivative either).
template <class B>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE B ratio_or_zero(const B& num, const B& den) {
  return den != B{} ? num / den : B{};  // lane by lane on vector lanes
}

// A pulse or inversion (its derivatives those of O_p) with no interval.
template <class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE SplitOp<B, N> split_op(const Op<Dual<B, N>>& o, bool pulse) {
  SplitOp<B, N> r;
  r.v = op_part(o, -1);
  for (int j = 0; j < N; ++j) {
    r.d[j] = op_part(o, j);
    r.gfr[j] = r.gfi[j] = r.gz[j] = B{};
  }
  r.pulse = pulse;
  r.q_dirs = r.e1_dirs = 0;
  return r;
}

// The log-derivatives of an interval's factors along each direction.
template <class B, int N>
struct LogDerivatives {
  B gfr[N], gfi[N], gz[N];
};

template <bool Complex, class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LogDerivatives<B, N> log_derivatives(const IvCoef<Dual<B, N>>& c) {
  LogDerivatives<B, N> g;
  const B q2 = c.qr.v * c.qr.v + c.qi.v * c.qi.v;
  for (int j = 0; j < N; ++j) {
    if (Complex) {
      // dq / q = dq conj(q) / |q|^2
      g.gfr[j] = ratio_or_zero(c.qr.d[j] * c.qr.v + c.qi.d[j] * c.qi.v, q2);
      g.gfi[j] = ratio_or_zero(c.qi.d[j] * c.qr.v - c.qr.d[j] * c.qi.v, q2);
    } else {
      g.gfr[j] = ratio_or_zero(c.qr.d[j], c.qr.v);
      g.gfi[j] = B{};
    }
    g.gz[j] = ratio_or_zero(c.e1.d[j], c.e1.v);
  }
  return g;
}

// The pulse o after the interval c (whose log-derivatives are g), in split
// form.
template <bool Complex, class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE SplitOp<B, N> split_fuse(const Op<Dual<B, N>>& o, const IvCoef<Dual<B, N>>& c,
                                                          const LogDerivatives<B, N>& g, bool pulse,
                                                          unsigned q_dirs, unsigned e1_dirs) {
  const IvCoef<B> cv{c.qr.v, c.qi.v, c.e1.v, c.rec.v, c.dlog.v, c.flow.v};
  SplitOp<B, N> r;
  r.v = fuse<B, Complex>(op_part(o, -1), cv);
  r.pulse = pulse;
  r.q_dirs = q_dirs;
  r.e1_dirs = e1_dirs;
  for (int j = 0; j < N; ++j) {
    r.d[j] = pulse ? fuse<B, Complex>(op_part(o, j), cv) : Op<B>{};
    // the source O_p (rec e_Z0) differentiated whole: rec is not e1-proportional
    r.d[j].jr = o.br.d[j] * cv.rec + o.br.v * c.rec.d[j];
    r.d[j].ji = o.bi.d[j] * cv.rec + o.bi.v * c.rec.d[j];
    r.d[j].jz = o.ca.d[j] * cv.rec + o.ca.v * c.rec.d[j];
    r.gfr[j] = g.gfr[j];
    r.gfi[j] = g.gfi[j];
    r.gz[j] = g.gz[j];
  }
  return r;
}

template <class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool has_pulse(const SplitOp<B, N>& o) {
  return o.pulse;
}

// Whether the order update skips the log-derivative factors of directions
// they do not depend on: a multiply-add each on the host; on the device the
// branch would cost more than the multiply-add (see order_update in epg/epg.hpp).
#if defined(__CUDA_ARCH__)
constexpr bool skip_zero_factors = false;
#else
constexpr bool skip_zero_factors = true;
#endif

// One order under a split operator (see SplitOp); Pulse: whether o carries
// pulse derivatives (has_pulse).
template <bool Complex, bool Pulse, class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void order_update(const SplitOp<B, N>& o, Dual<B, N>& fpr, Dual<B, N>& fpi,
                                                   Dual<B, N>& fmr, Dual<B, N>& fmi, Dual<B, N>& zr,
                                                   Dual<B, N>& zi) {
  const B xpr = fpr.v, xpi = fpi.v, xmr = fmr.v, xmi = fmi.v, xzr = zr.v, xzi = zi.v;
BLOCHSIM_UNROLL
  for (int j = 0; j < N; ++j) {
    // F+ by g, F- by conj(g), Z by g_z, skipping the factors that do not
    // depend on direction j (a multiply-add each per order)
    B tpr = fpr.d[j], tmr = fmr.d[j], tzr = zr.d[j], tpi{}, tmi{}, tzi{};
    if (Complex) {
      tpi = fpi.d[j];
      tmi = fmi.d[j];
      tzi = zi.d[j];
    }
    if (!skip_zero_factors || (o.q_dirs >> j & 1u)) {
      const B gr = o.gfr[j];
      tpr += gr * xpr;
      tmr += gr * xmr;
      if (Complex) {
        const B gi = o.gfi[j];
        tpr -= gi * xpi;
        tpi += gr * xpi + gi * xpr;
        tmr += gi * xmi;
        tmi += gr * xmi - gi * xmr;
      }
    }
    if (!skip_zero_factors || (o.e1_dirs >> j & 1u)) {
      tzr += o.gz[j] * xzr;
      if (Complex) tzi += o.gz[j] * xzi;
    }
    apply_order<B, Complex>(o.v, tpr, tpi, tmr, tmi, tzr, tzi);
    if (Pulse) {
      B ypr = xpr, ypi = xpi, ymr = xmr, ymi = xmi, yzr = xzr, yzi = xzi;
      apply_order<B, Complex>(o.d[j], ypr, ypi, ymr, ymi, yzr, yzi);
      tpr += ypr;
      tmr += ymr;
      tzr += yzr;
      if (Complex) {
        tpi += ypi;
        tmi += ymi;
        tzi += yzi;
      }
    }
    fpr.d[j] = tpr;
    fmr.d[j] = tmr;
    zr.d[j] = tzr;
    if (Complex) {
      fpi.d[j] = tpi;
      fmi.d[j] = tmi;
      zi.d[j] = tzi;
    }
  }
  B vpr = xpr, vpi = xpi, vmr = xmr, vmi = xmi, vzr = xzr, vzi = xzi;
  apply_order<B, Complex>(o.v, vpr, vpi, vmr, vmi, vzr, vzi);
  fpr.v = vpr;
  fmr.v = vmr;
  zr.v = vzr;
  if (Complex) {
    fpi.v = vpi;
    fmi.v = vmi;
    zi.v = vzi;
  }
}

// The value of a team's member flag (a lane type, or a dual of one with
// no derivative).
template <class B>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE B flag_value(const B& f) {
  return f;
}
template <class B, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE B flag_value(const Dual<B, N>& f) {
  return f.v;
}

template <bool Complex, class B, int N, class F>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void add_source(const SplitOp<B, N>& o, const F& flag, Dual<B, N>& fpr,
                                                 Dual<B, N>& fpi, Dual<B, N>& fmr, Dual<B, N>& fmi,
                                                 Dual<B, N>& zr) {
  const B f = flag_value(flag);  // 0 or 1
  add_source<Complex>(o.v, f, fpr.v, fpi.v, fmr.v, fmi.v, zr.v);
  for (int j = 0; j < N; ++j) add_source<Complex>(o.d[j], f, fpr.d[j], fpi.d[j], fmr.d[j], fmi.d[j], zr.d[j]);
}

// A store on duals (a plane or register store of Dual<B, N>) that plays
// its tangents in split form.  pulse_dirs: whether a seeded direction moves
// the pulses or the inversion (B1, B1phase, inv_efficiency).
template <class Store, class B, int N, bool Complex>
struct SplitStore : Store {
  using OpT = SplitOp<B, N>;
  bool pulse_dirs = true;
  unsigned q_dirs = ~0u, e1_dirs = ~0u;
  // the log-derivatives of interval g_iv: play() asks for an event's
  // interval before fusing it, and runs of events share one
  int64_t g_iv = -1;
  LogDerivatives<B, N> g;
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE IvCoef<Dual<B, N>> interval(int64_t iv) {
    const IvCoef<Dual<B, N>> c = Store::interval(iv);
    if (iv != g_iv) {
      g = log_derivatives<Complex>(c);
      g_iv = iv;
    }
    return c;
  }
  // the seeded fields[0 .. n) of the dual directions
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void directions(const int* fields, int n) {
    pulse_dirs = moves_pulses(fields, n);
    q_dirs = q_directions(fields, n);
    e1_dirs = e1_directions(fields, n);
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE OpT as_op(const Op<Dual<B, N>>& o) const { return split_op(o, pulse_dirs); }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE OpT fused(const Op<Dual<B, N>>& o, const IvCoef<Dual<B, N>>& c) const {
    return split_fuse<Complex>(o, c, g, pulse_dirs, q_dirs, e1_dirs);
  }
};

// Seeds direction j with the field f of every lane: d field_f / d dir_j =
// value (1: derivatives per the field's SI unit; the SI value of one public
// unit: derivatives per public unit).
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void seed(LaneTissue<Dual<V, N>>& lt, int f, int j, float value = 1.0f) {
  // predicated over the fields, so that lt stays in registers on the device
  for (int g = 0; g < tissue_fields; ++g)
    if (g == f) lt[g].d[j] = splat<V>(value);
}

// The requested directions fields[0 .. n_dirs) as the kernels carry them:
// M0 (column m0_col, or -1) from the unscaled signal, the others as dual
// directions duals[0 .. n_duals) seeded with dseeds[] (column j is dual
// direction slot[j], dual direction k column col[k]).
struct DirectionSlots {
  int slot[tissue_fields], duals[tissue_fields], col[tissue_fields];
  float dseeds[tissue_fields];
  int m0_col = -1, n_duals = 0;
  float m0_seed = 1.0f;  // d M0 / d column m0_col

  BLOCHSIM_HD DirectionSlots(const int* fields, int n_dirs, const float* seeds) {
    for (int j = 0; j < n_dirs; ++j) {
      const float sd = seeds ? seeds[j] : 1.0f;
      if (fields[j] == field_M0) {
        m0_col = j;
        m0_seed = sd;
        slot[j] = 0;
      } else {
        duals[n_duals] = fields[j];
        dseeds[n_duals] = sd;
        col[n_duals] = j;
        slot[j] = n_duals++;
      }
    }
  }
};

// The tissue of problems [first, first + width) of t on duals, the dual
// directions of ds seeded, M0 set to 1 (the sinks scale by it): its values
// into m0.
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LaneTissue<Dual<V, N>> seeded_lanes(const Tissue& t, int64_t first,
                                                                     const DirectionSlots& ds, V& m0) {
  using T = Dual<V, N>;
  constexpr int W = Lanes<V>::width;
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  LaneTissue<T> lt = gather<T>(t, idx);
  for (int k = 0; k < ds.n_duals; ++k) seed(lt, ds.duals[k], k, ds.dseeds[k]);
  m0 = lt[field_M0].v;
  lt[field_M0] = T(1.0f);
  return lt;
}

// Writes the samples of a lane vector of problems [first, first + width)
// and their n_dirs derivatives, skipping lanes past n.  The event loop plays
// with M0 = 1; the sink scales by each lane's M0 and takes the direction
// m0_dir (if >= 0) as the unscaled sample; output direction j is dual
// direction slot[j] otherwise, column first_dir + j of jac's jac_dirs.  The
// signal and each direction are staged a tile of readouts at a time
// (SampleTile; flush() after the last event writes what is left).  The
// fields are distinct (validate_directions), so a pass carries at most N
// dual directions and M0.
template <class V, int N>
struct JacobianSink {
  float* out;
  float* jac;
  int64_t first, n, n_samples;
  int n_dirs, m0_dir;
  const int* slot;
  V m0;
  float m0_seed;  // d M0 / d direction m0_dir
  int jac_dirs, first_dir;
  SampleTile<V> tiles[N + 2]{};  // the signal, then output direction j in tiles[1 + j]

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void write(int64_t s, const Dual<V, N>& re, const Dual<V, N>& im) {
    const bool full = tiles[0].push(s, m0 * re.v, m0 * im.v);
    for (int j = 0; j < n_dirs; ++j) {
      if (j == m0_dir)
        tiles[1 + j].push(s, m0_seed * re.v, m0_seed * im.v);
      else
        tiles[1 + j].push(s, m0 * re.d[slot[j]], m0 * im.d[slot[j]]);
    }
    if (full) flush();
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void flush() {
    tiles[0].flush(out + 2 * first * n_samples, 2 * n_samples, n - first);
    for (int j = 0; j < n_dirs; ++j)
      tiles[1 + j].flush(jac + 2 * ((first * jac_dirs + first_dir + j) * n_samples), 2 * jac_dirs * n_samples,
                         n - first);
  }
};

// Jacobian of problems [first, first + width) of t along the fields
// fields[0 .. n_dirs) (dual_directions(fields, n_dirs) <= N) into columns
// [first_dir, first_dir + n_dirs) of jac's jac_dirs, with all orders in
// `work` (SlidingPlaneStore<Dual<V, N>, Complex>::workspace(s) dual lane
// vectors).
template <class V, int N, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int jacobian_block(const EventStream& s, const Tissue& t, const int* fields,
                                                    int n_dirs, int64_t first, Dual<V, N>* work, float* out,
                                                    float* jac, const float* seeds, int jac_dirs, int first_dir) {
  using T = Dual<V, N>;
  const DirectionSlots ds(fields, n_dirs, seeds);
  V m0;
  const LaneTissue<T> lt = seeded_lanes<V, N>(t, first, ds, m0);
  SplitStore<SlidingPlaneStore<T, Complex>, V, N, Complex> st;
  st.directions(ds.duals, ds.n_duals);
  st.template init<double>(s, lt, work);
  JacobianSink<V, N> sink{out, jac, first, t.n, s.n_samples, n_dirs,
                          ds.m0_col, ds.slot, m0, ds.m0_seed, jac_dirs, first_dir};
  play<T, Complex>(s, t, lt, st, sink, LaneProblems{first, 1});
  sink.flush();
  return ok;
}

// The Jacobian of blocks [b0, b1) of lane vectors V (problems b W to
// (b + 1) W - 1) with a workspace of (1 + dual_width(dual_directions(fields,
// n_dirs))) SlidingPlaneStore<V, true> workspaces of V: the dual width and
// the path picked at run time, in passes of at most max_dual_width
// directions (each pass plays the events again and writes the signal
// again, the same values).  In the ISA namespace, so that each instruction-set build of
// the host kernels keeps its own instantiations.
template <class V>
inline int jacobian_range(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, int64_t b0,
                          int64_t b1, void* work, float* out, float* jac, const float* seeds = nullptr) {
  return jacobian_passes(fields, n_dirs, [&](int a, int b, auto width) {
    constexpr int N = decltype(width)::value;
    auto blocks = [&](auto complex) {
      constexpr bool C = decltype(complex)::value;
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int st = jacobian_block<V, N, C>(s, t, fields + a, b - a, blk * Lanes<V>::width,
                                               static_cast<Dual<V, N>*>(work), out, jac, seeds ? seeds + a : nullptr,
                                               n_dirs, a);
        if (st != ok) return st;
      }
      return static_cast<int>(ok);
    };
    return s.real_path ? blocks(std::false_type{}) : blocks(std::true_type{});
  });
}

// The tissue of problem p with directions fields[0 .. n_dirs) seeded (with
// seeds[j], or 1 without seeds), as one lane's dual scalars.
template <int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LaneTissue<Dual<float, N>> seeded_tissue(const Tissue& t, int64_t p,
                                                                          const int* fields, int n_dirs,
                                                                          const float* seeds = nullptr) {
  LaneTissue<Dual<float, N>> lt = gather<Dual<float, N>>(t, &p);
  for (int j = 0; j < n_dirs; ++j) seed(lt, fields[j], j, seeds ? seeds[j] : 1.0f);
  return lt;
}

// Writes the samples of member 0 of a team (lane 0 of V) and their
// derivatives for problem `problem`, as JacobianSink: played with M0 = 1,
// scaled by m0, direction m0_dir the unscaled sample, the others dual
// direction slot[j].
template <class V, int N>
struct TeamJacobianSink {
  float* out;
  float* jac;
  int64_t problem, n_samples;
  int n_dirs, m0_dir;
  const int* slot;
  float m0, m0_seed;
  void write(int64_t s, const Dual<V, N>& re, const Dual<V, N>& im) {
    using LT = Lanes<V>;
    const float vr = LT::get(re.v, 0), vi = LT::get(im.v, 0);
    float* o = out + (problem * n_samples + s) * 2;
    o[0] = m0 * vr;
    o[1] = m0 * vi;
    for (int j = 0; j < n_dirs; ++j) {
      float* d = jac + ((problem * n_dirs + j) * n_samples + s) * 2;
      d[0] = j == m0_dir ? m0_seed * vr : m0 * LT::get(re.d[slot[j]], 0);
      d[1] = j == m0_dir ? m0_seed * vi : m0 * LT::get(im.d[slot[j]], 0);
    }
  }
};

// Host instantiation of the device's Jacobian register path (a team of
// Lanes<V>::width members holding R orders each, on duals of N directions
// in split form, M0 from the unscaled signal), one problem at a time: the
// tests' view of the device Jacobian kernels.  The directions other than M0
// are at most N; without Tail K is at most width * R, with it (TailStore,
// the device's tail Jacobian kernel) any K.
template <class V, int N, int R, bool Complex, bool Tail = false>
inline int jacobian_registers_host(const EventStream& s, const Tissue& t, const int* fields, int n_dirs,
                                   float* out, float* jac, const float* seeds = nullptr) {
  using T = Dual<V, N>;
  using Team = LaneTeam<T, R>;
  using Store = std::conditional_t<Tail, TailStore<T, R, Complex, Team>, RegisterStore<T, R, Complex, Team>>;
  constexpr int W = Lanes<V>::width;
  if (!Tail && s.states > W * R) return states_exceed_team;
  if (n_dirs < 1 || dual_directions(fields, n_dirs) > N) return bad_shape;
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  const DirectionSlots ds(fields, n_dirs, seeds);
  using LT = Lanes<T>;
  std::vector<Dual<float, N>> work;
  if constexpr (Tail) work.resize(static_cast<size_t>(Store::workspace(s.states, W)));
  for (int64_t p = 0; p < t.n; ++p) {
    LaneTissue<Dual<float, N>> one = seeded_tissue<N>(t, p, ds.duals, ds.n_duals, ds.dseeds);
    const float m0 = one[field_M0].v;
    one[field_M0] = Dual<float, N>(1.0f);
    const LaneTissue<T> lt = splat_tissue<T>(one, [](const Dual<float, N>& x) { return LT::splat(x); });
    SplitStore<Store, V, N, Complex> st;
    st.directions(ds.duals, ds.n_duals);
    if constexpr (Tail) {
      std::fill(work.begin(), work.end(), Dual<float, N>{});
      st.init(sr, lt, Team{}, work.data());
    } else {
      st.init(sr, lt, Team{});
    }
    TeamJacobianSink<V, N> sink{out, jac, p, s.n_samples, n_dirs, ds.m0_col, ds.slot, m0, ds.m0_seed};
    play<T, Complex>(sr, t, lt, st, sink, LaneProblems{p, 0});
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
