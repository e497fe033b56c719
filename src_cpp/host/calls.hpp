// The extension's entries: one per operation, each taking one Call that
// says where it runs (the host's lanes, the device on device arrays, or the
// device for host arrays), so that the Cython layer has one wrapper shape.
// Each returns a Status (config.hpp), cuda_error_base + a cudaError_t with
// a message in err, and never throws.
#pragma once

#include <cstddef>
#include <cstdint>

#include <blochsim/epg/keyed.hpp>
#include <blochsim/events.hpp>
#include <blochsim/pools/pools.hpp>

namespace blochsim {

// Where a call runs.
enum CallPlace : int {
  on_host = 0,         // the host kernels on host arrays
  on_device = 1,       // the device kernels on device arrays, ordered on cuda_stream
  through_device = 2,  // the device kernels on host arrays moved through the device
};

// Everything an operation reads and writes; an operation reads only its
// own members (the others stay at their defaults).
struct Call {
  int place = on_host;
  const EventStream* stream = nullptr;
  const KeyedProgram* program = nullptr;  // the moment-keyed EPG's program (host; forward also on the device)
  const Tissue* tissue = nullptr;
  const Pools* pools = nullptr;
  const int* fields = nullptr;  // derivative directions (field numbers)
  int n_dirs = 0;
  const float* seeds = nullptr;  // d field / d direction, per direction
  float* out = nullptr;          // (n, n_samples) complex64
  float* jac = nullptr;          // (n, n_dirs, n_samples) complex64
  const float* cot = nullptr;    // the cotangent, complex64
  int64_t cot_stride = 0;        // adjoint2: complex values between problems' cotangent rows
  int outer_field = -1;          // adjoint2: the second-order direction
  double* ev_grad = nullptr;     // event gradients, host
  float* tgrad = nullptr;        // (n, n_dirs) tissue gradients
  unsigned mask = 0;             // pooled adjoint: the event columns computed
  int threads = 1;               // host threads
  int variant = 0;               // host: the device's register team emulated (tests)
  void* cuda_stream = nullptr;   // on_device: the stream the work is ordered on
  const EventStream* kept = nullptr;  // on_device forward: the stream's copy on the device (keep_stream), or null
  std::size_t budget_bytes = 0;  // through_device forward: device memory per chunk pair (0: most of it)
  char* err = nullptr;           // the message of a failed CUDA call
  int err_len = 0;
};

// Signal: forward (and, with program, the moment-keyed EPG).
int call_forward(const Call& c) noexcept;
// Signal and tissue Jacobian along fields[0 .. n_dirs).
int call_jacobian(const Call& c) noexcept;
// Reverse mode: ev_grad (n_events, 4) and tgrad along fields.
int call_adjoint(const Call& c) noexcept;
// Second order along outer_field: ev_grad (n_events, 4).
int call_adjoint2(const Call& c) noexcept;
// With pools: signal and, with n_dirs > 0, the Jacobian along fields.
int call_pooled(const Call& c) noexcept;
// With pools, reverse mode: ev_grad (n_events, 6) and tgrad along fields.
int call_pooled_adjoint(const Call& c) noexcept;

}  // namespace blochsim
