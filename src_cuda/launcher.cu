// The device backend: the EPG templates of src_cpp instantiated for the GPU,
// and the launcher behind launcher.hpp.
//
// Kernel choice by the number of orders K, T being the smallest power of
// two with T R >= K threads per problem:
//   warp_kernel   R = 32 (real path) or 16 (complex) orders per thread in
//                 registers, T <= 32: teams inside warps, boundary orders
//                 passed by warp shuffles (several problems per warp when
//                 T < 32); K <= 1024 / 512;
//   block_kernel  R = 16 or 8 (a block of up to 512 threads leaves 128
//                 registers each), T <= 512: one problem per block, boundary
//                 orders through shared memory; K <= 8192 / 4096;
//   plane_kernel  beyond: one thread per problem with its planes in global
//                 memory (any K that fits in memory).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <blochsim/epg.hpp>
#include <blochsim/epg_registers.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {
namespace {

constexpr int warp_orders_real = 32, warp_orders_complex = 16;
constexpr int block_orders_real = 16, block_orders_complex = 8;
constexpr int warp_block = 256;
constexpr int max_block_team = 512;
// Output rows of one chunk of the streamed path (bounds the pinned staging).
constexpr int64_t stream_chunk_bytes = int64_t(64) << 20;

int fail(cudaError_t e, const char* what, char* err, int n) {
  if (err && n > 0)
    std::snprintf(err, static_cast<size_t>(n), "%s: %s (in %s)", cudaGetErrorName(e), cudaGetErrorString(e),
                  what);
  return cuda_error_base + static_cast<int>(e);
}

int say(int status, char* err, int n) {
  if (err && n > 0) std::snprintf(err, static_cast<size_t>(n), "%s", status_message(status));
  return status;
}

#define BLOCHSIM_CUDA(call, what)                          \
  do {                                                     \
    const cudaError_t e_ = (call);                         \
    if (e_ != cudaSuccess) return fail(e_, what, err, n);  \
  } while (0)

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// A team of T lanes of one warp (T a power of two <= 32).
struct WarpTeam {
  int rank, T, first_order;
  BLOCHSIM_HD int members() const { return T; }
  BLOCHSIM_HD float from_below(float x) const {
#if defined(__CUDA_ARCH__)
    const float v = __shfl_up_sync(0xffffffffu, x, 1, T);
    return rank == 0 ? 0.0f : v;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float from_above(float x) const {
#if defined(__CUDA_ARCH__)
    const float v = __shfl_down_sync(0xffffffffu, x, 1, T);
    return rank == T - 1 ? 0.0f : v;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float first() const { return rank == 0 ? 1.0f : 0.0f; }
  BLOCHSIM_HD float base() const { return static_cast<float>(first_order); }
  BLOCHSIM_HD bool active(int band) const { return first_order < band; }
  BLOCHSIM_HD float below(int r, int K) const { return first_order + r < K ? 1.0f : 0.0f; }
};

// A team of one block of T threads; boundary orders through shared memory.
struct BlockTeam {
  int rank, T, first_order;
  float* buf;  // shared, T floats
  BLOCHSIM_HD int members() const { return T; }
  BLOCHSIM_HD float from_below(float x) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    buf[rank] = x;
    __syncthreads();
    return rank > 0 ? buf[rank - 1] : 0.0f;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float from_above(float x) const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    buf[rank] = x;
    __syncthreads();
    return rank + 1 < T ? buf[rank + 1] : 0.0f;
#else
    return x * 0.0f;
#endif
  }
  BLOCHSIM_HD float first() const { return rank == 0 ? 1.0f : 0.0f; }
  BLOCHSIM_HD float base() const { return static_cast<float>(first_order); }
  BLOCHSIM_HD bool active(int band) const { return first_order < band; }
  BLOCHSIM_HD float below(int r, int K) const { return first_order + r < K ? 1.0f : 0.0f; }
};

// Member 0 of a team writes its problem's samples.
struct DeviceSink {
  float* out;
  int64_t problem, n_samples;
  bool writer;
  BLOCHSIM_HD void write(int64_t slot, float re, float im) {
    if (writer) reinterpret_cast<float2*>(out)[problem * n_samples + slot] = make_float2(re, im);
  }
};

template <bool Complex, int R>
__global__ void __launch_bounds__(warp_block) warp_kernel(EventStream s, Tissue t, float* out, int T) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t team = g / T;
  const int rank = static_cast<int>(g % T);
  // teams past the last problem replay it, so that every warp stays full
  // for the shuffles, and write nothing
  const int64_t p = team < t.n ? team : t.n - 1;
  const epg::LaneTissue<float> lt = epg::gather<float>(t, &p);
  epg::RegisterStore<float, R, Complex, WarpTeam> st;
  st.init(s, lt, WarpTeam{rank, T, rank * R});
  DeviceSink sink{out, team, s.n_samples, rank == 0 && team < t.n};
  epg::play<float, Complex>(s, t, lt, st, sink);
}

template <bool Complex, int R>
__global__ void __launch_bounds__(max_block_team) block_kernel(EventStream s, Tissue t, float* out) {
  extern __shared__ float exchange[];
  const int64_t p = blockIdx.x;
  const int rank = threadIdx.x;
  const epg::LaneTissue<float> lt = epg::gather<float>(t, &p);
  epg::RegisterStore<float, R, Complex, BlockTeam> st;
  st.init(s, lt, BlockTeam{rank, static_cast<int>(blockDim.x), rank * R, exchange});
  DeviceSink sink{out, p, s.n_samples, rank == 0};
  epg::play<float, Complex>(s, t, lt, st, sink);
}

template <bool Complex>
__global__ void __launch_bounds__(128) plane_kernel(EventStream s, Tissue t, float* out, float* scratch,
                                                    int64_t first, int64_t count, int64_t ws) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int64_t p = first + i;
  const epg::LaneTissue<float> lt = epg::gather<float>(t, &p);
  epg::PlaneStore<float, Complex> st;
  st.template init<float>(s, lt, scratch + i * ws);
  epg::LaneSink<float> sink{out, p, t.n, s.n_samples};
  epg::play<float, Complex>(s, t, lt, st, sink);
}

// Members of a team of R orders each that K orders need (a power of two).
int team_size(int K, int R) {
  int T = 1;
  while (static_cast<int64_t>(T) * R < K && T <= max_block_team) T *= 2;
  return T;
}

enum Kind { warp_kind, block_kind, plane_kind };

Kind kind_of(const EventStream& s, int& T) {
  T = team_size(s.states, s.real_path ? warp_orders_real : warp_orders_complex);
  if (T <= 32) return warp_kind;
  T = team_size(s.states, s.real_path ? block_orders_real : block_orders_complex);
  if (T <= max_block_team) return block_kind;
  return plane_kind;
}

// Plays `ds` (device pointers) for the problems of t into out on `st`.
int launch(const EventStream& ds, const Tissue& t, float* out, cudaStream_t st, char* err, int n) {
  if (t.n == 0 || ds.n_samples == 0) return ok;
  int T = 1;
  const Kind kind = kind_of(ds, T);
  const bool cplx = !ds.real_path;
  if (kind == warp_kind) {
    const int64_t threads = t.n * T;
    const unsigned blocks = static_cast<unsigned>((threads + warp_block - 1) / warp_block);
    if (cplx)
      warp_kernel<true, warp_orders_complex><<<blocks, warp_block, 0, st>>>(ds, t, out, T);
    else
      warp_kernel<false, warp_orders_real><<<blocks, warp_block, 0, st>>>(ds, t, out, T);
    BLOCHSIM_CUDA(cudaGetLastError(), "warp_kernel launch");
  } else if (kind == block_kind) {
    const size_t smem = sizeof(float) * T;
    if (cplx)
      block_kernel<true, block_orders_complex><<<static_cast<unsigned>(t.n), T, smem, st>>>(ds, t, out);
    else
      block_kernel<false, block_orders_real><<<static_cast<unsigned>(t.n), T, smem, st>>>(ds, t, out);
    BLOCHSIM_CUDA(cudaGetLastError(), "block_kernel launch");
  } else {
    const int64_t ws = epg::PlaneStore<float, true>::workspace(ds);
    size_t free_b = 0, total_b = 0;
    BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    const int64_t per = ws * static_cast<int64_t>(sizeof(float));
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(free_b / 2) / per);
    const int64_t chunk = std::min<int64_t>(t.n, std::min<int64_t>(fit, 65536));
    float* scratch = nullptr;
    BLOCHSIM_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&scratch), static_cast<size_t>(chunk * per), st),
                  "cudaMallocAsync (plane scratch)");
    for (int64_t first = 0; first < t.n; first += chunk) {
      const int64_t count = std::min<int64_t>(chunk, t.n - first);
      const unsigned blocks = static_cast<unsigned>((count + 127) / 128);
      if (cplx)
        plane_kernel<true><<<blocks, 128, 0, st>>>(ds, t, out, scratch, first, count, ws);
      else
        plane_kernel<false><<<blocks, 128, 0, st>>>(ds, t, out, scratch, first, count, ws);
      BLOCHSIM_CUDA(cudaGetLastError(), "plane_kernel launch");
    }
    BLOCHSIM_CUDA(cudaFreeAsync(scratch, st), "cudaFreeAsync");
  }
  return ok;
}

// The event stream copied to the device as one buffer.
struct DeviceStream {
  EventStream ds;
  void* buf = nullptr;
};

template <class T>
size_t put(std::vector<unsigned char>& h, const T* src, int64_t count) {
  size_t off = (h.size() + 15) / 16 * 16;
  h.resize(off + sizeof(T) * static_cast<size_t>(count));
  if (count > 0) std::memcpy(h.data() + off, src, sizeof(T) * static_cast<size_t>(count));
  return off;
}

int upload_stream(const EventStream& s, DeviceStream& d, cudaStream_t st, char* err, int n) {
  std::vector<unsigned char> h;
  const int64_t ne = s.n_events;
  const size_t o_dur = put(h, s.duration_s, s.n_intervals);
  const size_t o_iv = put(h, s.interval, ne), o_fl = put(h, s.flags, ne);
  const size_t o_sb = put(h, s.shift_before, ne), o_sa = put(h, s.shift_after, ne);
  const size_t o_flip = put(h, s.flip_rad, ne), o_ph = put(h, s.phase_rad, ne);
  const size_t o_rx = put(h, s.rx_phase_rad, ne), o_slot = put(h, s.slot, ne);
  const size_t o_rft = s.rf_table ? put(h, s.rf_table, ne * rf_table_fields) : 0;
  h.resize(std::max<size_t>(h.size(), 16));
  BLOCHSIM_CUDA(cudaMallocAsync(&d.buf, h.size(), st), "cudaMallocAsync (event stream)");
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
  return ok;
}

struct Expand {
  int64_t shape[8];
  int64_t strides[8];
  int ndim;
};

__global__ void expand_kernel(const void* src, int is_f64, Expand e, double scale, float* dst, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    for (int d = e.ndim - 1; d >= 0; --d) {
      const int64_t idx = rem % e.shape[d];
      rem /= e.shape[d];
      off += idx * e.strides[d];
    }
    const double x = is_f64 ? static_cast<const double*>(src)[off] : static_cast<double>(static_cast<const float*>(src)[off]);
    dst[i] = static_cast<float>(x * scale);
  }
}

__global__ void bad_value_kernel(const float* x, int64_t count, int check_lower, float lower, int strict,
                                 unsigned long long* first) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    bool bad = !isfinite(v);
    if (check_lower) bad = bad || (strict ? !(v > lower) : !(v >= lower));
    if (bad) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

}  // namespace

int available(char* why, int n) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    fail(e, "cudaGetDeviceCount", why, n);
    cudaGetLastError();
    return 0;
  }
  if (count == 0) {
    if (why && n > 0) std::snprintf(why, static_cast<size_t>(n), "no CUDA device is visible");
    return 0;
  }
  return 1;
}

int device_malloc(void** p, std::size_t bytes, char* err, int n) {
  *p = nullptr;
  if (bytes == 0) return ok;
  BLOCHSIM_CUDA(cudaMalloc(p, bytes), "cudaMalloc");
  return ok;
}

int device_free(void* p, char* err, int n) {
  if (p) BLOCHSIM_CUDA(cudaFree(p), "cudaFree");
  return ok;
}

int copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream, char* err, int n) {
  if (bytes) BLOCHSIM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)), "copy to device");
  return ok;
}

int copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream, char* err, int n) {
  if (bytes) {
    BLOCHSIM_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)), "copy to host");
    BLOCHSIM_CUDA(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  }
  return ok;
}

int stream_create(void** stream, char* err, int n) {
  cudaStream_t s = nullptr;
  BLOCHSIM_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  *stream = s;
  return ok;
}

int stream_destroy(void* stream, char* err, int n) {
  if (stream) BLOCHSIM_CUDA(cudaStreamDestroy(as_stream(stream)), "cudaStreamDestroy");
  return ok;
}

int stream_synchronize(void* stream, char* err, int n) {
  BLOCHSIM_CUDA(cudaStreamSynchronize(as_stream(stream)), "cudaStreamSynchronize");
  return ok;
}

int memory_info(std::size_t* free_bytes, std::size_t* total_bytes, char* err, int n) {
  BLOCHSIM_CUDA(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
  return ok;
}

int current_device(int* device, char* err, int n) {
  BLOCHSIM_CUDA(cudaGetDevice(device), "cudaGetDevice");
  return ok;
}

int pointer_device(const void* p, int* device, char* err, int n) {
  cudaPointerAttributes a;
  BLOCHSIM_CUDA(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes");
  *device = (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) ? a.device : -1;
  return ok;
}

int expand_to_float(const void* src, int src_is_f64, int ndim, const int64_t* shape, const int64_t* strides,
                    double scale, float* dst, int64_t count, void* stream, char* err, int n) {
  if (count == 0) return ok;
  if (ndim > 8) return say(bad_shape, err, n);
  Expand e{};
  e.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    e.shape[d] = shape[d];
    e.strides[d] = strides[d];
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 65535));
  expand_kernel<<<blocks, 256, 0, as_stream(stream)>>>(src, src_is_f64, e, scale, dst, count);
  BLOCHSIM_CUDA(cudaGetLastError(), "expand_kernel launch");
  return ok;
}

int first_bad_value(const float* x, int64_t count, int check_lower, float lower, int strict, int64_t* index,
                    float* bad_value, void* stream, char* err, int n) {
  *index = -1;
  if (count == 0) return ok;
  cudaStream_t st = as_stream(stream);
  unsigned long long* d = nullptr;
  BLOCHSIM_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&d), sizeof(unsigned long long), st), "cudaMallocAsync");
  BLOCHSIM_CUDA(cudaMemsetAsync(d, 0xff, sizeof(unsigned long long), st), "cudaMemsetAsync");
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((count + 255) / 256, 4096));
  bad_value_kernel<<<blocks, 256, 0, st>>>(x, count, check_lower, lower, strict, d);
  BLOCHSIM_CUDA(cudaGetLastError(), "bad_value_kernel launch");
  unsigned long long h = 0;
  BLOCHSIM_CUDA(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, st), "copy to host");
  BLOCHSIM_CUDA(cudaFreeAsync(d, st), "cudaFreeAsync");
  BLOCHSIM_CUDA(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  if (h != ~0ull) {
    *index = static_cast<int64_t>(h);
    BLOCHSIM_CUDA(cudaMemcpy(bad_value, x + h, sizeof(float), cudaMemcpyDeviceToHost), "copy to host");
  }
  return ok;
}

std::size_t bytes_per_problem(const EventStream& s, const Tissue&) {
  std::size_t b = static_cast<std::size_t>(s.n_samples) * 8 + 9 * sizeof(float);
  int T = 1;
  if (kind_of(s, T) == plane_kind) b += static_cast<std::size_t>(epg::PlaneStore<float, true>::workspace(s)) * 4;
  return b;
}

int forward(const EventStream& s, const Tissue& t, float* out, void* stream, char* err, int n) {
  const int v = validate(s, t);
  if (v != ok) return say(v, err, n);
  cudaStream_t st = as_stream(stream);
  DeviceStream d;
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return r;
  r = launch(d.ds, t, out, st, err, n);
  const cudaError_t e = cudaFreeAsync(d.buf, st);
  if (r != ok) return r;
  if (e != cudaSuccess) return fail(e, "cudaFreeAsync", err, n);
  return ok;
}

int forward_streamed(const EventStream& s, const Tissue& t, float* out, std::size_t budget_bytes, char* err,
                     int n) {
  const int v = validate(s, t);
  if (v != ok) return say(v, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const size_t budget = budget_bytes ? budget_bytes : free_b / 10 * 8;
  const size_t per = bytes_per_problem(s, t);
  const int64_t rows_cap = std::max<int64_t>(1, stream_chunk_bytes / (s.n_samples * 8));
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>({t.n, static_cast<int64_t>(budget / (2 * per)), rows_cap}));
  const size_t out_bytes = static_cast<size_t>(chunk) * static_cast<size_t>(s.n_samples) * 8;
  using Field = Property Tissue::*;
  const Field props[9] = {&Tissue::T1_s,   &Tissue::T2_s,  &Tissue::M0,
                                &Tissue::B1,     &Tissue::B1phase_rad, &Tissue::B0_hz,
                                &Tissue::D_m2_s, &Tissue::v_m_s, &Tissue::inv_efficiency};

  cudaStream_t streams[2] = {nullptr, nullptr};
  float* d_out[2] = {nullptr, nullptr};
  float* d_tis[2] = {nullptr, nullptr};
  float* staging[2] = {nullptr, nullptr};
  int64_t pending_first[2] = {-1, -1}, pending_count[2] = {0, 0};
  DeviceStream d;
  int r = ok;
  auto cleanup = [&]() {
    for (int k = 0; k < 2; ++k) {
      if (streams[k]) cudaStreamSynchronize(streams[k]);
      if (d_out[k]) cudaFree(d_out[k]);
      if (d_tis[k]) cudaFree(d_tis[k]);
      if (staging[k]) cudaFreeHost(staging[k]);
      if (streams[k]) cudaStreamDestroy(streams[k]);
    }
    if (d.buf) cudaFree(d.buf);
  };
  auto drain = [&](int k) -> int {
    if (pending_first[k] < 0) return ok;
    const cudaError_t e = cudaStreamSynchronize(streams[k]);
    if (e != cudaSuccess) return fail(e, "cudaStreamSynchronize", err, n);
    std::memcpy(out + pending_first[k] * s.n_samples * 2, staging[k],
                static_cast<size_t>(pending_count[k]) * static_cast<size_t>(s.n_samples) * 8);
    pending_first[k] = -1;
    return ok;
  };
#define BLOCHSIM_TRY(call, what)                   \
  do {                                             \
    const cudaError_t e_ = (call);                 \
    if (e_ != cudaSuccess) {                       \
      r = fail(e_, what, err, n);                  \
      cleanup();                                   \
      return r;                                    \
    }                                              \
  } while (0)
  for (int k = 0; k < 2; ++k) {
    BLOCHSIM_TRY(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking), "cudaStreamCreate");
    BLOCHSIM_TRY(cudaMalloc(reinterpret_cast<void**>(&d_out[k]), out_bytes), "cudaMalloc (output chunk)");
    BLOCHSIM_TRY(cudaMalloc(reinterpret_cast<void**>(&d_tis[k]), 9 * sizeof(float) * static_cast<size_t>(chunk)),
                 "cudaMalloc (tissue chunk)");
    BLOCHSIM_TRY(cudaMallocHost(reinterpret_cast<void**>(&staging[k]), out_bytes), "cudaMallocHost (staging)");
  }
  r = upload_stream(s, d, streams[0], err, n);
  if (r != ok) {
    cleanup();
    return r;
  }
  BLOCHSIM_TRY(cudaStreamSynchronize(streams[0]), "cudaStreamSynchronize");
  int c = 0;
  for (int64_t first = 0; first < t.n; first += chunk, ++c) {
    const int k = c % 2;
    r = drain(k);
    if (r != ok) {
      cleanup();
      return r;
    }
    const int64_t count = std::min<int64_t>(chunk, t.n - first);
    Tissue tc = t;
    tc.n = count;
    for (int f = 0; f < 9; ++f) {
      const Property& hp = t.*props[f];
      Property& dp = tc.*props[f];
      if (!hp.present()) continue;
      float* dst = d_tis[k] + static_cast<int64_t>(f) * chunk;
      const int64_t m = hp.stride == 0 ? 1 : count;
      BLOCHSIM_TRY(cudaMemcpyAsync(dst, hp.data + (hp.stride == 0 ? 0 : first), sizeof(float) * m,
                                   cudaMemcpyHostToDevice, streams[k]),
                   "copy of a tissue chunk");
      dp.data = dst;
      dp.stride = hp.stride == 0 ? 0 : 1;
    }
    r = launch(d.ds, tc, d_out[k], streams[k], err, n);
    if (r != ok) {
      cleanup();
      return r;
    }
    BLOCHSIM_TRY(cudaMemcpyAsync(staging[k], d_out[k], static_cast<size_t>(count) * s.n_samples * 8,
                                 cudaMemcpyDeviceToHost, streams[k]),
                 "copy of an output chunk");
    pending_first[k] = first;
    pending_count[k] = count;
  }
  for (int k = 0; k < 2; ++k) {
    // drain in the order the chunks were issued
    const int kk = (c + k) % 2;
    r = drain(kk);
    if (r != ok) {
      cleanup();
      return r;
    }
  }
#undef BLOCHSIM_TRY
  cleanup();
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
