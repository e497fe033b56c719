// The moment-keyed EPG on the device (epg/keyed.hpp): one thread a
// problem, every thread playing the same program, so that the maps' reads
// of the program are uniform across a warp; the states of a chunk of
// problems in two device buffers with each component's problems side by
// side (StridedBuffer), so that a warp's reads and writes of a component
// are coalesced.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "../epg/keyed.hpp"
#include "forward.cuh"

namespace blochsim {
namespace cuda {
namespace detail {

__global__ void keyed_kernel(EventStream s, KeyedProgram k, Tissue t, int64_t first, int64_t count, float* buf,
                             float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const epg::StridedBuffer<float> a{buf + i, count};
  const epg::StridedBuffer<float> b{buf + 6 * static_cast<int64_t>(k.max_slots) * count + i, count};
  epg::keyed_thread<float>(s, k, t, first + i, a, b, out);
}

// The program's arrays copied to the device as one buffer.
inline int upload_program(const KeyedProgram& k, KeyedProgram& dk, void** buf, cudaStream_t st, char* err, int n) {
  std::vector<unsigned char> h;
  const int64_t maps = 2 * k.n_events, entries = k.n_events > 0 ? k.first[maps] : 0;
  const size_t o_slots = put(h, k.slots, maps), o_first = put(h, k.first, maps + 1);
  const size_t o_dst = put(h, k.dst, entries), o_src = put(h, k.src, entries);
  const size_t o_k2 = k.k2 ? put(h, k.k2, k.n_k2) : 0, o_k2f = k.k2 ? put(h, k.k2_first, maps) : 0;
  const size_t o_reach = k.reach ? put(h, k.reach, k.n_reach) : 0;
  h.resize(std::max<size_t>(h.size(), 16));
  BLOCHSIM_CUDA(pool_malloc(buf, h.size(), st), "cudaMallocFromPoolAsync (keyed program)");
  BLOCHSIM_CUDA(cudaMemcpyAsync(*buf, h.data(), h.size(), cudaMemcpyHostToDevice, st), "copy of the keyed program");
  unsigned char* b = static_cast<unsigned char*>(*buf);
  dk = k;
  dk.slots = reinterpret_cast<const int32_t*>(b + o_slots);
  dk.first = reinterpret_cast<const int64_t*>(b + o_first);
  dk.dst = reinterpret_cast<const int32_t*>(b + o_dst);
  dk.src = reinterpret_cast<const int32_t*>(b + o_src);
  dk.k2 = k.k2 ? reinterpret_cast<const double*>(b + o_k2) : nullptr;
  dk.k2_first = k.k2 ? reinterpret_cast<const int64_t*>(b + o_k2f) : nullptr;
  dk.reach = k.reach ? reinterpret_cast<const uint8_t*>(b + o_reach) : nullptr;
  return ok;
}

}  // namespace detail

// The moment-keyed EPG on the device.  The stream's and the program's
// arrays are host pointers (copied here, stream-ordered); the tissue's
// Property pointers and out are device pointers, out (t.n, s.n_samples)
// complex64 interleaved.  The states take 48 max_slots bytes a problem: the
// problems are played in chunks that fit half the free device memory.
// Ordered on `stream`, not synchronised.  Returns 0, a blochsim Status, or
// cuda_error_base + cudaError_t with a message in err (n bytes).
template <int Unused = 0>
inline int keyed_device(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out,
                        cudaStream_t stream, char* err = nullptr, int n = 0) {
  using detail::fail;
  int v = validate(s, t, false, false);
  if (v == ok) v = validate_keyed(s, k);
  if (v == ok) v = keyed_plays(k, t);
  if (v != ok) return detail::say(v, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const int64_t per = 48 * static_cast<int64_t>(k.max_slots);
  const int64_t chunk = std::min<int64_t>(t.n, std::max<int64_t>(1, static_cast<int64_t>(free_b / 2) / per));
  detail::DeviceStream d;
  int r = detail::upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  KeyedProgram dk;
  void* pbuf = nullptr;
  r = detail::upload_program(k, dk, &pbuf, stream, err, n);
  void* work = nullptr;
  if (r == ok) {
    const cudaError_t e = detail::pool_malloc(&work, static_cast<size_t>(chunk * per), stream);
    if (e != cudaSuccess) r = detail::fail(e, "cudaMallocFromPoolAsync (keyed states)", err, n);
  }
  for (int64_t first = 0; r == ok && first < t.n; first += chunk) {
    const int64_t count = std::min(chunk, t.n - first);
    detail::keyed_kernel<<<static_cast<unsigned>((count + 127) / 128), 128, 0, stream>>>(
        d.ds, dk, t, first, count, static_cast<float*>(work), out);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) r = detail::fail(e, "keyed_kernel launch", err, n);
  }
  if (work) cudaFreeAsync(work, stream);
  if (pbuf) cudaFreeAsync(pbuf, stream);
  cudaFreeAsync(d.buf, stream);
  return r;
}

}  // namespace cuda
}  // namespace blochsim
