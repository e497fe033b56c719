// The device backend's pooled entries (launcher.hpp): the forward and
// Jacobian kernels of the pooled EPG (cuda/pools.cuh), in a translation
// unit of their own (see launcher.cu); pools_adjoint.cu holds its reverse
// mode.
#include <blochsim/cuda/pools.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int pooled(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs, const float* seeds,
           float* out, float* jac, char* err, int n) {
  return guarded([&] { return pooled_from_host(s, t, p, out, err, n, fields, n_dirs, seeds, jac); });
}

int pooled_resident(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                    const float* seeds, float* out, float* jac, void* stream, char* err, int n) {
  return guarded(
      [&] { return pooled_device(s, t, p, out, as_stream(stream), err, n, fields, n_dirs, seeds, jac); });
}

}  // namespace cuda
}  // namespace blochsim
