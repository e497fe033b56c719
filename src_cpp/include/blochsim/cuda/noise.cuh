// Complex Gaussian noise on the device (noise.hpp: the host's numbers), and
// the elementwise sum of double arrays that training sums are combined by.
#pragma once

#include <cuda_runtime.h>

#include "../noise.hpp"
#include "runtime.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

__global__ void noise_kernel(float* z, int64_t n, int64_t first, double sigma, NoiseKey k) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step)
    noise_add_one(z, j, first, sigma, k);
}

__global__ void add_kernel(double* a, const double* b, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += step) a[j] += b[j];
}

inline unsigned stride_blocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

}  // namespace detail

// z[j] += sigma · (complex normal first + j of k) for the count complex64
// values of device array z.  Ordered on `stream`.
inline int noise_add_device(float* z, int64_t count, int64_t first, double sigma, const NoiseKey& k,
                            cudaStream_t stream, char* err, int n) {
  using namespace detail;
  if (count < 0 || first < 0) return say(bad_shape, err, n);
  if (count == 0) return ok;
  no_stale_error();
  noise_kernel<<<stride_blocks(count), 256, 0, stream>>>(z, count, first, sigma, k);
  BLOCHSIM_CUDA(cudaGetLastError(), "noise kernel launch");
  return ok;
}

// a[j] += b[j] for the count doubles of device arrays a and b.  Ordered
// on `stream`.
inline int add_device(double* a, const double* b, int64_t count, cudaStream_t stream, char* err, int n) {
  using namespace detail;
  if (count < 0) return say(bad_shape, err, n);
  if (count == 0) return ok;
  no_stale_error();
  add_kernel<<<stride_blocks(count), 256, 0, stream>>>(a, b, count);
  BLOCHSIM_CUDA(cudaGetLastError(), "add kernel launch");
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
