// The host backend of dictionary matching (match.hpp): signals on the lanes,
// atoms broadcast.
//
// The signals are cut into blocks of match_block_signals, one contiguous
// range of blocks per thread.  A block's signals are packed once, component
// by component, as lane vectors (rows of S vectors: S·W signals); the atoms
// are read where they lie, in panels small enough to stay in cache while
// every row of the block sweeps them, each atom component broadcast to the
// lanes.  A row × A atoms is one register tile (match_accumulate); its
// powers are compared with the row's per-lane thresholds (each signal's
// k-th best so far) and only a lane that beats its threshold leaves the
// vector path.  A signal's atoms are visited in ascending order, and every
// (signal, atom) pair is computed by the same instructions wherever it
// falls, so results do not depend on threads, blocks or atom chunks.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../match.hpp"
#include "epg.hpp"

#if !defined(__CUDA_ARCH__)
namespace blochsim {

// Signals in one block of the host's matching entry.
constexpr int match_block_signals = 64;
// The stride of the sample that sets each signal's floor (match_blocks).
constexpr int64_t match_sample_stride = 32;

// Floats of workspace one thread needs: the packed block and its top-k
// lists (powers, and indices as two floats each).
inline int64_t match_host_workspace(const MatchProblem& p) {
  return 2 * match_block_signals * p.dim + 3 * match_block_signals * static_cast<int64_t>(p.k) + match_block_signals +
         64;
}

inline namespace BLOCHSIM_ISA {

#if defined(BLOCHSIM_HAVE_VECTOR_LANES)
// The register tile of a lane type: S signal vectors × A atoms, sized so
// that the 4·S·A accumulator vectors, the row's loaded components and the
// broadcasts fit the level's vector registers.
template <class V>
struct MatchTile {
  static constexpr int S = 2;
  static constexpr int A = sizeof(V) == 64 ? 4 : 2;
};

// Blocks [b0, b1) of match_block_signals signals of p into r.  work holds
// match_host_workspace(p) floats.  Returns a Status.
template <class V>
inline int match_blocks(const MatchProblem& p, const MatchResult& r, int64_t b0, int64_t b1, float* work) {
  using LT = Lanes<V>;
  constexpr int W = LT::width, S = MatchTile<V>::S, A = MatchTile<V>::A, R = S * W;
  static_assert(match_block_signals % R == 0, "a block holds whole rows");
  constexpr int rows = match_block_signals / R;
  const int64_t dim = p.dim;
  const int k = p.k;
  // (rows, dim, S, 2) lane vectors: row q, component j, vector s, real/imaginary
  V* packed = reinterpret_cast<V*>(work);
  float* pw = work + 2 * match_block_signals * dim;          // (block, k)
  int64_t* ix = reinterpret_cast<int64_t*>(pw + match_block_signals * k);  // (block, k)
  float* floors = pw + 3 * match_block_signals * k;                        // (block)
  // atoms a panel: about 32 KiB of them, a whole number of tiles
  const int64_t panel = ((8192 / (2 * dim)) / A + 1) * A;

  for (int64_t b = b0; b < b1; ++b) {
    const int64_t first = b * match_block_signals;
    const int64_t count = p.n - first < match_block_signals ? p.n - first : match_block_signals;
    for (int q = 0; q < rows; ++q)
      for (int s = 0; s < S; ++s)
        for (int l = 0; l < W; ++l) {
          const int64_t local = static_cast<int64_t>(q) * R + s * W + l;
          const float* src = p.signal + 2 * dim * (first + (local < count ? local : count - 1));
          V* dst = packed + (static_cast<int64_t>(q) * dim * S + s) * 2;
          for (int64_t j = 0; j < dim; ++j) {
            LT::set(dst[j * S * 2], l, src[2 * j]);
            LT::set(dst[j * S * 2 + 1], l, src[2 * j + 1]);
          }
        }
    const int live_rows = static_cast<int>((count + R - 1) / R);
    auto reset = [&]() {
      for (int64_t i = 0; i < static_cast<int64_t>(match_block_signals) * k; ++i) {
        pw[i] = -1.0f;
        ix[i] = -1;
      }
    };

    // Every atom `stride`-th (atom u·stride at position u) against the
    // block: candidates beating max(the k-th best so far, floor) offered.
    auto sweep = [&](int64_t stride) {
      const int64_t positions = (p.atoms + stride - 1) / stride;
      for (int64_t u0 = 0; u0 < positions; u0 += panel) {
        const int64_t u1 = u0 + panel < positions ? u0 + panel : positions;
        for (int q = 0; q < live_rows; ++q) {
          const V* row = packed + static_cast<int64_t>(q) * dim * S * 2;
          float* rpw = pw + static_cast<int64_t>(q) * R * k;
          int64_t* rix = ix + static_cast<int64_t>(q) * R * k;
          const float* rfloor = floors + static_cast<int64_t>(q) * R;
          V thr[S];
          for (int s = 0; s < S; ++s)
            for (int l = 0; l < W; ++l) {
              const float t = rpw[(s * W + l) * k + k - 1], f = rfloor[s * W + l];
              LT::set(thr[s], l, t > f ? t : f);
            }
          auto signal_at = [&](int64_t j, int s, V& sr, V& si) BLOCHSIM_LAMBDA_INLINE {
            sr = row[(j * S + s) * 2];
            si = row[(j * S + s) * 2 + 1];
          };
          // one tile of n_atoms (A, or 1 for the panel's tail) atoms from position u
          auto tile = [&](auto n_atoms, int64_t u) BLOCHSIM_LAMBDA_INLINE {
            constexpr int T = decltype(n_atoms)::value;
            V re[S][T] = {}, im[S][T] = {};
            const float* at[T];
            for (int v = 0; v < T; ++v) at[v] = p.atom + 2 * dim * (u + v) * stride;
            match_accumulate<V, float, S, T>(0, dim, signal_at, [&](int64_t j, int v, float& ar, float& ai)
                                                 BLOCHSIM_LAMBDA_INLINE {
                                                   ar = at[v][2 * j];
                                                   ai = at[v][2 * j + 1];
                                                 },
                                             re, im);
            for (int v = 0; v < T; ++v)
              for (int s = 0; s < S; ++s) {
                const V pv = match_power(re[s][v], im[s][v]);
                if (!any_greater(pv, thr[s])) continue;
                for (int l = 0; l < W; ++l) {
                  const float x = LT::get(pv, l);
                  if (!(x > LT::get(thr[s], l))) continue;
                  const int64_t o = static_cast<int64_t>(s * W + l) * k;
                  match_offer(rpw + o, rix + o, k, x, (u + v) * stride);
                  const float t = rpw[o + k - 1], f = rfloor[s * W + l];
                  LT::set(thr[s], l, t > f ? t : f);
                }
              }
          };
          int64_t u = u0;
          for (; u + A <= u1; u += A) tile(std::integral_constant<int, A>{}, u);
          for (; u < u1; ++u) tile(std::integral_constant<int, 1>{}, u);
        }
      }
    };

    // A dictionary scanned in order improves each signal's k-th best a
    // few thousand times (its scores rise along the grid), and each time
    // a lane leaves the vector path.  A first pass over a strided sample
    // gives each signal a floor, the k-th best power of the sample: the k
    // best of all atoms score at least that, so the full pass offers only
    // atoms reaching it (those of the sample again among them, with the
    // same powers), and the result is the same.
    for (int i = 0; i < match_block_signals; ++i) floors[i] = -1.0f;
    if (p.atoms >= match_sample_stride * 4 * static_cast<int64_t>(k)) {
      reset();
      sweep(match_sample_stride);
      for (int i = 0; i < match_block_signals; ++i) {
        const float t = pw[static_cast<int64_t>(i) * k + k - 1];
        floors[i] = t >= 0.0f ? std::nextafter(t, -1.0f) : -1.0f;
      }
    }
    reset();
    sweep(1);

    for (int64_t i = 0; i < count; ++i) {
      const float* s = p.signal + 2 * dim * (first + i);
      for (int q = 0; q < k; ++q) {
        const int64_t o = (first + i) * k + q;
        const int64_t a = ix[i * k + q];
        r.index[o] = a;
        r.power[o] = a < 0 ? -1.0f : pw[i * k + q];
        double re = 0.0, im = 0.0;
        if (a >= 0) match_exact(p.atom + 2 * dim * a, s, dim, re, im);
        r.dot[2 * o] = re;
        r.dot[2 * o + 1] = im;
      }
    }
  }
  return ok;
}
#endif

}  // namespace BLOCHSIM_ISA

namespace host {

// Signature of a function that matches blocks [b0, b1) of
// match_block_signals signals with a workspace of match_host_workspace(p)
// floats.
using MatchRangeFn = int (*)(const MatchProblem& p, const MatchResult& r, int64_t b0, int64_t b1, float* work);

inline int match_range(const MatchProblem& p, const MatchResult& r, int64_t b0, int64_t b1, float* work) {
  return match_blocks<Vec>(p, r, b0, b1, work);
}

// The k best atoms of every signal of p into r on `threads` threads (each a
// contiguous range of signal blocks); returns a Status.
inline int match_status(const MatchProblem& p, const MatchResult& r, int threads,
                        MatchRangeFn fn = &match_range) noexcept {
  return guarded([&]() -> int {
    const int v = validate_match(p, r);
    if (v != ok) return v;
    if (threads < 1) return bad_threads;
    if (p.n == 0) return ok;
    const std::size_t work = static_cast<std::size_t>(match_host_workspace(p));
    return run_ranges((p.n + match_block_signals - 1) / match_block_signals, threads, work,
                      [&](int64_t b0, int64_t b1, float* w) { return fn(p, r, b0, b1, w); });
  });
}

}  // namespace host
}  // namespace blochsim
#endif
