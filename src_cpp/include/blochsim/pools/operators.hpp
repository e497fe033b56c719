// The pooled EPG's operators on one order (pools/pools.hpp holds the
// configuration, each problem's values and its interval and exact-pulse
// operators): the semisolid pools' saturation by a pulse (per problem,
// applied per order), and the interval's relaxation, exchange and
// precession (pool_relax), an exact rectangular pulse (pool_drive) and a
// hard pulse (PoolRotation) on one order held in locals (PoolOrder).
// pools/play.hpp's event applies them for every Store, the adjoint
// (pools/adjoint.hpp) on transposed matrices.
#pragma once

#include "pools.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

// exp of the symmetric 2 × 2 matrix [[p, q], [q, r]] as [[a, b], [b, c]]:
// with h = (p + r) / 2, g = (p - r) / 2 and d = sqrt(g^2 + q^2),
// exp = e^h (cosh(d) I + sinh(d) / d [[g, q], [q, -g]]); e^{h +- d} are
// formed apart (cosh(d) alone may overflow), and near d = 0 cosh(d) and
// sinh(d) / d come from their series in d^2 (smooth there, as the
// derivatives need).
template <class S>
BLOCHSIM_HD inline void symmetric_expm2(const S& p, const S& q, const S& r, S& a, S& b, S& c) {
  using std::exp;
  const S h = (p + r) * 0.5, g = (p - r) * 0.5;
  const S d2 = g * g + q * q;
  S ch, sh;  // e^h cosh(d), e^h sinh(d) / d
  if (value_of(d2) < 1e-4) {
    const S e = exp(h);
    ch = e * (1.0 + d2 * (1.0 / 2) * (1.0 + d2 * (1.0 / 12) * (1.0 + d2 * (1.0 / 30) * (1.0 + d2 * (1.0 / 56)))));
    sh = e * (1.0 + d2 * (1.0 / 6) * (1.0 + d2 * (1.0 / 20) * (1.0 + d2 * (1.0 / 42) * (1.0 + d2 * (1.0 / 72)))));
  } else {
    const S d = pools_detail::root(d2), ep = exp(h + d), em = exp(h - d);
    ch = (ep + em) * 0.5;
    sh = (ep - em) * 0.5 / d;
  }
  a = ch + sh * g;
  c = ch - sh * g;
  b = sh * q;
}

// The semisolid pools' saturation by one pulse, per order: each semisolid
// pool's Z^b (family z[j]) and, with dipolar order, its Z^d (family dz[j],
// else -1) by the symmetric [[a, b], [b, c]]; a pool without dipolar order
// by a alone.  The fixed-count lanes and the register teams, which play
// the star only, keep its one semisolid pool in SingleSaturation.
template <class Sc>
struct SemisolidSaturation {
  int count = 0;
  int z[max_semisolid_pools] = {}, dz[max_semisolid_pools] = {-1, -1};
  Sc a[max_semisolid_pools] = {}, b[max_semisolid_pools] = {}, c[max_semisolid_pools] = {};
  template <bool Real, class Order>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(Order& o, int) const {
    for (int j = 0; j < count; ++j) {
      if (dz[j] < 0) {
        o.cr[z[j]] = o.cr[z[j]] * a[j];
        if constexpr (!Real) o.ci[z[j]] = o.ci[z[j]] * a[j];
      } else {
        const auto zr = o.cr[z[j]], dr = o.cr[dz[j]];
        o.cr[z[j]] = zr * a[j] + dr * b[j];
        o.cr[dz[j]] = zr * b[j] + dr * c[j];
        if constexpr (!Real) {
          const auto zi = o.ci[z[j]], di = o.ci[dz[j]];
          o.ci[z[j]] = zi * a[j] + di * b[j];
          o.ci[dz[j]] = zi * b[j] + di * c[j];
        }
      }
    }
  }
};
// The one semisolid pool of the star (family n): Z^b times decay.
template <class Sc>
struct SingleSaturation {
  Sc decay{};
  template <bool Real, class Order>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(Order& o, int n) const {
    o.cr[n] = o.cr[n] * decay;
    if constexpr (!Real) o.ci[n] = o.ci[n] * decay;
  }
};

// Whether event e saturates the semisolid pools of q: an RF pulse (or a
// saturation) of positive duration.
template <class S>
BLOCHSIM_HD inline bool saturates(const EventStream& s, const PoolTissue<S>& q, int64_t e) {
  return q.bound && s.rf_duration_s != nullptr && (s.flags[e] & (event_rf | event_saturation)) &&
         s.rf_duration_s[e] > 0.0f;
}

// T2 G(offset - B0) of a semisolid pool of T2 t2 (s) without dipolar
// order, lifted to S: the lineshape a pulse at offset (Hz) saturates it
// by; dual: the mean over +offset and -offset (half the power at each).
// The stores that cache it per offset (the star's lanes and register
// teams) form it here; semisolid_saturation sums the sides itself, since
// dipolar order needs each side's own x.
template <class S>
BLOCHSIM_HD inline S saturation_lineshape(int lineshape, const LineshapeTable& ls, const S& t2, const S& B0,
                                          float offset, bool dual) {
  double g, dg;
  const S x = (S(static_cast<double>(offset)) - B0) * t2 * (2.0 * pi);
  lineshape_eval(lineshape, value_of(x), ls, g, dg);
  S out = t2 * lift(x, g, dg);
  if (dual) {
    const S xm = (S(static_cast<double>(-offset)) - B0) * t2 * (2.0 * pi);
    lineshape_eval(lineshape, value_of(xm), ls, g, dg);
    out = (out + t2 * lift(xm, g, dg)) * 0.5;
  }
  return out;
}

// The saturation of q's semisolid pools by a pulse of duration tau_rf (s),
// effective flip alpha (rad, B1 included), power factor power and offset
// from water (Hz), dual: the power split evenly between +offset and
// -offset.  A component at offset o saturates pool j at
// W tau = pi power alpha^2 T2 G(o - B0) / tau_rf (SPEC §3), and moves its
// dipolar order through x = 2 pi (o - B0) / D (symmetric_expm2 of the sum
// of the components' generators).  Pool 0 of the star alone (no dipolar
// order, one offset) gets a = exp(-W tau), formed by the same products
// as the lanes' SingleSaturation.
template <class S>
BLOCHSIM_HD inline void semisolid_saturation(const PoolTissue<S>& q, int lineshape, const LineshapeTable& ls,
                                             const S& tau_rf, const S& alpha, double power, const S& offset,
                                             bool dual, SemisolidSaturation<S>& out) {
  using std::exp;
  out.count = q.nb;
  for (int j = 0; j < q.nb; ++j) {
    out.z[j] = q.n + j;
    out.dz[j] = q.dipolar[j];
    S p = S(0.0), qq = S(0.0), r = S(0.0);
    for (int side = 0; side < (dual ? 2 : 1); ++side) {
      const S at = side == 0 ? offset - q.B0 : S(0.0) - offset - q.B0;
      const S xg = at * q.T2s[j] * (2.0 * pi);
      double g, dg;
      lineshape_eval(lineshape, value_of(xg), ls, g, dg);
      const S Wt = ((pi * (dual ? 0.5 * power : power)) / tau_rf) * (q.T2s[j] * lift(xg, g, dg)) * (alpha * alpha);
      const S x = xg * (1.0 / dipolar_field_factor);
      p = p - Wt;
      qq = qq + Wt * x;
      r = r - Wt * (x * x);
    }
    if (out.dz[j] < 0) {
      out.a[j] = exp(p);
    } else {
      symmetric_expm2(p, qq, r, out.a[j], out.b[j], out.c[j]);
    }
  }
}

// The per-order operators of the pooled EPG, which pools/play.hpp's event
// applies for every Store and the adjoint (pools/adjoint.hpp) on transposed
// matrices: the interval's relaxation, exchange and precession
// (pool_relax), an exact rectangular pulse (pool_drive) and a hard pulse
// (PoolRotation).  Each acts on one order held in locals (PoolOrder); the
// Stores differ only in where they keep the orders and how they form the
// per-problem operators.

// One order of the pooled state in locals (V: a scalar, a dual, or lanes):
// F+ (ar, ai) and F- (br, bi) of each liquid pool, Z (cr, ci) of each
// longitudinal family (the liquid pools, then the semisolid pool).  On the
// real planes (pooled_real_path) only ai, bi and cr are used.  N and M are
// the most pools the order holds.
template <class V, int N = max_liquid_pools, int M = max_longitudinal_pools>
struct PoolOrder {
  V ar[N], ai[N], br[N], bi[N], cr[M], ci[M];
};

// The pool counts of a store: n liquid pools and m longitudinal families.
// Fixed: the compile-time N and M (set() checks nothing; the caller picked
// the instantiation for its pools); else members, at most N and M, set from
// the problem's pools.
template <int N, int M, bool Fixed>
struct PoolCounts {
  static constexpr int n = N, m = M, m_max = M;
  BLOCHSIM_HD void set(int, int) {}
};
template <int N, int M>
struct PoolCounts<N, M, false> {
  static constexpr int m_max = M;
  int n = N, m = M;
  BLOCHSIM_HD void set(int n_, int m_) {
    n = n_;
    m = m_;
  }
};

// f(j) for j in [0, n): over the compile-time count N, unrolled, when the
// player's pool counts are template parameters (Fixed: n == N, so the
// orders' arrays stay in registers on the device); over the run-time n
// otherwise (the one-problem player, whose unrolled loops on duals would
// cost minutes of compile time).
template <int N, bool Fixed, class F>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void each_index(int n, F&& f) {
  if constexpr (Fixed) {
BLOCHSIM_UNROLL
    for (int j = 0; j < N; ++j) f(j);
  } else {
    for (int j = 0; j < n; ++j) f(j);
  }
}

// x = one order o after the interval: F+ by P, F- by conj(P), Z by L (P: n
// × n complex as (re, im) pairs; L: m × m real; C their type), each Z of x
// starting from z0 (the recovery, at order 0) or zero.  Fixed: n = N and
// m = M.
template <bool Real, bool Fixed, class V, class C, class Z, int N, int M>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pool_relax(const C* P, const C* L, const PoolOrder<V, N, M>& o,
                                                 PoolOrder<V, N, M>& x, const Z* z0, int n = N, int m = M) {
  if constexpr (Fixed) {
    n = N;
    m = M;
  }
  each_index<N, Fixed>(n, [&](int j) BLOCHSIM_LAMBDA_INLINE {
    if constexpr (Real) {
      // P is real here: imaginary F+ and F- by P
      V xi{}, yi{};
      each_index<N, Fixed>(n, [&](int l) BLOCHSIM_LAMBDA_INLINE {
        xi += P[2 * (j * n + l)] * o.ai[l];
        yi += P[2 * (j * n + l)] * o.bi[l];
      });
      x.ai[j] = xi;
      x.bi[j] = yi;
    } else {
      V xr{}, xi{}, yr{}, yi{};
      each_index<N, Fixed>(n, [&](int l) BLOCHSIM_LAMBDA_INLINE {
        const C pr = P[2 * (j * n + l)], pi_ = P[2 * (j * n + l) + 1];
        xr += pr * o.ar[l] - pi_ * o.ai[l];
        xi += pr * o.ai[l] + pi_ * o.ar[l];
        yr += pr * o.br[l] + pi_ * o.bi[l];
        yi += pr * o.bi[l] - pi_ * o.br[l];
      });
      x.ar[j] = xr;
      x.ai[j] = xi;
      x.br[j] = yr;
      x.bi[j] = yi;
    }
  });
  each_index<M, Fixed>(m, [&](int j) BLOCHSIM_LAMBDA_INLINE {
    V xr{}, xi{};
    if (z0) xr = xr + z0[j];
    each_index<M, Fixed>(m, [&](int l) BLOCHSIM_LAMBDA_INLINE {
      const C c = L[j * m + l];
      xr += c * o.cr[l];
      if constexpr (!Real) xi += c * o.ci[l];
    });
    x.cr[j] = xr;
    if constexpr (!Real) x.ci[j] = xi;
  });
}

// x = o (the first n liquid pools and m families when not Fixed).
template <bool Fixed, class V, int N, int M>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pool_copy(const PoolOrder<V, N, M>& o, PoolOrder<V, N, M>& x, int n, int m) {
  if constexpr (Fixed) {
    x = o;
  } else {
    for (int j = 0; j < n; ++j) {
      x.ar[j] = o.ar[j];
      x.ai[j] = o.ai[j];
      x.br[j] = o.br[j];
      x.bi[j] = o.bi[j];
    }
    for (int j = 0; j < m; ++j) {
      x.cr[j] = o.cr[j];
      x.ci[j] = o.ci[j];
    }
  }
}

// One order o under an exact rectangular pulse (pool_driven): the d × d
// complex matrix on its components (F+, F-, Z of each of the n liquid
// pools, then the other m - n longitudinal families: d = 2 n + m), plus at
// order 0 (order0) the source.  mat(i) and src(i) read entry i of the
// matrix and of the source as (re, im) pairs, wherever the player keeps
// them.  Fixed: n = N and m = M.
template <bool Fixed, class V, int N, int M, class Mat, class Src>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pool_drive(const Mat& mat, const Src& src, bool order0, PoolOrder<V, N, M>& o,
                                                 int n = N, int m = M) {
  constexpr int D = 2 * N + M;
  if constexpr (Fixed) {
    n = N;
    m = M;
  }
  const int d = 2 * n + m;
  auto re = [&](int i) BLOCHSIM_LAMBDA_INLINE -> V& {
    const int j = i < 3 * n ? i / 3 : i - 2 * n, comp = i < 3 * n ? i % 3 : 2;
    return comp == 0 ? o.ar[j] : comp == 1 ? o.br[j] : o.cr[j];
  };
  auto im = [&](int i) BLOCHSIM_LAMBDA_INLINE -> V& {
    const int j = i < 3 * n ? i / 3 : i - 2 * n, comp = i < 3 * n ? i % 3 : 2;
    return comp == 0 ? o.ai[j] : comp == 1 ? o.bi[j] : o.ci[j];
  };
  V vr[D], vi[D];
  each_index<D, Fixed>(d, [&](int i) BLOCHSIM_LAMBDA_INLINE {
    vr[i] = re(i);
    vi[i] = im(i);
  });
  each_index<D, Fixed>(d, [&](int i) BLOCHSIM_LAMBDA_INLINE {
    V xr{}, xi{};
    if (order0) {
      xr = xr + src(2 * i);
      xi = xi + src(2 * i + 1);
    }
    each_index<D, Fixed>(d, [&](int l) BLOCHSIM_LAMBDA_INLINE {
      const auto a = mat(2 * (i * d + l)), b = mat(2 * (i * d + l) + 1);
      xr += a * vr[l] - b * vi[l];
      xi += a * vi[l] + b * vr[l];
    });
    re(i) = xr;
    im(i) = xi;
  });
}

// A hard pulse (SPEC §2) on one order of one liquid pool, from the cos and
// sin of its effective flip a and phase phi (C: scalars, or lanes of
// problems).  Real: the real planes of pooled_real_path (phi 0 or pi), where
// F+ and F- are imaginary (ai, bi) and Z real (zr); otherwise every part.
template <class C>
struct PoolRotation {
  C ca, c2, s2, e2r, e2i, mr, mi;  // m = -i e^{i phi} sin(a) = mr + i mi, e2 = e^{2 i phi}
  BLOCHSIM_HD PoolRotation(const C& cos_a, const C& sin_a, const C& cos_phi, const C& sin_phi)
      : ca(cos_a),
        c2((1.0f + cos_a) * 0.5f),
        s2((1.0f - cos_a) * 0.5f),
        e2r(cos_phi * cos_phi - sin_phi * sin_phi),
        e2i(2.0f * cos_phi * sin_phi),
        mr(sin_phi * sin_a),
        mi(-(cos_phi * sin_a)) {}
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void real(V& ai, V& bi, V& zr) const {
    // e2 = 1 and m = i mi
    const V a = ai, b = bi, z = zr;
    ai = c2 * a + s2 * b + mi * z;
    bi = c2 * b + s2 * a - mi * z;
    zr = ca * z - 0.5f * (mi * (a - b));
  }
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void apply(V& ar, V& ai, V& br, V& bi, V& zr, V& zi) const {
    const V a = ar, b = ai, c = br, d = bi, x = zr, y = zi;
    // F+' = c2 F+ + s2 e2 F- + m Z; F-' = c2 F- + s2 conj(e2) F+ + conj(m) Z
    ar = c2 * a + s2 * (e2r * c - e2i * d) + (mr * x - mi * y);
    ai = c2 * b + s2 * (e2r * d + e2i * c) + (mr * y + mi * x);
    br = c2 * c + s2 * (e2r * a + e2i * b) + (mr * x + mi * y);
    bi = c2 * d + s2 * (e2r * b - e2i * a) + (mr * y - mi * x);
    // Z' = cos(a) Z - (conj(m) F+ + m F-) / 2
    zr = ca * x - 0.5f * ((mr * a + mi * b) + (mr * c - mi * d));
    zi = ca * y - 0.5f * ((mr * b - mi * a) + (mr * d + mi * c));
  }
  // The transpose of apply(), for the adjoint sweep (pools/adjoint.hpp):
  // F+' = c2 F+ + s2 e2 F- - m Z / 2, F-' = s2 conj(e2) F+ + c2 F- -
  // conj(m) Z / 2, Z' = conj(m) F+ + m F- + cos(a) Z.
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void transpose(V& ar, V& ai, V& br, V& bi, V& zr, V& zi) const {
    const V a = ar, b = ai, c = br, d = bi, x = zr, y = zi;
    ar = c2 * a + s2 * (e2r * c - e2i * d) - 0.5f * (mr * x - mi * y);
    ai = c2 * b + s2 * (e2r * d + e2i * c) - 0.5f * (mr * y + mi * x);
    br = c2 * c + s2 * (e2r * a + e2i * b) - 0.5f * (mr * x + mi * y);
    bi = c2 * d + s2 * (e2r * b - e2i * a) - 0.5f * (mr * y - mi * x);
    zr = ca * x + (mr * a + mi * b) + (mr * c - mi * d);
    zi = ca * y + (mr * b - mi * a) + (mr * d + mi * c);
  }
  // apply() of a pulse at phase 0 (e2 = 1, m = i mi) on every part
  template <class V>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void in_phase(V& ar, V& ai, V& br, V& bi, V& zr, V& zi) const {
    const V a = ar, b = ai, c = br, d = bi, x = zr, y = zi;
    ar = c2 * a + s2 * c - mi * y;
    ai = c2 * b + s2 * d + mi * x;
    br = c2 * c + s2 * a + mi * y;
    bi = c2 * d + s2 * b - mi * x;
    zr = ca * x - 0.5f * (mi * (b - d));
    zi = ca * y + 0.5f * (mi * (a - c));
  }
};

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
