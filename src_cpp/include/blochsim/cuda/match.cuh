// Dictionary matching on the device (match.hpp): one launch of tiles of
// signals against tiles of atoms, then a merge.
//
// A block holds match_signals signals and sweeps the atoms of its split
// (gridDim.y cuts the atoms when there are too few signal tiles to fill the
// card) in tiles of match_atoms, both staged through shared memory
// match_step components at a time (a signal tile of at most match_step
// components is staged once).  Thread (ty, tx) of the 16 × 16 threads holds
// the register tile of signals ty + 16 s (s < 8) against atoms tx + 16 v
// (v < 4) of match_accumulate, 32 complex accumulators, and offers each
// power to its own sorted list per signal (its atoms in ascending order).
// The 16 threads that share signals sit in one half-warp and merge their
// lists by butterfly shuffles; each split's lists go to scratch, and
// match_finish merges the splits per signal and computes the winners' inner
// products in double precision (match_exact).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "../match.hpp"
#include "runtime.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

constexpr int match_signals = 128, match_atoms = 64, match_step = 16;
constexpr int match_S = 8, match_A = 4;  // a thread's signals and atoms
constexpr int match_threads = (match_signals / match_S) * (match_atoms / match_A);
static_assert(match_threads == 256 && match_signals / match_S == 16 && match_atoms / match_A == 16,
              "16 x 16 threads: a row of 16 shares its signals within a half-warp");
// The largest k of the device's lists (local memory; k = 1 in registers).
constexpr int match_device_max_k = 64;

// Shuffle a list entry from the lane `mask` apart (within a half-warp).
__device__ __forceinline__ void match_shuffle(float& pw, int64_t& ix, int mask) {
  pw = __shfl_xor_sync(0xffffffffu, pw, mask);
  ix = __shfl_xor_sync(0xffffffffu, static_cast<long long>(ix), mask);
}

// Partial lists of atoms [split·per_split, (split + 1)·per_split) for
// signals of block x: part_pw/part_ix (n, splits, k).
template <int KC>
__global__ void __launch_bounds__(match_threads) match_kernel(MatchProblem p, int64_t per_split, float* part_pw,
                                                              int64_t* part_ix) {
  // padded rows: the strided stores of the staging hit every bank once
  __shared__ float2 sig[match_step][match_signals + 1];
  __shared__ float2 atm[match_step][match_atoms + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int k = KC == 1 ? 1 : p.k;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * match_signals;
  const int64_t abegin = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t aend = abegin + per_split < p.atoms ? abegin + per_split : p.atoms;
  const float2* sg = reinterpret_cast<const float2*>(p.signal);
  const float2* at = reinterpret_cast<const float2*>(p.atom);
  const int64_t dim = p.dim;
  const bool resident = dim <= match_step;

  float pw[match_S][KC];
  int64_t ix[match_S][KC];
  float thr[match_S];
#pragma unroll
  for (int s = 0; s < match_S; ++s) {
    thr[s] = -1.0f;
    for (int q = 0; q < k; ++q) {
      pw[s][q] = -1.0f;
      ix[s][q] = -1;
    }
  }

  auto stage_signals = [&](int64_t j0) {
    for (int e = tid; e < match_signals * match_step; e += match_threads) {
      const int si = e / match_step, jj = e % match_step;
      const int64_t s = s0 + si, j = j0 + jj;
      sig[jj][si] = (s < p.n && j < dim) ? sg[s * dim + j] : make_float2(0.0f, 0.0f);
    }
  };
  if (resident) stage_signals(0);

  for (int64_t a0 = abegin; a0 < aend; a0 += match_atoms) {
    float re[match_S][match_A], im[match_S][match_A];
#pragma unroll
    for (int s = 0; s < match_S; ++s)
#pragma unroll
      for (int v = 0; v < match_A; ++v) re[s][v] = im[s][v] = 0.0f;
    for (int64_t j0 = 0; j0 < dim; j0 += match_step) {
      __syncthreads();
      if (!resident) stage_signals(j0);
      for (int e = tid; e < match_atoms * match_step; e += match_threads) {
        const int ai = e / match_step, jj = e % match_step;
        const int64_t a = a0 + ai, j = j0 + jj;
        atm[jj][ai] = (a < aend && j < dim) ? at[a * dim + j] : make_float2(0.0f, 0.0f);
      }
      __syncthreads();
      const int64_t jn = dim - j0 < match_step ? dim - j0 : match_step;
      match_accumulate<float, float, match_S, match_A>(
          0, jn,
          [&](int64_t j, int s, float& sr, float& si) {
            const float2 x = sig[j][ty + 16 * s];
            sr = x.x;
            si = x.y;
          },
          [&](int64_t j, int v, float& ar, float& ai) {
            const float2 x = atm[j][tx + 16 * v];
            ar = x.x;
            ai = x.y;
          },
          re, im);
    }
#pragma unroll
    for (int v = 0; v < match_A; ++v) {
      const int64_t a = a0 + tx + 16 * v;
      if (a >= aend) continue;
#pragma unroll
      for (int s = 0; s < match_S; ++s) {
        const float x = match_power(re[s][v], im[s][v]);
        if (x > thr[s]) {
          match_offer(pw[s], ix[s], k, x, a);
          thr[s] = pw[s][k - 1];
        }
      }
    }
  }

  // the 16 threads of a row (one half-warp) merge their lists: after the
  // butterfly every one of them holds the row's
  for (int mask = 8; mask >= 1; mask >>= 1) {
#pragma unroll
    for (int s = 0; s < match_S; ++s) {
      float opw[KC], mpw[KC];
      int64_t oix[KC], mix[KC];
      for (int q = 0; q < k; ++q) {
        opw[q] = pw[s][q];
        oix[q] = ix[s][q];
        match_shuffle(opw[q], oix[q], mask);
      }
      match_merge(pw[s], ix[s], opw, oix, k, mpw, mix);
      for (int q = 0; q < k; ++q) {
        pw[s][q] = mpw[q];
        ix[s][q] = mix[q];
      }
    }
  }
  const int64_t splits = gridDim.y;
#pragma unroll
  for (int s = 0; s < match_S; ++s) {
    const int64_t sigi = s0 + ty + 16 * s;
    if (sigi >= p.n) continue;
    for (int q = tx; q < k; q += 16) {
      const int64_t o = (sigi * splits + blockIdx.y) * k + q;
      part_pw[o] = pw[s][q];
      part_ix[o] = ix[s][q];
    }
  }
}

// The k best of each signal over its splits' lists, and their inner
// products in double precision, into r.
template <int KC>
__global__ void match_finish(MatchProblem p, int64_t splits, const float* part_pw, const int64_t* part_ix,
                             MatchResult r) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const int k = KC == 1 ? 1 : p.k;
  float pw[KC], tpw[KC], opw[KC];
  int64_t ix[KC], tix[KC], oix[KC];
  for (int q = 0; q < k; ++q) {
    pw[q] = part_pw[i * splits * k + q];
    ix[q] = part_ix[i * splits * k + q];
  }
  for (int64_t sp = 1; sp < splits; ++sp) {
    for (int q = 0; q < k; ++q) {
      opw[q] = part_pw[(i * splits + sp) * k + q];
      oix[q] = part_ix[(i * splits + sp) * k + q];
    }
    match_merge(pw, ix, opw, oix, k, tpw, tix);
    for (int q = 0; q < k; ++q) {
      pw[q] = tpw[q];
      ix[q] = tix[q];
    }
  }
  for (int q = 0; q < k; ++q) {
    const int64_t o = i * k + q;
    double re = 0.0, im = 0.0;
    if (ix[q] >= 0) match_exact(p.atom + 2 * p.dim * ix[q], p.signal + 2 * p.dim * i, p.dim, re, im);
    r.index[o] = ix[q];
    r.power[o] = ix[q] < 0 ? -1.0f : pw[q];
    r.dot[2 * o] = re;
    r.dot[2 * o + 1] = im;
  }
}

template <int KC>
inline int match_launch(const MatchProblem& p, const MatchResult& r, cudaStream_t st, char* err, int n) {
  int dev = 0, sms = 1;
  BLOCHSIM_CUDA(cudaGetDevice(&dev), "cudaGetDevice");
  BLOCHSIM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int64_t tiles = (p.n + match_signals - 1) / match_signals;
  const int64_t atom_tiles = (p.atoms + match_atoms - 1) / match_atoms;
  // splits of the atoms: enough blocks for two waves, at least 8 atom tiles a split
  int64_t splits = std::max<int64_t>(1, (2 * sms + tiles - 1) / tiles);
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, atom_tiles / 8));
  splits = std::min<int64_t>(splits, 65535);
  const int64_t per_split = ((atom_tiles + splits - 1) / splits) * match_atoms;
  splits = std::max<int64_t>(1, (p.atoms + per_split - 1) / per_split);
  if (tiles > 2147483647) return say(bad_shape, err, n);
  void* scratch = nullptr;
  const size_t entries = static_cast<size_t>(p.n) * static_cast<size_t>(splits) * static_cast<size_t>(p.k);
  no_stale_error();
  BLOCHSIM_CUDA(pool_malloc(&scratch, entries * (sizeof(float) + sizeof(int64_t)), st), "cudaMallocAsync");
  int64_t* part_ix = static_cast<int64_t*>(scratch);
  float* part_pw = reinterpret_cast<float*>(part_ix + entries);
  match_kernel<KC><<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), match_threads, 0, st>>>(
      p, per_split, part_pw, part_ix);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    match_finish<KC><<<static_cast<unsigned>((p.n + 127) / 128), 128, 0, st>>>(p, splits, part_pw, part_ix, r);
    e = cudaGetLastError();
  }
  cudaFreeAsync(scratch, st);
  if (e != cudaSuccess) return fail(e, "match kernel launch", err, n);
  return ok;
}

// One warp a row of rows (n, c): its norm (double) into norms, and the row,
// scaled to unit norm when `unit` (a null row stays null), projected on
// basis (c, r) into out (n, r), or copied into out (n, c) without a basis.
__global__ void project_kernel(const float2* rows, int64_t n, int64_t c, const float2* basis, int64_t r, int unit,
                               float2* out, double* norms) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= n) return;
  const float2* x = rows + row * c;
  double e = 0.0;
  for (int64_t j = lane; j < c; j += 32) e += static_cast<double>(x[j].x) * x[j].x + static_cast<double>(x[j].y) * x[j].y;
  for (int m = 16; m >= 1; m >>= 1) e += __shfl_xor_sync(0xffffffffu, e, m);
  const double norm = sqrt(e);
  if (lane == 0 && norms) norms[row] = norm;
  const float scale = unit ? (norm > 0.0 ? static_cast<float>(1.0 / norm) : 0.0f) : 1.0f;
  if (!basis) {
    if (out)
      for (int64_t j = lane; j < c; j += 32) out[row * c + j] = make_float2(x[j].x * scale, x[j].y * scale);
    return;
  }
  for (int64_t t = 0; t < r; ++t) {
    float re = 0.0f, im = 0.0f;
    for (int64_t j = lane; j < c; j += 32) {
      const float2 b = basis[j * r + t], v = x[j];
      re += v.x * b.x - v.y * b.y;
      im += v.x * b.y + v.y * b.x;
    }
    for (int m = 16; m >= 1; m >>= 1) {
      re += __shfl_xor_sync(0xffffffffu, re, m);
      im += __shfl_xor_sync(0xffffffffu, im, m);
    }
    if (lane == 0) out[row * r + t] = make_float2(re * scale, im * scale);
  }
}

// One warp a candidate: <atom i·m + q, signal i> (double) of atoms (n·m, c)
// and signals (n, c) into dots (n·m), the atom's norm into norms (n·m).
__global__ void candidate_dots_kernel(const float2* atoms, const float2* signals, int64_t n, int64_t m, int64_t c,
                                      double2* dots, double* norms) {
  const int lane = threadIdx.x % 32;
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= n * m) return;
  const float2* a = atoms + w * c;
  const float2* s = signals + (w / m) * c;
  double re = 0.0, im = 0.0, e = 0.0;
  for (int64_t j = lane; j < c; j += 32) {
    const double ar = a[j].x, ai = a[j].y, sr = s[j].x, si = s[j].y;
    re += ar * sr + ai * si;
    im += ar * si - ai * sr;
    e += ar * ar + ai * ai;
  }
  for (int k = 16; k >= 1; k >>= 1) {
    re += __shfl_xor_sync(0xffffffffu, re, k);
    im += __shfl_xor_sync(0xffffffffu, im, k);
    e += __shfl_xor_sync(0xffffffffu, e, k);
  }
  if (lane == 0) {
    dots[w] = make_double2(re, im);
    norms[w] = sqrt(e);
  }
}

inline unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps * 32 + 255) / 256); }

}  // namespace detail

// The k best atoms of every signal of p into r on the device: p's signals
// and atoms and r's arrays are device pointers.  Ordered on `stream`, not
// synchronised; k at most match_device_max_k.  Returns a Status (a CUDA
// error as cuda_error_base + its code, named in err).
inline int match_device(const MatchProblem& p, const MatchResult& r, cudaStream_t stream, char* err, int n) {
  using namespace detail;
  int v = validate_match(p, r);
  if (v == ok && p.k > match_device_max_k) v = bad_shape;
  if (v != ok) return say(v, err, n);
  if (p.n == 0) return ok;
  if (p.k == 1) return match_launch<1>(p, r, stream, err, n);
  if (p.k <= 8) return match_launch<8>(p, r, stream, err, n);
  return match_launch<match_device_max_k>(p, r, stream, err, n);
}

// Rows (count, c) complex64 on the device: their norms (double, count; may
// be nullptr) and the rows, scaled to unit norm when `unit`, projected on
// the device basis (c, r) into out (count, r), or copied into out (count,
// c) when basis is nullptr (out nullptr too: the norms alone).  Ordered on
// `stream`.
inline int project_device(const float* rows, int64_t count, int64_t c, const float* basis, int64_t r, bool unit,
                          float* out, double* norms, cudaStream_t stream, char* err, int n) {
  using namespace detail;
  if (count < 0 || c < 1 || (basis && r < 1)) return say(bad_shape, err, n);
  if (count == 0) return ok;
  no_stale_error();
  project_kernel<<<warp_blocks(count), 256, 0, stream>>>(reinterpret_cast<const float2*>(rows), count, c,
                                                         reinterpret_cast<const float2*>(basis), r, unit ? 1 : 0,
                                                         reinterpret_cast<float2*>(out), norms);
  BLOCHSIM_CUDA(cudaGetLastError(), "project kernel launch");
  return ok;
}

// Candidate atoms (count·m, c) and signals (count, c) complex64 on the
// device: <atom, signal> of each signal's m candidates (double, (count, m,
// 2)) and the atoms' norms (count, m).  Ordered on `stream`.
inline int candidate_dots_device(const float* atoms, const float* signals, int64_t count, int64_t m, int64_t c,
                                 double* dots, double* norms, cudaStream_t stream, char* err, int n) {
  using namespace detail;
  if (count < 0 || m < 1 || c < 1) return say(bad_shape, err, n);
  if (count == 0) return ok;
  no_stale_error();
  candidate_dots_kernel<<<warp_blocks(count * m), 256, 0, stream>>>(
      reinterpret_cast<const float2*>(atoms), reinterpret_cast<const float2*>(signals), count, m, c,
      reinterpret_cast<double2*>(dots), norms);
  BLOCHSIM_CUDA(cudaGetLastError(), "candidate dots kernel launch");
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
