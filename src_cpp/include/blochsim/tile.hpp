// The tile runtime: small (orders, lanes) views shared by the host and the
// device instantiation of every kernel.
//
// A Plane is one real component of one EPG family (say Re F+) for a block of
// L atoms, stored order-major: element (k, l) at p[k * L + l], so that a loop
// over lanes at fixed order is contiguous and vectorises.  The host backend
// uses L = 16 lanes (one AVX-512 register of floats, two AVX2 registers).
#pragma once

#include "config.hpp"

namespace blochsim {

template <int L>
struct Plane {
  float* BLOCHSIM_RESTRICT p;  // (orders, L)

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE float* row(int k) const { return p + static_cast<int64_t>(k) * L; }

  // Zero orders [k0, k1).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void zero(int k0, int k1) const {
    for (int k = k0; k < k1; ++k) {
      float* r = row(k);
      BLOCHSIM_LANE_LOOP
      for (int l = 0; l < L; ++l) r[l] = 0.0f;
    }
  }

  // Move every order up by one over [0, band): row k takes row k-1, row 0 is
  // left for the caller.  Orders at or above `band` are zero and row
  // `band` (when it exists) receives row band-1.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_up(int band, int K) const {
    int top = band < K ? band : K - 1;
    for (int k = top; k >= 1; --k) {
      float* d = row(k);
      const float* s = row(k - 1);
      BLOCHSIM_LANE_LOOP
      for (int l = 0; l < L; ++l) d[l] = s[l];
    }
  }

  // Move every order down by one: row k takes row k+1 over [0, band), the
  // highest row of the band becomes zero.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_down(int band) const {
    for (int k = 0; k + 1 < band; ++k) {
      float* d = row(k);
      const float* s = row(k + 1);
      BLOCHSIM_LANE_LOOP
      for (int l = 0; l < L; ++l) d[l] = s[l];
    }
    float* d = row(band - 1);
    BLOCHSIM_LANE_LOOP
    for (int l = 0; l < L; ++l) d[l] = 0.0f;
  }
};

}  // namespace blochsim
