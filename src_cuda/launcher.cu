// The device backend behind launcher.hpp, one translation unit per kernel
// family so that they compile in parallel and a change recompiles one
// family: this file holds the forward kernels (cuda/forward.cuh), the
// streamed forward, and the memory, copy and validation helpers of the
// Python layer; jacobian.cu, adjoint.cu and pools.cu the others.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <blochsim/cuda/forward.cuh>
#include <blochsim/cuda/keyed.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {
namespace {

using namespace detail;

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

int device_malloc_async(void** p, std::size_t bytes, void* stream, char* err, int n) {
  *p = nullptr;
  if (bytes == 0) return ok;
  BLOCHSIM_CUDA(pool_malloc(p, bytes, as_stream(stream)), "cudaMallocFromPoolAsync");
  return ok;
}

int device_free_async(void* p, void* stream, char* err, int n) {
  if (p) BLOCHSIM_CUDA(cudaFreeAsync(p, as_stream(stream)), "cudaFreeAsync");
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
  no_stale_error();
  expand_kernel<<<blocks, 256, 0, as_stream(stream)>>>(src, src_is_f64, e, scale, dst, count);
  BLOCHSIM_CUDA(cudaGetLastError(), "expand_kernel launch");
  return ok;
}

int first_bad_values(const ValueCheck* checks, int m, int64_t* index, float* bad_value, void* stream, char* err,
                     int n) {
  for (int j = 0; j < m; ++j) index[j] = -1;
  if (m <= 0) return ok;
  cudaStream_t st = as_stream(stream);
  const size_t bytes = sizeof(unsigned long long) * static_cast<size_t>(m);
  unsigned long long* d = nullptr;
  BLOCHSIM_CUDA(pool_malloc(reinterpret_cast<void**>(&d), bytes, st), "cudaMallocFromPoolAsync");
  BLOCHSIM_CUDA(cudaMemsetAsync(d, 0xff, bytes, st), "cudaMemsetAsync");
  no_stale_error();
  for (int j = 0; j < m; ++j) {
    const ValueCheck& c = checks[j];
    if (c.count == 0) continue;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((c.count + 255) / 256, 4096));
    bad_value_kernel<<<blocks, 256, 0, st>>>(c.x, c.count, c.check_lower, c.lower, c.strict, d + j);
    BLOCHSIM_CUDA(cudaGetLastError(), "bad_value_kernel launch");
  }
  std::vector<unsigned long long> h(static_cast<size_t>(m));
  BLOCHSIM_CUDA(cudaMemcpyAsync(h.data(), d, bytes, cudaMemcpyDeviceToHost, st), "copy to host");
  BLOCHSIM_CUDA(cudaFreeAsync(d, st), "cudaFreeAsync");
  BLOCHSIM_CUDA(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  for (int j = 0; j < m; ++j) {
    if (h[j] == ~0ull) continue;
    index[j] = static_cast<int64_t>(h[j]);
    BLOCHSIM_CUDA(cudaMemcpy(bad_value + j, checks[j].x + h[j], sizeof(float), cudaMemcpyDeviceToHost),
                  "copy to host");
  }
  return ok;
}

std::size_t bytes_per_problem(const EventStream& s, const Tissue&) {
  std::size_t b = static_cast<std::size_t>(s.n_samples) * 8 + tissue_fields * sizeof(float);
  const Shape sh = shape_of(s);
  if (sh.kind == tail_kind) b += 4 * static_cast<std::size_t>(tail_workspace(s, sh.T));
  return b;
}

int forward(const EventStream& s, const Tissue& t, float* out, void* stream, char* err, int n,
            const EventStream* kept) {
  return guarded([&] { return forward_device(s, t, out, as_stream(stream), err, n, kept); });
}

int keep_stream(const EventStream& s, EventStream* view, void** buf, char* err, int n) {
  return guarded([&] { return keep_stream_device(s, view, buf, err, n); });
}

void free_kept_stream(void* buf) {
  if (buf) cudaFree(buf);
}

int keyed_forward(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out, void* stream, char* err,
                  int n) {
  return guarded([&] { return keyed_device(s, k, t, out, as_stream(stream), err, n); });
}

int forward_streamed_unguarded(const EventStream& s, const Tissue& t, float* out, std::size_t budget_bytes,
                               char* err, int n);

int forward_streamed(const EventStream& s, const Tissue& t, float* out, std::size_t budget_bytes, char* err,
                     int n) {
  return guarded([&] { return forward_streamed_unguarded(s, t, out, budget_bytes, err, n); });
}

int forward_streamed_unguarded(const EventStream& s, const Tissue& t, float* out, std::size_t budget_bytes,
                               char* err, int n) {
  const int v = validate(s, t, false, false);
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
    BLOCHSIM_TRY(cudaMalloc(reinterpret_cast<void**>(&d_tis[k]), tissue_fields * sizeof(float) * static_cast<size_t>(chunk)),
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
  Stop halt;  // the caller's poll (Ctrl-C in Python), between chunks
  for (int64_t first = 0; first < t.n; first += chunk, ++c) {
    const int k = c % 2;
    if (halt()) {
      cleanup();
      return static_cast<int>(interrupted);
    }
    r = drain(k);
    if (r != ok) {
      cleanup();
      return r;
    }
    const int64_t count = std::min<int64_t>(chunk, t.n - first);
    Tissue tc = t;
    tc.n = count;
    for (int f = 0; f < tissue_fields; ++f) {
      const Property& hp = t[f];
      Property& dp = tc[f];
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
