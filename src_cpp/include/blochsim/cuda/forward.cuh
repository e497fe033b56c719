// The forward EPG on the device: the warp, block and tail kernels, the
// launch shape chosen by a cost model, the event stream's upload, and
// forward_device().
#pragma once

#include "teams.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

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
    epg::play<float, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
  } else {
    const int lane = static_cast<int>(threadIdx.x % 32);
    WarpStage<1>* stage = sm.stage<1>(static_cast<int>(threadIdx.x / 32));
    stage->row[lane] = at.writer ? row : nullptr;
    StagedSink sink{{stage, lane, 0}};
    epg::play<float, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
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
  epg::play<float, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
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
  epg::play<float, Complex>(s, t, lt, st, sink, epg::LaneProblems{p, 0});
}

enum Kind { warp_kind, block_kind, tail_kind };

// The launch shape for K orders: T threads per problem, `per` problems per
// group (a warp for warp_kind, a block of `threads` for block_kind); narrow:
// the real path's warp kernel of warp_orders_narrow orders a thread.
struct Shape {
  Kind kind;
  int T, per, threads;
  bool narrow = false;
};

// Orders a thread of the real path's narrow warp kernel: the launch for
// few problems, whose time is one team's chain of events (a team of
// 32 / warp_orders_narrow times more threads, each with that many times
// fewer orders to update between two shifts; bench/NOTES.md, one voxel).
// Compiled in only with -DBLOCHSIM_NARROW_TEAMS=1: a result must not depend
// on how many problems a call holds (streamed chunks, Dask blocks), and the
// narrow team's rounding differs from the solo thread's by up to 2e-7
// (GPU suite on an H100: the streamed forward against one call).
#ifndef BLOCHSIM_NARROW_TEAMS
#define BLOCHSIM_NARROW_TEAMS 0
#endif
constexpr int warp_orders_narrow = 8;

// Per-thread work of a kernel in units of one order's operator: R orders
// plus the event's fixed cost (its record, coefficients, readout and
// shifts; the block kernel's barriers add to it).
constexpr int warp_fixed = 8, block_fixed = 12;

// Chooses the cheaper of the warp and block kernels for the stream: the
// cost of a problem is the threads it occupies (its share of the group,
// spare threads included) times each thread's work.  Orders beyond what a
// block team holds go to the tail kernel, a block team of the most threads
// with the rest of the orders in memory.  With `few` problems (their
// narrow teams fill at most two warps an SM), the narrow kernel on the real
// path: the call lasts as long as one team takes, not the card's throughput.
inline Shape shape_of(const EventStream& s, bool few = false) {
  const int64_t K = s.states;
  if (BLOCHSIM_NARROW_TEAMS && few && s.real_path && K > warp_orders_narrow && K <= 32 * warp_orders_narrow) {
    const int T = static_cast<int>((K + warp_orders_narrow - 1) / warp_orders_narrow);
    Shape sh{warp_kind, T, 32 / T, warp_block};
    sh.narrow = true;
    return sh;
  }
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

// The tail kernels' launches over n problems, each with `bytes` of zeroed
// scratch: chunks of problems that fit in half the free device memory (at
// most 65536 a launch), launch(first, count, scratch) starting each.
template <class Launch>
inline int tail_chunks(int64_t problems, int64_t bytes, cudaStream_t st, char* err, int n, Launch&& launch) {
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(free_b / 2) / bytes);
  const int64_t chunk = std::min<int64_t>(problems, std::min<int64_t>(fit, 65536));
  void* scratch = nullptr;
  BLOCHSIM_CUDA(pool_malloc(&scratch, static_cast<size_t>(chunk * bytes), st), "cudaMallocFromPoolAsync (tail scratch)");
  int r = ok;
  for (int64_t first = 0; first < problems && r == ok; first += chunk) {
    const int64_t count = std::min<int64_t>(chunk, problems - first);
    const cudaError_t e = cudaMemsetAsync(scratch, 0, static_cast<size_t>(count * bytes), st);
    r = e != cudaSuccess ? fail(e, "cudaMemsetAsync", err, n) : launch(first, count, scratch);
  }
  const cudaError_t e = cudaFreeAsync(scratch, st);
  if (r != ok) return r;
  if (e != cudaSuccess) return fail(e, "cudaFreeAsync", err, n);
  return ok;
}

// Plays `ds` (device pointers) for the problems of t into out on `st`.
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
inline int launch(const EventStream& ds, const Tissue& t, float* out, cudaStream_t st, char* err, int n) {
  if (t.n == 0 || ds.n_samples == 0) return ok;
  no_stale_error();
  bool few = false;
#if BLOCHSIM_NARROW_TEAMS
  int device = 0, sms = 0;
  BLOCHSIM_CUDA(cudaGetDevice(&device), "cudaGetDevice");
  BLOCHSIM_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  few = t.n * ((ds.states + warp_orders_narrow - 1) / warp_orders_narrow) <= 64 * int64_t(sms);
#endif
  const Shape sh = shape_of(ds, few);
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
#if BLOCHSIM_NARROW_TEAMS
    } else if (sh.narrow) {
      BLOCHSIM_CUDA(allow_shared(warp_kernel<false, warp_orders_narrow, false>, smem), "cudaFuncSetAttribute");
      warp_kernel<false, warp_orders_narrow, false><<<blocks, warp_block, smem, st>>>(ds, t, out, sh.T, w);
#endif
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
    const size_t smem = BlockShared::bytes(w, sh.T);
    return tail_chunks(t.n, ws * static_cast<int64_t>(sizeof(float)), st, err, n,
                       [&](int64_t first, int64_t count, void* scratch) {
                         const unsigned blocks = static_cast<unsigned>(count);
                         float* work = static_cast<float*>(scratch);
                         if (cplx) {
                           BLOCHSIM_CUDA(allow_shared(tail_kernel<true, block_orders_complex>, smem),
                                         "cudaFuncSetAttribute");
                           tail_kernel<true, block_orders_complex><<<blocks, sh.T, smem, st>>>(ds, t, out, work,
                                                                                               first, ws, w);
                         } else {
                           BLOCHSIM_CUDA(allow_shared(tail_kernel<false, block_orders_real>, smem),
                                         "cudaFuncSetAttribute");
                           tail_kernel<false, block_orders_real><<<blocks, sh.T, smem, st>>>(ds, t, out, work,
                                                                                             first, ws, w);
                         }
                         BLOCHSIM_CUDA(cudaGetLastError(), "tail_kernel launch");
                         return static_cast<int>(ok);
                       });
  }
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

// s's arrays and records in one device buffer, d.ds pointing into it: from
// the calls' pool in the order of st, or with kept from cudaMalloc, copied
// before it returns (a copy that outlives the call: keep_stream).
inline int upload_stream(const EventStream& s, DeviceStream& d, cudaStream_t st, char* err, int n,
                         bool kept = false) {
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
  const size_t o_tx = s.transmit ? put(h, s.transmit, ne) : 0;
  std::vector<EventRecord> records(static_cast<size_t>(ne + 1));
  pack_events(s, records.data());
  const size_t o_rec = put(h, records.data(), ne + 1);
  h.resize(std::max<size_t>(h.size(), 16));
  if (kept) {
    BLOCHSIM_CUDA(cudaMalloc(&d.buf, h.size()), "cudaMalloc (event stream)");
    const cudaError_t e = cudaMemcpy(d.buf, h.data(), h.size(), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      cudaFree(d.buf);
      d.buf = nullptr;
      return fail(e, "copy of the event stream", err, n);
    }
  } else {
    BLOCHSIM_CUDA(pool_malloc(&d.buf, h.size(), st), "cudaMallocFromPoolAsync (event stream)");
    BLOCHSIM_CUDA(cudaMemcpyAsync(d.buf, h.data(), h.size(), cudaMemcpyHostToDevice, st), "copy of the event stream");
  }
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
  d.ds.transmit = s.transmit ? reinterpret_cast<const int32_t*>(b + o_tx) : nullptr;
  d.ds.records = reinterpret_cast<const EventRecord*>(b + o_rec);
  return ok;
}

}  // namespace detail

// s copied to the current device for as long as the caller keeps it, for
// calls that play it again (forward_device's `kept`): *view points into the
// copy, *buf owns it (cudaFree).  Synchronous (cudaMemcpy).
inline int keep_stream_device(const EventStream& s, EventStream* view, void** buf, char* err = nullptr, int n = 0) {
  detail::DeviceStream d;
  const int r = detail::upload_stream(s, d, nullptr, err, n, true);
  if (r != ok) return r;
  *view = d.ds;
  *buf = d.buf;
  return ok;
}

// Forward EPG on the device.  The stream's arrays are host pointers (copied
// here, stream-ordered, unless `kept` is s's copy on the device:
// keep_stream_device); the tissue's Property pointers and out are device
// pointers, out being (t.n, s.n_samples) complex64 interleaved.  Ordered on
// `stream`, not synchronised.  Returns 0, a blochsim Status, or
// cuda_error_base + cudaError_t with a message in err (n bytes).
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
inline int forward_device(const EventStream& s, const Tissue& t, float* out, cudaStream_t stream,
                          char* err = nullptr, int n = 0, const EventStream* kept = nullptr) {
  const int v = validate(s, t);
  if (v != ok) return detail::say(v, err, n);
  if (kept) return detail::launch(*kept, t, out, stream, err, n);
  detail::DeviceStream d;
  int r = detail::upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  r = detail::launch(d.ds, t, out, stream, err, n);
  const cudaError_t e = cudaFreeAsync(d.buf, stream);
  if (r != ok) return r;
  if (e != cudaSuccess) return detail::fail(e, "cudaFreeAsync", err, n);
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
