// PERK (SPEC §5; Nataraj, Fessler & Nielsen 2018, IEEE TMI 37:2103): kernel
// ridge regression with a Gaussian kernel approximated by random Fourier
// features (Rahimi & Recht 2007, NIPS).  A fitted model maps an input x
// (d coordinates: a voxel's preprocessed signal, known parameters appended)
// to p estimates
//
//     θ̂(x) = offset + Wf · cos(Ω x + b),
//
// Ω (F × d) the feature frequencies, b (F) their phases, Wf (p × F) the
// regression weights times sqrt(2/F), offset (p) = mean θ − W mean z.  The
// kernels here are fused: each feature is formed, turned into its cosine
// and accumulated into the estimates at once, so the voxels × features
// matrix never exists.  The pullback of a cotangent ḡ (p) of θ̂ to x is
//
//     x̄ = Ωᵀ (−sin(Ω x + b) ∘ (Wfᵀ ḡ)),
//
// which forms the features again (one more pass over Ω) instead of storing
// them.
//
// Lanes: V is a lane type of tile.hpp; a block holds Lanes<V>::width voxels
// with its inputs transposed (coordinate k of every lane at xt[k]).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "config.hpp"
#include "events.hpp"
#include "tile.hpp"

namespace blochsim {

// A fitted PERK model as the kernels read it (host or device memory, all
// row-major float32).
struct PerkModel {
  int64_t d = 0;                  // input coordinates
  int64_t F = 0;                  // features
  int64_t p = 0;                  // estimates, at most perk_max_outputs
  const float* omega = nullptr;   // (F, d) feature frequencies
  const float* phase = nullptr;   // (F) feature phases b
  const float* weight = nullptr;  // (p, F) regression weights times sqrt(2/F)
  const float* offset = nullptr;  // (p)
};

constexpr int perk_max_outputs = 16;
// features formed together in one pass over a block's inputs
constexpr int perk_feature_run = 4;

// Checks a model's sizes and pointers; returns a Status.
inline int validate_perk(const PerkModel& m) {
  if (m.d < 1 || m.F < 1 || m.p < 1 || m.p > perk_max_outputs) return bad_shape;
  if (!m.omega || !m.phase || !m.weight || !m.offset) return bad_shape;
  return ok;
}

inline namespace BLOCHSIM_ISA {

// sin and cos of every lane.  Float lanes (the device, one voxel a thread)
// call the library; vector lanes reduce by the nearest multiple n of π/2 in
// three parts (Cody & Waite 1980) and evaluate minimax polynomials on
// [−π/4, π/4] (the single-precision ones of Moshier's Cephes library,
// Methods and Programs for Mathematical Functions, 1989), choosing and
// signing them by n mod 4.  Error about 1e-7 for |x| below 1e4.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void lane_sincos(float x, float& s, float& c) {
  s = std::sin(x);
  c = std::cos(x);
}

#if defined(BLOCHSIM_HAVE_VECTOR_LANES)
template <class V, class I>
BLOCHSIM_FORCEINLINE void vector_sincos(V x, V& s, V& c) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const V n = (x * 0.636619772367581f + magic) - magic;
  const I ni = __builtin_convertvector(n, I);
  V r = x - n * 1.5703125f;
  r = r - n * 4.837512969970703125e-4f;
  r = r - n * 7.54978995489188216e-8f;
  const V r2 = r * r;
  const V sr = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
  const V cr = 1.0f - 0.5f * r2 + r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
  const I odd = -(ni & 1);  // every bit set where n is odd: sin and cos swap
  const I sin_sign = (ni & 2) << 30;
  const I cos_sign = ((ni + 1) & 2) << 30;
  const I si = ((I)sr & ~odd) | ((I)cr & odd), ci = ((I)cr & ~odd) | ((I)sr & odd);
  s = (V)(si ^ sin_sign);
  c = (V)(ci ^ cos_sign);
}
typedef int32_t vint16 __attribute__((vector_size(64)));
typedef int32_t vint4 __attribute__((vector_size(16)));
typedef int32_t vint8 __attribute__((vector_size(32)));
BLOCHSIM_FORCEINLINE void lane_sincos(vfloat16 x, vfloat16& s, vfloat16& c) { vector_sincos<vfloat16, vint16>(x, s, c); }
BLOCHSIM_FORCEINLINE void lane_sincos(vfloat8 x, vfloat8& s, vfloat8& c) { vector_sincos<vfloat8, vint8>(x, s, c); }
BLOCHSIM_FORCEINLINE void lane_sincos(vfloat4 x, vfloat4& s, vfloat4& c) { vector_sincos<vfloat4, vint4>(x, s, c); }
#endif

// Floats of workspace a block of V needs: the transposed inputs and, for
// the pullback, the transposed input cotangents.
template <class V>
inline int64_t perk_block_workspace(const PerkModel& m) {
  return 2 * m.d * Lanes<V>::width;
}

namespace perk_detail {

// xt[k] = coordinate k of voxels first .. first + width (the last voxel
// repeated past n)
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void gather(const PerkModel& m, const float* x, int64_t n, int64_t first, V* xt) {
  using LT = Lanes<V>;
  for (int l = 0; l < LT::width; ++l) {
    const int64_t i = first + l < n ? first + l : n - 1;
    const float* row = x + i * m.d;
    for (int64_t k = 0; k < m.d; ++k) LT::set(xt[k], l, row[k]);
  }
}

// u[i] = Ω x + b for features f0 .. f0 + R of the block (R <= perk_feature_run)
template <class V, int R>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void features(const PerkModel& m, const V* xt, int64_t f0, V* u) {
  const float* om[R];
  for (int i = 0; i < R; ++i) {
    om[i] = m.omega + (f0 + i) * m.d;
    u[i] = V{} + m.phase[f0 + i];
  }
  for (int64_t k = 0; k < m.d; ++k) {
    const V xk = xt[k];
    for (int i = 0; i < R; ++i) u[i] += om[i][k] * xk;
  }
}

template <class V, int R>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void map_run(const PerkModel& m, const V* xt, int64_t f0, V* acc) {
  V u[R];
  features<V, R>(m, xt, f0, u);
  for (int i = 0; i < R; ++i) {
    V s, c;
    lane_sincos(u[i], s, c);
    for (int j = 0; j < m.p; ++j) acc[j] += m.weight[j * m.F + f0 + i] * c;
  }
}

template <class V, int R>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void pullback_run(const PerkModel& m, const V* xt, const V* g, int64_t f0, V* acc,
                                                   V* xbar) {
  V u[R], w[R];
  features<V, R>(m, xt, f0, u);
  for (int i = 0; i < R; ++i) {
    V s, c;
    lane_sincos(u[i], s, c);
    V gw{};
    for (int j = 0; j < m.p; ++j) {
      const float wj = m.weight[j * m.F + f0 + i];
      acc[j] += wj * c;
      gw += wj * g[j];
    }
    w[i] = -(s * gw);
  }
  const float* om[R];
  for (int i = 0; i < R; ++i) om[i] = m.omega + (f0 + i) * m.d;
  for (int64_t k = 0; k < m.d; ++k) {
    V a = xbar[k];
    for (int i = 0; i < R; ++i) a += om[i][k] * w[i];
    xbar[k] = a;
  }
}

}  // namespace perk_detail

// θ̂ of voxels [first, first + width) of x (n, d): out (n, p).  work holds
// perk_block_workspace<V>(m) floats.
template <class V>
BLOCHSIM_HD inline void perk_map_block(const PerkModel& m, const float* x, int64_t n, int64_t first, V* work,
                                       float* out) {
  using LT = Lanes<V>;
  V* xt = work;
  perk_detail::gather(m, x, n, first, xt);
  V acc[perk_max_outputs];
  for (int j = 0; j < m.p; ++j) acc[j] = V{} + m.offset[j];
  int64_t f = 0;
  for (; f + perk_feature_run <= m.F; f += perk_feature_run)
    perk_detail::map_run<V, perk_feature_run>(m, xt, f, acc);
  for (; f < m.F; ++f) perk_detail::map_run<V, 1>(m, xt, f, acc);
  for (int l = 0; l < LT::width && first + l < n; ++l)
    for (int j = 0; j < m.p; ++j) out[(first + l) * m.p + j] = LT::get(acc[j], l);
}

// The pullback of the cotangent g (n, p) of θ̂ to x (n, d) for voxels
// [first, first + width): xbar (n, d); out (n, p) receives θ̂ on the way
// (nullptr: not written).  work holds perk_block_workspace<V>(m) floats.
template <class V>
BLOCHSIM_HD inline void perk_pullback_block(const PerkModel& m, const float* x, const float* g, int64_t n,
                                            int64_t first, V* work, float* xbar, float* out) {
  using LT = Lanes<V>;
  V* xt = work;
  V* xb = work + m.d;
  perk_detail::gather(m, x, n, first, xt);
  V gl[perk_max_outputs], acc[perk_max_outputs];
  for (int j = 0; j < m.p; ++j) {
    acc[j] = V{} + m.offset[j];
    gl[j] = V{};
    for (int l = 0; l < LT::width; ++l)
      if (first + l < n) LT::set(gl[j], l, g[(first + l) * m.p + j]);
  }
  for (int64_t k = 0; k < m.d; ++k) xb[k] = V{};
  int64_t f = 0;
  for (; f + perk_feature_run <= m.F; f += perk_feature_run)
    perk_detail::pullback_run<V, perk_feature_run>(m, xt, gl, f, acc, xb);
  for (; f < m.F; ++f) perk_detail::pullback_run<V, 1>(m, xt, gl, f, acc, xb);
  for (int l = 0; l < LT::width && first + l < n; ++l) {
    for (int64_t k = 0; k < m.d; ++k) xbar[(first + l) * m.d + k] = LT::get(xb[k], l);
    if (out)
      for (int j = 0; j < m.p; ++j) out[(first + l) * m.p + j] = LT::get(acc[j], l);
  }
}

// Blocks [b0, b1) of Lanes<V>::width voxels: the map when g is nullptr,
// else the pullback of g (as perk_pullback_block).  Returns a Status.
template <class V>
inline int perk_blocks(const PerkModel& m, const float* x, const float* g, int64_t n, int64_t b0, int64_t b1,
                       void* work, float* xbar, float* out) {
  constexpr int W = Lanes<V>::width;
  for (int64_t b = b0; b < b1; ++b) {
    if (g)
      perk_pullback_block<V>(m, x, g, n, b * W, static_cast<V*>(work), xbar, out);
    else
      perk_map_block<V>(m, x, n, b * W, static_cast<V*>(work), out);
  }
  return ok;
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
