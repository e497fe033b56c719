// Reverse mode on the device: the adjoint sweep of epg/adjoint.hpp one thread a
// problem, its block accumulators, adjoint_device() and adjoint2_device().
#pragma once

#include "../epg/adjoint.hpp"
#include "forward.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

// ---------------------------------------------------------------------------
// Reverse mode: the adjoint sweep of epg/adjoint.hpp, one thread per problem.
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

// Second order (epg/adjoint.hpp): the sweep on Dual<float, 1> seeded in
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

// partial (blocks, m) summed over the blocks in order into out (m,).  A
// template so that every .cu file including this header may instantiate it.
template <int Unused = 0>
__global__ void sum_partials_kernel(const double* partial, int64_t blocks, int64_t m, double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) return;
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += partial[b * m + i];
  out[i] = sum;
}

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
    sum_partials_kernel<0><<<static_cast<unsigned>((m + 255) / 256), 256, 0, stream>>>(partial, blocks_total, m, dsum);
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

// Reverse mode on the device (epg/adjoint.hpp): the tissue's Property pointers,
// cot (t.n, s.n_samples) complex64 and tgrad (t.n, n_tdirs) float32 are
// device pointers; ev_grad (s.n_events, event_gradients) float64 is a host
// array, written when the call returns (it synchronises `stream`).  The
// problems run in launches of as many as fit in half the free memory.
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
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
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
inline int adjoint2_device(const EventStream& s, const Tissue& t, int outer_field, const float* cot,
                           int64_t cot_stride, double* ev_grad, cudaStream_t stream, char* err = nullptr,
                           int n = 0) {
  using namespace detail;
  const int v = validate(s, t, false, false);
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

}  // namespace cuda
}  // namespace blochsim
