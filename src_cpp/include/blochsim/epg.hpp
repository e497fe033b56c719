// The EPG forward kernel (SPEC §1-2), one source for host and device.
//
// forward_block<L, Complex> plays the whole event stream for a block of L
// problems (atoms or voxels) held side by side in (orders, lanes) planes.
// Complex = false is the real subspace: when every RF phase is phi0 or
// phi0 + pi and nothing off-axis is on, the embedding
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
namespace epg {

// Interval operator, tabulated per (interval, lane) before the event loop so
// that the loop does no exp or sincos that depends on the voxel.
enum IntervalField : int {
  iv_e1,      // exp(-tau/T1)
  iv_e2c,     // exp(-tau/T2) cos(2 pi B0 tau)
  iv_e2s,     // exp(-tau/T2) sin(2 pi B0 tau)
  iv_rec,     // 1 - exp(-tau/T1): recovery of Z_0 towards M_eq = 1
  iv_diff,    // exp(-D dk^2 tau): order k is attenuated by iv_diff^(k^2)
  iv_flow,    // dk v tau: order k is dephased by exp(-i k iv_flow)
  iv_keep,    // 1 - washout fraction
  iv_fields
};

// Per-lane RF coefficients of the current pulse.
enum RfField : int { rf_c2, rf_s2, rf_ar, rf_ai, rf_br, rf_bi, rf_cr, rf_ci, rf_ca, rf_fields };

// Per-lane tissue values.
enum LaneField : int { ln_m0, ln_b1, ln_b1phase, ln_eta, ln_fields };

template <int L>
BLOCHSIM_HD inline int64_t workspace_floats(const EventStream& s) {
  const int64_t planes = s.real_path ? 3 : 6;
  return planes * s.states * L + (s.n_intervals * iv_fields + rf_fields + ln_fields) * L;
}

// Tabulate the interval operators of every distinct duration for the lanes.
template <int L>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void tabulate_intervals(const EventStream& s, const Tissue& t,
                                                         const int64_t* idx, float* ivt) {
  const double dk = s.dk_rad_per_m;
  const double voxel = s.voxel_size_m;
  for (int64_t i = 0; i < s.n_intervals; ++i) {
    const double tau = s.duration_s[i];
    float* row = ivt + i * iv_fields * L;
    for (int l = 0; l < L; ++l) {
      const int64_t p = idx[l];
      const double e1 = std::exp(-tau / static_cast<double>(t.T1_s.at(p)));
      const double e2 = std::exp(-tau / static_cast<double>(t.T2_s.at(p)));
      const double theta = 2.0 * pi * static_cast<double>(t.B0_hz.at(p)) * tau;
      const double D = t.D_m2_s.at(p);
      const double v = t.v_m_s.at(p);
      double w = voxel > 0.0 ? std::fabs(v) * tau / voxel : 0.0;
      w = w < 1.0 ? w : 1.0;
      row[iv_e1 * L + l] = static_cast<float>(e1);
      row[iv_e2c * L + l] = static_cast<float>(e2 * std::cos(theta));
      row[iv_e2s * L + l] = static_cast<float>(e2 * std::sin(theta));
      row[iv_rec * L + l] = static_cast<float>(-std::expm1(-tau / static_cast<double>(t.T1_s.at(p))));
      row[iv_diff * L + l] = static_cast<float>(std::exp(-D * dk * dk * tau));
      row[iv_flow * L + l] = static_cast<float>(dk * v * tau);
      row[iv_keep * L + l] = static_cast<float>(1.0 - w);
    }
  }
}

// Fill the RF coefficients of pulse e for every lane.  Complex layout:
//   F+' = c2 F+ + A F- + B Z,  F-' = conj(A) F+ + c2 F- + conj(B) Z,
//   Z'  = C F+ + conj(C) F- + ca Z,
// A = e^{2i phi} sin^2(a/2), B = -i e^{i phi} sin a, C = -(i/2) e^{-i phi} sin a.
// Real layout (phi = phi0 + {0, pi}, sigma = +-1):
//   f+' = c2 f+ - s2 f- + sigma sin(a) z,  f-' = -s2 f+ + c2 f- + sigma sin(a) z,
//   z'  = -(sigma/2) sin(a) (f+ + f-) + cos(a) z;  rf_br holds sigma sin a.
template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rf_coefficients(const EventStream& s, int64_t e, bool uniform,
                                                      const float* lane, float* rf) {
  const int n = uniform ? 1 : L;
  for (int l = 0; l < n; ++l) {
    const float alpha = s.flip_rad[e] * lane[ln_b1 * L + l];
    const float phi = s.phase_rad[e] + lane[ln_b1phase * L + l];
    const float c = std::cos(0.5f * alpha), sn = std::sin(0.5f * alpha);
    const float c2 = c * c, s2 = sn * sn, sa = 2.0f * sn * c, ca = c2 - s2;
    rf[rf_c2 * L + l] = c2;
    rf[rf_s2 * L + l] = s2;
    rf[rf_ca * L + l] = ca;
    if (Complex) {
      const float cp = std::cos(phi), sp = std::sin(phi);
      const float c2p = cp * cp - sp * sp, s2p = 2.0f * sp * cp;
      rf[rf_ar * L + l] = c2p * s2;
      rf[rf_ai * L + l] = s2p * s2;
      rf[rf_br * L + l] = sa * sp;
      rf[rf_bi * L + l] = -sa * cp;
      rf[rf_cr * L + l] = -0.5f * sa * sp;
      rf[rf_ci * L + l] = -0.5f * sa * cp;
    } else {
      const float sigma = std::cos(phi - s.common_phase_rad) >= 0.0f ? 1.0f : -1.0f;
      rf[rf_br * L + l] = sigma * sa;
    }
  }
  if (uniform) {
    for (int f = 0; f < rf_fields; ++f)
      for (int l = 1; l < L; ++l) rf[f * L + l] = rf[f * L];
  }
}

template <int L>
struct State {
  Plane<L> fpr, fmr, zr;  // real parts (the only planes on the real path)
  Plane<L> fpi, fmi, zi;  // imaginary parts (complex path)
};

// One shift of every transverse order by one (dir = +1: F+ up, F- down;
// dir = -1 the reverse), keeping F-_0 = conj(F+_0).
template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_once(const State<L>& st, int dir, int& band, int K) {
  const Plane<L>& upr = dir > 0 ? st.fpr : st.fmr;
  const Plane<L>& dnr = dir > 0 ? st.fmr : st.fpr;
  upr.shift_up(band, K);
  dnr.shift_down(band);
  {
    float* u = upr.row(0);
    const float* d = dnr.row(0);
    BLOCHSIM_LANE_LOOP
    for (int l = 0; l < L; ++l) u[l] = d[l];
  }
  if (Complex) {
    const Plane<L>& upi = dir > 0 ? st.fpi : st.fmi;
    const Plane<L>& dni = dir > 0 ? st.fmi : st.fpi;
    upi.shift_up(band, K);
    dni.shift_down(band);
    float* u = upi.row(0);
    const float* d = dni.row(0);
    BLOCHSIM_LANE_LOOP
    for (int l = 0; l < L; ++l) u[l] = -d[l];
  }
  band = band < K ? band + 1 : K;
}

template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift(const State<L>& st, int n, int& band, int K) {
  const int dir = n > 0 ? 1 : -1;
  for (int i = 0; i < (n > 0 ? n : -n); ++i) shift_once<L, Complex>(st, dir, band, K);
}

// Relaxation, recovery, off-resonance, diffusion, flow and washout over one
// interval, for orders [0, band).
template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void relax(const State<L>& st, const float* iv, int band, bool per_order,
                                            bool washout) {
  const float* e1 = iv + iv_e1 * L;
  const float* e2c = iv + iv_e2c * L;
  const float* e2s = iv + iv_e2s * L;
  if (!per_order) {
    for (int k = 0; k < band; ++k) {
      float* fpr = st.fpr.row(k);
      float* fmr = st.fmr.row(k);
      float* zr = st.zr.row(k);
      if (Complex) {
        float* fpi = st.fpi.row(k);
        float* fmi = st.fmi.row(k);
        float* zi = st.zi.row(k);
        BLOCHSIM_LANE_LOOP
        for (int l = 0; l < L; ++l) {
          const float pr = fpr[l], pi_ = fpi[l], mr = fmr[l], mi = fmi[l];
          fpr[l] = e2c[l] * pr + e2s[l] * pi_;
          fpi[l] = e2c[l] * pi_ - e2s[l] * pr;
          fmr[l] = e2c[l] * mr - e2s[l] * mi;
          fmi[l] = e2c[l] * mi + e2s[l] * mr;
          zr[l] *= e1[l];
          zi[l] *= e1[l];
        }
      } else {
        BLOCHSIM_LANE_LOOP
        for (int l = 0; l < L; ++l) {
          fpr[l] *= e2c[l];
          fmr[l] *= e2c[l];
          zr[l] *= e1[l];
        }
      }
    }
  } else {
    // Order-dependent factors: diffusion a^(k^2) and flow e^{-i k phi},
    // advanced by recurrences in double so that 2048 orders keep float32
    // accuracy: a^(k^2) = a^((k-1)^2) a^(2k-1), e^{-ik phi} by rotation.
    const float* da = iv + iv_diff * L;
    const float* fl = iv + iv_flow * L;
    const float* keep = iv + iv_keep * L;
    double g[L], step[L], a2[L], wc[L], ws[L], rc[L], rs[L];
    for (int l = 0; l < L; ++l) {
      g[l] = keep[l];
      step[l] = da[l];
      a2[l] = static_cast<double>(da[l]) * da[l];
      wc[l] = 1.0;
      ws[l] = 0.0;
      rc[l] = std::cos(static_cast<double>(fl[l]));
      rs[l] = std::sin(static_cast<double>(fl[l]));
    }
    for (int k = 0; k < band; ++k) {
      float* fpr = st.fpr.row(k);
      float* fmr = st.fmr.row(k);
      float* zr = st.zr.row(k);
      if (Complex) {
        float* fpi = st.fpi.row(k);
        float* fmi = st.fmi.row(k);
        float* zi = st.zi.row(k);
        for (int l = 0; l < L; ++l) {
          const float gk = static_cast<float>(g[l]);
          const float c = static_cast<float>(wc[l]), sn = static_cast<float>(ws[l]);
          // F+ multiplier gk (e2c - i e2s)(c - i sn); F- takes its conjugate,
          // Z_k takes gk e1 (c - i sn).
          const float mr = gk * (e2c[l] * c - e2s[l] * sn);
          const float mi = -gk * (e2c[l] * sn + e2s[l] * c);
          const float zmr = gk * e1[l] * c, zmi = -gk * e1[l] * sn;
          const float pr = fpr[l], pi_ = fpi[l], qr = fmr[l], qi = fmi[l], ar = zr[l], ai = zi[l];
          fpr[l] = mr * pr - mi * pi_;
          fpi[l] = mr * pi_ + mi * pr;
          fmr[l] = mr * qr + mi * qi;
          fmi[l] = mr * qi - mi * qr;
          zr[l] = zmr * ar - zmi * ai;
          zi[l] = zmr * ai + zmi * ar;
          // (wc - i ws) advances by (rc - i rs) = e^{-i phi}.
          const double nc = wc[l] * rc[l] - ws[l] * rs[l];
          ws[l] = wc[l] * rs[l] + ws[l] * rc[l];
          wc[l] = nc;
          g[l] *= step[l];
          step[l] *= a2[l];
        }
      } else {
        for (int l = 0; l < L; ++l) {
          const float gk = static_cast<float>(g[l]);
          fpr[l] *= gk * e2c[l];
          fmr[l] *= gk * e2c[l];
          zr[l] *= gk * e1[l];
          g[l] *= step[l];
          step[l] *= a2[l];
        }
      }
    }
  }
  const float* rec = iv + iv_rec * L;
  float* z0 = st.zr.row(0);
  if (washout) {
    const float* keep = iv + iv_keep * L;
    BLOCHSIM_LANE_LOOP
    for (int l = 0; l < L; ++l) z0[l] += keep[l] * rec[l] + (1.0f - keep[l]);
  } else {
    BLOCHSIM_LANE_LOOP
    for (int l = 0; l < L; ++l) z0[l] += rec[l];
  }
}

template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void rotate(const State<L>& st, const float* rf, int band) {
  const float* c2 = rf + rf_c2 * L;
  const float* s2 = rf + rf_s2 * L;
  const float* ca = rf + rf_ca * L;
  const float* br = rf + rf_br * L;
  for (int k = 0; k < band; ++k) {
    float* fpr = st.fpr.row(k);
    float* fmr = st.fmr.row(k);
    float* zr = st.zr.row(k);
    if (Complex) {
      const float* ar = rf + rf_ar * L;
      const float* ai = rf + rf_ai * L;
      const float* bi = rf + rf_bi * L;
      const float* cr = rf + rf_cr * L;
      const float* ci = rf + rf_ci * L;
      float* fpi = st.fpi.row(k);
      float* fmi = st.fmi.row(k);
      float* zi = st.zi.row(k);
      BLOCHSIM_LANE_LOOP
      for (int l = 0; l < L; ++l) {
        const float pr = fpr[l], pi_ = fpi[l], mr = fmr[l], mi = fmi[l], zre = zr[l], zim = zi[l];
        fpr[l] = c2[l] * pr + (ar[l] * mr - ai[l] * mi) + (br[l] * zre - bi[l] * zim);
        fpi[l] = c2[l] * pi_ + (ar[l] * mi + ai[l] * mr) + (br[l] * zim + bi[l] * zre);
        fmr[l] = (ar[l] * pr + ai[l] * pi_) + c2[l] * mr + (br[l] * zre + bi[l] * zim);
        fmi[l] = (ar[l] * pi_ - ai[l] * pr) + c2[l] * mi + (br[l] * zim - bi[l] * zre);
        zr[l] = (cr[l] * pr - ci[l] * pi_) + (cr[l] * mr + ci[l] * mi) + ca[l] * zre;
        zi[l] = (cr[l] * pi_ + ci[l] * pr) + (cr[l] * mi - ci[l] * mr) + ca[l] * zim;
      }
    } else {
      BLOCHSIM_LANE_LOOP
      for (int l = 0; l < L; ++l) {
        const float p = fpr[l], m = fmr[l], z = zr[l];
        fpr[l] = c2[l] * p - s2[l] * m + br[l] * z;
        fmr[l] = c2[l] * m - s2[l] * p + br[l] * z;
        zr[l] = ca[l] * z - 0.5f * br[l] * (p + m);
      }
    }
  }
}

// Play the stream for problems [first, first + L) of t, writing their
// samples into out.  Lanes past t.n replay the last problem and write
// nothing, so every problem goes through the same instructions and results
// do not depend on how problems are partitioned into blocks or threads.
template <int L, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int forward_block(const EventStream& s, const Tissue& t, int64_t first,
                                                   float* work, float* out) {
  const int K = s.states;
  const int64_t KL = static_cast<int64_t>(K) * L;
  State<L> st{Plane<L>{work}, Plane<L>{work + KL}, Plane<L>{work + 2 * KL},
              Plane<L>{work + 3 * KL}, Plane<L>{work + 4 * KL}, Plane<L>{work + 5 * KL}};
  float* ivt = work + (Complex ? 6 : 3) * KL;
  float* rf = ivt + s.n_intervals * iv_fields * L;
  float* lane = rf + rf_fields * L;

  int64_t idx[L];
  for (int l = 0; l < L; ++l) {
    const int64_t p = first + l;
    idx[l] = p < t.n ? p : t.n - 1;
    lane[ln_m0 * L + l] = t.M0.at(idx[l]);
    lane[ln_b1 * L + l] = t.B1.at(idx[l]);
    lane[ln_b1phase * L + l] = t.B1phase_rad.at(idx[l]);
    lane[ln_eta * L + l] = t.inv_efficiency.at(idx[l]);
  }
  tabulate_intervals<L>(s, t, idx, ivt);

  for (int64_t i = 0; i < (Complex ? 6 : 3) * KL; ++i) work[i] = 0.0f;
  {
    float* z0 = st.zr.row(0);
    for (int l = 0; l < L; ++l) z0[l] = 1.0f;
  }

  const bool rf_uniform = !t.B1.present() && !t.B1phase_rad.present();
  const bool per_order = t.D_m2_s.present() || t.v_m_s.present();
  const bool washout = t.v_m_s.present();
  const float* eta = lane + ln_eta * L;
  const float* m0 = lane + ln_m0 * L;
  int band = 1;

  for (int64_t e = 0; e < s.n_events; ++e) {
    const int32_t iv = s.interval[e];
    if (iv >= 0) relax<L, Complex>(st, ivt + static_cast<int64_t>(iv) * iv_fields * L, band, per_order, washout);
    if (s.shift_before[e] != 0) shift<L, Complex>(st, s.shift_before[e], band, K);
    const uint32_t f = s.flags[e];
    if (f & event_rf) {
      rf_coefficients<L, Complex>(s, e, rf_uniform, lane, rf);
      rotate<L, Complex>(st, rf, band);
    } else if (f & event_inversion) {
      for (int k = 0; k < band; ++k) {
        float* zr = st.zr.row(k);
        BLOCHSIM_LANE_LOOP
        for (int l = 0; l < L; ++l) zr[l] *= -eta[l];
        if (Complex) {
          float* zi = st.zi.row(k);
          BLOCHSIM_LANE_LOOP
          for (int l = 0; l < L; ++l) zi[l] *= -eta[l];
        }
      }
    }
    if (f & event_readout) {
      const int64_t slot = s.slot[e];
      const float rx = s.rx_phase_rad[e];
      const float* fr = st.fpr.row(0);
      if (Complex) {
        const float* fi = st.fpi.row(0);
        const float c = std::cos(rx), sn = std::sin(rx);
        for (int l = 0; l < L; ++l) {
          if (first + l >= t.n) break;
          float* o = out + ((first + l) * s.n_samples + slot) * 2;
          o[0] = m0[l] * (fr[l] * c + fi[l] * sn);
          o[1] = m0[l] * (fi[l] * c - fr[l] * sn);
        }
      } else {
        // F+_0 e^{-i rx} = f+_0 e^{i (phi0 - pi/2 - rx)}
        const double th = static_cast<double>(s.common_phase_rad) - 0.5 * pi - rx;
        const float c = static_cast<float>(std::cos(th)), sn = static_cast<float>(std::sin(th));
        for (int l = 0; l < L; ++l) {
          if (first + l >= t.n) break;
          float* o = out + ((first + l) * s.n_samples + slot) * 2;
          o[0] = m0[l] * fr[l] * c;
          o[1] = m0[l] * fr[l] * sn;
        }
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
      shift<L, Complex>(st, s.shift_after[e], band, K);
    }
  }
  return ok;
}

}  // namespace epg
}  // namespace blochsim
