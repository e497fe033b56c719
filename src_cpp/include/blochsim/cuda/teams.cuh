// Teams of threads that play one problem each (a warp's lanes or a block's
// threads, boundary orders through shuffles or shared memory), where they
// sit in a launch, and the sinks that write their readouts.
#pragma once

#include "../dual.hpp"
#include "../epg/epg.hpp"
#include "../epg/registers.hpp"
#include "runtime.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

// Readouts of one warp, staged in shared memory and written out
// stage_samples at a time (StagedRows).  Rows: output rows a lane fills at
// each readout (1 for the signal; the Jacobian's value, d / d M0 and its
// tangents).  Row c = r * 32 + lane holds lane's r-th row, so that the lanes
// writing one component hit distinct banks.
constexpr int stage_samples = 8;
template <int Rows>
struct WarpStage {
  float2 value[Rows * 32 * (stage_samples + 1)];  // (rows, stage_samples + 1); the pad spreads a row over the banks
  float2* row[Rows * 32];                          // each row's output, null where nothing is written
  int32_t slot[stage_samples];
};

// A block's dynamic shared memory: the records window, then `width` floats
// per thread for the block team's exchange (a dual's components pass
// together), then each thread's tissue values
// (kept there rather than in registers: the event loop reads them only when
// an interval changes or a pulse depends on B1), then, for the staged warp
// kernels, one WarpStage per warp.
struct BlockShared {
  unsigned char* base;
  int32_t window;  // records
  int threads;
  int width = 1;  // exchange floats per thread

  BLOCHSIM_HD static size_t stage_offset(int32_t window, int threads, int width = 1) {
    const size_t b = sizeof(EventRecord) * static_cast<size_t>(window) +
                     (sizeof(float) * width + sizeof(epg::LaneTissue<float>)) * static_cast<size_t>(threads);
    return (b + 15) / 16 * 16;
  }
  // stage_bytes: sizeof the WarpStage of each warp, 0 for none
  static size_t bytes(int32_t window, int threads, size_t stage_bytes = 0, int width = 1) {
    return stage_offset(window, threads, width) + stage_bytes * static_cast<size_t>(threads / 32);
  }
  BLOCHSIM_HD SharedRecords records() const {  // empty until the first advance()
    return {reinterpret_cast<EventRecord*>(base), -window, window};
  }
  BLOCHSIM_HD float* exchange() const {
    return reinterpret_cast<float*>(base + sizeof(EventRecord) * static_cast<size_t>(window));
  }
  // The thread's tissue values, gathered into their place.
  BLOCHSIM_HD const epg::LaneTissue<float>& tissue(int thread, const Tissue& t, int64_t problem) const {
    epg::LaneTissue<float>* all = reinterpret_cast<epg::LaneTissue<float>*>(exchange() + threads * width);
    all[thread] = epg::gather<float>(t, &problem);
    return all[thread];
  }
  template <int Rows>
  BLOCHSIM_HD WarpStage<Rows>* stage(int warp) const {
    return reinterpret_cast<WarpStage<Rows>*>(base + stage_offset(window, threads, width)) + warp;
  }
};

// A team's from_below / from_above for duals (epg/jacobian.hpp): component by
// component, through the team's float versions.
#define BLOCHSIM_HD_DUAL_PASSING                                         \
  template <int N>                                                       \
  BLOCHSIM_HD Dual<float, N> from_below(const Dual<float, N>& x) const { \
    Dual<float, N> r;                                                    \
    r.v = from_below(x.v);                                               \
    for (int j = 0; j < N; ++j) r.d[j] = from_below(x.d[j]);             \
    return r;                                                            \
  }                                                                      \
  template <int N>                                                       \
  BLOCHSIM_HD Dual<float, N> from_above(const Dual<float, N>& x) const { \
    Dual<float, N> r;                                                    \
    r.v = from_above(x.v);                                               \
    for (int j = 0; j < N; ++j) r.d[j] = from_above(x.d[j]);             \
    return r;                                                            \
  }

// A team of T consecutive lanes of one warp, any T <= 32: a warp holds
// 32 / T teams, and its last 32 mod T lanes form a spare team that replays a
// problem and writes nothing.  Boundary orders pass by full-warp shuffles
// (lane - 1 and lane + 1), which every lane of the warp executes, so team
// sizes need not be powers of two; the first and last members drop what
// crosses their team's edge.  Solo: teams of one thread, which exchange
// nothing (the launcher's choice for T = 1).
template <bool Solo>
struct WarpTeam {
  static constexpr bool band_skips = false;  // members of a team share a warp
  int rank, T, first_order;
  bool last;  // the top member of its team (of the spare team too)
  SharedRecords records;
  BLOCHSIM_HD int members() const { return Solo ? 1 : T; }
  BLOCHSIM_HD float from_below(float x) const {
#if defined(__CUDA_ARCH__)
    if (Solo) return 0.0f;
    const float v = __shfl_up_sync(0xffffffffu, x, 1);
    return rank == 0 ? 0.0f : v;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float from_above(float x) const {
#if defined(__CUDA_ARCH__)
    if (Solo) return 0.0f;
    const float v = __shfl_down_sync(0xffffffffu, x, 1);
    return last ? 0.0f : v;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD_DUAL_PASSING
  BLOCHSIM_HD float first() const { return Solo || rank == 0 ? 1.0f : 0.0f; }
  BLOCHSIM_HD float base() const { return Solo ? 0.0f : static_cast<float>(first_order); }
  BLOCHSIM_HD bool active(int band) const { return Solo || first_order < band; }
  BLOCHSIM_HD float below(int r, int K) const { return (Solo ? 0 : first_order) + r < K ? 1.0f : 0.0f; }
  BLOCHSIM_HD void advance(const EventStream& s, int32_t e, int32_t n) { records.advance(s, e, n); }
  BLOCHSIM_HD EventRecord record(const EventStream& s, int32_t e) const { return records.record(s, e); }
};

// Teams of T consecutive threads of a block (any T <= block_threads(R)), a
// block holding one or more of them plus spare threads up to a whole warp;
// boundary orders pass through shared memory (one float per thread).
struct BlockTeam {
  static constexpr bool band_skips = true;
  int rank, T, first_order, tid;
  bool last;
  float* buf;  // shared, blockDim.x floats (times a dual's components)
  SharedRecords records;
  BLOCHSIM_HD int members() const { return T; }
  // The value x of the member below or above: a float, or a dual whose
  // components pass together (component c at buf[c * blockDim.x + tid]), so
  // that a whole value costs one barrier pair (the block's exchange is
  // BlockShared::width floats a thread).
  template <class X>
  BLOCHSIM_HD X from_below(const X& x) const {
    return pass(x, tid - 1, rank > 0);
  }
  template <class X>
  BLOCHSIM_HD X from_above(const X& x) const {
    return pass(x, tid + 1, !last);
  }
  // every thread's x into the exchange; thread `from`'s back where `keep`
  BLOCHSIM_HD float pass(float x, int from, bool keep) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    buf[tid] = x;
    __syncthreads();
    return keep ? buf[from] : 0.0f;
#else
    (void)from;
    (void)keep;
    return x * 0.0f;
#endif
  }
  template <int N>
  BLOCHSIM_HD Dual<float, N> pass(const Dual<float, N>& x, int from, bool keep) const {
    Dual<float, N> r;
#if defined(__CUDA_ARCH__)
    const int stride = static_cast<int>(blockDim.x);
    __syncthreads();
    buf[tid] = x.v;
    for (int j = 0; j < N; ++j) buf[(j + 1) * stride + tid] = x.d[j];
    __syncthreads();
    if (keep) {
      r.v = buf[from];
      for (int j = 0; j < N; ++j) r.d[j] = buf[(j + 1) * stride + from];
    }
#endif
    return r;
  }
  BLOCHSIM_HD float first() const { return rank == 0 ? 1.0f : 0.0f; }
  BLOCHSIM_HD float base() const { return static_cast<float>(first_order); }
  BLOCHSIM_HD bool active(int band) const { return first_order < band; }
  BLOCHSIM_HD float below(int r, int K) const { return first_order + r < K ? 1.0f : 0.0f; }
  BLOCHSIM_HD void advance(const EventStream& s, int32_t e, int32_t n) { records.advance(s, e, n); }
  BLOCHSIM_HD EventRecord record(const EventStream& s, int32_t e) const { return records.record(s, e); }
  // the tail of a TailStore (one team per block), elements E of floats or
  // duals
  template <class E>
  BLOCHSIM_HD E load(const E* p) const {
    return p[rank];
  }
  template <class E>
  BLOCHSIM_HD void store(E* p, const E& x) const {
    p[rank] = x;
  }
  template <class E>
  BLOCHSIM_HD void put_top(E* p, const E& x) const {
    if (last) *p = x;
  }
  template <class E>
  BLOCHSIM_HD E take_top(const E* p) const {
    return last ? *p : E{};
  }
  BLOCHSIM_HD void sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  BLOCHSIM_HD float below_tail(int k0, int K) const { return k0 + rank < K ? 1.0f : 0.0f; }
};

// Member 0 of a team writes its problem's samples (row: its output row).
struct DeviceSink {
  float2* row;
  bool writer;
  BLOCHSIM_HD void write(int64_t slot, float re, float im) {
    if (writer) row[slot] = make_float2(re, im);
  }
};

// The staging of the warp kernels: every lane puts its readouts in its
// warp's WarpStage (all lanes of a warp play the same events, so the count
// is the same in each), and every stage_samples readouts the warp writes
// them out together, each store instruction covering stage_samples
// consecutive samples of 32 / stage_samples rows.  A store per readout
// would touch 32 rows, and a store holds its source registers until the
// memory system has taken all of them: the event loop would stall on them
// (ncu: a third of the warps' stall samples, right after such stores).
template <int Rows>
struct StagedRows {
  WarpStage<Rows>* stage;
  int lane, count;
  BLOCHSIM_HD void put([[maybe_unused]] int r, [[maybe_unused]] float re, [[maybe_unused]] float im) {
#if defined(__CUDA_ARCH__)
    stage->value[(r * 32 + lane) * (stage_samples + 1) + count] = make_float2(re, im);
#endif
  }
  // after the put()s of one readout
  BLOCHSIM_HD void next([[maybe_unused]] int64_t slot) {
#if defined(__CUDA_ARCH__)
    stage->slot[count] = static_cast<int32_t>(slot);
    if (++count == stage_samples) flush<true>();
#endif
  }
  // Full: all stage_samples staged (else the first `count`).  The stores go
  // to L2 (st.global.cg): nothing reads the samples back.
  template <bool Full = false>
  BLOCHSIM_HD void flush() {
#if defined(__CUDA_ARCH__)
    __syncwarp();
BLOCHSIM_UNROLL
    for (int j = 0; j < Rows * stage_samples; ++j) {
      const int i = lane + 32 * j;
      const int c = i / stage_samples, k = i % stage_samples;
      float2* row = stage->row[c];
      if (row != nullptr && (Full || k < count))
        __stcg(row + stage->slot[k], stage->value[c * (stage_samples + 1) + k]);
    }
    __syncwarp();
    count = 0;
#endif
  }
};

struct StagedSink : StagedRows<1> {
  BLOCHSIM_HD void write(int64_t slot, float re, float im) {
    put(0, re, im);
    next(slot);
  }
};

// Where a thread sits in a launch of teams of T threads packed `per` to a
// group of `group` threads (a warp, or a block): its team's problem, its
// rank, whether it is its team's top member and whether it writes.
struct Seat {
  int64_t problem;
  int rank;
  bool last, writer;
};

BLOCHSIM_HD inline Seat seat(int64_t group_index, int thread, int group, int T, int per, int64_t n) {
  const int slot = thread / T;  // == per for the spare threads
  Seat st;
  st.rank = thread - slot * T;
  const int size = slot < per ? T : group - per * T;
  st.last = st.rank == size - 1;
  const int64_t team = group_index * per + (slot < per ? slot : per - 1);
  // teams past the last problem replay it, so that every warp stays full for
  // the shuffles and every block for its barriers, and write nothing
  st.problem = team < n ? team : n - 1;
  st.writer = slot < per && st.rank == 0 && team < n;
  return st;
}

}  // namespace detail

}  // namespace cuda
}  // namespace blochsim
