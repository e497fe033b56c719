// Dictionary matching on the device (match.hpp): one launch of tiles of
// signals against tiles of atoms, then a merge.  From compute capability
// 8.0 the products run on the tensor cores (match_pipe_kernel, below);
// before, on the FMA units (match_kernel), as described here.
//
// A block holds match_signals signals and sweeps the atoms of its split
// (gridDim.y cuts the atoms when there are too few signal tiles to fill the
// card) in tiles of match_atoms, both staged through shared memory
// match_step components at a time (a signal tile of at most match_step
// components is staged once).  Thread (ty, tx) of the 16 × 16 threads holds
// the register tile of signals 8 ty + s (s < 8) against atoms 4 tx + v
// (v < 4) of match_accumulate, 32 complex accumulators, and offers each
// power to its own sorted list per signal (its atoms in ascending order).
// The 16 threads that share signals sit in one half-warp and merge their
// lists by butterfly shuffles; each split's lists go to scratch, and
// match_finish merges the splits per signal and computes the winners' inner
// products in double precision (match_exact).
#pragma once

#include <cuda_fp16.h>
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
// A first pass over every match_device_sample_stride-th atom gives each
// signal a floor (match_floor), as on the host (host/match.hpp).
constexpr int match_device_max_k = 64;

// Blocks of 256 threads for one warp per item.
inline unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps * 32 + 255) / 256); }

// Shuffle a list entry from the lane `mask` apart (within a half-warp).
__device__ __forceinline__ void match_shuffle(float& pw, int64_t& ix, int mask) {
  pw = __shfl_xor_sync(0xffffffffu, pw, mask);
  ix = __shfl_xor_sync(0xffffffffu, static_cast<long long>(ix), mask);
}

// A thread's lists of S signals (k entries each), empty, with each
// signal's floor (floors[signal(s)], -1 without floors or past n) as its
// threshold.
template <int KC, int S, class SignalOf>
__device__ __forceinline__ void match_lists_start(float (&pw)[S][KC], int64_t (&ix)[S][KC], float (&thr)[S],
                                                  float (&fl)[S], int k, const float* floors, int64_t n,
                                                  SignalOf signal) {
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const int64_t sx = signal(s);
    fl[s] = floors && sx < n ? floors[sx] : -1.0f;
    thr[s] = fl[s];
    for (int q = 0; q < k; ++q) {
      pw[s][q] = -1.0f;
      ix[s][q] = -1;
    }
  }
}

// The `lanes` adjacent lanes (a power of two) that hold the same signals
// merge their lists by a butterfly of shuffles: after it every one of them
// holds the k best of all of theirs.
template <int KC, int S>
__device__ __forceinline__ void match_lists_merge(float (&pw)[S][KC], int64_t (&ix)[S][KC], int k, int lanes) {
  for (int mask = lanes / 2; mask >= 1; mask >>= 1) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
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
}

#ifndef BLOCHSIM_MATCH_MIN_BLOCKS
#define BLOCHSIM_MATCH_MIN_BLOCKS 1
#endif
// Atom stages in shared memory: 2 lets a step store the next step's atoms
// while slower warps still read this step's, one barrier a step instead of
// two when the signals stay resident (-D to compare: bench/device_match.cu).
// The tensor-core kernel where the card has them: on FP16 parts for atoms
// longer than a staging step and TF32 parts for shorter ones (3, the
// default: FP16's k-steps of 8 components waste a third of rank 12;
// bench/NOTES.md has the figures), FP16 (2) or TF32 (1) always; 0 for the
// scalar kernel everywhere (bench/device_match.cu compares them).
#ifndef BLOCHSIM_MATCH_TENSOR
#define BLOCHSIM_MATCH_TENSOR 3
#endif
#ifndef BLOCHSIM_MATCH_ATOM_STAGES
#define BLOCHSIM_MATCH_ATOM_STAGES 2
#endif

// Partial lists of atoms [split·per_split, (split + 1)·per_split) for
// signals of block x: part_pw/part_ix (n, splits, k).
//
// Thread (ty, tx) holds signals 8·ty + s and atoms 4·tx + v of a tile, so
// that its components come from shared memory in 16-byte loads (4 for its
// signals, the same address across its half-warp; 2 for its atoms).  The
// tiles and their components are played as one sequence of steps; each
// step's global loads for the next step are issued into registers before
// its products and stored after them, so that their latency hides behind
// the arithmetic.
template <int KC>
__global__ void __launch_bounds__(match_threads, BLOCHSIM_MATCH_MIN_BLOCKS)
    match_kernel(MatchProblem p, int64_t stride, const float* floors, int64_t per_split, float* part_pw,
                 int64_t* part_ix) {
  // padded rows (16 bytes): the strided stores of the staging spread over
  // the banks, and rows stay 16-byte aligned for the vector loads
  __shared__ __align__(16) float2 sig[match_step][match_signals + 2];
  __shared__ __align__(16) float2 atm[BLOCHSIM_MATCH_ATOM_STAGES][match_step][match_atoms + 2];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int k = KC == 1 ? 1 : p.k;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * match_signals;
  const int64_t abegin = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t positions = (p.atoms + stride - 1) / stride;  // atom u·stride at position u
  const int64_t aend = abegin + per_split < positions ? abegin + per_split : positions;
  const float2* sg = reinterpret_cast<const float2*>(p.signal);
  const float2* at = reinterpret_cast<const float2*>(p.atom);
  const int64_t dim = p.dim;
  const bool resident = dim <= match_step;
  const int64_t chunks = (dim + match_step - 1) / match_step;
  const int64_t steps = ((aend - abegin + match_atoms - 1) / match_atoms) * chunks;

  float pw[match_S][KC];
  int64_t ix[match_S][KC];
  float thr[match_S], fl[match_S];
  match_lists_start(pw, ix, thr, fl, k, floors, p.n, [&](int s) { return s0 + match_S * ty + s; });

  constexpr int sig_per_thread = match_signals * match_step / match_threads;  // 8
  constexpr int atom_per_thread = match_atoms * match_step / match_threads;   // 4
  float2 rs[sig_per_thread], ra[atom_per_thread];
  // the global loads of step t into registers, and from there to shared memory
  auto load = [&](int64_t t) {
    const int64_t a0 = abegin + (t / chunks) * match_atoms, j0 = (t % chunks) * match_step;
    if (!resident)
#pragma unroll
      for (int u = 0; u < sig_per_thread; ++u) {
        const int e = tid + u * match_threads, si = e / match_step, jj = e % match_step;
        const int64_t sx = s0 + si, j = j0 + jj;
        rs[u] = (sx < p.n && j < dim) ? sg[sx * dim + j] : make_float2(0.0f, 0.0f);
      }
#pragma unroll
    for (int u = 0; u < atom_per_thread; ++u) {
      const int e = tid + u * match_threads, ai = e / match_step, jj = e % match_step;
      const int64_t a = a0 + ai, j = j0 + jj;
      ra[u] = (a < aend && j < dim) ? at[a * stride * dim + j] : make_float2(0.0f, 0.0f);
    }
  };
  auto store = [&](int buf) {
    if (!resident)
#pragma unroll
      for (int u = 0; u < sig_per_thread; ++u) {
        const int e = tid + u * match_threads;
        sig[e % match_step][e / match_step] = rs[u];
      }
#pragma unroll
    for (int u = 0; u < atom_per_thread; ++u) {
      const int e = tid + u * match_threads;
      atm[buf][e % match_step][e / match_step] = ra[u];
    }
  };
  if (resident)
    for (int e = tid; e < match_signals * match_step; e += match_threads) {
      const int si = e / match_step, jj = e % match_step;
      const int64_t sx = s0 + si;
      sig[jj][si] = (sx < p.n && jj < dim) ? sg[sx * dim + jj] : make_float2(0.0f, 0.0f);
    }
  if (steps > 0) {
    load(0);
    store(0);
  }

  float re[match_S][match_A], im[match_S][match_A];
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t c = t % chunks;
    __syncthreads();
    if (t + 1 < steps) load(t + 1);
    if (c == 0) {
#pragma unroll
      for (int s = 0; s < match_S; ++s)
#pragma unroll
        for (int v = 0; v < match_A; ++v) re[s][v] = im[s][v] = 0.0f;
    }
    const int64_t jn = dim - c * match_step < match_step ? dim - c * match_step : match_step;
    match_accumulate<float, float, match_S, match_A>(
        0, jn,
        [&](int64_t j, int s, float& sr, float& si) {
          const float2 x = sig[j][match_S * ty + s];
          sr = x.x;
          si = x.y;
        },
        [&](int64_t j, int v, float& ar, float& ai) {
          const float2 x = atm[t % BLOCHSIM_MATCH_ATOM_STAGES][j][match_A * tx + v];
          ar = x.x;
          ai = x.y;
        },
        re, im);
    if (c == chunks - 1) {
      const int64_t a0 = abegin + (t / chunks) * match_atoms;
#pragma unroll
      for (int v = 0; v < match_A; ++v) {
        const int64_t a = a0 + match_A * tx + v;
        if (a >= aend) continue;
#pragma unroll
        for (int s = 0; s < match_S; ++s) {
          const float x = match_power(re[s][v], im[s][v]);
          if (x > thr[s]) {
            match_offer(pw[s], ix[s], k, x, a * stride);
            thr[s] = fmaxf(pw[s][k - 1], fl[s]);
          }
        }
      }
    }
    // one stage (or signals read from the one signal stage): all warps done
    // reading before the next step's values overwrite them
    if (BLOCHSIM_MATCH_ATOM_STAGES == 1 || !resident) __syncthreads();
    if (t + 1 < steps) store(static_cast<int>((t + 1) % BLOCHSIM_MATCH_ATOM_STAGES));
  }

  match_lists_merge(pw, ix, k, 16);  // the 16 threads of a row: one half-warp
  const int64_t splits = gridDim.y;
#pragma unroll
  for (int s = 0; s < match_S; ++s) {
    const int64_t sigi = s0 + match_S * ty + s;
    if (sigi >= p.n) continue;
    for (int q = tx; q < k; q += 16) {
      const int64_t o = (sigi * splits + blockIdx.y) * k + q;
      part_pw[o] = pw[s][q];
      part_ix[o] = ix[s][q];
    }
  }
}

// The same partial lists on the tensor cores (compute capability 8.0 and
// later).  Each complex inner product is a real one over the components
// laid out planar by k-step (per_k components: their real parts, then
// their imaginary parts): a signal's row [sr, si] against an atom's column
// [ar, ai] gives the real part of <atom, signal>, and the signal's row with
// its halves swapped and the real parts negated, [si, -sr], against the
// same column the imaginary part: the swap renames the signal's fragment
// registers and the negation is one sign flip of half of them, so one
// staged copy of each atom and one fragment of it serve both.
// mma.m16n8k8 (TF32) and mma.m16n8k16 (FP16) (PTX ISA, "Matrix fragments
// for mma.m16n8k8 / m16n8k16") read their fragments with ldmatrix.  Both
// formats keep 11 significant bits; every value is split into two parts
// (big, the rounded value; small, the rounded rest) and the three products
// big·big, big·small and small·big are accumulated in float32, which
// restores single precision (the "3xTF32" split of CUTLASS; Ootomo and
// Yokota, Int. J. High Perform. Comput. Appl. 36, 2022, for FP16 with
// scaling).  FP16 does twice the products of TF32 per
// instruction and per byte of shared memory read; its range is kept by
// scaling each signal and each atom by a power of two (exact) that puts its
// largest component in [2^14, 2^15), so that the small parts stay normal:
// match_split_kernel applies the factors as it splits the rows once per
// launch, the atoms' come off each power before it is ranked, the signals'
// off the final powers (a signal's list is ranked in its own scale).
//
// The 8 warps sit 4 (signals) × 2 (atoms): warp (wm, wn) holds signals
// 32 wm + [0, 32) and atoms 32 wn + [0, 32) of the block's tile, as 2 × 4
// tiles of 16 signals × 8 atoms, each with a real and an imaginary
// accumulator tile; lane (g, q) = (lane / 4, lane % 4) holds signals g and
// g + 8 of each signal tile against atoms 2 q and 2 q + 1 of each atom
// tile: 4 signals × 8 atoms, as the scalar kernel's threads hold 8 × 4.
// The four lanes of a signal merge their lists by shuffles; the two warps
// of a signal write theirs as two lists of the split (2 gridDim.y lists a
// signal).
//
// A staged row holds 32-bit words, 8 a k-step (TF32: 4 real parts, then 4
// imaginary parts; FP16: 4 pairs of real parts, then 4 pairs of imaginary
// parts), so that in both formats a fragment register is word kk + q or
// kk + q + 4 of a row (kk = 8 · k-step), and the first is the real half.
constexpr int match_tc_lists = 2;  // lists a split writes per signal

__device__ __forceinline__ void tf32_split(float x, uint32_t& big, uint32_t& small) {
  uint32_t b, s;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(b) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(s) : "f"(x - __uint_as_float(b)));
  big = b;
  small = s;
}

// TF32 parts: a word a real.
struct match_tf32_parts {
  static constexpr int row = 2 * match_step + 4;  // words a staged row: 8 rows' 16-byte reads on distinct banks
  static constexpr int per_k = 4;                 // complex components an mma consumes
  static constexpr int words = 2;                 // words a component of a part
  static constexpr bool scaled = false;
  static constexpr uint32_t negate = 0x80000000u;  // the sign of a word's values
  __device__ static void put(uint32_t* hi, uint32_t* lo, int j, float2 x) {
    const int w = 8 * (j / 4) + j % 4;
    tf32_split(x.x, hi[w], lo[w]);
    tf32_split(x.y, hi[w + 4], lo[w + 4]);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// FP16 parts: a word a pair of real or of imaginary parts.
struct match_f16_parts {
  static constexpr int row = match_step + 4;  // 8 rows' 16-byte reads on distinct banks
  static constexpr int per_k = 8;
  static constexpr int words = 1;
  static constexpr bool scaled = true;
  static constexpr uint32_t negate = 0x80008000u;
  __device__ static void put(uint32_t* hi, uint32_t* lo, int j, float2 x) {
    const int h = 2 * (8 * (j / 8) + j % 8 / 2) + j % 2;  // the real part's half
    const __half2 b = __floats2half2_rn(x.x, x.y);
    const float2 bf = __half22float2(b);
    const __half2 l = __floats2half2_rn(x.x - bf.x, x.y - bf.y);
    __half* H = reinterpret_cast<__half*>(hi);
    __half* L = reinterpret_cast<__half*>(lo);
    H[h] = __low2half(b);
    H[h + 8] = __high2half(b);
    L[h] = __low2half(l);
    L[h + 8] = __high2half(l);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// Four 8 × 8 matrices of 16-byte rows from shared memory: lane l gives the
// address of row l % 8 of matrix l / 8, and receives word l % 4 of row
// l / 4 of each matrix (PTX ISA, ldmatrix).
__device__ __forceinline__ void match_ldmatrix(uint32_t (&r)[4], const uint32_t* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

template <class F>
using match_row = uint32_t[F::row];
constexpr int match_tc_TS = 4, match_tc_TA = 8;  // a lane's signals and atoms
// a warp's accumulators: [signal tile][atom tile][real, imaginary][4]
typedef float match_tc_acc[2][4][2][4];

__device__ __forceinline__ void match_tc_zero(match_tc_acc& acc) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][t][c][e] = 0.0f;
}

// One staged chunk (`left` components of it count) of the block's signal
// tile against its atom tile, accumulated into warp (wm, wn)'s tiles.
template <class F>
__device__ __forceinline__ void match_tc_products(match_tc_acc& acc, const match_row<F>* sig_hi,
                                                  const match_row<F>* sig_lo, const match_row<F>* atm_hi,
                                                  const match_row<F>* atm_lo, int64_t left, int wm, int wn,
                                                  int lane) {
  const int ksteps = static_cast<int>(((left < match_step ? left : match_step) + F::per_k - 1) / F::per_k);
  const int l8 = lane % 8, mi = lane / 8;  // the row and matrix this lane addresses
#pragma unroll
  for (int ks = 0; ks < match_step / F::per_k; ++ks) {
    if (ks >= ksteps) break;
    const int kk = 8 * ks;
    // A: matrices (rows +0, real half), (+8, real), (+0, imaginary), (+8, imaginary)
    uint32_t ah[2][4], al[2][4], nh[2][4], nl[2][4], b[4][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int r = 32 * wm + 16 * m + 8 * (mi % 2) + l8, w = kk + 4 * (mi / 2);
      match_ldmatrix(ah[m], &sig_hi[r][w]);
      match_ldmatrix(al[m], &sig_lo[r][w]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // [si, -sr]
        nh[m][e] = e < 2 ? ah[m][e + 2] : ah[m][e - 2] ^ F::negate;
        nl[m][e] = e < 2 ? al[m][e + 2] : al[m][e - 2] ^ F::negate;
      }
    }
    // B: atom tile t's matrices (big, real half), (big, imaginary), (small, real), (small, imaginary)
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int r = 32 * wn + 8 * t + l8, w = kk + 4 * (mi % 2);
      match_ldmatrix(b[t], mi < 2 ? &atm_hi[r][w] : &atm_lo[r][w]);
    }
    // the three products pass by pass: 16 independent accumulations
    // between two into the same accumulator
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        F::mma(acc[m][t][0], al[m], b[t][0], b[t][1]);
        F::mma(acc[m][t][1], nl[m], b[t][0], b[t][1]);
      }
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        F::mma(acc[m][t][0], ah[m], b[t][2], b[t][3]);
        F::mma(acc[m][t][1], nh[m], b[t][2], b[t][3]);
      }
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        F::mma(acc[m][t][0], ah[m], b[t][0], b[t][1]);
        F::mma(acc[m][t][1], nh[m], b[t][0], b[t][1]);
      }
  }
}

// The finished tile's powers offered to the lane's lists: its atoms at
// positions a0 + 8 t + e (t < 4, e < 2; before aend; atom index
// position · stride), each power without its atom's factor
// scale(position) where F scales.
template <class F, int KC, class Scale>
__device__ __forceinline__ void match_tc_offers(const match_tc_acc& acc, float (&pw)[match_tc_TS][KC],
                                                int64_t (&ix)[match_tc_TS][KC], float (&thr)[match_tc_TS],
                                                const float (&fl)[match_tc_TS], int k, int64_t a0, int64_t aend,
                                                int64_t stride, Scale scale) {
  constexpr int TA = match_tc_TA;
  auto atom = [&](int v) { return a0 + 8 * (v / 2) + v % 2; };
  float inv[TA];  // the atoms' factors come off (1 unscaled)
#pragma unroll
  for (int v = 0; v < TA; ++v) inv[v] = F::scaled && atom(v) < aend ? __frcp_rn(scale(atom(v))) : 1.0f;
#pragma unroll
  for (int s = 0; s < match_tc_TS; ++s) {
    float x[TA], best = -1.0f;
#pragma unroll
    for (int v = 0; v < TA; ++v) {
      const int e = 2 * (s % 2) + v % 2;
      const float re = acc[s / 2][v / 2][0][e], im = acc[s / 2][v / 2][1][e];
      x[v] = F::scaled ? match_power(re * inv[v], im * inv[v]) : match_power(re, im);
      best = fmaxf(best, x[v]);
    }
    if (best > thr[s])  // rare once the lists fill: one test for the lane's 8 atoms
#pragma unroll
      for (int v = 0; v < TA; ++v) {
        const int64_t a = atom(v);
        if (x[v] > thr[s] && a < aend) {
          match_offer(pw[s], ix[s], k, x[v], a * stride);
          thr[s] = fmaxf(pw[s][k - 1], fl[s]);
        }
      }
  }
}

// The lanes' lists merged per signal and written as list `list` of
// `lists` per signal (the two warps of a signal tile write one each).
template <int KC, class SignalOf>
__device__ __forceinline__ void match_tc_write(float (&pw)[match_tc_TS][KC], int64_t (&ix)[match_tc_TS][KC], int k,
                                               int64_t n, int64_t lists, int64_t list, SignalOf row, int q4,
                                               float* part_pw, int64_t* part_ix) {
  match_lists_merge(pw, ix, k, 4);  // the 4 lanes (g, 0..3) of a signal
#pragma unroll
  for (int s = 0; s < match_tc_TS; ++s) {
    const int64_t sigi = row(s);
    if (sigi >= n) continue;
    for (int q = q4; q < k; q += 4) {
      const int64_t o = (sigi * lists + list) * k + q;
      part_pw[o] = pw[s][q];
      part_ix[o] = ix[s][q];
    }
  }
}

// The staged parts of rows, made once per launch (match_split_kernel) and
// copied to shared memory as they are (cp.async): row u's chunk c (components
// [16 c, 16 c + 16), zero past the row's end) holds its big parts then its
// small parts, match_part_words<F>() words each.
template <class F>
__host__ __device__ constexpr int match_part_words() {
  return F::words * match_step;
}
template <class F>
constexpr size_t match_part_bytes(int64_t chunks) {
  return sizeof(uint32_t) * 2 * match_part_words<F>() * static_cast<size_t>(chunks);
}
// Shared memory of a stage of match_pipe_kernel: the signal and the atom
// tile's big and small rows.
template <class F>
constexpr size_t match_stage_bytes() {
  return sizeof(uint32_t) * 2 * (match_signals + match_atoms) * F::row;
}

// The power of two that puts a row's largest magnitude m in [2^14, 2^15)
// (1 for m = 0; at most 2^127).
__device__ __forceinline__ float match_factor(float m) {
  int e = 0;
  frexpf(m, &e);  // m = f · 2^e, f in [0.5, 1)
  const int sh = m > 0.0f ? min(15 - e, 127) : 0;
  return __int_as_float((sh + 127) << 23);
}

// Rows rows[u · stride] (u < count) of `dim` complex components into their
// parts (match_part_words), each scaled by its factor (into scale[u]) where
// F scales: one warp a row.
template <class F>
__global__ void match_split_kernel(const float2* rows, int64_t count, int64_t stride, int64_t dim, int chunks,
                                   float* scale, uint32_t* parts) {
  const int64_t u = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (u >= count) return;
  const float2* x = rows + u * stride * dim;
  float f = 1.0f;
  if (F::scaled) {
    float m = 0.0f;
    for (int64_t j = lane; j < dim; j += 32) m = fmaxf(m, fmaxf(fabsf(x[j].x), fabsf(x[j].y)));
    for (int mask = 16; mask >= 1; mask >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, mask));
    f = match_factor(m);
    if (lane == 0) scale[u] = f;
  }
  constexpr int PW = match_part_words<F>();
  uint32_t* out = parts + u * chunks * 2 * PW;
  for (int64_t j = lane; j < static_cast<int64_t>(chunks) * match_step; j += 32) {
    const float2 v = j < dim ? x[j] : make_float2(0.0f, 0.0f);
    uint32_t* c = out + (j / match_step) * 2 * PW;
    F::put(c, c + PW, static_cast<int>(j % match_step), make_float2(v.x * f, v.y * f));
  }
}

// 16 bytes from global src to the shared address dst (zeros unless full).
__device__ __forceinline__ void match_copy16(unsigned dst, const void* src, bool full) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(full ? 16 : 0));
#endif
}
__device__ __forceinline__ void match_copy_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
// Wait until at most `pending` (0, 1 or 2) committed groups are in flight.
__device__ __forceinline__ void match_copy_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (pending <= 0)
    asm volatile("cp.async.wait_group 0;");
  else if (pending == 1)
    asm volatile("cp.async.wait_group 1;");
  else
    asm volatile("cp.async.wait_group 2;");
#endif
}

// The partial lists (part_pw/part_ix (n, 2 splits, k): two lists a
// split, one a warp of a signal tile) of blocks x of signals against
// blocks y of splits split0 + y of `splits`, from the staged parts:
// the signals' (sig_parts, rows n) and the atoms' (atom_parts, row
// position - pbegin, with their factors atom_scale where F scales).  A
// ring of `stages` (2 to 4) stages in shared memory: while the block
// multiplies step t (an atom tile's chunk), the copies of the steps up to
// t + stages - 1 are in flight, one barrier a step.  A signal tile of one
// chunk is copied once into each stage.
template <int KC, class F>
__global__ void __launch_bounds__(match_threads, BLOCHSIM_MATCH_MIN_BLOCKS)
    match_pipe_kernel(MatchProblem p, int64_t stride, const float* floors, int64_t per_split, int64_t split0,
                      int64_t splits, int64_t pbegin, int stages, float* part_pw, int64_t* part_ix,
                      const uint32_t* sig_parts, const uint32_t* atom_parts, const float* atom_scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint32_t smem[];
  typedef match_row<F> Row;
  constexpr int PW = match_part_words<F>(), pieces = PW / 4;  // 16-byte pieces of a part of a chunk
  constexpr int stage_rows = 2 * (match_signals + match_atoms);
  // stage st: signal big, signal small, atom big and atom small rows
  auto sig_hi = [&](int st) { return reinterpret_cast<Row*>(smem) + st * stage_rows; };
  auto atm_hi = [&](int st) { return sig_hi(st) + 2 * match_signals; };
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, q4 = lane % 4, wm = warp % 4, wn = warp / 4;
  const int k = KC == 1 ? 1 : p.k;
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * match_signals;
  const int64_t split = static_cast<int64_t>(blockIdx.y) + split0;
  const int64_t abegin = split * per_split;
  const int64_t positions = (p.atoms + stride - 1) / stride;
  const int64_t aend = abegin + per_split < positions ? abegin + per_split : positions;
  const int64_t dim = p.dim;
  const int chunks = static_cast<int>((dim + match_step - 1) / match_step);
  const int64_t steps = ((aend - abegin + match_atoms - 1) / match_atoms) * chunks;
  auto row = [&](int s) { return s0 + 32 * wm + 16 * (s / 2) + 8 * (s % 2) + g; };

  float pw[match_tc_TS][KC];
  int64_t ix[match_tc_TS][KC];
  float thr[match_tc_TS], fl[match_tc_TS];
  match_lists_start(pw, ix, thr, fl, k, floors, p.n, row);

  // A thread's copies, the same every step but for the chunk and the atom
  // tile: u-th signal piece e = tid + u · match_threads (row e / (2 pieces),
  // part e / pieces % 2, word 4 (e % pieces)), likewise its atom pieces; their
  // global sources at chunk 0 of the block's first tile and their shared
  // destinations within a stage.
  constexpr int SU = match_signals * 2 * pieces / match_threads, AU = match_atoms * 2 * pieces / match_threads;
  static_assert(SU * match_threads == match_signals * 2 * pieces && AU * match_threads == match_atoms * 2 * pieces,
                "whole copies a thread");
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  constexpr unsigned stage_bytes = 4u * stage_rows * F::row;
  // piece u's row r, part h and word w
  auto piece = [&](int u, int& r, int& h, int& w) {
    const int e = tid + u * match_threads;
    r = e / (2 * pieces);
    h = e / pieces % 2;
    w = 4 * (e % pieces);
  };
  const uint32_t* ssrc[SU];
  unsigned sdst[SU];
  bool sin[SU];
#pragma unroll
  for (int u = 0; u < SU; ++u) {
    int r, h, w;
    piece(u, r, h, w);
    sin[u] = s0 + r < p.n;
    ssrc[u] = sig_parts + (sin[u] ? ((s0 + r) * chunks * 2 + h) * PW + w : 0);
    sdst[u] = base + 4u * ((h * match_signals + r) * F::row + w);
  }
  const uint32_t* asrc[AU];
  unsigned adst[AU];
  int arow[AU];
#pragma unroll
  for (int u = 0; u < AU; ++u) {
    int h, w;
    piece(u, arow[u], h, w);
    asrc[u] = atom_parts + ((abegin - pbegin + arow[u]) * chunks * 2 + h) * PW + w;
    adst[u] = base + 4u * ((2 * match_signals + h * match_atoms + arow[u]) * F::row + w);
  }
  // the copies of step (atom tile from position a0, chunk c) into stage st
  auto issue = [&](int64_t a0, int c, int64_t step, int st) {
    const unsigned at = static_cast<unsigned>(st) * stage_bytes;
    if (chunks > 1 || step < stages)
#pragma unroll
      for (int u = 0; u < SU; ++u) match_copy16(sdst[u] + at, sin[u] ? ssrc[u] + c * 2 * PW : sig_parts, sin[u]);
    const int64_t off = ((a0 - abegin) * chunks + c) * 2 * PW;
#pragma unroll
    for (int u = 0; u < AU; ++u) {
      const bool in = a0 + arow[u] < aend;
      match_copy16(adst[u] + at, in ? asrc[u] + off : atom_parts, in);
    }
  };
  // the next step to issue (atom position ia, chunk ic), stages - 1 ahead
  // of the step multiplied
  int64_t ia = abegin;
  int ic = 0;
  auto next = [&](int64_t& a, int& c) {
    if (++c == chunks) {
      c = 0;
      a += match_atoms;
    }
  };
  for (int st = 0; st + 1 < stages; ++st) {
    if (st < steps) {
      issue(ia, ic, st, st);
      next(ia, ic);
    }
    match_copy_commit();
  }

  match_tc_acc acc;
  match_tc_zero(acc);
  int64_t ta = abegin;
  int tc = 0;
  // the stages of the step multiplied and of the step issued
  int st = 0, ist = stages - 1;
  for (int64_t t = 0; t < steps; ++t) {
    match_copy_wait(stages - 2);  // step t's copies landed (this thread's) ...
    __syncthreads();              // ... and everyone's; step t - 1 multiplied by all
    if (t + stages - 1 < steps) {
      issue(ia, ic, t + stages - 1, ist);
      next(ia, ic);
    }
    match_copy_commit();
    ist = ist + 1 == stages ? 0 : ist + 1;
    const Row* sh = sig_hi(st);
    const Row* ah = atm_hi(st);
    match_tc_products<F>(acc, sh, sh + match_signals, ah, ah + match_atoms,
                         dim - static_cast<int64_t>(tc) * match_step, wm, wn, lane);
    if (tc == chunks - 1) {  // the tile done: its offers, and the next tile's sums start
      match_tc_offers<F>(acc, pw, ix, thr, fl, k, ta + 32 * wn + 2 * q4, aend, stride,
                         [&](int64_t a) { return atom_scale[a - pbegin]; });
      match_tc_zero(acc);
    }
    next(ta, tc);
    st = st + 1 == stages ? 0 : st + 1;
  }
  match_copy_wait(0);
  match_tc_write(pw, ix, k, p.n, splits * match_tc_lists, split * match_tc_lists + wn, row, q4, part_pw, part_ix);
#else
  __trap();
#endif
}

// Signal i's k best over its splits' sorted lists (n, splits, k) into pw,
// ix.
template <int KC>
__device__ inline void match_merge_splits(const float* part_pw, const int64_t* part_ix, int64_t i, int64_t splits,
                                          int k, float* pw, int64_t* ix) {
  float tpw[KC], opw[KC];
  int64_t tix[KC], oix[KC];
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
}

// The k best of each signal over its splits' lists, and their inner
// products in double precision, into r; the powers without the signal's
// factor where the kernel scaled the signals (sig_scale, else null).
template <int KC>
__global__ void match_finish(MatchProblem p, int64_t splits, const float* part_pw, const int64_t* part_ix,
                             const float* sig_scale, MatchResult r) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const int k = KC == 1 ? 1 : p.k;
  float pw[KC];
  int64_t ix[KC];
  match_merge_splits<KC>(part_pw, part_ix, i, splits, k, pw, ix);
  const float inv = sig_scale ? __frcp_rn(sig_scale[i]) : 1.0f;
  for (int q = 0; q < k; ++q) {
    const int64_t o = i * k + q;
    double re = 0.0, im = 0.0;
    if (ix[q] >= 0) match_exact(p.atom + 2 * p.dim * ix[q], p.signal + 2 * p.dim * i, p.dim, re, im);
    r.index[o] = ix[q];
    r.power[o] = ix[q] < 0 ? -1.0f : pw[q] * inv * inv;
    r.dot[2 * o] = re;
    r.dot[2 * o + 1] = im;
  }
}

// Each signal's floor from the lists of a strided first pass: just below
// its k-th best power there (-1 with fewer than k), since the k best of all
// atoms score at least that.
template <int KC>
__global__ void match_floor(MatchProblem p, int64_t splits, const float* part_pw, const int64_t* part_ix,
                            float* floors) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const int k = KC == 1 ? 1 : p.k;
  float pw[KC];
  int64_t ix[KC];
  match_merge_splits<KC>(part_pw, part_ix, i, splits, k, pw, ix);
  floors[i] = ix[k - 1] >= 0 ? nextafterf(pw[k - 1], -1.0f) : -1.0f;
}

// The stride of the first pass that sets the floors (as the host's).
constexpr int64_t match_device_sample_stride = 32;

#ifndef BLOCHSIM_MATCH_STAGES
#define BLOCHSIM_MATCH_STAGES 3
#endif
// The most bytes of atom parts made at once (a larger dictionary is split
// and matched in groups of splits).
constexpr size_t match_parts_budget = size_t(1) << 30;

// One pass of match_pipe_kernel over the positions of `stride`: `splits`
// splits of `per` positions, in groups of `group` splits whose atoms'
// parts are made just before their launch.
template <int KC, class F>
inline cudaError_t match_pipe(const MatchProblem& p, cudaStream_t st, int stages, int64_t stride, const float* fl,
                              int64_t splits, int64_t per, int64_t group, float* part_pw, int64_t* part_ix,
                              const uint32_t* sig_parts, uint32_t* atom_parts, float* atom_scale) {
  const int64_t positions = (p.atoms + stride - 1) / stride;
  const int chunks = static_cast<int>((p.dim + match_step - 1) / match_step);
  const unsigned tiles = static_cast<unsigned>((p.n + match_signals - 1) / match_signals);
  const float2* at = reinterpret_cast<const float2*>(p.atom);
  for (int64_t s = 0; s < splits; s += group) {
    const int64_t b = s * per, e = std::min(positions, (s + group) * per);
    match_split_kernel<F><<<warp_blocks(e - b), 256, 0, st>>>(at + b * stride * p.dim, e - b, stride, p.dim, chunks,
                                                              atom_scale, atom_parts);
    const dim3 grid(tiles, static_cast<unsigned>(std::min(group, splits - s)));
    match_pipe_kernel<KC, F><<<grid, match_threads, stages * match_stage_bytes<F>(), st>>>(
        p, stride, fl, per, s, splits, b, stages, part_pw, part_ix, sig_parts, atom_parts, atom_scale);
    const cudaError_t e2 = cudaGetLastError();
    if (e2 != cudaSuccess) return e2;
  }
  return cudaSuccess;
}

// The whole match on staged parts of format F: the signals' parts, a
// strided first pass for the floors (`sample`), the full pass, the merge.
template <int KC, class F>
inline int match_pipe_launch(const MatchProblem& p, const MatchResult& r, cudaStream_t st, int stages, bool sample,
                             int64_t splits, int64_t per_split, int64_t sample_splits, int64_t sample_per_split,
                             char* err, int n) {
  BLOCHSIM_CUDA(cudaFuncSetAttribute(match_pipe_kernel<KC, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(stages * match_stage_bytes<F>())),
                "cudaFuncSetAttribute");
  const int64_t chunks = (p.dim + match_step - 1) / match_step;
  const size_t row_bytes = match_part_bytes<F>(chunks);
  // groups of splits whose atom parts fit the budget, and the rows they take
  int64_t rows = 0;
  auto group = [&](int64_t stride, int64_t splits_, int64_t per) {
    const int64_t positions = (p.atoms + stride - 1) / stride;
    const int64_t g = std::max<int64_t>(1, static_cast<int64_t>(match_parts_budget / (row_bytes * per)));
    rows = std::max(rows, std::min(positions, std::min(g, splits_) * per));
    return g;
  };
  const int64_t full_group = group(1, splits, per_split);
  const int64_t sample_group = sample ? group(match_device_sample_stride, sample_splits, sample_per_split) : 1;
  const int64_t lists = std::max(splits, sample_splits) * match_tc_lists;
  const size_t entries = static_cast<size_t>(p.n) * static_cast<size_t>(lists) * static_cast<size_t>(p.k);
  const size_t words = (static_cast<size_t>(p.n) + static_cast<size_t>(rows)) * row_bytes / 4;
  void* scratch = nullptr;
  no_stale_error();
  BLOCHSIM_CUDA(pool_malloc(&scratch,
                            entries * (sizeof(float) + sizeof(int64_t)) +
                                (2 * static_cast<size_t>(p.n) + static_cast<size_t>(rows)) * 4 + words * 4,
                            st),
                "cudaMallocAsync");
  // the parts first (16-byte aligned for the copies; a row's parts are a
  // multiple of 64 bytes), then the lists and the factors
  uint32_t* sig_parts = static_cast<uint32_t*>(scratch);
  uint32_t* atom_parts = sig_parts + static_cast<size_t>(p.n) * row_bytes / 4;
  int64_t* part_ix = reinterpret_cast<int64_t*>(sig_parts + words);
  float* part_pw = reinterpret_cast<float*>(part_ix + entries);
  float* floors = part_pw + entries;
  float* sig_scale = floors + p.n;
  float* atom_scale = sig_scale + p.n;
  match_split_kernel<F><<<warp_blocks(p.n), 256, 0, st>>>(reinterpret_cast<const float2*>(p.signal), p.n, 1, p.dim,
                                                          static_cast<int>(chunks), sig_scale, sig_parts);
  cudaError_t e = cudaGetLastError();
  const unsigned per_signal = static_cast<unsigned>((p.n + 127) / 128);
  if (sample && e == cudaSuccess) {
    e = match_pipe<KC, F>(p, st, stages, match_device_sample_stride, nullptr, sample_splits, sample_per_split,
                          sample_group, part_pw, part_ix, sig_parts, atom_parts, atom_scale);
    if (e == cudaSuccess) {
      match_floor<KC><<<per_signal, 128, 0, st>>>(p, sample_splits * match_tc_lists, part_pw, part_ix, floors);
      e = cudaGetLastError();
    }
  }
  if (e == cudaSuccess)
    e = match_pipe<KC, F>(p, st, stages, 1, sample ? floors : nullptr, splits, per_split, full_group, part_pw,
                          part_ix, sig_parts, atom_parts, atom_scale);
  if (e == cudaSuccess) {
    match_finish<KC><<<per_signal, 128, 0, st>>>(p, splits * match_tc_lists, part_pw, part_ix,
                                                 F::scaled ? sig_scale : nullptr, r);
    e = cudaGetLastError();
  }
  cudaFreeAsync(scratch, st);
  if (e != cudaSuccess) return fail(e, "match kernel launch", err, n);
  return ok;
}

template <int KC>
inline int match_launch(const MatchProblem& p, const MatchResult& r, cudaStream_t st, char* err, int n) {
  int dev = 0, sms = 1;
  BLOCHSIM_CUDA(cudaGetDevice(&dev), "cudaGetDevice");
  BLOCHSIM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const int64_t tiles = (p.n + match_signals - 1) / match_signals;
  if (tiles > 2147483647) return say(bad_shape, err, n);
  // splits of the atoms at a stride: enough blocks for two waves, at least
  // 8 atom tiles a split
  auto split = [&](int64_t stride, int64_t& splits, int64_t& per_split) {
    const int64_t positions = (p.atoms + stride - 1) / stride;
    const int64_t atom_tiles = (positions + match_atoms - 1) / match_atoms;
    splits = std::max<int64_t>(1, (2 * sms + tiles - 1) / tiles);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, atom_tiles / 8));
    splits = std::min<int64_t>(splits, 65535);
    per_split = ((atom_tiles + splits - 1) / splits) * match_atoms;
    splits = std::max<int64_t>(1, (positions + per_split - 1) / per_split);
  };
  int major = 0, optin = 0;
  BLOCHSIM_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  BLOCHSIM_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                "cudaDeviceGetAttribute");
  int tensor = major < 8 ? 0 : BLOCHSIM_MATCH_TENSOR != 3 ? BLOCHSIM_MATCH_TENSOR
                           : p.dim > match_step ? 2 : 1;  // 0 scalar, 1 TF32, 2 FP16
  // the stages that fit a block's shared memory; TF32's rows are twice
  // FP16's, and a card that cannot hold two of their stages gets FP16
  auto stages_of = [&](size_t stage) {
    return static_cast<int>(std::min<size_t>(BLOCHSIM_MATCH_STAGES, static_cast<size_t>(optin) / stage));
  };
  if (tensor == 1 && stages_of(match_stage_bytes<match_tf32_parts>()) < 2) tensor = 2;
  const bool sample = p.atoms >= match_device_sample_stride * 4 * static_cast<int64_t>(p.k);
  int64_t splits = 1, per_split = 0, sample_splits = 1, sample_per_split = 0;
  split(1, splits, per_split);
  if (sample) split(match_device_sample_stride, sample_splits, sample_per_split);
  if (tensor == 1)
    return match_pipe_launch<KC, match_tf32_parts>(p, r, st, stages_of(match_stage_bytes<match_tf32_parts>()),
                                                   sample, splits, per_split, sample_splits, sample_per_split, err,
                                                   n);
  if (tensor == 2)
    return match_pipe_launch<KC, match_f16_parts>(p, r, st, stages_of(match_stage_bytes<match_f16_parts>()), sample,
                                                  splits, per_split, sample_splits, sample_per_split, err, n);
  // the FMA units: one list a split
  const size_t entries =
      static_cast<size_t>(p.n) * static_cast<size_t>(std::max(splits, sample_splits)) * static_cast<size_t>(p.k);
  void* scratch = nullptr;
  no_stale_error();
  BLOCHSIM_CUDA(pool_malloc(&scratch, entries * (sizeof(float) + sizeof(int64_t)) + static_cast<size_t>(p.n) * 4, st),
                "cudaMallocAsync");
  int64_t* part_ix = static_cast<int64_t*>(scratch);
  float* part_pw = reinterpret_cast<float*>(part_ix + entries);
  float* floors = part_pw + entries;
  const unsigned per_signal = static_cast<unsigned>((p.n + 127) / 128);
  auto partial = [&](int64_t stride, const float* fl, int64_t splits_, int64_t per) {
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits_));
    match_kernel<KC><<<grid, match_threads, 0, st>>>(p, stride, fl, per, part_pw, part_ix);
    return cudaGetLastError();
  };
  cudaError_t e = cudaSuccess;
  if (sample) {
    e = partial(match_device_sample_stride, nullptr, sample_splits, sample_per_split);
    if (e == cudaSuccess) {
      match_floor<KC><<<per_signal, 128, 0, st>>>(p, sample_splits, part_pw, part_ix, floors);
      e = cudaGetLastError();
    }
  }
  if (e == cudaSuccess) e = partial(1, sample ? floors : nullptr, splits, per_split);
  if (e == cudaSuccess) {
    match_finish<KC><<<per_signal, 128, 0, st>>>(p, splits, part_pw, part_ix, nullptr, r);
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
