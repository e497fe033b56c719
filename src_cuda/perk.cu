// The device backend's PERK entries (launcher.hpp): the fused map and
// pullback of cuda/perk.cuh, the training sums, and the training's noise
// (cuda/noise.cuh), in a translation unit of their own (see launcher.cu).
#include <blochsim/cuda/noise.cuh>
#include <blochsim/cuda/perk.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int perk(const PerkModel& m, const float* x, const float* g, int64_t count, float* out, float* xbar, void* stream,
         char* err, int n) {
  return guarded([&] { return perk_device(m, x, g, count, out, xbar, as_stream(stream), err, n); });
}

int perk_inputs(const float* s, int64_t count, int64_t c, int mode, int normalize, const float* basis, int64_t r,
                const float* known, int64_t nk, float* x, int64_t d, void* stream, char* err, int n) {
  return guarded([&] {
    return perk_inputs_device(s, count, c, mode, normalize != 0, basis, r, known, nk, x, d, as_stream(stream), err, n);
  });
}

int perk_moments(const PerkModel& m, const float* x, const double* t, int64_t count, int64_t p, float scale,
                 double* sz, double* szz, double* stz, void* stream, char* err, int n) {
  return guarded([&] { return perk_moments_device(m, x, t, count, p, scale, sz, szz, stz, as_stream(stream), err, n); });
}

int noise_add(float* z, int64_t count, int64_t first, double sigma, const NoiseKey& k, void* stream, char* err,
              int n) {
  return guarded([&] { return noise_add_device(z, count, first, sigma, k, as_stream(stream), err, n); });
}

int add(double* a, const double* b, int64_t count, void* stream, char* err, int n) {
  return guarded([&] { return add_device(a, b, count, as_stream(stream), err, n); });
}

}  // namespace cuda
}  // namespace blochsim
