// The device backend's matching entry (launcher.hpp): the fused matching
// kernel of cuda/match.cuh, in a translation unit of its own (see
// launcher.cu).
#include <blochsim/cuda/match.cuh>
#include <blochsim/host/interrupt.hpp>

#include "launcher.hpp"

namespace blochsim {
namespace cuda {

using namespace detail;

int match(const MatchProblem& p, const MatchResult& r, void* stream, char* err, int n) {
  return guarded([&] { return match_device(p, r, as_stream(stream), err, n); });
}

int match_max_k() { return match_device_max_k; }

int project(const float* rows, int64_t count, int64_t c, const float* basis, int64_t r, int unit, float* out,
            double* norms, void* stream, char* err, int n) {
  return guarded([&] { return project_device(rows, count, c, basis, r, unit != 0, out, norms, as_stream(stream), err, n); });
}

int candidate_dots(const float* atoms, const float* signals, int64_t count, int64_t m, int64_t c, double* dots,
                   double* norms, void* stream, char* err, int n) {
  return guarded([&] { return candidate_dots_device(atoms, signals, count, m, c, dots, norms, as_stream(stream), err, n); });
}

}  // namespace cuda
}  // namespace blochsim
