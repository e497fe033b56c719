// The host backend: the EPG kernel over a thread pool of the caller's size.
//
// Problems are grouped into blocks of `lanes` and the blocks are split into
// one contiguous range per thread.  Each problem is computed by the same
// instructions whatever block or thread it lands in (forward_block pads the
// last block by replaying its last problem), so the result is bitwise the
// same at every thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../epg/adjoint.hpp"
#include "../epg/epg.hpp"
#include "../epg/jacobian.hpp"
#include "../events.hpp"
#include "interrupt.hpp"

// Host code only: skipped by nvcc's device pass when a .cu file includes it.
#if !defined(__CUDA_ARCH__)
namespace blochsim {
namespace host {

// Host lane type: 16 problems per block, one SIMD vector per plane row.
using Vec = vfloat16;
constexpr int lanes = Lanes<Vec>::width;

// Signature of a function that plays blocks [b0, b1) with a workspace of
// epg::SlidingPlaneStore<Vec, true>::workspace(s) lane vectors.
using RangeFn = int (*)(const EventStream& s, const Tissue& t, int64_t b0, int64_t b1, void* work,
                        float* out);

template <bool Complex>
inline int forward_range(const EventStream& s, const Tissue& t, int64_t b0, int64_t b1, void* work,
                         float* out) {
  for (int64_t b = b0; b < b1; ++b) {
    const int st = epg::forward_block<Vec, Complex>(s, t, b * lanes, static_cast<Vec*>(work), out);
    if (st != ok) return st;
  }
  return ok;
}

// Run fn(i0, i1, work) over [0, count) on `threads` threads (the calling
// thread is one of them), each thread with a workspace of `work_floats`
// floats and its own contiguous range, played in pieces of at most 1/256 of
// it so that the call stops within a piece of being asked to (host/interrupt.hpp;
// `stop` is the call's, for bodies that also check it within a piece).  A
// workspace that does not fit the memory available is refused before any
// thread starts (out_of_memory); an exception in a thread becomes a status
// and stops the others; a thread that cannot be started leaves its range to
// the calling thread.  Returns the first failure of any range (an
// interruption only when nothing failed).
template <class Body>
inline int run_ranges(int64_t count, int threads, std::size_t work_floats, Body&& fn, Stop* stop = nullptr) {
  if (threads < 1) return bad_threads;
  if (count == 0) return ok;
  const int64_t nthreads = std::min<int64_t>(threads, count);
  if (!workspace_fits(static_cast<double>(work_floats + 16) * sizeof(float) * static_cast<double>(nthreads)))
    return out_of_memory;
  Stop own;
  Stop& halt = stop ? *stop : own;
  std::vector<int> status(static_cast<std::size_t>(nthreads), ok);
  auto body = [&](int64_t i) noexcept {
    int r = ok;
    try {
      // 64-byte aligned, so that each plane row is one aligned register load
      std::vector<float> buf(work_floats + 16);
      float* work = buf.data();
      while (reinterpret_cast<std::uintptr_t>(work) % 64 != 0) ++work;
      const int64_t i0 = count * i / nthreads, i1 = count * (i + 1) / nthreads;
      const int64_t piece = std::max<int64_t>(1, (i1 - i0) / 256);
      for (int64_t j = i0; j < i1 && r == ok; j += piece) {
        if (halt()) {
          r = interrupted;
          break;
        }
        r = fn(j, std::min(j + piece, i1), work);
      }
    } catch (const std::bad_alloc&) {
      r = out_of_memory;
    } catch (...) {
      r = internal_error;
    }
    if (r != ok) halt.stop();
    status[static_cast<std::size_t>(i)] = r;
  };
  std::vector<std::thread> pool;
  int64_t started = 1;
  try {
    pool.reserve(static_cast<std::size_t>(nthreads - 1));
    for (; started < nthreads; ++started) pool.emplace_back(body, started);
  } catch (...) {
    // no more threads: the calling thread plays the ranges left
  }
  body(0);
  for (int64_t i = started; i < nthreads; ++i) body(i);
  for (auto& th : pool) th.join();
  bool was_interrupted = false;
  for (int st : status) {
    if (st == interrupted) was_interrupted = true;
    else if (st != ok) return st;
  }
  return was_interrupted ? static_cast<int>(interrupted) : static_cast<int>(ok);
}

// Run body(b0, b1, work) over the blocks of t on `threads` threads, each
// thread with its own contiguous range of blocks (run_ranges).
template <class Body>
inline int run_blocks_with(const Tissue& t, int threads, std::size_t work_floats, Body&& fn) {
  return run_ranges((t.n + lanes - 1) / lanes, threads, work_floats, fn);
}

// Run fn over the blocks of t on `threads` threads.
inline int run_blocks(const EventStream& s, const Tissue& t, float* out, int threads, RangeFn fn) {
  const std::size_t work_size = static_cast<std::size_t>(epg::SlidingPlaneStore<Vec, true>::workspace(s));
  return run_blocks_with(t, threads, work_size * lanes,
                         [&](int64_t b0, int64_t b1, float* work) { return fn(s, t, b0, b1, work, out); });
}

// Forward EPG on the host: validates the stream, then plays it for every
// problem of t, writing complex64 samples (interleaved float pairs, layout in
// events.hpp) into out.  real_fn/complex_fn select the compiled block
// functions (the defaults are built with the caller's compiler flags; the
// Python extension passes builds for each x86-64 level).
inline int forward_status(const EventStream& s, const Tissue& t, float* out, int threads,
                          RangeFn real_fn = &forward_range<false>,
                          RangeFn complex_fn = &forward_range<true>) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t);
    if (v != ok) return v;
    // the event records (pack_events), whose runs of simple events the
    // real path's blocks play two at a time (epg::SlidingPlaneStore::pipelined_run)
    std::vector<EventRecord> records;
    EventStream sr = s;
    if (!s.records && s.real_path) {
      records.resize(static_cast<std::size_t>(s.n_events + 1));
      pack_events(s, records.data());
      sr.records = records.data();
    }
    return run_blocks(sr, t, out, threads, s.real_path ? real_fn : complex_fn);
  });
}

// Signature of a function that plays the Jacobian of blocks [b0, b1) with a
// workspace of jacobian_workspace(s, fields, n_dirs) floats.
using JacobianRangeFn = int (*)(const EventStream& s, const Tissue& t, const int* fields, int n_dirs,
                                int64_t b0, int64_t b1, void* work, float* out, float* jac,
                                const float* seeds);

inline std::size_t jacobian_workspace(const EventStream& s, const int* fields, int n_dirs) {
  return static_cast<std::size_t>(epg::SlidingPlaneStore<Vec, true>::workspace(s)) * lanes *
         static_cast<std::size_t>(1 + dual_width(dual_directions(fields, n_dirs)));
}

inline int jacobian_range_any(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, int64_t b0,
                              int64_t b1, void* work, float* out, float* jac, const float* seeds) {
  return epg::jacobian_range<Vec>(s, t, fields, n_dirs, b0, b1, work, out, jac, seeds);
}

// Signal and tissue Jacobian on the host in one pass: out as forward_status,
// jac (t.n, n_dirs, s.n_samples) complex64 interleaved, the derivative of
// each sample with respect to tissue field fields[j] (TissueField) in its SI
// unit.  n_dirs in [1, tissue_fields], the fields distinct.  With seeds,
// direction j is seeded d field / d direction = seeds[j] (the SI value of
// one public unit gives derivatives per public unit).
inline int jacobian_status(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                           float* jac, int threads, const float* seeds = nullptr,
                           JacobianRangeFn fn = &jacobian_range_any) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t);
    if (v != ok) return v;
    const int d = validate_directions(fields, n_dirs);
    if (d != ok) return d;
    return run_blocks_with(t, threads, jacobian_workspace(s, fields, n_dirs), [&](int64_t b0, int64_t b1, float* work) {
      return fn(s, t, fields, n_dirs, b0, b1, work, out, jac, seeds);
    });
  });
}

// Signature of a function that runs the adjoint of blocks [b0, b1)
// (epg::adjoint_range) with a workspace of adjoint_workspace(s, fields,
// n_tdirs) floats.
using AdjointRangeFn = int (*)(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, int64_t b0,
                               int64_t b1, void* work, const float* cot, const int32_t* band, double* rows,
                               float* tgrad);

inline std::size_t adjoint_workspace(const EventStream& s, const int* fields, int n_tdirs) {
  return static_cast<std::size_t>(epg::adjoint_workspace(s, adjoint_width(dual_directions(fields, n_tdirs)))) *
         lanes;
}

inline int adjoint_range_any(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, int64_t b0,
                             int64_t b1, void* work, const float* cot, const int32_t* band, double* rows,
                             float* tgrad) {
  return epg::adjoint_range<Vec>(s, t, fields, n_tdirs, b0, b1, work, cot, band, rows, tgrad);
}

// Checks adjoint tissue directions: 0 to tissue_fields distinct fields.
inline int validate_adjoint_directions(const int* fields, int n_tdirs) {
  return n_tdirs == 0 ? ok : validate_directions(fields, n_tdirs);
}

// Partitions of the blocks whose event gradients are summed separately and
// then added in order: fixed, so that the sums do not depend on the thread
// count.
constexpr int64_t adjoint_partitions = 64;

// The event gradients of every block of t: range(b0, b1, work, rows) adds
// blocks [b0, b1) into rows (n_events, event_gradients); the partitions'
// rows are summed in order into ev_grad.
template <class Range>
inline int adjoint_partitioned(const EventStream& s, const Tissue& t, int threads, std::size_t work_floats,
                               double* ev_grad, Range&& range) {
  if (threads < 1) return bad_threads;
  const int64_t nev = s.n_events, m = nev * event_gradients;
  for (int64_t i = 0; i < m; ++i) ev_grad[i] = 0.0;
  const int64_t nblocks = (t.n + lanes - 1) / lanes;
  if (nblocks == 0 || nev == 0) return ok;
  const int64_t parts = std::min(adjoint_partitions, nblocks);
  std::vector<double> rows(static_cast<std::size_t>(parts * m), 0.0);
  Stop halt;
  const int st = run_ranges(
      parts, threads, work_floats,
      [&](int64_t p0, int64_t p1, float* work) {
        // block by block (the rows add in the same order), so that a stop is seen within a block
        for (int64_t p = p0; p < p1; ++p)
          for (int64_t b = nblocks * p / parts; b < nblocks * (p + 1) / parts; ++b) {
            if (halt()) return static_cast<int>(interrupted);
            const int r = range(b, b + 1, work, rows.data() + p * m);
            if (r != ok) return r;
          }
        return static_cast<int>(ok);
      },
      &halt);
  if (st != ok) return st;
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t i = 0; i < m; ++i) ev_grad[i] += rows[p * m + i];
  return ok;
}

// Reverse mode on the host (epg/adjoint.hpp): given the cotangent cot (t.n,
// s.n_samples) complex64 interleaved of a real loss L, writes ev_grad
// (s.n_events, event_gradients) = dL / d(duration_s, flip_rad, phase_rad,
// rx_phase_rad) of each event, summed over the problems, and tgrad (t.n,
// n_tdirs) = dL / d tissue field fields[j] (SI units) per problem.
inline int adjoint_status(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot,
                          double* ev_grad, float* tgrad, int threads, AdjointRangeFn fn = &adjoint_range_any) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t);
    if (v != ok) return v;
    const int d = validate_adjoint_directions(fields, n_tdirs);
    if (d != ok) return d;
    if (s.n_events == 0)
      for (int64_t i = 0; i < t.n * n_tdirs; ++i) tgrad[i] = 0.0f;
    std::vector<int32_t> band(static_cast<std::size_t>(s.n_events + 1));
    band_starts(s, band.data());
    return adjoint_partitioned(s, t, threads, adjoint_workspace(s, fields, n_tdirs), ev_grad,
                               [&](int64_t b0, int64_t b1, float* work, double* rows) {
                                 return fn(s, t, fields, n_tdirs, b0, b1, work, cot, band.data(), rows, tgrad);
                               });
  });
}

// Signature of a function that runs second order for blocks [b0, b1)
// (epg::adjoint2_range) with a workspace of adjoint2_workspace(s) floats.
using Adjoint2RangeFn = int (*)(const EventStream& s, const Tissue& t, int outer_field, int64_t b0, int64_t b1,
                                void* work, const float* cot, int64_t cot_stride, const int32_t* band,
                                double* rows);

inline std::size_t adjoint2_workspace(const EventStream& s) {
  return static_cast<std::size_t>(epg::adjoint_workspace(s, adjoint_event_dirs)) * 2 * lanes;
}

inline int adjoint2_range_any(const EventStream& s, const Tissue& t, int outer_field, int64_t b0, int64_t b1,
                              void* work, const float* cot, int64_t cot_stride, const int32_t* band,
                              double* rows) {
  return epg::adjoint2_range<Vec>(s, t, outer_field, b0, b1, work, cot, cot_stride, band, rows);
}

// Second order on the host (forward over reverse, epg/adjoint.hpp): writes
// ev_grad (s.n_events, event_gradients) = d/d field_outer (SI unit) of the
// event gradients of the cotangent cot (sample `slot` of problem p at
// cot[(p * cot_stride + slot) * 2]), summed over the problems.  With cot =
// dC/dJ for a cost C of the Jacobian column J = d s / d field_outer, that
// is dC / d(duration_s, flip_rad, phase_rad, rx_phase_rad) of each event.
inline int adjoint2_status(const EventStream& s, const Tissue& t, int outer_field, const float* cot,
                           int64_t cot_stride, double* ev_grad, int threads,
                           Adjoint2RangeFn fn = &adjoint2_range_any) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t, false, false);
    if (v != ok) return v;
    if (outer_field < 0 || outer_field >= tissue_fields || cot_stride < s.n_samples) return bad_shape;
    std::vector<int32_t> band(static_cast<std::size_t>(s.n_events + 1));
    band_starts(s, band.data());
    return adjoint_partitioned(s, t, threads, adjoint2_workspace(s), ev_grad,
                               [&](int64_t b0, int64_t b1, float* work, double* rows) {
                                 return fn(s, t, outer_field, b0, b1, work, cot, cot_stride, band.data(), rows);
                               });
  });
}

// The host entries, for workspace_bytes.
enum class Entry : int { forward = 0, jacobian = 1, adjoint = 2, adjoint2 = 3 };

// Bytes an entry allocates beyond its inputs and outputs for n problems on
// `threads` threads: every thread's workspace, and the partition rows of
// the adjoints.  What a caller compares with the memory it has before a
// large call (the entries themselves refuse a workspace that does not fit
// with out_of_memory).  fields/n_dirs as the entry's.
inline double workspace_bytes(Entry e, const EventStream& s, int64_t n, int threads, const int* fields = nullptr,
                              int n_dirs = 0) noexcept {
  const int64_t blocks = (n + lanes - 1) / lanes;
  const double nthreads = static_cast<double>(std::max<int64_t>(1, std::min<int64_t>(threads, blocks)));
  const double rows = static_cast<double>(std::min<int64_t>(adjoint_partitions, blocks)) *
                          static_cast<double>(s.n_events) * event_gradients * sizeof(double) +
                      static_cast<double>(s.n_events + 1) * sizeof(int32_t);
  const double align = 16 * sizeof(float);
  switch (e) {
    case Entry::forward:
      return nthreads * (static_cast<double>(epg::SlidingPlaneStore<Vec, true>::workspace(s)) * lanes * sizeof(float) +
                         align);
    case Entry::jacobian:
      return nthreads * (static_cast<double>(jacobian_workspace(s, fields, n_dirs)) * sizeof(float) + align);
    case Entry::adjoint:
      return nthreads * (static_cast<double>(adjoint_workspace(s, fields, n_dirs)) * sizeof(float) + align) + rows;
    case Entry::adjoint2:
      return nthreads * (static_cast<double>(adjoint2_workspace(s)) * sizeof(float) + align) + rows;
  }
  return 0.0;
}

// As forward_status, throwing std::bad_alloc when the workspace does not
// fit, std::runtime_error when interrupted, std::invalid_argument on a bad
// stream.
inline void forward(const EventStream& s, const Tissue& t, float* out, int threads = 1) {
  const int st = forward_status(s, t, out, threads);
  if (st == out_of_memory) throw std::bad_alloc();
  if (st == interrupted || st == internal_error)
    throw std::runtime_error(std::string("blochsim: ") + status_message(st));
  if (st != ok) throw std::invalid_argument(std::string("blochsim: ") + status_message(st));
}

}  // namespace host
}  // namespace blochsim
#endif  // !__CUDA_ARCH__
