// The device backend's reverse-mode entries (launcher.hpp): the adjoint
// kernels of cuda/adjoint.cuh, in a translation unit of their own (see
// launcher.cu).
#include <blochsim/cuda/adjoint.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int adjoint(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot, double* ev_grad,
            float* tgrad, void* stream, char* err, int n) {
  return guarded([&] { return adjoint_device(s, t, fields, n_tdirs, cot, ev_grad, tgrad, as_stream(stream), err, n); });
}

int adjoint2(const EventStream& s, const Tissue& t, int outer_field, const float* cot, int64_t cot_stride,
             double* ev_grad, void* stream, char* err, int n) {
  return guarded([&] { return adjoint2_device(s, t, outer_field, cot, cot_stride, ev_grad, as_stream(stream), err, n); });
}

}  // namespace cuda
}  // namespace blochsim
