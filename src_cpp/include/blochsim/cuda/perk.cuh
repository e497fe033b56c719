// PERK's fused map and its pullback on the device (perk.hpp): one thread a
// voxel, its inputs read where they lie (the row of x), the features formed
// a run at a time by the same perk_detail steps as the host's lanes.  The
// model's arrays are read by every thread of a warp at the same address
// (broadcast loads).
#pragma once

#include <cuda_runtime.h>

#include "../perk.hpp"
#include "runtime.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

// θ̂ of voxel i of x (n, d) into out (n, p); with g, its pullback
// accumulated in xbar (n, d), zeroed here.
__global__ void perk_kernel(PerkModel m, const float* x, const float* g, int64_t n, float* out, float* xbar) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* xt = x + i * m.d;
  float acc[perk_max_outputs];
  for (int j = 0; j < m.p; ++j) acc[j] = m.offset[j];
  int64_t f = 0;
  if (!g) {
    for (; f + perk_feature_run <= m.F; f += perk_feature_run) perk_detail::map_run<float, perk_feature_run>(m, xt, f, acc);
    for (; f < m.F; ++f) perk_detail::map_run<float, 1>(m, xt, f, acc);
  } else {
    float gl[perk_max_outputs];
    for (int j = 0; j < m.p; ++j) gl[j] = g[i * m.p + j];
    float* xb = xbar + i * m.d;
    for (int64_t k = 0; k < m.d; ++k) xb[k] = 0.0f;
    for (; f + perk_feature_run <= m.F; f += perk_feature_run)
      perk_detail::pullback_run<float, perk_feature_run>(m, xt, gl, f, acc, xb);
    for (; f < m.F; ++f) perk_detail::pullback_run<float, 1>(m, xt, gl, f, acc, xb);
  }
  if (out)
    for (int j = 0; j < m.p; ++j) out[i * m.p + j] = acc[j];
}

// One warp a voxel: PERK's inputs from its complex signal (n, c) into x
// (n, d), as PERK._inputs forms them on the host.  mode 0: real and
// imaginary parts interleaved (2c values), 1: magnitudes (c); normalize:
// divided by the signal's norm; with a basis (v, r) (v the values of the
// mode) the values are projected on it (r inputs), else kept (v inputs);
// the known columns (n, nk) follow.
__global__ void perk_inputs_kernel(const float2* s, int64_t n, int64_t c, int mode, int normalize,
                                   const float* basis, int64_t r, const float* known, int64_t nk, float* x,
                                   int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (i >= n) return;
  const float2* row = s + i * c;
  float scale = 1.0f;
  if (normalize) {
    double e = 0.0;
    for (int64_t j = lane; j < c; j += 32) e += static_cast<double>(row[j].x) * row[j].x + static_cast<double>(row[j].y) * row[j].y;
    for (int m = 16; m >= 1; m >>= 1) e += __shfl_xor_sync(0xffffffffu, e, m);
    const double norm = sqrt(e);
    scale = norm > 0.0 ? static_cast<float>(1.0 / norm) : 1.0f;
  }
  const int64_t values = mode == 0 ? 2 * c : c;
  auto value = [&](int64_t v) -> float {
    if (mode == 0) {
      const float2 z = row[v / 2];
      return (v % 2 ? z.y : z.x) * scale;
    }
    const float2 z = row[v];
    return sqrtf(z.x * z.x + z.y * z.y) * scale;
  };
  float* xi = x + i * d;
  int64_t u = 0;
  if (basis) {
    for (int64_t t = 0; t < r; ++t) {
      float a = 0.0f;
      for (int64_t v = lane; v < values; v += 32) a += value(v) * basis[v * r + t];
      for (int m = 16; m >= 1; m >>= 1) a += __shfl_xor_sync(0xffffffffu, a, m);
      if (lane == 0) xi[t] = a;
    }
    u = r;
  } else {
    for (int64_t v = lane; v < values; v += 32) xi[v] = value(v);
    u = values;
  }
  for (int64_t q = lane; q < nk; q += 32) xi[u + q] = known[i * nk + q];
}

// Z[i, f] = scale · cos(ω_f · x_i + b_f) for the m inputs x (m, d): the
// training features (m, F), float32.
__global__ void perk_features_kernel(PerkModel m, const float* x, int64_t count, float scale, float* z) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t i = blockIdx.y;
  if (f >= m.F || i >= count) return;
  const float* xi = x + i * m.d;
  const float* om = m.omega + f * m.d;
  float u = m.phase[f];
  for (int64_t k = 0; k < m.d; ++k) u += om[k] * xi[k];
  z[i * m.F + f] = scale * cosf(u);
}

// One 64 × 64 tile of ZᵀZ (F × F) over the m rows of Z, in double: 16 × 16
// threads of 4 × 4 outputs, rows staged 32 at a time.
__global__ void __launch_bounds__(256) perk_gram_kernel(const float* z, int64_t count, int64_t F, double* zz) {
  __shared__ float a[32][64], b[32][64];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 64, c0 = static_cast<int64_t>(blockIdx.x) * 64;
  double acc[4][4] = {};
  for (int64_t i0 = 0; i0 < count; i0 += 32) {
    __syncthreads();
    for (int e = threadIdx.x; e < 32 * 64; e += 256) {
      const int ii = e / 64, cc = e % 64;
      const int64_t i = i0 + ii;
      a[ii][cc] = (i < count && r0 + cc < F) ? z[i * F + r0 + cc] : 0.0f;
      b[ii][cc] = (i < count && c0 + cc < F) ? z[i * F + c0 + cc] : 0.0f;
    }
    __syncthreads();
    for (int ii = 0; ii < 32; ++ii) {
      double av[4], bv[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        av[q] = a[ii][ty + 16 * q];
        bv[q] = b[ii][tx + 16 * q];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int w = 0; w < 4; ++w) acc[q][w] += av[q] * bv[w];
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t r = r0 + ty + 16 * q, c = c0 + tx + 16 * w;
      if (r < F && c < F) zz[r * F + c] = acc[q][w];
    }
}

// Column sums of Z (sz, F) and tᵀZ (stz, p × F) in double, t (m, p) double;
// one thread a feature, the rows in order.
__global__ void perk_sums_kernel(const float* z, const double* t, int64_t count, int64_t F, int64_t p, double* sz,
                                 double* stz) {
  const int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= F) return;
  double s = 0.0, st[perk_max_outputs] = {};
  for (int64_t i = 0; i < count; ++i) {
    const double v = z[i * F + f];
    s += v;
    for (int64_t j = 0; j < p; ++j) st[j] += t[i * p + j] * v;
  }
  sz[f] = s;
  for (int64_t j = 0; j < p; ++j) stz[j * F + f] = st[j];
}

}  // namespace detail

// PERK's inputs on the device (perk_inputs_kernel): signals s (count, c)
// complex64, basis (values, r) float32 or nullptr, known (count, nk) or
// nullptr, x (count, d); device pointers, ordered on `stream`.
inline int perk_inputs_device(const float* s, int64_t count, int64_t c, int mode, bool normalize, const float* basis,
                              int64_t r, const float* known, int64_t nk, float* x, int64_t d, cudaStream_t stream,
                              char* err, int n) {
  using namespace detail;
  const int64_t values = mode == 0 ? 2 * c : c;
  if (count < 0 || c < 1 || (mode != 0 && mode != 1) || nk < 0 || (basis ? r : values) + nk != d)
    return say(bad_shape, err, n);
  if (count == 0) return ok;
  no_stale_error();
  perk_inputs_kernel<<<static_cast<unsigned>((count * 32 + 255) / 256), 256, 0, stream>>>(
      reinterpret_cast<const float2*>(s), count, c, mode, normalize ? 1 : 0, basis, r, known, nk, x, d);
  BLOCHSIM_CUDA(cudaGetLastError(), "perk inputs kernel launch");
  return ok;
}

// PERK estimates of n voxels on the device (perk.hpp's model, inputs x (n,
// m.d), out (n, m.p), all device pointers); with a cotangent g (n, m.p)
// also its pullback xbar (n, m.d) (out may then be nullptr).  Ordered on
// `stream`.  Returns a Status.
inline int perk_device(const PerkModel& m, const float* x, const float* g, int64_t n, float* out, float* xbar,
                       cudaStream_t stream, char* err, int nerr) {
  using namespace detail;
  const int n_ = nerr;
  int v = validate_perk(m);
  if (v == ok && (n < 0 || (n > 0 && (!x || (!g && !out) || (g && !xbar))))) v = bad_shape;
  if (v != ok) return say(v, err, n_);
  if (n == 0) return ok;
  no_stale_error();
  perk_kernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, stream>>>(m, x, g, n, out, xbar);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return fail(e, "perk kernel launch", err, n_);
  return ok;
}

// The sums of one training block on the device (perk.py's moments): the
// features Z = scale · cos(Ω x + b) of its inputs x (count, m.d) and, in
// double, Σ z (sz, F), Σ z zᵀ (szz, F × F) and Σ t zᵀ (stz, p × F) for its
// targets t (count, p) double; m's omega and phase and every array are
// device pointers (m.weight and m.offset unused).  Each sum runs over the
// rows in a fixed order: the result is the same at every call.  Ordered
// on `stream`.
inline int perk_moments_device(const PerkModel& m, const float* x, const double* t, int64_t count, int64_t p,
                               float scale, double* sz, double* szz, double* stz, cudaStream_t stream, char* err,
                               int n) {
  using namespace detail;
  if (m.d < 1 || m.F < 1 || p < 0 || p > perk_max_outputs || count < 1 || count > 65535 || !m.omega || !m.phase)
    return say(bad_shape, err, n);
  void* zbuf = nullptr;
  no_stale_error();
  BLOCHSIM_CUDA(pool_malloc(&zbuf, static_cast<size_t>(count) * static_cast<size_t>(m.F) * sizeof(float), stream),
                "cudaMallocAsync");
  float* z = static_cast<float*>(zbuf);
  perk_features_kernel<<<dim3(static_cast<unsigned>((m.F + 127) / 128), static_cast<unsigned>(count)), 128, 0,
                         stream>>>(m, x, count, scale, z);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    const unsigned tiles = static_cast<unsigned>((m.F + 63) / 64);
    perk_gram_kernel<<<dim3(tiles, tiles), 256, 0, stream>>>(z, count, m.F, szz);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    perk_sums_kernel<<<static_cast<unsigned>((m.F + 127) / 128), 128, 0, stream>>>(z, t, count, m.F, p, sz, stz);
    e = cudaGetLastError();
  }
  cudaFreeAsync(zbuf, stream);
  if (e != cudaSuccess) return fail(e, "perk moments kernel launch", err, n);
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
