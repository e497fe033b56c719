// Dictionary matching (SPEC §5b): for each signal s, the k atoms d with the
// largest |<d, s>|² = |Σ_j conj(d_j) s_j|², ties to the lower atom index.
// With unit atoms this ranks by the normalised score |<d, s>| / (‖d‖ ‖s‖),
// since ‖s‖ is the signal's own.
//
// The kernels are fused: tiles of signals against tiles of atoms, the
// complex inner products accumulated in registers and each product offered
// at once to its signal's running top-k, so the signals × atoms score matrix
// never exists.  The pieces here are shared by the host (host/match.hpp,
// lane vectors of atoms against broadcast signal components) and the device
// (cuda/match.cuh, a thread's registers of signals × atoms out of shared
// memory):
//
//   match_accumulate  the register tile: S signals × A atom lanes, four
//                     fused multiply-adds per complex product;
//   match_offer       one candidate into a signal's sorted top-k;
//   match_merge       two sorted top-k lists into one (the device's threads
//                     and blocks that saw different atoms);
//   match_exact       the winners' inner products again in double precision
//                     (the M0 and score the caller reports).
//
// Every pair (signal, atom) is computed by the same instructions wherever it
// lands in a tile, and each signal sees its atoms in ascending order, so the
// ranking key (the single-precision power) does not depend on tiling,
// threads or how the atoms were cut into chunks: chunked results merged by
// (power, index) equal one call over all atoms.
#pragma once

#include <cstdint>

#include "config.hpp"
#include "tile.hpp"

namespace blochsim {

// A matching problem as the kernels read it (host or device memory).
struct MatchProblem {
  int64_t n = 0;                  // signals
  int64_t atoms = 0;              // atoms
  int64_t dim = 0;                // complex components of a signal and of an atom
  int k = 1;                      // best atoms kept per signal, 1 .. match_max_k
  const float* signal = nullptr;  // (n, dim) complex, real and imaginary parts interleaved
  const float* atom = nullptr;    // (atoms, dim) complex, interleaved (unit atoms: normalised scores)
};

// Where a matching call writes, each row best first.  Slots past the atoms
// (k > atoms) hold index -1, power -1 and dot 0.
struct MatchResult {
  int64_t* index = nullptr;  // (n, k) atom indices
  float* power = nullptr;    // (n, k) |<atom, s>|² in single precision: the ranking key
  double* dot = nullptr;     // (n, k, 2) <atom, s> in double precision (real, imaginary)
};

constexpr int match_max_k = 1024;

// Checks a problem's sizes and pointers; returns a Status.
inline int validate_match(const MatchProblem& p, const MatchResult& r) {
  if (p.n < 0 || p.atoms < 0 || p.dim < 1 || p.k < 1 || p.k > match_max_k) return bad_shape;
  if (p.n > 0 && (!p.signal || !r.index || !r.power || !r.dot)) return bad_shape;
  if (p.n > 0 && p.atoms > 0 && !p.atom) return bad_shape;
  return ok;
}

// Candidate (p, i) into the sorted list (pw, ix) of k entries, best first,
// when p beats the last entry (the caller has checked p > pw[k - 1]).  An
// equal power goes after the entries already there: they came from lower
// indices.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void match_offer(float* pw, int64_t* ix, int k, float p, int64_t i) {
  int q = k - 1;
  while (q > 0 && pw[q - 1] < p) {
    pw[q] = pw[q - 1];
    ix[q] = ix[q - 1];
    --q;
  }
  pw[q] = p;
  ix[q] = i;
}

// Whether (pa, ia) ranks before (pb, ib): a larger power, or an equal one at
// a lower index; empty slots (index -1) rank last.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool match_before(float pa, int64_t ia, float pb, int64_t ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return pa > pb || (pa == pb && ia < ib);
}

// The k best of two sorted lists (a and b, k entries each) into out (k
// entries; may not alias a or b).
BLOCHSIM_HD inline void match_merge(const float* pa, const int64_t* ia, const float* pb, const int64_t* ib, int k,
                                    float* po, int64_t* io) {
  int x = 0, y = 0;
  for (int q = 0; q < k; ++q) {
    if (y >= k || (x < k && match_before(pa[x], ia[x], pb[y], ib[y]))) {
      po[q] = pa[x];
      io[q] = ia[x];
      ++x;
    } else {
      po[q] = pb[y];
      io[q] = ib[y];
      ++y;
    }
  }
}

// <atom, s> in double precision from single-precision vectors of dim
// complex components.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void match_exact(const float* atom, const float* s, int64_t dim, double& re,
                                                  double& im) {
  double r = 0.0, m = 0.0;
  for (int64_t j = 0; j < dim; ++j) {
    const double ar = atom[2 * j], ai = atom[2 * j + 1], sr = s[2 * j], si = s[2 * j + 1];
    r += ar * sr + ai * si;
    m += ar * si - ai * sr;
  }
  re = r;
  im = m;
}

inline namespace BLOCHSIM_ISA {

// The register tile: for components j in [j0, j1), re[s][v] + i·im[s][v]
// accumulates conj(atom v) · signal s for signals s < S and atoms v < A.
// signal(j, s, sr, si) reads signal s's component j as VS, atom(j, v, ar,
// ai) atom v's as VA: on the host VS is a lane vector of signals and VA a
// float broadcast to it; on the device both are floats of a thread's
// registers.  Written as four separate multiply-adds so that each contracts
// to one FMA, the same four for every pair wherever it falls in a tile.
template <class VS, class VA, int S, int A, class SignalAt, class AtomAt>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void match_accumulate(int64_t j0, int64_t j1, SignalAt&& signal, AtomAt&& atom,
                                                       VS (&re)[S][A], VS (&im)[S][A]) {
  for (int64_t j = j0; j < j1; ++j) {
    VS sr[S], si[S];
    BLOCHSIM_UNROLL
    for (int s = 0; s < S; ++s) signal(j, s, sr[s], si[s]);
    BLOCHSIM_UNROLL
    for (int v = 0; v < A; ++v) {
      VA ar, ai;
      atom(j, v, ar, ai);
      BLOCHSIM_UNROLL
      for (int s = 0; s < S; ++s) {
        re[s][v] += ar * sr[s];
        re[s][v] += ai * si[s];
        im[s][v] += ar * si[s];
        im[s][v] -= ai * sr[s];
      }
    }
  }
}

// |re + i·im|² of every lane.
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE V match_power(V re, V im) {
  return re * re + im * im;
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
