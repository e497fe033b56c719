// The device runtime of blochsim's kernels: tuning constants, CUDA error
// handling, the memory pool, and the window of event records a block reads
// from shared memory.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "../events.hpp"

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
  BLOCHSIM_HD void advance([[maybe_unused]] const EventStream& s, [[maybe_unused]] int32_t e,
                           [[maybe_unused]] int32_t n) {
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

}  // namespace detail

}  // namespace cuda
}  // namespace blochsim
