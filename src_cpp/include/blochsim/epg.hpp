// The EPG forward kernel (SPEC §1-2), one source for host and device.
//
// forward_block<V, Complex> plays the whole event stream for one block of
// Lanes<V>::width problems (atoms or voxels), V being the lane type of
// tile.hpp.  Complex = false is the real subspace: when every RF phase is
// phi0 or phi0 + pi and nothing off-axis is on, the embedding
//     F+_k = -i e^{i phi0} f+_k,   F-_k = i e^{-i phi0} f-_k,   Z_k = z_k
// with real f+, f-, z is closed under every operator, so three real planes
// replace six (the host decides this once per sequence).
//
// Only orders below `band` can be non-zero: the state starts at Z_0 = 1 and
// each shift of one order widens the band by one, so the cost per event
// grows with the number of shifts played so far, up to K.
#pragma once

#include <cmath>

#include "events.hpp"
#include "tile.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {
namespace epg {

// Interval operator, tabulated per (interval, lane) before the event loop so
// that the loop does no exp or sincos that depends on the voxel.
enum IntervalField : int {
  iv_e1,    // exp(-tau/T1)
  iv_e2c,   // exp(-tau/T2) cos(2 pi B0 tau)
  iv_e2s,   // exp(-tau/T2) sin(2 pi B0 tau)
  iv_rec,   // 1 - exp(-tau/T1): recovery of Z_0 towards M_eq = 1
  iv_diff,  // exp(-D dk^2 tau): order k is attenuated by iv_diff^(k^2)
  iv_flow,  // dk v tau: order k is dephased by exp(-i k iv_flow)
  iv_keep,  // 1 - washout fraction
  iv_fields
};

// RF coefficients of the current pulse (see rf_coefficients).
enum RfField : int { rf_c2, rf_s2, rf_ar, rf_ai, rf_br, rf_bi, rf_cr, rf_ci, rf_ca, rf_fields };

// Per-lane tissue values used by events.
enum LaneField : int { ln_m0, ln_b1, ln_b1phase, ln_eta, ln_fields };

// Workspace one block needs, in units of V.
template <class V>
BLOCHSIM_HD inline int64_t workspace_vectors(const EventStream& s) {
  const int64_t planes = s.real_path ? 3 : 6;
  return planes * s.states + s.n_intervals * iv_fields + rf_fields + ln_fields;
}

// Tabulate the interval operators of every distinct duration for the lanes.
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void tabulate_intervals(const EventStream& s, const Tissue& t,
                                                         const int64_t* idx, V* ivt) {
  using LT = Lanes<V>;
  const double dk = s.dk_rad_per_m;
  const double voxel = s.voxel_size_m;
  for (int64_t i = 0; i < s.n_intervals; ++i) {
    const double tau = s.duration_s[i];
    V* row = ivt + i * iv_fields;
    for (int l = 0; l < LT::width; ++l) {
      const int64_t p = idx[l];
      const double T1 = t.T1_s.at(p), T2 = t.T2_s.at(p);
      const double theta = 2.0 * pi * static_cast<double>(t.B0_hz.at(p)) * tau;
      const double D = t.D_m2_s.at(p);
      const double v = t.v_m_s.at(p);
      double w = voxel > 0.0 ? std::fabs(v) * tau / voxel : 0.0;
      w = w < 1.0 ? w : 1.0;
      const double e2 = std::exp(-tau / T2);
      LT::set(row[iv_e1], l, static_cast<float>(std::exp(-tau / T1)));
      LT::set(row[iv_e2c], l, static_cast<float>(e2 * std::cos(theta)));
      LT::set(row[iv_e2s], l, static_cast<float>(e2 * std::sin(theta)));
      LT::set(row[iv_rec], l, static_cast<float>(-std::expm1(-tau / T1)));
      LT::set(row[iv_diff], l, static_cast<float>(std::exp(-D * dk * dk * tau)));
      LT::set(row[iv_flow], l, static_cast<float>(dk * v * tau));
      LT::set(row[iv_keep], l, static_cast<float>(1.0 - w));
    }
  }
}

// RF coefficients of pulse e for every lane.  Complex layout:
//   F+' = c2 F+ + A F- + B Z,  F-' = conj(A) F+ + c2 F- + conj(B) Z,
//   Z'  = C F+ + conj(C) F- + ca Z,
// A = e^{2i phi} sin^2(a/2), B = -i e^{i phi} sin a, C = -(i/2) e^{-i phi} sin a,
// which is SPEC §2's rotation written out.  Real layout (phi = phi0 + {0, pi},
// sigma = +-1; rf_br holds sigma sin a):
//   f+' = c2 f+ - s2 f- + sigma sin(a) z,  f-' = -s2 f+ + c2 f- + sigma sin(a) z,
//   z'  = -(sigma/2) sin(a) (f+ + f-) + cos(a) z.
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rf_coefficients(const EventStream& s, int64_t e, bool uniform,
                                                      const V* lane, V* rf) {
  using LT = Lanes<V>;
  const int n = uniform ? 1 : LT::width;
  float c[rf_fields];
  for (int l = 0; l < n; ++l) {
    const float alpha = s.flip_rad[e] * LT::get(lane[ln_b1], l);
    const float phi = s.phase_rad[e] + LT::get(lane[ln_b1phase], l);
    const float ch = std::cos(0.5f * alpha), sh = std::sin(0.5f * alpha);
    const float sa = 2.0f * sh * ch;
    c[rf_c2] = ch * ch;
    c[rf_s2] = sh * sh;
    c[rf_ca] = ch * ch - sh * sh;
    if (Complex) {
      const float cp = std::cos(phi), sp = std::sin(phi);
      c[rf_ar] = (cp * cp - sp * sp) * c[rf_s2];
      c[rf_ai] = 2.0f * sp * cp * c[rf_s2];
      c[rf_br] = sa * sp;
      c[rf_bi] = -sa * cp;
      c[rf_cr] = -0.5f * sa * sp;
      c[rf_ci] = -0.5f * sa * cp;
    } else {
      const float sigma = std::cos(phi - s.common_phase_rad) >= 0.0f ? 1.0f : -1.0f;
      c[rf_br] = sigma * sa;
      c[rf_ar] = c[rf_ai] = c[rf_bi] = c[rf_cr] = c[rf_ci] = 0.0f;
    }
    if (uniform) {
      for (int f = 0; f < rf_fields; ++f) rf[f] = splat<V>(c[f]);
    } else {
      for (int f = 0; f < rf_fields; ++f) LT::set(rf[f], l, c[f]);
    }
  }
}

template <class V>
struct State {
  Plane<V> fpr, fmr, zr;  // real parts (the only planes on the real path)
  Plane<V> fpi, fmi, zi;  // imaginary parts (complex path)
};

// One shift of every transverse order by one (dir = +1: F+ up, F- down;
// dir = -1 the reverse), keeping F-_0 = conj(F+_0).
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(const State<V>& st, int dir, int& band, int K) {
  const Plane<V>& upr = dir > 0 ? st.fpr : st.fmr;
  const Plane<V>& dnr = dir > 0 ? st.fmr : st.fpr;
  upr.shift_up(band, K);
  dnr.shift_down(band);
  upr[0] = dnr[0];
  if (Complex) {
    const Plane<V>& upi = dir > 0 ? st.fpi : st.fmi;
    const Plane<V>& dni = dir > 0 ? st.fmi : st.fpi;
    upi.shift_up(band, K);
    dni.shift_down(band);
    upi[0] = -dni[0];
  }
  band = band < K ? band + 1 : K;
}

template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift(const State<V>& st, int n, int& band, int K) {
  const int dir = n > 0 ? 1 : -1;
  for (int i = 0; i < (n > 0 ? n : -n); ++i) shift_once<V, Complex>(st, dir, band, K);
}

// Relaxation, recovery, off-resonance, diffusion, flow and washout over one
// interval, for orders [0, band).
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax(const State<V>& st, const V* iv, int band, bool per_order,
                                            bool washout) {
  const V e1 = iv[iv_e1], e2c = iv[iv_e2c], e2s = iv[iv_e2s];
  if (!per_order) {
    for (int k = 0; k < band; ++k) {
      if (Complex) {
        const V pr = st.fpr[k], pi_ = st.fpi[k], mr = st.fmr[k], mi = st.fmi[k];
        st.fpr[k] = e2c * pr + e2s * pi_;
        st.fpi[k] = e2c * pi_ - e2s * pr;
        st.fmr[k] = e2c * mr - e2s * mi;
        st.fmi[k] = e2c * mi + e2s * mr;
        st.zr[k] *= e1;
        st.zi[k] *= e1;
      } else {
        st.fpr[k] *= e2c;
        st.fmr[k] *= e2c;
        st.zr[k] *= e1;
      }
    }
  } else {
    // Order-dependent factors: diffusion a^(k^2) and flow e^{-i k phi},
    // advanced by recurrences in double so that 2048 orders keep float32
    // accuracy: a^(k^2) = a^((k-1)^2) a^(2k-1), and (wc - i ws) rotates by
    // e^{-i phi} each order.
    using LT = Lanes<V>;
    using D = typename LT::Double;
    D g = LT::widen(iv[iv_keep]);
    D step = LT::widen(iv[iv_diff]);
    const D a2 = step * step;
    D wc = splatd<D>(1.0), ws = D{}, rc, rs;
    for (int l = 0; l < LT::width; ++l) {
      const double phi = LT::get(iv[iv_flow], l);
      LT::setd(rc, l, std::cos(phi));
      LT::setd(rs, l, std::sin(phi));
    }
    for (int k = 0; k < band; ++k) {
      const V gk = LT::narrow(g);
      if (Complex) {
        const V c = LT::narrow(wc), sn = LT::narrow(ws);
        // F+ multiplier gk (e2c - i e2s)(c - i sn); F- takes its conjugate;
        // Z_k takes gk e1 (c - i sn).
        const V mr = gk * (e2c * c - e2s * sn);
        const V mi = -gk * (e2c * sn + e2s * c);
        const V zmr = gk * e1 * c, zmi = -gk * e1 * sn;
        const V pr = st.fpr[k], pi_ = st.fpi[k], qr = st.fmr[k], qi = st.fmi[k];
        const V ar = st.zr[k], ai = st.zi[k];
        st.fpr[k] = mr * pr - mi * pi_;
        st.fpi[k] = mr * pi_ + mi * pr;
        st.fmr[k] = mr * qr + mi * qi;
        st.fmi[k] = mr * qi - mi * qr;
        st.zr[k] = zmr * ar - zmi * ai;
        st.zi[k] = zmr * ai + zmi * ar;
        const D nc = wc * rc - ws * rs;
        ws = wc * rs + ws * rc;
        wc = nc;
      } else {
        st.fpr[k] *= gk * e2c;
        st.fmr[k] *= gk * e2c;
        st.zr[k] *= gk * e1;
      }
      g *= step;
      step *= a2;
    }
  }
  if (washout) {
    const V keep = iv[iv_keep];
    st.zr[0] += keep * iv[iv_rec] + (1.0f - keep);
  } else {
    st.zr[0] += iv[iv_rec];
  }
}

template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rotate(const State<V>& st, const V* rf, int band) {
  const V c2 = rf[rf_c2], s2 = rf[rf_s2], ca = rf[rf_ca], br = rf[rf_br];
  if (Complex) {
    const V ar = rf[rf_ar], ai = rf[rf_ai], bi = rf[rf_bi], cr = rf[rf_cr], ci = rf[rf_ci];
    for (int k = 0; k < band; ++k) {
      const V pr = st.fpr[k], pi_ = st.fpi[k], mr = st.fmr[k], mi = st.fmi[k];
      const V zre = st.zr[k], zim = st.zi[k];
      st.fpr[k] = c2 * pr + (ar * mr - ai * mi) + (br * zre - bi * zim);
      st.fpi[k] = c2 * pi_ + (ar * mi + ai * mr) + (br * zim + bi * zre);
      st.fmr[k] = (ar * pr + ai * pi_) + c2 * mr + (br * zre + bi * zim);
      st.fmi[k] = (ar * pi_ - ai * pr) + c2 * mi + (br * zim - bi * zre);
      st.zr[k] = (cr * pr - ci * pi_) + (cr * mr + ci * mi) + ca * zre;
      st.zi[k] = (cr * pi_ + ci * pr) + (cr * mi - ci * mr) + ca * zim;
    }
  } else {
    const V hb = 0.5f * br;
    for (int k = 0; k < band; ++k) {
      const V p = st.fpr[k], m = st.fmr[k], z = st.zr[k];
      st.fpr[k] = c2 * p - s2 * m + br * z;
      st.fmr[k] = c2 * m - s2 * p + br * z;
      st.zr[k] = ca * z - hb * (p + m);
    }
  }
}

// Play the stream for problems [first, first + width) of t, writing their
// samples into out.  Lanes past t.n replay the last problem and write
// nothing, so every problem goes through the same instructions and results
// do not depend on how problems are partitioned into blocks or threads.
template <class V, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int forward_block(const EventStream& s, const Tissue& t, int64_t first,
                                                   V* work, float* out) {
  using LT = Lanes<V>;
  constexpr int W = LT::width;
  const int K = s.states;
  State<V> st{Plane<V>{work}, Plane<V>{work + K}, Plane<V>{work + 2 * K},
              Plane<V>{work + 3 * K}, Plane<V>{work + 4 * K}, Plane<V>{work + 5 * K}};
  V* ivt = work + (Complex ? 6 : 3) * K;
  V* rf = ivt + s.n_intervals * iv_fields;
  V* lane = rf + rf_fields;

  int64_t idx[W];
  for (int l = 0; l < W; ++l) {
    const int64_t p = first + l;
    idx[l] = p < t.n ? p : t.n - 1;
    LT::set(lane[ln_m0], l, t.M0.at(idx[l]));
    LT::set(lane[ln_b1], l, t.B1.at(idx[l]));
    LT::set(lane[ln_b1phase], l, t.B1phase_rad.at(idx[l]));
    LT::set(lane[ln_eta], l, t.inv_efficiency.at(idx[l]));
  }
  tabulate_intervals<V>(s, t, idx, ivt);

  for (int64_t i = 0; i < (Complex ? 6 : 3) * K; ++i) work[i] = V{};
  st.zr[0] = splat<V>(1.0f);

  const bool rf_uniform = !t.B1.present() && !t.B1phase_rad.present();
  const bool per_order = t.D_m2_s.present() || t.v_m_s.present();
  const bool washout = t.v_m_s.present();
  const V eta = lane[ln_eta];
  const V m0 = lane[ln_m0];
  int band = 1;

  for (int64_t e = 0; e < s.n_events; ++e) {
    const int32_t iv = s.interval[e];
    if (iv >= 0) relax<V, Complex>(st, ivt + static_cast<int64_t>(iv) * iv_fields, band, per_order, washout);
    if (s.shift_before[e] != 0) shift<V, Complex>(st, s.shift_before[e], band, K);
    const uint32_t f = s.flags[e];
    if (f & event_rf) {
      rf_coefficients<V, Complex>(s, e, rf_uniform, lane, rf);
      rotate<V, Complex>(st, rf, band);
    } else if (f & event_inversion) {
      const V neg = -eta;
      for (int k = 0; k < band; ++k) {
        st.zr[k] *= neg;
        if (Complex) st.zi[k] *= neg;
      }
    }
    if (f & event_readout) {
      const int64_t slot = s.slot[e];
      const float rx = s.rx_phase_rad[e];
      V re, im;
      if (Complex) {
        const float c = std::cos(rx), sn = std::sin(rx);
        re = m0 * (st.fpr[0] * c + st.fpi[0] * sn);
        im = m0 * (st.fpi[0] * c - st.fpr[0] * sn);
      } else {
        // F+_0 e^{-i rx} = f+_0 e^{i (phi0 - pi/2 - rx)}
        const double th = static_cast<double>(s.common_phase_rad) - 0.5 * pi - rx;
        const V a = m0 * st.fpr[0];
        re = a * static_cast<float>(std::cos(th));
        im = a * static_cast<float>(std::sin(th));
      }
      for (int l = 0; l < W; ++l) {
        if (first + l >= t.n) break;
        float* o = out + ((first + l) * s.n_samples + slot) * 2;
        o[0] = LT::get(re, l);
        o[1] = LT::get(im, l);
      }
    }
    if (f & event_spoil) {
      st.fpr.zero(0, band);
      st.fmr.zero(0, band);
      if (Complex) {
        st.fpi.zero(0, band);
        st.fmi.zero(0, band);
      }
    } else if (s.shift_after[e] != 0) {
      shift<V, Complex>(st, s.shift_after[e], band, K);
    }
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
