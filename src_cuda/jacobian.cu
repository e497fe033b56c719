// The device backend's Jacobian entries (launcher.hpp): the forward-mode
// kernel of cuda/jacobian.cuh, in a translation unit of its own (see
// launcher.cu).
#include <blochsim/cuda/jacobian.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int jacobian(const EventStream& s, const Tissue& t, const int* fields, const float* seeds, int n_dirs, float* out,
             float* jac, void* stream, char* err, int n) {
  return guarded([&] { return jacobian_device(s, t, fields, n_dirs, out, jac, as_stream(stream), err, n, seeds); });
}

}  // namespace cuda
}  // namespace blochsim
