// The device backend's launcher, behind a plain C++ header (no CUDA types),
// so that the Cython extension is the same with and without CUDA.  Built
// with CUDA from launcher.cu, without it from stub.cpp (every call then
// returns no_cuda).
//
// Return codes: 0 on success, a blochsim Status (config.hpp) for a bad
// stream, or cuda_error_base + the cudaError_t value for a CUDA error; on
// any failure `err` (n bytes) receives a message naming the CUDA error.
#pragma once

#include <cstddef>
#include <cstdint>

#include <blochsim/epg/keyed.hpp>
#include <blochsim/events.hpp>
#include <blochsim/match.hpp>
#include <blochsim/noise.hpp>
#include <blochsim/perk.hpp>
#include <blochsim/pools/pools.hpp>

namespace blochsim {
namespace cuda {

// 1 if the device backend is compiled and a device is usable; otherwise 0,
// with the reason written into why.
int available(char* why, int n);

// Device memory, copies and streams for the Python layer.  Streams are
// opaque handles (cudaStream_t); 0 is the legacy default stream.
int device_malloc(void** p, std::size_t bytes, char* err, int n);
int device_free(void* p, char* err, int n);
// Stream-ordered allocation (no device-wide synchronisation): the memory is
// usable by work ordered after it on `stream` and freed in stream order.
int device_malloc_async(void** p, std::size_t bytes, void* stream, char* err, int n);
int device_free_async(void* p, void* stream, char* err, int n);
int copy_to_device(void* dst, const void* src, std::size_t bytes, void* stream, char* err, int n);
int copy_to_host(void* dst, const void* src, std::size_t bytes, void* stream, char* err, int n);
int stream_create(void** stream, char* err, int n);
int stream_destroy(void* stream, char* err, int n);
int stream_synchronize(void* stream, char* err, int n);
int memory_info(std::size_t* free_bytes, std::size_t* total_bytes, char* err, int n);
int current_device(int* device, char* err, int n);
// The device a pointer belongs to (-1 for host memory).
int pointer_device(const void* p, int* device, char* err, int n);

// dst[i] = float(scale * src[offset(i)]) for i < count, where src is float32
// (src_is_f64 = 0) or float64 and offset(i) broadcasts src (ndim <= 8, the
// shape of the full index space, element strides with 0 for broadcast axes).
int expand_to_float(const void* src, int src_is_f64, int ndim, const int64_t* shape,
                    const int64_t* strides, double scale, float* dst, int64_t count, void* stream, char* err, int n);

// One check of first_bad_values: the elements x[0, count) must be finite
// and, with check_lower, x > lower (strict) or x >= lower.
struct ValueCheck {
  const float* x;
  int64_t count;
  int check_lower;
  float lower;
  int strict;
};

// For each of the m checks, the index of the first element that fails it
// in index[j] (-1 if none) and its value in bad_value[j]: every check is
// launched on `stream`, then one copy back and one synchronisation serve
// them all.
int first_bad_values(const ValueCheck* checks, int m, int64_t* index, float* bad_value, void* stream, char* err,
                     int n);

// Forward EPG on the device.  The stream's arrays are host pointers (copied
// here, unless `kept` is its copy on the device: keep_stream); the tissue's
// Property pointers and out are device pointers; out is (t.n, s.n_samples)
// complex64 interleaved.  Ordered on `stream`, not synchronised.
int forward(const EventStream& s, const Tissue& t, float* out, void* stream, char* err, int n,
            const EventStream* kept = nullptr);
// s copied to the current device until free_kept_stream(*buf): *view is s
// with device pointers, for forward's `kept`.
int keep_stream(const EventStream& s, EventStream* view, void** buf, char* err, int n);
void free_kept_stream(void* buf);

// The moment-keyed EPG on the device (cuda/keyed.cuh): the program's arrays
// are host pointers, the rest as forward().  Ordered on `stream`.
int keyed_forward(const EventStream& s, const KeyedProgram& k, const Tissue& t, float* out, void* stream, char* err,
                  int n);

// Signal and tissue Jacobian on the device in one pass (cuda.cuh
// jacobian_device): fields are 1 to tissue_fields distinct TissueField values,
// seeds[j] the seed of direction j; jac is a device (t.n, n_dirs,
// s.n_samples) complex64 array.  Ordered on `stream`.
int jacobian(const EventStream& s, const Tissue& t, const int* fields, const float* seeds, int n_dirs, float* out,
             float* jac, void* stream, char* err, int n);

// Reverse mode on the device (cuda.cuh adjoint_device): cot (t.n,
// s.n_samples) complex64 and tgrad (t.n, n_tdirs) float32 are device
// pointers, ev_grad (s.n_events, 4) float64 a host array written before the
// call returns (it synchronises `stream`); fields as host_adjoint_dispatch.
int adjoint(const EventStream& s, const Tissue& t, const int* fields, int n_tdirs, const float* cot, double* ev_grad,
            float* tgrad, void* stream, char* err, int n);

// Second order on the device (cuda.cuh adjoint2_device): cot a device
// pointer with row stride cot_stride complex values, ev_grad (s.n_events, 4)
// float64 a host array written before the call returns.
int adjoint2(const EventStream& s, const Tissue& t, int outer_field, const float* cot, int64_t cot_stride,
             double* ev_grad, void* stream, char* err, int n);

// Forward EPG of host tissue arrays into a host output, streamed through the
// device in chunks that fit `budget_bytes` of device memory (0: most of the
// free memory), two streams overlapping copies and compute.  Synchronous.
int forward_streamed(const EventStream& s, const Tissue& t, float* out, std::size_t budget_bytes, char* err,
                     int n);

// The pooled EPG (pools/pools.hpp) on the device for host inputs and outputs
// (cuda.cuh pooled_from_host): t's and p's Property pointers, out and jac
// are host pointers; with n_dirs > 0 the Jacobian along fields (as
// host_pooled_dispatch) too.  Synchronous.
int pooled(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs, const float* seeds,
           float* out, float* jac, char* err, int n);

// The pooled EPG of device properties into a device output (cuda.cuh
// pooled_device): the stream's arrays are host pointers; t's and p's
// Property pointers, out and jac are device pointers whose values the caller
// has checked (fractions, rates, times); with n_dirs > 0 the Jacobian along
// fields too.  Ordered on `stream` and synchronised with it.
int pooled_resident(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_dirs,
                    const float* seeds, float* out, float* jac, void* stream, char* err, int n);

// Reverse mode with pools on the device for host inputs and outputs
// (cuda.cuh pooled_adjoint_from_host; arguments and results as
// host_pooled_adjoint_dispatch).  Synchronous.
int pooled_adjoint(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_tdirs,
                   const float* cot, double* ev_grad, float* tgrad, unsigned mask, char* err, int n);

// Reverse mode with pools of device properties (cuda.cuh
// pooled_adjoint_device): cot and tgrad are device arrays, ev_grad a host
// array; the rest as pooled_adjoint().  Ordered on `stream`, synchronous.
int pooled_adjoint_resident(const EventStream& s, const Tissue& t, const Pools& p, const int* fields, int n_tdirs,
                            const float* cot, double* ev_grad, float* tgrad, unsigned mask, void* stream, char* err,
                            int n);

// The k best atoms of every signal of p into r (cuda/match.cuh
// match_device): p's signals and atoms and r's arrays are device pointers.
// Ordered on `stream`, not synchronised.
int match(const MatchProblem& p, const MatchResult& r, void* stream, char* err, int n);
// The largest k match() takes (0 when built without CUDA).
int match_max_k();
// Row norms (double) and rows, unit-scaled when `unit`, projected on a
// basis (c, r) or copied (cuda/match.cuh project_device); device pointers,
// ordered on `stream`.
int project(const float* rows, int64_t count, int64_t c, const float* basis, int64_t r, int unit, float* out,
            double* norms, void* stream, char* err, int n);
// Each signal's m candidate atoms: their inner products with it and their
// norms, in double (cuda/match.cuh candidate_dots_device); device pointers,
// ordered on `stream`.
int candidate_dots(const float* atoms, const float* signals, int64_t count, int64_t m, int64_t c, double* dots,
                   double* norms, void* stream, char* err, int n);

// PERK's fused map of `count` voxels (cuda/perk.cuh perk_device): x
// (count, m.d), out (count, m.p), and with a cotangent g (count, m.p) its
// pullback xbar (count, m.d); the model's arrays too are device pointers.
// Ordered on `stream`.
int perk(const PerkModel& m, const float* x, const float* g, int64_t count, float* out, float* xbar, void* stream,
         char* err, int n);

// PERK's inputs from complex signals (cuda/perk.cuh perk_inputs_device);
// device pointers, ordered on `stream`.
int perk_inputs(const float* s, int64_t count, int64_t c, int mode, int normalize, const float* basis, int64_t r,
                const float* known, int64_t nk, float* x, int64_t d, void* stream, char* err, int n);

// The sums of one PERK training block (cuda/perk.cuh perk_moments_device);
// device pointers, ordered on `stream`.
int perk_moments(const PerkModel& m, const float* x, const double* t, int64_t count, int64_t p, float scale,
                 double* sz, double* szz, double* stz, void* stream, char* err, int n);

// z[j] += sigma · (complex normal first + j of k) for the count complex64
// values of device array z (cuda/noise.cuh); ordered on `stream`.
int noise_add(float* z, int64_t count, int64_t first, double sigma, const NoiseKey& k, void* stream, char* err,
              int n);
// a[j] += b[j] for count doubles of device arrays; ordered on `stream`.
int add(double* a, const double* b, int64_t count, void* stream, char* err, int n);

// How many device bytes one problem needs (output, tissue, scratch).
std::size_t bytes_per_problem(const EventStream& s, const Tissue& t);

}  // namespace cuda
}  // namespace blochsim
