// The device backend's pooled reverse mode (launcher.hpp): the adjoint
// kernel of the pooled EPG (cuda/pools.cuh), in a translation unit of its
// own (see launcher.cu).
#include <blochsim/cuda/pools.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int pooled_adjoint(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_tdirs,
                   const float* cot, double* ev_grad, float* tgrad, unsigned mask, char* err, int n) {
  return guarded([&] { return pooled_adjoint_from_host(s, t, p, fields, n_tdirs, cot, ev_grad, tgrad, err, n, mask); });
}

int pooled_adjoint_resident(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_tdirs,
                            const float* cot, double* ev_grad, float* tgrad, unsigned mask, void* stream, char* err,
                            int n) {
  return guarded([&] {
    return pooled_adjoint_device(s, t, p, fields, n_tdirs, cot, ev_grad, tgrad, as_stream(stream), err, n, mask);
  });
}

}  // namespace cuda
}  // namespace blochsim
