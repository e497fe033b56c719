// The moment-keyed EPG (epg/keyed.hpp) on the host for C++ callers: the
// problems in blocks of host::lanes over a thread pool of the caller's
// size, as forward_status.  (The Python extension plays the same blocks on
// the best x86-64 level's lanes, src_cpp/host/dispatch.cpp.)
#pragma once

#include "../epg/keyed.hpp"
#include "epg.hpp"

#if !defined(__CUDA_ARCH__)
namespace blochsim {
namespace host {

// Signature of a function that plays the keyed blocks [b0, b1) with a
// workspace of keyed_workspace(s, k) lane vectors a block.
using KeyedRangeFn = int (*)(const EventStream& s, const KeyedProgram& k, const Tissue& t, int64_t b0, int64_t b1,
                             void* work, float* out);

inline int keyed_range_any(const EventStream& s, const KeyedProgram& k, const Tissue& t, int64_t b0, int64_t b1,
                           void* work, float* out) {
  for (int64_t b = b0; b < b1; ++b) {
    const int st = epg::keyed_block<Vec>(s, k, t, b * lanes, static_cast<Vec*>(work), out);
    if (st != ok) return st;
  }
  return ok;
}

// The samples of every problem of t through the keyed program k of stream
// s into out (events.hpp's layout) on `threads` threads, fn playing the
// blocks; returns a Status.
inline int keyed_status(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out, int threads,
                        KeyedRangeFn fn = &keyed_range_any) noexcept {
  return guarded([&]() -> int {
    int v = validate(s, t, false, false);
    if (v == ok) v = validate_keyed(s, k);
    if (v == ok) v = keyed_plays(k, t);
    if (v != ok) return v;
    const std::size_t work = static_cast<std::size_t>(keyed_workspace(s, k)) * lanes;
    return run_blocks_with(t, threads, work, [&](int64_t b0, int64_t b1, void* w) {
      return fn(s, k, t, b0, b1, w, out);
    });
  });
}

}  // namespace host
}  // namespace blochsim
#endif
