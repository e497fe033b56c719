// The device kernels of blochsim (CUDA C++, compiled by nvcc): the EPG
// templates of epg.hpp and epg_registers.hpp instantiated for the GPU, and
// forward_device(), which launches them for an event stream on a CUDA
// stream.  Include it from a .cu file to embed the device backend in a C++
// program; the Python extension compiles it in src_cuda/launcher.cu.
//
// Kernels, for K orders with T = ceil(K / R) threads per problem, each
// holding R orders in registers:
//   warp_kernel   R = 32 (real path) or 8 (complex), T <= 32 (K <= 1024 /
//                 256): teams of T consecutive lanes, 32 / T to a warp (any
//                 T; the lanes left over replay a problem), boundary orders
//                 passed by warp shuffles;
//   block_kernel  R = 32 or 8, T <= 256 / 512 (K <= 8192 / 4096): teams of
//                 T threads, as many to a block (of up to 256 / 512) as fit,
//                 boundary orders through shared memory;
//   tail_kernel   beyond: a block team of the most threads holding the
//                 first orders in registers and the rest in device memory
//                 (epg::TailStore), so that the cost grows with K across the
//                 boundary (any K that fits in memory).
// shape_of() picks the warp or the block kernel by a cost model (threads
// per problem, spare threads included, times each thread's work), so that
// the cost grows with K in steps of one thread's orders rather than in
// powers of two.  The teams read the event records from a window in their
// block's shared memory (SharedRecords).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "adjoint.hpp"
#include "epg.hpp"
#include "epg_registers.hpp"
#include "jacobian.hpp"
#include "pools.hpp"
#include "pools_adjoint.hpp"
#include "pools_registers.hpp"

namespace blochsim {
namespace cuda {

namespace detail {

#ifndef BLOCHSIM_WARP_ORDERS_REAL
#define BLOCHSIM_WARP_ORDERS_REAL 32
#endif
#ifndef BLOCHSIM_WARP_ORDERS_COMPLEX
#define BLOCHSIM_WARP_ORDERS_COMPLEX 8
#endif
#ifndef BLOCHSIM_WARP_MIN_BLOCKS_REAL
#define BLOCHSIM_WARP_MIN_BLOCKS_REAL 1
#endif
#ifndef BLOCHSIM_WARP_MIN_BLOCKS_COMPLEX
#define BLOCHSIM_WARP_MIN_BLOCKS_COMPLEX 4
#endif
// Orders per thread of the warp kernel, and the blocks per SM its register
// budget is sized for (compile-time: -D to tune; bench/device_tune.sh).
constexpr int warp_orders_real = BLOCHSIM_WARP_ORDERS_REAL;
constexpr int warp_orders_complex = BLOCHSIM_WARP_ORDERS_COMPLEX;
constexpr int warp_min_blocks_real = BLOCHSIM_WARP_MIN_BLOCKS_REAL;
constexpr int warp_min_blocks_complex = BLOCHSIM_WARP_MIN_BLOCKS_COMPLEX;
#ifndef BLOCHSIM_BLOCK_ORDERS_REAL
#define BLOCHSIM_BLOCK_ORDERS_REAL 32
#endif
constexpr int block_orders_real = BLOCHSIM_BLOCK_ORDERS_REAL, block_orders_complex = 8;
constexpr int warp_block = 128;  // small blocks: register-limited residency in whole blocks
constexpr int max_block_team = 512;
// Threads of a block of the block kernel with R orders each: 32 orders
// need the whole register file of a thread (255), which 256 threads fill.
constexpr int block_threads(int R) { return R >= 32 ? 256 : max_block_team; }
// Output rows of one chunk of the streamed path (bounds the pinned staging).
constexpr int64_t stream_chunk_bytes = int64_t(64) << 20;

// A failed runtime call also stays the thread's last error, which the
// check after a later kernel launch would report as the launch's: fail()
// clears it (a sticky error comes back from the next call anyway), and
// each launch clears what other code left (no_stale_error()).
inline void no_stale_error() { (void)cudaGetLastError(); }

inline int fail(cudaError_t e, const char* what, char* err, int n) {
  no_stale_error();
  if (err && n > 0)
    std::snprintf(err, static_cast<size_t>(n), "%s: %s (in %s)", cudaGetErrorName(e), cudaGetErrorString(e),
                  what);
  return cuda_error_base + static_cast<int>(e);
}

inline int say(int status, char* err, int n) {
  if (err && n > 0) std::snprintf(err, static_cast<size_t>(n), "%s", status_message(status));
  return status;
}

#define BLOCHSIM_CUDA(call, what)                          \
  do {                                                     \
    const cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) return fail(e_, what, err, n);  \
  } while (0)

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// blochsim's temporaries (event streams, tissue planes, scratch) come from
// a memory pool of its own that keeps up to pool_keep_bytes of freed memory
// between calls.  The device's default pool hands freed memory back to the
// driver at every synchronisation, so that each call mapped its buffers
// afresh.
constexpr uint64_t pool_keep_bytes = uint64_t(256) << 20;

inline cudaError_t current_pool(cudaMemPool_t* pool) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  constexpr int max_devices = 64;
  if (dev < 0 || dev >= max_devices) return cudaErrorInvalidDevice;
  static std::mutex guard;
  static cudaMemPool_t pools[max_devices] = {};
  std::lock_guard<std::mutex> lock(guard);
  if (pools[dev] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t made = nullptr;
    e = cudaMemPoolCreate(&made, &props);
    if (e != cudaSuccess) return e;
    uint64_t keep = pool_keep_bytes;
    e = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) {
      cudaMemPoolDestroy(made);
      return e;
    }
    pools[dev] = made;
  }
  *pool = pools[dev];
  return cudaSuccess;
}

// Stream-ordered allocation from that pool (release with cudaFreeAsync).
inline cudaError_t pool_malloc(void** p, size_t bytes, cudaStream_t st) {
  cudaMemPool_t pool = nullptr;
  const cudaError_t e = current_pool(&pool);
  if (e != cudaSuccess) return e;
  return cudaMallocFromPoolAsync(p, bytes, pool, st);
}

// A window of the stream's event records in a block's shared memory, which
// every thread reads at every event: the block refills it, between two
// barriers, when play() asks for records past its end (advance() is called
// by every thread of the block at the same events).
struct SharedRecords {
  EventRecord* buf;  // shared, `cap` records
  int32_t first;     // the window holds records [first, first + cap), less past the sentinel
  int32_t cap;
  BLOCHSIM_HD void advance(const EventStream& s, int32_t e, int32_t n) {
#if defined(__CUDA_ARCH__)
    const int32_t total = static_cast<int32_t>(s.n_events) + 1;  // with the sentinel
    const int32_t need = e + n < total ? e + n : total;
    if (need <= first + cap) return;
    __syncthreads();
    first = e;
    const int32_t count = (total - e < cap ? total - e : cap) * 4;
    const uint4* src = reinterpret_cast<const uint4*>(s.records + e);
    uint4* dst = reinterpret_cast<uint4*>(buf);
    for (int i = threadIdx.x; i < count; i += blockDim.x) dst[i] = src[i];
    __syncthreads();
#endif
  }
  BLOCHSIM_HD EventRecord record(const EventStream& s, int32_t e) const {
#if defined(__CUDA_ARCH__)
    return buf[e - first];
#else
    return s.records[e];
#endif
  }
};

// Records of the window: all of a stream's when they fit in 32 kB, else as
// many at a time.
constexpr int32_t window_cap = 32 * 1024 / static_cast<int32_t>(sizeof(EventRecord));

inline int32_t window_records(const EventStream& s) {
  return static_cast<int32_t>(std::min<int64_t>(s.n_events + 1, window_cap));
}

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

// A block's dynamic shared memory: the records window, then one float per
// thread for the block team's exchange, then each thread's tissue values
// (kept there rather than in registers: the event loop reads them only when
// an interval changes or a pulse depends on B1), then, for the staged warp
// kernels, one WarpStage per warp.
struct BlockShared {
  unsigned char* base;
  int32_t window;  // records
  int threads;

  BLOCHSIM_HD static size_t stage_offset(int32_t window, int threads) {
    const size_t b = sizeof(EventRecord) * static_cast<size_t>(window) +
                     (sizeof(float) + sizeof(epg::LaneTissue<float>)) * static_cast<size_t>(threads);
    return (b + 15) / 16 * 16;
  }
  // stage_bytes: sizeof the WarpStage of each warp, 0 for none
  static size_t bytes(int32_t window, int threads, size_t stage_bytes = 0) {
    return stage_offset(window, threads) + stage_bytes * static_cast<size_t>(threads / 32);
  }
  BLOCHSIM_HD SharedRecords records() const {  // empty until the first advance()
    return {reinterpret_cast<EventRecord*>(base), -window, window};
  }
  BLOCHSIM_HD float* exchange() const {
    return reinterpret_cast<float*>(base + sizeof(EventRecord) * static_cast<size_t>(window));
  }
  // The thread's tissue values, gathered into their place.
  BLOCHSIM_HD const epg::LaneTissue<float>& tissue(int thread, const Tissue& t, int64_t problem) const {
    epg::LaneTissue<float>* all = reinterpret_cast<epg::LaneTissue<float>*>(exchange() + threads);
    all[thread] = epg::gather<float>(t, &problem);
    return all[thread];
  }
  template <int Rows>
  BLOCHSIM_HD WarpStage<Rows>* stage(int warp) const {
    return reinterpret_cast<WarpStage<Rows>*>(base + stage_offset(window, threads)) + warp;
  }
};

// A team's from_below / from_above for duals (jacobian.hpp): component by
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
  float* buf;  // shared, blockDim.x floats
  SharedRecords records;
  BLOCHSIM_HD int members() const { return T; }
  BLOCHSIM_HD float from_below(float x) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    buf[tid] = x;
    __syncthreads();
    return rank > 0 ? buf[tid - 1] : 0.0f;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float from_above(float x) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    buf[tid] = x;
    __syncthreads();
    return last ? 0.0f : buf[tid + 1];
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD_DUAL_PASSING  // a barrier pair per component
  BLOCHSIM_HD float first() const { return rank == 0 ? 1.0f : 0.0f; }
  BLOCHSIM_HD float base() const { return static_cast<float>(first_order); }
  BLOCHSIM_HD bool active(int band) const { return first_order < band; }
  BLOCHSIM_HD float below(int r, int K) const { return first_order + r < K ? 1.0f : 0.0f; }
  BLOCHSIM_HD void advance(const EventStream& s, int32_t e, int32_t n) { records.advance(s, e, n); }
  BLOCHSIM_HD EventRecord record(const EventStream& s, int32_t e) const { return records.record(s, e); }
  // the tail of a TailStore (one team per block)
  BLOCHSIM_HD float load(const float* p) const { return p[rank]; }
  BLOCHSIM_HD void store(float* p, float x) const { p[rank] = x; }
  BLOCHSIM_HD void put_top(float* p, float x) const {
    if (last) *p = x;
  }
  BLOCHSIM_HD float take_top(const float* p) const { return last ? *p : 0.0f; }
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
  BLOCHSIM_HD void put(int r, float re, float im) {
#if defined(__CUDA_ARCH__)
    stage->value[(r * 32 + lane) * (stage_samples + 1) + count] = make_float2(re, im);
#endif
  }
  // after the put()s of one readout
  BLOCHSIM_HD void next(int64_t slot) {
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

template <bool Complex, int R, bool Solo>
__global__ void __launch_bounds__(warp_block, Complex ? warp_min_blocks_complex : warp_min_blocks_real)
    warp_kernel(EventStream s, Tissue t, float* out, int T, int32_t window) {
  extern __shared__ __align__(16) unsigned char shared[];
  const BlockShared sm{shared, window, static_cast<int>(blockDim.x)};
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Seat at = seat(g / 32, static_cast<int>(g % 32), 32, T, 32 / T, t.n);
  const epg::LaneTissue<float>& lt = sm.tissue(threadIdx.x, t, at.problem);
  epg::RegisterStore<float, R, Complex, WarpTeam<Solo>> st;
  st.init(s, lt, WarpTeam<Solo>{at.rank, T, at.rank * R, at.last, sm.records()});
  float2* row = reinterpret_cast<float2*>(out) + at.problem * s.n_samples;
  if (Complex) {
    // issue-bound (many warps of 128 registers): the stage's instructions
    // and registers cost more than the stores' stalls
    DeviceSink sink{row, at.writer};
    epg::play<float, Complex>(s, t, lt, st, sink);
  } else {
    const int lane = static_cast<int>(threadIdx.x % 32);
    WarpStage<1>* stage = sm.stage<1>(static_cast<int>(threadIdx.x / 32));
    stage->row[lane] = at.writer ? row : nullptr;
    StagedSink sink{{stage, lane, 0}};
    epg::play<float, Complex>(s, t, lt, st, sink);
    if (sink.count > 0) sink.flush();
  }
}

template <bool Complex, int R>
__global__ void __launch_bounds__(block_threads(R)) block_kernel(EventStream s, Tissue t, float* out, int T,
                                                                int per, int32_t window) {
  extern __shared__ __align__(16) unsigned char shared[];
  const BlockShared sm{shared, window, static_cast<int>(blockDim.x)};
  const int tid = threadIdx.x;
  const Seat at = seat(blockIdx.x, tid, blockDim.x, T, per, t.n);
  const epg::LaneTissue<float>& lt = sm.tissue(tid, t, at.problem);
  epg::RegisterStore<float, R, Complex, BlockTeam> st;
  st.init(s, lt, BlockTeam{at.rank, T, at.rank * R, tid, at.last, sm.exchange(), sm.records()});
  DeviceSink sink{reinterpret_cast<float2*>(out) + at.problem * s.n_samples, at.writer};
  epg::play<float, Complex>(s, t, lt, st, sink);
}

template <bool Complex, int R>
__global__ void __launch_bounds__(block_threads(R)) tail_kernel(EventStream s, Tissue t, float* out,
                                                                 float* scratch, int64_t first, int64_t ws,
                                                                 int32_t window) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int tid = threadIdx.x, T = blockDim.x;
  const BlockShared sm{shared, window, T};
  const int64_t p = first + blockIdx.x;
  const epg::LaneTissue<float>& lt = sm.tissue(tid, t, p);
  epg::TailStore<float, R, Complex, BlockTeam> st;
  st.init(s, lt, BlockTeam{tid, T, tid * R, tid, tid == T - 1, sm.exchange(), sm.records()},
          scratch + blockIdx.x * ws);
  DeviceSink sink{reinterpret_cast<float2*>(out) + p * s.n_samples, tid == 0};
  epg::play<float, Complex>(s, t, lt, st, sink);
}

// ---------------------------------------------------------------------------
// Tissue Jacobians: the warp kernel on duals (jacobian.hpp), tangents in
// split form.  One launch covers every direction: the grid's y index is a
// group of up to jacobian_dirs dual directions, and each team carries its
// problem's value with its group's tangents, so that no team holds more than
// jacobian_dirs of them (duals of eight directions in one team, 2 orders a
// lane, spilled and ran 7x slower than pairs: bench/NOTES.md v0.7).  The
// loop plays with M0 = 1 and the sink scales by M0, so M0 is no dual
// direction (d S / d M0 is the unscaled sample, written by group 0 with the
// signal).

#ifndef BLOCHSIM_JACOBIAN_DIRS
#define BLOCHSIM_JACOBIAN_DIRS 2
#endif
#ifndef BLOCHSIM_JACOBIAN_ORDERS_REAL
#define BLOCHSIM_JACOBIAN_ORDERS_REAL 8
#endif
#ifndef BLOCHSIM_JACOBIAN_ORDERS_COMPLEX
#define BLOCHSIM_JACOBIAN_ORDERS_COMPLEX 4
#endif
#ifndef BLOCHSIM_JACOBIAN_MIN_BLOCKS
#define BLOCHSIM_JACOBIAN_MIN_BLOCKS 1
#endif
// Dual directions a team carries, orders a lane, and the blocks per SM
// the kernel's register budget is sized for (compile-time: -D to tune with
// bench/device_tune_jacobian.sh; the layouts measured are in bench/NOTES.md
// v0.8, none faster than these).
constexpr int jacobian_dirs = BLOCHSIM_JACOBIAN_DIRS;
constexpr int jacobian_min_blocks = BLOCHSIM_JACOBIAN_MIN_BLOCKS;
template <bool Complex>
BLOCHSIM_HD constexpr int jacobian_orders() {
  return Complex ? BLOCHSIM_JACOBIAN_ORDERS_COMPLEX : BLOCHSIM_JACOBIAN_ORDERS_REAL;
}

struct Directions {
  int n;       // dual directions of the call
  int total;   // output columns of the call: the stride of jac's rows
  int m0_col;  // the output column of M0, or -1
  int field[tissue_fields];
  int col[tissue_fields];     // the output column of dual direction j
  float seed[tissue_fields];  // d field / d direction
  float m0_seed;              // d M0 / d its column
};

// Member 0 of a team writes its group's derivatives of its problem's
// samples, and group 0 the samples and d / d M0, through the warp's stage:
// row 0 the samples, row 1 d / d M0, row 2 + j the group's tangent j.
constexpr int jacobian_rows = 2 + jacobian_dirs;
struct JacobianStagedSink : StagedRows<jacobian_rows> {
  static constexpr int ND = jacobian_dirs;
  float m0, m0_seed;
  // Points the lane's rows of the stage at their outputs (null: not written).
  BLOCHSIM_HD void rows(float2* row, float2* jrow, int64_t n_samples, const Directions& dirs, int first, bool writer,
                        bool values) {
    stage->row[lane] = writer && values ? row : nullptr;
    stage->row[32 + lane] = writer && values && dirs.m0_col >= 0 ? jrow + dirs.m0_col * n_samples : nullptr;
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j)
      stage->row[(2 + j) * 32 + lane] = writer && first + j < dirs.n ? jrow + dirs.col[first + j] * n_samples : nullptr;
  }
  BLOCHSIM_HD void write(int64_t slot, const Dual<float, ND>& re, const Dual<float, ND>& im) {
    put(0, m0 * re.v, m0 * im.v);
    put(1, m0_seed * re.v, m0_seed * im.v);
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j) put(2 + j, m0 * re.d[j], m0 * im.d[j]);
    next(slot);
  }
};

// The same, a store per readout and row (the paths not staged).
struct JacobianDeviceSink {
  static constexpr int ND = jacobian_dirs;
  float2* row;   // the problem's samples
  float2* jrow;  // its (total, n_samples) derivatives
  int64_t n_samples;
  const Directions* dirs;
  int first;  // the group's first dual direction
  float m0;
  bool writer, values;
  BLOCHSIM_HD void write(int64_t slot, const Dual<float, ND>& re, const Dual<float, ND>& im) {
    if (!writer) return;
    if (values) {
      row[slot] = make_float2(m0 * re.v, m0 * im.v);
      if (dirs->m0_col >= 0)
        jrow[dirs->m0_col * n_samples + slot] = make_float2(dirs->m0_seed * re.v, dirs->m0_seed * im.v);
    }
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j)
      if (first + j < dirs->n)
        jrow[dirs->col[first + j] * n_samples + slot] = make_float2(m0 * re.d[j], m0 * im.d[j]);
  }
};

#ifndef BLOCHSIM_JACOBIAN_STAGED
#define BLOCHSIM_JACOBIAN_STAGED 1
#endif
// Which paths stage the Jacobian's rows: 1 the real, 2 the complex, 3 both.
// Staging makes d / d M0 free on the real path and costs the complex path
// 12 % (bench/NOTES.md v0.9), which is issue-bound as the forward's.
template <bool Complex>
BLOCHSIM_HD constexpr bool jacobian_staged() {
  return (BLOCHSIM_JACOBIAN_STAGED & (Complex ? 2 : 1)) != 0;
}

template <bool Complex>
__global__ void __launch_bounds__(warp_block, jacobian_min_blocks) jacobian_kernel(EventStream s, Tissue t,
                                                             const __grid_constant__ Directions dirs, float* out,
                                                             float* jac, int T, int32_t window) {
  // (dirs is read in place: __grid_constant__ lets the kernel take the
  // parameter's address without a copy to local memory)
  constexpr int ND = jacobian_dirs;
  using D = Dual<float, ND>;
  constexpr int R = jacobian_orders<Complex>();
  extern __shared__ __align__(16) unsigned char shared[];
  const BlockShared sm{shared, window, static_cast<int>(blockDim.x)};
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Seat at = seat(g / 32, static_cast<int>(g % 32), 32, T, 32 / T, t.n);
  const int first = static_cast<int>(blockIdx.y) * ND;
  const int count = dirs.n - first < ND ? dirs.n - first : ND;
  epg::LaneTissue<D> lt = epg::seeded_tissue<ND>(t, at.problem, dirs.field + first, count, dirs.seed + first);
  const float m0 = lt.M0.v;
  lt.M0 = D(1.0f);
  epg::SplitStore<epg::RegisterStore<D, R, Complex, WarpTeam<false>>, float, ND, Complex> st;
  st.directions(dirs.field + first, count);
  st.init(s, lt, WarpTeam<false>{at.rank, T, at.rank * R, at.last, sm.records()});
  float2* row = reinterpret_cast<float2*>(out) + at.problem * s.n_samples;
  float2* jrow = reinterpret_cast<float2*>(jac) + at.problem * dirs.total * s.n_samples;
  if constexpr (jacobian_staged<Complex>()) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    JacobianStagedSink sink{{sm.stage<jacobian_rows>(static_cast<int>(threadIdx.x / 32)), lane, 0}, m0, dirs.m0_seed};
    sink.rows(row, jrow, s.n_samples, dirs, first, at.writer, blockIdx.y == 0);
    epg::play<D, Complex>(s, t, lt, st, sink);
    if (sink.count > 0) sink.flush();
  } else {
    JacobianDeviceSink sink{row, jrow, s.n_samples, &dirs, first, m0, at.writer, blockIdx.y == 0};
    epg::play<D, Complex>(s, t, lt, st, sink);
  }
}

// ---------------------------------------------------------------------------
// Reverse mode: the adjoint sweep of adjoint.hpp, one thread per problem.
// The checkpoints and the segment are in global memory; the hot part of the
// workspace (state, adjoint, dual state) is a local array when K is at most
// adjoint_local_states: local memory is laid out so that the threads of a
// warp reading the same element touch adjacent words, where a per-thread
// block of global memory puts them 32 sectors apart.

constexpr int adjoint_threads = 128;
constexpr int adjoint_local_states = 32;

struct AdjointFields {
  int n;
  int field[tissue_fields];
};

// Sums each event's gradients over the threads of a block in thread order
// (in double, by one thread per column) into the block's row of partials:
// a fixed order, so that the gradient is the same on every run.
struct BlockAccumulator {
  double* rows;  // this block's (n_events, event_gradients)
  float* sh;     // shared (event_gradients, blockDim.x)
  BLOCHSIM_HD void operator()(int64_t e, const float* g) {
#if defined(__CUDA_ARCH__)
    const int tid = threadIdx.x, T = blockDim.x;
    for (int q = 0; q < event_gradients; ++q) sh[q * T + tid] = g[q];
    __syncthreads();
    if (tid < event_gradients) {
      double sum = 0.0;
      for (int i = 0; i < T; ++i) sum += sh[tid * T + i];
      rows[e * event_gradients + tid] = sum;
    }
    __syncthreads();
#else
    (void)e;
    (void)g;
#endif
  }
};

// Local = true: the hot workspace in a local array (K <= adjoint_local_states),
// ws the cold part per thread; else both parts in global memory.
template <int N, bool Local>
__global__ void __launch_bounds__(adjoint_threads)
    adjoint_kernel(EventStream s, Tissue t, AdjointFields f, const float* cot, const int32_t* band, float* work,
                   int64_t ws, int64_t first, double* partial, float* tgrad, int* status) {
  __shared__ float sh[event_gradients * adjoint_threads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  BlockAccumulator acc{partial + ((first / adjoint_threads) + blockIdx.x) * s.n_events * event_gradients, sh};
  float* const mine = work + i * ws;
  int st;
  if constexpr (Local) {
    float hot[6 * adjoint_local_states * (N + 3)];
    st = epg::adjoint_block<float, N>(s, t, f.field, f.n, first + i, hot, mine, cot, s.n_samples, band, acc, tgrad);
  } else {
    st = epg::adjoint_block<float, N>(s, t, f.field, f.n, first + i, mine, mine + epg::adjoint_hot(s.states, N), cot,
                                      s.n_samples, band, acc, tgrad);
  }
  if (st != ok) *status = st;
}

// As BlockAccumulator for second order: sums the tangents of the gradients.
struct BlockTangentAccumulator {
  BlockAccumulator base;
  BLOCHSIM_HD void operator()(int64_t e, const Dual<float, 1>* g) {
    float d[event_gradients];
    for (int q = 0; q < event_gradients; ++q) d[q] = g[q].d[0];
    base(e, d);
  }
};

// Second order (adjoint.hpp): the sweep on Dual<float, 1> seeded in
// outer_field; ws is the workspace per thread in Dual<float, 1> (the cold
// part with Local, both parts without).
template <bool Local>
__global__ void __launch_bounds__(adjoint_threads)
    adjoint2_kernel(EventStream s, Tissue t, int outer_field, const float* cot, int64_t cot_stride,
                    const int32_t* band, Dual<float, 1>* work, int64_t ws, int64_t first, double* partial,
                    int* status) {
  using D = Dual<float, 1>;
  constexpr int N = adjoint_event_dirs;
  __shared__ float sh[event_gradients * adjoint_threads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  BlockTangentAccumulator acc{
      BlockAccumulator{partial + ((first / adjoint_threads) + blockIdx.x) * s.n_events * event_gradients, sh}};
  D* const mine = work + i * ws;
  int st;
  if constexpr (Local) {
    D hot[6 * adjoint_local_states * (N + 3)];
    st = epg::adjoint_block<D, N>(s, t, nullptr, 0, first + i, hot, mine, cot, cot_stride, band, acc, nullptr,
                                  outer_field);
  } else {
    st = epg::adjoint_block<D, N>(s, t, nullptr, 0, first + i, mine, mine + epg::adjoint_hot(s.states, N), cot,
                                  cot_stride, band, acc, nullptr, outer_field);
  }
  if (st != ok) *status = st;
}

// partial (blocks, m) summed over the blocks in order into out (m,).
__global__ void sum_partials_kernel(const double* partial, int64_t blocks, int64_t m, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) return;
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += partial[b * m + i];
  out[i] = sum;
}

enum Kind { warp_kind, block_kind, tail_kind };

// The launch shape for K orders: T threads per problem, `per` problems per
// group (a warp for warp_kind, a block of `threads` for block_kind).
struct Shape {
  Kind kind;
  int T, per, threads;
};

// Per-thread work of a kernel in units of one order's operator: R orders
// plus the event's fixed cost (its record, coefficients, readout and
// shifts; the block kernel's barriers add to it).
constexpr int warp_fixed = 8, block_fixed = 12;

// Chooses the cheaper of the warp and block kernels for the stream: the
// cost of a problem is the threads it occupies (its share of the group,
// spare threads included) times each thread's work.  Orders beyond what a
// block team holds go to the tail kernel, a block team of the most threads
// with the rest of the orders in memory.
inline Shape shape_of(const EventStream& s) {
  const int64_t K = s.states;
  const int Rw = s.real_path ? warp_orders_real : warp_orders_complex;
  const int Rb = s.real_path ? block_orders_real : block_orders_complex;
  const int Bmax = block_threads(Rb);
  Shape best{tail_kind, Bmax, 1, Bmax};
  double best_cost = 0.0;
  const int64_t Tw = (K + Rw - 1) / Rw;
  if (Tw <= 32) {
    const int per = 32 / static_cast<int>(Tw);
    best = {warp_kind, static_cast<int>(Tw), per, warp_block};
    best_cost = 32.0 / per * (Rw + warp_fixed);
  }
  const int64_t Tb = (K + Rb - 1) / Rb;
  if (Tb <= Bmax) {
    const int per = Bmax / static_cast<int>(Tb);
    const int threads = (per * static_cast<int>(Tb) + 31) / 32 * 32;
    const double cost = static_cast<double>(threads) / per * (Rb + block_fixed);
    if (best.kind == tail_kind || cost < best_cost) best = {block_kind, static_cast<int>(Tb), per, threads};
  }
  return best;
}

// Floats of device memory one problem's tail takes (tail_kind, T threads).
inline int64_t tail_workspace(const EventStream& s, int T) {
  return s.real_path ? epg::TailStore<float, block_orders_real, false, BlockTeam>::workspace(s.states, T)
                     : epg::TailStore<float, block_orders_complex, true, BlockTeam>::workspace(s.states, T);
}

// Lets `kernel` take `bytes` of dynamic shared memory (past 48 kB a kernel
// must opt in).
template <class F>
inline cudaError_t allow_shared(F* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Plays `ds` (device pointers) for the problems of t into out on `st`.
inline int launch(const EventStream& ds, const Tissue& t, float* out, cudaStream_t st, char* err, int n) {
  if (t.n == 0 || ds.n_samples == 0) return ok;
  no_stale_error();
  const Shape sh = shape_of(ds);
  const bool cplx = !ds.real_path;
  const unsigned groups = static_cast<unsigned>((t.n + sh.per - 1) / sh.per);
  const int32_t w = window_records(ds);
  if (sh.kind == warp_kind) {
    const int64_t threads = static_cast<int64_t>(groups) * 32;
    const unsigned blocks = static_cast<unsigned>((threads + warp_block - 1) / warp_block);
    const size_t smem = BlockShared::bytes(w, warp_block, cplx ? 0 : sizeof(WarpStage<1>));  // the real path stages its samples
    if (cplx) {
      BLOCHSIM_CUDA(allow_shared(warp_kernel<true, warp_orders_complex, false>, smem), "cudaFuncSetAttribute");
      warp_kernel<true, warp_orders_complex, false><<<blocks, warp_block, smem, st>>>(ds, t, out, sh.T, w);
    } else if (sh.T == 1) {
      BLOCHSIM_CUDA(allow_shared(warp_kernel<false, warp_orders_real, true>, smem), "cudaFuncSetAttribute");
      warp_kernel<false, warp_orders_real, true><<<blocks, warp_block, smem, st>>>(ds, t, out, sh.T, w);
    } else {
      BLOCHSIM_CUDA(allow_shared(warp_kernel<false, warp_orders_real, false>, smem), "cudaFuncSetAttribute");
      warp_kernel<false, warp_orders_real, false><<<blocks, warp_block, smem, st>>>(ds, t, out, sh.T, w);
    }
    BLOCHSIM_CUDA(cudaGetLastError(), "warp_kernel launch");
  } else if (sh.kind == block_kind) {
    const size_t smem = BlockShared::bytes(w, sh.threads);
    if (cplx) {
      BLOCHSIM_CUDA(allow_shared(block_kernel<true, block_orders_complex>, smem), "cudaFuncSetAttribute");
      block_kernel<true, block_orders_complex><<<groups, sh.threads, smem, st>>>(ds, t, out, sh.T, sh.per, w);
    } else {
      BLOCHSIM_CUDA(allow_shared(block_kernel<false, block_orders_real>, smem), "cudaFuncSetAttribute");
      block_kernel<false, block_orders_real><<<groups, sh.threads, smem, st>>>(ds, t, out, sh.T, sh.per, w);
    }
    BLOCHSIM_CUDA(cudaGetLastError(), "block_kernel launch");
  } else {
    const int64_t ws = tail_workspace(ds, sh.T);
    size_t free_b = 0, total_b = 0;
    BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const int64_t per = ws * static_cast<int64_t>(sizeof(float));
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(free_b / 2) / per);
    const int64_t chunk = std::min<int64_t>(t.n, std::min<int64_t>(fit, 65536));
    float* scratch = nullptr;
    BLOCHSIM_CUDA(pool_malloc(reinterpret_cast<void**>(&scratch), static_cast<size_t>(chunk * per), st),
                  "cudaMallocFromPoolAsync (tail scratch)");
    const size_t smem = BlockShared::bytes(w, sh.T);
    for (int64_t first = 0; first < t.n; first += chunk) {
      const int64_t count = std::min<int64_t>(chunk, t.n - first);
      BLOCHSIM_CUDA(cudaMemsetAsync(scratch, 0, static_cast<size_t>(count * per), st), "cudaMemsetAsync");
      const unsigned blocks = static_cast<unsigned>(count);
      if (cplx) {
        BLOCHSIM_CUDA(allow_shared(tail_kernel<true, block_orders_complex>, smem), "cudaFuncSetAttribute");
        tail_kernel<true, block_orders_complex><<<blocks, sh.T, smem, st>>>(ds, t, out, scratch, first, ws, w);
      } else {
        BLOCHSIM_CUDA(allow_shared(tail_kernel<false, block_orders_real>, smem), "cudaFuncSetAttribute");
        tail_kernel<false, block_orders_real><<<blocks, sh.T, smem, st>>>(ds, t, out, scratch, first, ws, w);
      }
      BLOCHSIM_CUDA(cudaGetLastError(), "tail_kernel launch");
    }
    BLOCHSIM_CUDA(cudaFreeAsync(scratch, st), "cudaFreeAsync");
  }
  return ok;
}

inline int launch_jacobian(const EventStream& ds, const Tissue& t, const Directions& dirs, float* out,
                           float* jac, cudaStream_t st, char* err, int n) {
  no_stale_error();
  const bool cplx = !ds.real_path;
  const int R = cplx ? jacobian_orders<true>() : jacobian_orders<false>();
  const int T = (ds.states + R - 1) / R;
  const int32_t w = window_records(ds);
  const int per = 32 / T;
  const int64_t warps = (t.n + per - 1) / per;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + warp_block - 1) / warp_block);
  const size_t smem =
      BlockShared::bytes(w, warp_block, jacobian_staged<false>() || jacobian_staged<true>() ? sizeof(WarpStage<jacobian_rows>) : 0);
  const dim3 grid(blocks, static_cast<unsigned>(std::max(1, (dirs.n + jacobian_dirs - 1) / jacobian_dirs)));
  if (cplx) {
    BLOCHSIM_CUDA(allow_shared(jacobian_kernel<true>, smem), "cudaFuncSetAttribute");
    jacobian_kernel<true><<<grid, warp_block, smem, st>>>(ds, t, dirs, out, jac, T, w);
  } else {
    BLOCHSIM_CUDA(allow_shared(jacobian_kernel<false>, smem), "cudaFuncSetAttribute");
    jacobian_kernel<false><<<grid, warp_block, smem, st>>>(ds, t, dirs, out, jac, T, w);
  }
  BLOCHSIM_CUDA(cudaGetLastError(), "jacobian_kernel launch");
  return ok;
}

// The event stream copied to the device as one buffer.
struct DeviceStream {
  EventStream ds;
  void* buf = nullptr;
};

template <class T>
inline size_t put(std::vector<unsigned char>& h, const T* src, int64_t count) {
  size_t off = (h.size() + 15) / 16 * 16;
  h.resize(off + sizeof(T) * static_cast<size_t>(count));
  if (count > 0) std::memcpy(h.data() + off, src, sizeof(T) * static_cast<size_t>(count));
  return off;
}

inline int upload_stream(const EventStream& s, DeviceStream& d, cudaStream_t st, char* err, int n) {
  std::vector<unsigned char> h;
  const int64_t ne = s.n_events;
  const size_t o_dur = put(h, s.duration_s, s.n_intervals);
  const size_t o_iv = put(h, s.interval, ne), o_fl = put(h, s.flags, ne);
  const size_t o_sb = put(h, s.shift_before, ne), o_sa = put(h, s.shift_after, ne);
  const size_t o_flip = put(h, s.flip_rad, ne), o_ph = put(h, s.phase_rad, ne);
  const size_t o_rx = put(h, s.rx_phase_rad, ne), o_slot = put(h, s.slot, ne);
  const size_t o_rft = s.rf_table ? put(h, s.rf_table, ne * rf_table_fields) : 0;
  const size_t o_rfd = s.rf_duration_s ? put(h, s.rf_duration_s, ne) : 0;
  const size_t o_rfo = s.rf_offset_hz ? put(h, s.rf_offset_hz, ne) : 0;
  const size_t o_rfp = s.rf_power ? put(h, s.rf_power, ne) : 0;
  const size_t o_drv = s.driven ? put(h, s.driven, ne) : 0;
  const size_t o_drt = s.driven ? put(h, s.driven_table, s.n_driven * driven_fields) : 0;
  std::vector<EventRecord> records(static_cast<size_t>(ne + 1));
  pack_events(s, records.data());
  const size_t o_rec = put(h, records.data(), ne + 1);
  h.resize(std::max<size_t>(h.size(), 16));
  BLOCHSIM_CUDA(pool_malloc(&d.buf, h.size(), st), "cudaMallocFromPoolAsync (event stream)");
  BLOCHSIM_CUDA(cudaMemcpyAsync(d.buf, h.data(), h.size(), cudaMemcpyHostToDevice, st), "copy of the event stream");
  // the copy from pageable memory has been staged when it returns, so h may go
  unsigned char* b = static_cast<unsigned char*>(d.buf);
  d.ds = s;
  d.ds.duration_s = reinterpret_cast<const double*>(b + o_dur);
  d.ds.interval = reinterpret_cast<const int32_t*>(b + o_iv);
  d.ds.flags = reinterpret_cast<const uint32_t*>(b + o_fl);
  d.ds.shift_before = reinterpret_cast<const int32_t*>(b + o_sb);
  d.ds.shift_after = reinterpret_cast<const int32_t*>(b + o_sa);
  d.ds.flip_rad = reinterpret_cast<const float*>(b + o_flip);
  d.ds.phase_rad = reinterpret_cast<const float*>(b + o_ph);
  d.ds.rx_phase_rad = reinterpret_cast<const float*>(b + o_rx);
  d.ds.slot = reinterpret_cast<const int32_t*>(b + o_slot);
  d.ds.rf_table = s.rf_table ? reinterpret_cast<const float*>(b + o_rft) : nullptr;
  d.ds.rf_duration_s = s.rf_duration_s ? reinterpret_cast<const float*>(b + o_rfd) : nullptr;
  d.ds.rf_offset_hz = s.rf_offset_hz ? reinterpret_cast<const float*>(b + o_rfo) : nullptr;
  d.ds.rf_power = s.rf_power ? reinterpret_cast<const float*>(b + o_rfp) : nullptr;
  d.ds.driven = s.driven ? reinterpret_cast<const int32_t*>(b + o_drv) : nullptr;
  d.ds.driven_table = s.driven ? reinterpret_cast<const double*>(b + o_drt) : nullptr;
  d.ds.records = reinterpret_cast<const EventRecord*>(b + o_rec);
  return ok;
}

}  // namespace detail

// Forward EPG on the device.  The stream's arrays are host pointers (copied
// here, stream-ordered); the tissue's Property pointers and out are device
// pointers, out being (t.n, s.n_samples) complex64 interleaved.  Ordered on
// `stream`, not synchronised.  Returns 0, a blochsim Status, or
// cuda_error_base + cudaError_t with a message in err (n bytes).
inline int forward_device(const EventStream& s, const Tissue& t, float* out, cudaStream_t stream,
                          char* err = nullptr, int n = 0) {
  const int v = validate(s, t);
  if (v != ok) return detail::say(v, err, n);
  detail::DeviceStream d;
  int r = detail::upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  r = detail::launch(d.ds, t, out, stream, err, n);
  const cudaError_t e = cudaFreeAsync(d.buf, stream);
  if (r != ok) return r;
  if (e != cudaSuccess) return detail::fail(e, "cudaFreeAsync", err, n);
  return ok;
}

// The most states a device Jacobian holds: a warp team's registers.
inline int jacobian_max_states(bool real_path) {
  return 32 * (real_path ? detail::jacobian_orders<false>() : detail::jacobian_orders<true>());
}

// Signal and tissue Jacobian on the device: out as forward_device, jac
// (t.n, n_dirs, s.n_samples) complex64 interleaved (device pointers), the
// derivative of each sample with respect to tissue field fields[j]
// (TissueField) in its SI unit, for 1 <= n_dirs <= tissue_fields distinct
// fields, in one launch: M0 comes with the signal, and the other
// directions are spread over teams of jacobian_dirs each (each team plays
// its problem's value with them).  With seeds, direction j is seeded
// d field / d direction = seeds[j] (the SI value of one public unit gives
// derivatives per public unit).  At most jacobian_max_states(s.real_path)
// states (states_exceed_team past them).  Ordered on `stream`, not
// synchronised.
inline int jacobian_device(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                           float* jac, cudaStream_t stream, char* err = nullptr, int n = 0,
                           const float* seeds = nullptr) {
  const int v = validate(s, t);
  if (v != ok) return detail::say(v, err, n);
  const int dv = validate_directions(fields, n_dirs);
  if (dv != ok) return detail::say(dv, err, n);
  if (s.states > jacobian_max_states(s.real_path != 0)) return detail::say(states_exceed_team, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  detail::DeviceStream d;
  int r = detail::upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  const epg::DirectionSlots ds(fields, n_dirs, seeds);
  detail::Directions dirs{};
  dirs.n = ds.n_duals;
  dirs.total = n_dirs;
  dirs.m0_col = ds.m0_col;
  dirs.m0_seed = ds.m0_seed;
  for (int j = 0; j < ds.n_duals; ++j) {
    dirs.col[j] = ds.col[j];
    dirs.field[j] = ds.duals[j];
    dirs.seed[j] = ds.dseeds[j];
  }
  r = detail::launch_jacobian(d.ds, t, dirs, out, jac, stream, err, n);
  const cudaError_t e = cudaFreeAsync(d.buf, stream);
  if (r != ok) return r;
  if (e != cudaSuccess) return detail::fail(e, "cudaFreeAsync", err, n);
  return ok;
}

namespace detail {

// The launches of an adjoint sweep: as many problems a launch as fit in half
// the free memory at ws_bytes of workspace each; launch(blocks, first,
// stream_on_device, band, work, partial, status) starts one, partial being
// (blocks of the call, n_events, event_gradients).  The blocks' partials are
// summed in order into ev_grad (host), and the call synchronises `stream`.
template <class Launch>
inline int adjoint_sweeps(const EventStream& s, const Tissue& t, int64_t ws_bytes, double* ev_grad,
                          cudaStream_t stream, char* err, int n, Launch&& launch) {
  const int64_t nev = s.n_events, m = nev * event_gradients;
  for (int64_t i = 0; i < m; ++i) ev_grad[i] = 0.0;
  if (t.n == 0 || nev == 0) return ok;
  no_stale_error();
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const int64_t blocks_total = (t.n + adjoint_threads - 1) / adjoint_threads;
  const int64_t per_block = ws_bytes * adjoint_threads;
  int64_t chunk_blocks = std::max<int64_t>(1, static_cast<int64_t>(free_b / 2) / std::max<int64_t>(per_block, 1));
  chunk_blocks = std::min(chunk_blocks, blocks_total);
  DeviceStream d;
  int r = upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  std::vector<int32_t> band(static_cast<size_t>(nev + 1));
  band_starts(s, band.data());
  unsigned char* buf = nullptr;
  const size_t o_band = 0;
  const size_t o_part = (sizeof(int32_t) * (nev + 1) + 15) / 16 * 16;
  const size_t o_sum = o_part + sizeof(double) * static_cast<size_t>(blocks_total * m);
  const size_t o_status = o_sum + sizeof(double) * static_cast<size_t>(m);
  const size_t o_work = (o_status + sizeof(int) + 255) / 256 * 256;
  const size_t bytes = o_work + static_cast<size_t>(chunk_blocks * per_block);
  BLOCHSIM_CUDA(pool_malloc(reinterpret_cast<void**>(&buf), bytes, stream), "cudaMallocFromPoolAsync (adjoint)");
  int32_t* dband = reinterpret_cast<int32_t*>(buf + o_band);
  double* partial = reinterpret_cast<double*>(buf + o_part);
  double* dsum = reinterpret_cast<double*>(buf + o_sum);
  int* dstatus = reinterpret_cast<int*>(buf + o_status);
  void* work = buf + o_work;
  cudaError_t e = cudaMemcpyAsync(dband, band.data(), sizeof(int32_t) * (nev + 1), cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(dstatus, 0, sizeof(int), stream);
  for (int64_t b0 = 0; b0 < blocks_total && e == cudaSuccess; b0 += chunk_blocks) {
    const unsigned nb = static_cast<unsigned>(std::min(chunk_blocks, blocks_total - b0));
    launch(nb, b0 * adjoint_threads, d.ds, dband, work, partial, dstatus);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) {
    sum_partials_kernel<<<static_cast<unsigned>((m + 255) / 256), 256, 0, stream>>>(partial, blocks_total, m, dsum);
    e = cudaGetLastError();
  }
  int status = ok;
  if (e == cudaSuccess) e = cudaMemcpyAsync(ev_grad, dsum, sizeof(double) * m, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&status, dstatus, sizeof(int), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  const cudaError_t e1 = cudaFreeAsync(buf, stream);
  const cudaError_t e2 = cudaFreeAsync(d.buf, stream);
  if (e != cudaSuccess) return fail(e, "adjoint_kernel", err, n);
  if (e1 != cudaSuccess) return fail(e1, "cudaFreeAsync", err, n);
  if (e2 != cudaSuccess) return fail(e2, "cudaFreeAsync", err, n);
  if (status != ok) return say(status, err, n);
  return ok;
}

}  // namespace detail

// Reverse mode on the device (adjoint.hpp): the tissue's Property pointers,
// cot (t.n, s.n_samples) complex64 and tgrad (t.n, n_tdirs) float32 are
// device pointers; ev_grad (s.n_events, event_gradients) float64 is a host
// array, written when the call returns (it synchronises `stream`).  The
// problems run in launches of as many as fit in half the free memory.
inline int adjoint_device(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot,
                          double* ev_grad, float* tgrad, cudaStream_t stream, char* err = nullptr, int n = 0) {
  using namespace detail;
  const int v = validate(s, t);
  if (v != ok) return say(v, err, n);
  const int dv = n_tdirs == 0 ? static_cast<int>(ok) : validate_directions(fields, n_tdirs);
  if (dv != ok) return say(dv, err, n);
  AdjointFields f{};
  f.n = n_tdirs;
  for (int j = 0; j < n_tdirs; ++j) f.field[j] = fields[j];
  const int N = adjoint_width(dual_directions(fields, n_tdirs));
  // the hot part in local memory for the narrow duals at up to 32 states
  const bool local = s.states <= adjoint_local_states && N <= adjoint_event_dirs + 2;
  const int64_t ws = local ? epg::adjoint_cold(s, N) : epg::adjoint_workspace(s, N);
  return adjoint_sweeps(s, t, ws * 4, ev_grad, stream, err, n,
                        [&](unsigned nb, int64_t first, const EventStream& ds, const int32_t* band, void* work,
                            double* partial, int* status) {
                          auto go = [&](auto kernel) {
                            kernel<<<nb, adjoint_threads, 0, stream>>>(ds, t, f, cot, band,
                                                                      static_cast<float*>(work), ws, first,
                                                                      partial, tgrad, status);
                          };
                          if (N == adjoint_event_dirs && local)
                            go(adjoint_kernel<adjoint_event_dirs, true>);
                          else if (N == adjoint_event_dirs)
                            go(adjoint_kernel<adjoint_event_dirs, false>);
                          else if (N == adjoint_event_dirs + 2 && local)
                            go(adjoint_kernel<adjoint_event_dirs + 2, true>);
                          else if (N == adjoint_event_dirs + 2)
                            go(adjoint_kernel<adjoint_event_dirs + 2, false>);
                          else
                            go(adjoint_kernel<adjoint_event_dirs + tissue_fields - 1, false>);
                        });
}

// Second order on the device (host::adjoint2_status's counterpart): cot is
// a device pointer (row stride cot_stride complex values), ev_grad a host
// array written when the call returns (it synchronises `stream`).
inline int adjoint2_device(const EventStream& s, const Tissue& t, int outer_field, const float* cot,
                           int64_t cot_stride, double* ev_grad, cudaStream_t stream, char* err = nullptr,
                           int n = 0) {
  using namespace detail;
  const int v = validate(s, t);
  if (v != ok) return say(v, err, n);
  if (outer_field < 0 || outer_field >= tissue_fields || cot_stride < s.n_samples) return say(bad_shape, err, n);
  const bool local = s.states <= adjoint_local_states;
  const int64_t ws = local ? epg::adjoint_cold(s, adjoint_event_dirs) : epg::adjoint_workspace(s, adjoint_event_dirs);
  return adjoint_sweeps(s, t, ws * static_cast<int64_t>(sizeof(Dual<float, 1>)), ev_grad, stream, err, n,
                        [&](unsigned nb, int64_t first, const EventStream& ds, const int32_t* band, void* work,
                            double* partial, int* status) {
                          auto go = [&](auto kernel) {
                            kernel<<<nb, adjoint_threads, 0, stream>>>(ds, t, outer_field, cot, cot_stride, band,
                                                                      static_cast<Dual<float, 1>*>(work), ws,
                                                                      first, partial, status);
                          };
                          if (local)
                            go(adjoint2_kernel<true>);
                          else
                            go(adjoint2_kernel<false>);
                        });
}

namespace detail {

// One thread a problem of the pooled EPG (pools.hpp pooled_block with
// V = float): its state and operators in device memory, element i of the
// problems of a launch interleaved (stride `count`), so that a warp's loads
// coalesce.
// (A template, like pooled_from_host, so that only programs that call it
// compile it.)
template <class V>
__global__ void pooled_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, int64_t first, int64_t count,
                              V* work, float* out, int* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int st = pooled_block<V>(s, t, p, ls, first + i, work + i, count, out);
  if (st != ok) atomicExch(status, st);
}

// One thread a problem: the operator table of pools_registers.hpp
// (pooled_table), value j of problem first + c at table[j * count + c].
// (Templates, like pooled_from_host, so that only programs that call them
// compile them.)
template <int Unused = 0>
__global__ void pooled_table_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, int64_t first,
                                    int64_t count, float* table) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  pooled_table(s, t, p, ls, first + c, table + c, count);
}

// A team of T lanes of a warp a problem (pools_registers.hpp PooledTeam),
// 32 / T teams a warp; the spare lanes replay their warp's last team's
// problem, the teams past the last problem replay that one, and neither
// writes.
template <int N, bool Bound, bool Real>
__global__ void __launch_bounds__(128) pooled_team_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls,
                                                          int64_t first, int64_t count, const float* table,
                                                          float* out, int T) {
  constexpr int R = pooled_team_orders<N, Bound, Real>();
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Seat at = seat(g / 32, static_cast<int>(g % 32), 32, T, 32 / T, count);
  PooledTeam<float, N, Bound, R, Real, WarpTeam<false>> st;
  DeviceSink sink{reinterpret_cast<float2*>(out) + (first + at.problem) * s.n_samples, at.writer};
  st.play(s, t, p, ls, first + at.problem, table + at.problem, count,
          WarpTeam<false>{at.rank, T, at.rank * R, at.last, SharedRecords{nullptr, 0, 0}}, sink);
}

// The pooled forward's kernels on stream st, for the stream s (host) and
// its upload ds, and the device properties dt, dp and lineshape table dl
// (their values checked; only their configuration is read here), into dout (device),
// kernel failures into *status: a register team a problem
// (pools_registers.hpp) for the pools it is compiled for and up to 32
// members' orders, its operator table formed first by pooled_table_kernel;
// else one thread a problem, its state in device memory (pooled_kernel).
// Launches of as many problems as fit in half the free memory; their
// buffers are freed in the stream's order.
template <class V = float>
inline int pooled_forward_launches(const EventStream& s, const EventStream& ds, const Tissue& dt, const Pools& dp,
                                   const LineshapeTable& dl, float* dout, int* status, cudaStream_t st, char* err,
                                   int n) {
  constexpr int threads = 128;
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const bool real = pooled_real_path(ds, dt, dp);
  const int kind = pooled_team_kind(dp);
  const int R = pooled_team_orders_of(kind, real);
  const bool team = kind != 0 && ds.states <= 32 * R;
  const int64_t per = team ? std::max<int64_t>(1, pooled_table_floats(s, dp)) * static_cast<int64_t>(sizeof(float))
                           : pool_block_workspace(s, dp) * static_cast<int64_t>(sizeof(V));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(dt.n, static_cast<int64_t>(free_b / 2) / per));
  void* work = nullptr;
  BLOCHSIM_CUDA(pool_malloc(&work, static_cast<size_t>(chunk * per), st), "cudaMallocFromPoolAsync (workspace)");
  auto check = [&](const char* what) -> int {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return ok;
    cudaFreeAsync(work, st);
    return fail(e, what, err, n);
  };
  for (int64_t first = 0; first < dt.n; first += chunk) {
    const int64_t count = std::min<int64_t>(chunk, dt.n - first);
    if (!team) {
      const unsigned blocks = static_cast<unsigned>((count + threads - 1) / threads);
      pooled_kernel<V><<<blocks, threads, 0, st>>>(ds, dt, dp, dl, first, count, static_cast<V*>(work), dout, status);
      const int c = check("pooled_kernel launch");
      if (c != ok) return c;
      continue;
    }
    float* table = static_cast<float*>(work);
    pooled_table_kernel<0><<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, st>>>(
        ds, dt, dp, dl, first, count, table);
    int c = check("pooled_table_kernel launch");
    if (c != ok) return c;
    const int T = (ds.states + R - 1) / R, per_warp = 32 / T;
    const int64_t warps = (count + per_warp - 1) / per_warp;
    const unsigned blocks = static_cast<unsigned>((warps * 32 + threads - 1) / threads);
    auto go = [&](auto kernel) {
      kernel<<<blocks, threads, 0, st>>>(ds, dt, dp, dl, first, count, table, dout, T);
    };
    if (kind == 1 && real) go(pooled_team_kernel<1, true, true>);
    else if (kind == 1) go(pooled_team_kernel<1, true, false>);
    else if (kind == 2 && real) go(pooled_team_kernel<2, false, true>);
    else if (kind == 2) go(pooled_team_kernel<2, false, false>);
    else go(pooled_team_kernel<2, true, false>);
    c = check("pooled_team_kernel launch");
    if (c != ok) return c;
  }
  BLOCHSIM_CUDA(cudaFreeAsync(work, st), "cudaFreeAsync");
  return ok;
}

// Directions of one pass of the pooled Jacobian kernel.
struct PooledDirs {
  int field[4];
  float seed[4];
  int n;       // directions of this pass (<= 4)
  int first;   // their first column in jac
  int total;   // columns of jac
};

// One thread a problem of the pooled Jacobian (pools.hpp pooled_problem on
// Dual<double, N>), its workspace contiguous (per values of S a thread).
template <int N>
__global__ void pooled_jacobian_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, PooledDirs dirs,
                                       int64_t first, int64_t count, Dual<double, N>* work, int64_t per, float* out,
                                       float* jac) {
  using S = Dual<double, N>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  const int64_t i = first + c, ns = s.n_samples;
  pooled_problem<S>(s, t, p, ls, i, dirs.field, dirs.n, dirs.seed, work + c * per,
                    [&](int32_t slot, const Cx<S>& v) {
                      float* o = out + (i * ns + slot) * 2;
                      o[0] = static_cast<float>(v.re.v);
                      o[1] = static_cast<float>(v.im.v);
                      for (int j = 0; j < dirs.n; ++j) {
                        float* d = jac + ((i * dirs.total + dirs.first + j) * ns + slot) * 2;
                        d[0] = static_cast<float>(v.re.d[j]);
                        d[1] = static_cast<float>(v.im.d[j]);
                      }
                    });
}

// Copies the present properties of t and p (host arrays of length t.n or 1)
// into the device buffer buf at offsets after `used` bytes, pointing dt and
// dp at them.
inline void place_properties(const Tissue& t, const Pools& p, Tissue& dt, Pools& dp, std::vector<unsigned char>& h,
                             std::vector<std::pair<Property*, size_t>>& where) {
  auto one = [&](const Property& src, Property& dst) {
    dst = src;
    if (!src.data) return;
    const int64_t count = src.stride == 0 ? 1 : t.n;
    where.emplace_back(&dst, put(h, src.data, count));
  };
  dt = t;
  dp = p;
  Property* tf[] = {&dt.T1_s, &dt.T2_s, &dt.M0, &dt.B1, &dt.B1phase_rad, &dt.B0_hz, &dt.D_m2_s, &dt.v_m_s,
                    &dt.inv_efficiency};
  const Property* ts[] = {&t.T1_s, &t.T2_s, &t.M0, &t.B1, &t.B1phase_rad, &t.B0_hz, &t.D_m2_s, &t.v_m_s,
                          &t.inv_efficiency};
  for (int k = 0; k < 9; ++k) one(*ts[k], *tf[k]);
  one(p.bound_fraction, dp.bound_fraction);
  one(p.bound_exchange_hz, dp.bound_exchange_hz);
  one(p.bound_T1_s, dp.bound_T1_s);
  one(p.bound_T2_s, dp.bound_T2_s);
  for (int j = 0; j < max_exchanging_pools; ++j)
    for (int c = 0; c < pool_columns; ++c) one(p.pool[j][c], dp.pool[j][c]);
}

// Moves the tissue and pool properties of t and p (host arrays) and the
// super-Lorentzian table into one device buffer *props (the caller frees
// it), and points dt, dp and dl at it.
inline cudaError_t upload_pool_inputs(const Tissue& t, const Pools& p, cudaStream_t st, void** props, Tissue& dt,
                                      Pools& dp, LineshapeTable& dl) {
  std::vector<unsigned char> h;
  std::vector<std::pair<Property*, size_t>> where;
  place_properties(t, p, dt, dp, h, where);
  const LineshapeTable hl = host_lineshape_table();
  const size_t o_g = put(h, hl.g, lineshape_detail::table_points);
  const size_t o_dg = put(h, hl.dg_dt, lineshape_detail::table_points);
  cudaError_t e = pool_malloc(props, h.size(), st);
  if (e != cudaSuccess) return e;
  e = cudaMemcpyAsync(*props, h.data(), h.size(), cudaMemcpyHostToDevice, st);
  if (e != cudaSuccess) return e;
  // the staging vector must outlive the copy
  e = cudaStreamSynchronize(st);
  unsigned char* b = static_cast<unsigned char*>(*props);
  for (auto& w : where) w.first->data = reinterpret_cast<const float*>(b + w.second);
  dl = hl;
  dl.g = reinterpret_cast<const double*>(b + o_g);
  dl.dg_dt = reinterpret_cast<const double*>(b + o_dg);
  return e;
}

// Tissue directions of the pooled adjoint kernel.
struct PooledAdjointDirs {
  int field[pool_field_count];
  int n;
  unsigned mask;  // the event parameters computed
};

// One thread a problem of the pooled adjoint (pools_adjoint.hpp on duals of
// W directions): its event gradients into its own row block of `rows`
// (count, n_events, pooled_event_gradients), summed afterwards in order.
template <int W>
__global__ void pooled_adjoint_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, PooledAdjointDirs dirs,
                                      int64_t first, int64_t count, double* work, int64_t per, const float* cot,
                                      double* rows, float* tgrad) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  const int64_t i = first + c, m = s.n_events * pooled_event_gradients;
  double* r = rows + c * m;
  for (int64_t j = 0; j < m; ++j) r[j] = 0.0;
  pooled_adjoint_problem<W>(s, t, p, ls, i, dirs.mask, dirs.field, dirs.n, cot + i * s.n_samples * 2, work + c * per, r,
                            tgrad + i * dirs.n);
}

// acc[j] += rows[c m + j] for c = 0 .. count - 1, one at a time, so that
// the total is summed in problem order whatever the launches' sizes (a
// template, like the kernels above, compiled only where called).
template <class T>
__global__ void sum_rows_kernel(const T* rows, int64_t count, int64_t m, T* acc) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= m) return;
  T sum = acc[j];
  for (int64_t c = 0; c < count; ++c) sum += rows[c * m + j];
  acc[j] = sum;
}

}  // namespace detail

// In the pooled entries below: a CUDA call that fails ends the entry
// through its finish(), with the error's message.
#define BLOCHSIM_POOLED_TRY(call, what)                                   \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    if (e_ != cudaSuccess) return finish(fail(e_, what, err, n));          \
  } while (0)

// The forward pooled EPG on the device for host inputs and output: the
// stream, the tissue and pool properties (host arrays of length t.n or 1)
// and out ((t.n, s.n_samples) complex64, host) are moved through the
// device, in launches of as many problems as fit in half the free memory.
// Synchronous.  Returns 0, a blochsim Status, or cuda_error_base +
// cudaError_t with a message in err (n bytes).
//
// With n_dirs > 0 it also writes the Jacobian jac ((t.n, n_dirs, s.n_samples)
// complex64, host), fields and seeds as host::pooled_status, by one thread a
// problem in double precision (pooled_problem on duals), four directions a
// pass (every pass on four-direction duals, one kernel for all counts).
template <class V = float>
inline int pooled_from_host(const EventStream& s, const Tissue& t, const Pools& p, float* out, char* err = nullptr,
                            int n = 0, const int* fields = nullptr, int n_dirs = 0, const float* seeds = nullptr,
                            float* jac = nullptr) {
  using namespace detail;
  const int v = validate(s, t, true);
  if (v != ok) return say(v, err, n);
  const int vp = validate_pools(s, t, p);
  if (vp != ok) return say(vp, err, n);
  if (n_dirs < 0 || (n_dirs > 0 && (!fields || !jac))) return say(bad_shape, err, n);
  for (int j = 0; j < n_dirs; ++j)
    if (!pooled_direction(fields[j]))
      return say(bad_shape, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  no_stale_error();
  cudaStream_t st = nullptr;
  BLOCHSIM_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceStream d;
  void* props = nullptr;
  float* dout = nullptr;
  float* djac = nullptr;
  int* status = nullptr;
  int r = ok;
  auto finish = [&](int result) {
    if (dout) cudaFreeAsync(dout, st);
    if (djac) cudaFreeAsync(djac, st);
    if (props) cudaFreeAsync(props, st);
    if (status) cudaFreeAsync(status, st);
    if (d.buf) cudaFreeAsync(d.buf, st);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    return result;
  };
  r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  Tissue dt;
  Pools dp;
  LineshapeTable dl;
  BLOCHSIM_POOLED_TRY(upload_pool_inputs(t, p, st, &props, dt, dp, dl), "upload of the tissue");
  const size_t out_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(s.n_samples) * 8;
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dout), out_bytes, st), "cudaMallocFromPoolAsync (output)");
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&status), sizeof(int), st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemsetAsync(status, 0, sizeof(int), st), "cudaMemsetAsync");
  const size_t jac_bytes = out_bytes * static_cast<size_t>(n_dirs);
  if (n_dirs > 0)
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&djac), jac_bytes, st),
                        "cudaMallocFromPoolAsync (Jacobian)");
  // launches of `chunk` problems, their workspaces in half the free memory
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_POOLED_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  constexpr int threads = 128;
  for (int d0 = 0; d0 < n_dirs; d0 += 4) {
    PooledDirs dirs{};
    dirs.n = std::min(4, n_dirs - d0);
    dirs.first = d0;
    dirs.total = n_dirs;
    for (int j = 0; j < dirs.n; ++j) {
      dirs.field[j] = fields[d0 + j];
      dirs.seed[j] = seeds ? seeds[d0 + j] : 1.0f;
    }
    const int64_t per_vals = pool_workspace(s, p);
    auto run = [&](auto tag) -> int {
      using S = decltype(tag);
      constexpr int N = sizeof(S) / sizeof(double) - 1;
      const int64_t per = per_vals * static_cast<int64_t>(sizeof(S));
      // a quarter of the free memory: the kernel's local memory (the
      // exponentials' scratch on duals) is reserved at launch
      const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(t.n, static_cast<int64_t>(free_b / 4) / per));
      S* jw = nullptr;
      BLOCHSIM_CUDA(pool_malloc(reinterpret_cast<void**>(&jw), static_cast<size_t>(chunk * per), st),
                    "cudaMallocFromPoolAsync (Jacobian workspace)");
      for (int64_t first = 0; first < t.n; first += chunk) {
        const int64_t count = std::min<int64_t>(chunk, t.n - first);
        const unsigned blocks = static_cast<unsigned>((count + threads - 1) / threads);
        pooled_jacobian_kernel<N><<<blocks, threads, 0, st>>>(d.ds, dt, dp, dl, dirs, first, count, jw, per_vals,
                                                              dout, djac);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) {
          cudaFreeAsync(jw, st);
          return fail(e, "pooled_jacobian_kernel launch", err, n);
        }
      }
      BLOCHSIM_CUDA(cudaFreeAsync(jw, st), "cudaFreeAsync");
      return ok;
    };
    r = run(Dual<double, 4>{});
    if (r != ok) return finish(r);
  }
  if (n_dirs == 0) {
    r = pooled_forward_launches<V>(s, d.ds, dt, dp, dl, dout, status, st, err, n);
    if (r != ok) return finish(r);
  }
  int hs = 0;
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(&hs, status, sizeof(int), cudaMemcpyDeviceToHost, st), "copy of the status");
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(out, dout, out_bytes, cudaMemcpyDeviceToHost, st), "copy of the output");
  if (n_dirs > 0)
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(jac, djac, jac_bytes, cudaMemcpyDeviceToHost, st), "copy of the Jacobian");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled_kernel");
  if (hs != ok) return finish(say(hs, err, n));
  return finish(ok);
}

// The forward pooled EPG for device properties: t and p point at device
// arrays (length t.n or 1, float32 SI values, already checked: fractions
// each >= 0 and summing to at most 1, rates >= 0, times > 0; only the
// configuration is checked here), out at (t.n, s.n_samples) complex64 on
// the device; s is a host stream.  Ordered on `stream`, and synchronous
// with it (the kernels' status is read back).  Returns 0, a blochsim
// Status, or cuda_error_base + cudaError_t with a message in err.
inline int pooled_device(const EventStream& s, const Tissue& t, const Pools& p, float* out, cudaStream_t stream,
                         char* err = nullptr, int n = 0) {
  using namespace detail;
  const int v = validate(s, t, true);
  if (v != ok) return say(v, err, n);
  const int vp = validate_pool_config(s, t, p);
  if (vp != ok) return say(vp, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  no_stale_error();
  cudaStream_t st = stream;
  DeviceStream d;
  void* props = nullptr;
  int* status = nullptr;
  auto finish = [&](int result) {
    if (props) cudaFreeAsync(props, st);
    if (d.buf) cudaFreeAsync(d.buf, st);
    return result;
  };
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  // the super-Lorentzian table and the status word
  const LineshapeTable hl = host_lineshape_table();
  std::vector<unsigned char> h;
  const size_t o_g = put(h, hl.g, lineshape_detail::table_points);
  const size_t o_dg = put(h, hl.dg_dt, lineshape_detail::table_points);
  const int zero = 0;
  const size_t o_status = put(h, &zero, 1);
  BLOCHSIM_POOLED_TRY(pool_malloc(&props, h.size(), st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(props, h.data(), h.size(), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  unsigned char* b = static_cast<unsigned char*>(props);
  LineshapeTable dl = hl;
  dl.g = reinterpret_cast<const double*>(b + o_g);
  dl.dg_dt = reinterpret_cast<const double*>(b + o_dg);
  status = reinterpret_cast<int*>(b + o_status);
  r = pooled_forward_launches<float>(s, d.ds, t, p, dl, out, status, st, err, n);
  if (r != ok) {
    cudaStreamSynchronize(st);
    return finish(r);
  }
  int hs = 0;
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(&hs, status, sizeof(int), cudaMemcpyDeviceToHost, st), "copy of the status");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled kernels");
  return finish(hs != ok ? say(hs, err, n) : ok);
}

// Reverse mode with pools on the device for host inputs and outputs
// (host::pooled_adjoint_status's counterpart, same arguments and results):
// one thread a problem in double precision, the per-event play on duals of
// W directions, launches of as many problems as fit in a quarter of the
// free memory; each launch's event gradients are summed in problem order,
// so the result does not depend on the launch size.  Synchronous.
template <int W = pooled_adjoint_width>
inline int pooled_adjoint_from_host(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                    int n_tdirs, const float* cot, double* ev_grad, float* tgrad,
                                    char* err = nullptr, int n = 0, unsigned mask = pooled_all_event_dirs) {
  using namespace detail;
  const int v = validate(s, t, true);
  if (v != ok) return say(v, err, n);
  const int vp = validate_pools(s, t, p);
  if (vp != ok) return say(vp, err, n);
  if (mask > pooled_all_event_dirs || n_tdirs < 0 || n_tdirs > pool_field_count ||
      (n_tdirs > 0 && (!fields || (t.n > 0 && !tgrad))))
    return say(bad_shape, err, n);
  PooledAdjointDirs dirs{};
  dirs.mask = mask;
  dirs.n = n_tdirs;
  for (int j = 0; j < n_tdirs; ++j) {
    if (!pooled_direction(fields[j]))
      return say(bad_shape, err, n);
    for (int l = 0; l < j; ++l)
      if (fields[l] == fields[j]) return say(bad_shape, err, n);
    dirs.field[j] = fields[j];
  }
  const int64_t m = s.n_events * pooled_event_gradients;
  for (int64_t j = 0; j < m; ++j) ev_grad[j] = 0.0;
  if (s.n_events == 0 || t.n == 0) {
    for (int64_t j = 0; j < t.n * n_tdirs; ++j) tgrad[j] = 0.0f;
    return ok;
  }
  no_stale_error();
  cudaStream_t st = nullptr;
  BLOCHSIM_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceStream d;
  void* props = nullptr;
  float *dcot = nullptr, *dtg = nullptr;
  double *work = nullptr, *rows = nullptr, *acc = nullptr;
  auto finish = [&](int result) {
    for (void* q : {static_cast<void*>(work), static_cast<void*>(rows), static_cast<void*>(acc),
                    static_cast<void*>(dcot), static_cast<void*>(dtg), props, d.buf})
      if (q) cudaFreeAsync(q, st);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    return result;
  };
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  Tissue dt;
  Pools dp;
  LineshapeTable dl;
  BLOCHSIM_POOLED_TRY(upload_pool_inputs(t, p, st, &props, dt, dp, dl), "upload of the tissue");
  const size_t cot_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(s.n_samples) * 8;
  const size_t tg_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(n_tdirs) * 4;
  if (cot_bytes > 0) {
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dcot), cot_bytes, st), "cudaMallocFromPoolAsync (cotangent)");
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(dcot, cot, cot_bytes, cudaMemcpyHostToDevice, st), "copy of the cotangent");
  }
  if (tg_bytes > 0)
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dtg), tg_bytes, st), "cudaMallocFromPoolAsync (gradient)");
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&acc), static_cast<size_t>(m) * 8, st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemsetAsync(acc, 0, static_cast<size_t>(m) * 8, st), "cudaMemsetAsync");
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_POOLED_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const int64_t per = pooled_adjoint_workspace(s, p, mask, n_tdirs, W);
  const int64_t per_bytes = (per + m) * 8;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(t.n, static_cast<int64_t>(free_b / 4) / per_bytes));
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&work), static_cast<size_t>(chunk * per) * 8, st),
                      "cudaMallocFromPoolAsync (adjoint workspace)");
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&rows), static_cast<size_t>(chunk * m) * 8, st),
                      "cudaMallocFromPoolAsync (event gradients)");
  constexpr int threads = 64;
  for (int64_t first = 0; first < t.n; first += chunk) {
    const int64_t count = std::min<int64_t>(chunk, t.n - first);
    pooled_adjoint_kernel<W><<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, st>>>(
        d.ds, dt, dp, dl, dirs, first, count, work, per, dcot, rows, dtg);
    BLOCHSIM_POOLED_TRY(cudaGetLastError(), "pooled_adjoint_kernel launch");
    sum_rows_kernel<double><<<static_cast<unsigned>((m + 255) / 256), 256, 0, st>>>(rows, count, m, acc);
    BLOCHSIM_POOLED_TRY(cudaGetLastError(), "sum_rows_kernel launch");
  }
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(ev_grad, acc, static_cast<size_t>(m) * 8, cudaMemcpyDeviceToHost, st),
                      "copy of the event gradients");
  if (tg_bytes > 0)
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(tgrad, dtg, tg_bytes, cudaMemcpyDeviceToHost, st), "copy of the gradient");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled_adjoint_kernel");
#undef BLOCHSIM_POOLED_TRY
  return finish(ok);
}

}  // namespace cuda
}  // namespace blochsim
