// The launcher when blochsim is built without CUDA: every call reports why.
#include "launcher.hpp"

#include <cstdio>

namespace blochsim {
namespace cuda {

namespace {
int no(char* err, int n) {
  if (err && n > 0) std::snprintf(err, static_cast<size_t>(n), "%s", status_message(no_cuda));
  return no_cuda;
}
}  // namespace

int available(char* why, int n) {
  no(why, n);
  return 0;
}

int device_malloc(void**, std::size_t, char* err, int n) { return no(err, n); }
int device_free(void*, char* err, int n) { return no(err, n); }
int device_malloc_async(void**, std::size_t, void*, char* err, int n) { return no(err, n); }
int device_free_async(void*, void*, char* err, int n) { return no(err, n); }
int copy_to_device(void*, const void*, std::size_t, void*, char* err, int n) { return no(err, n); }
int copy_to_host(void*, const void*, std::size_t, void*, char* err, int n) { return no(err, n); }
int stream_create(void**, char* err, int n) { return no(err, n); }
int stream_destroy(void*, char* err, int n) { return no(err, n); }
int stream_synchronize(void*, char* err, int n) { return no(err, n); }
int memory_info(std::size_t*, std::size_t*, char* err, int n) { return no(err, n); }
int current_device(int*, char* err, int n) { return no(err, n); }
int pointer_device(const void*, int*, char* err, int n) { return no(err, n); }
int expand_to_float(const void*, int, int, const int64_t*, const int64_t*, double, float*, int64_t, void*,
                    char* err, int n) {
  return no(err, n);
}
int first_bad_values(const ValueCheck*, int, int64_t*, float*, void*, char* err, int n) {
  return no(err, n);
}
int forward(const EventStream&, const Tissue&, float*, void*, char* err, int n, const EventStream*) {
  return no(err, n);
}
int keep_stream(const EventStream&, EventStream*, void**, char* err, int n) { return no(err, n); }
void free_kept_stream(void*) {}
int keyed_forward(const EventStream&, const KeyedProgram&, const Tissue&, float*, void*, char* err, int n) {
  return no(err, n);
}
int jacobian(const EventStream&, const Tissue&, const int*, const float*, int, float*, float*, void*, char* err,
             int n) {
  return no(err, n);
}
int adjoint(const EventStream&, const Tissue&, const int*, int, const float*, double*, float*, void*, char* err,
            int n) {
  return no(err, n);
}
int adjoint2(const EventStream&, const Tissue&, int, const float*, int64_t, double*, void*, char* err, int n) {
  return no(err, n);
}
int pooled(const EventStream&, const Tissue&, const Pools&, const int*, int, const float*, float*, float*, char* err,
           int n) {
  return no(err, n);
}
int pooled_resident(const EventStream&, const Tissue&, const Pools&, const int*, int, const float*, float*, float*,
                    void*, char* err, int n) {
  return no(err, n);
}
int pooled_adjoint(const EventStream&, const Tissue&, const Pools&, const int*, int, const float*, double*, float*,
                   unsigned, char* err, int n) {
  return no(err, n);
}
int pooled_adjoint_resident(const EventStream&, const Tissue&, const Pools&, const int*, int, const float*, double*,
                            float*, unsigned, void*, char* err, int n) {
  return no(err, n);
}
int forward_streamed(const EventStream&, const Tissue&, float*, std::size_t, char* err, int n) {
  return no(err, n);
}
int match(const MatchProblem&, const MatchResult&, void*, char* err, int n) { return no(err, n); }
int match_max_k() { return 0; }
int project(const float*, int64_t, int64_t, const float*, int64_t, int, float*, double*, void*, char* err, int n) {
  return no(err, n);
}
int candidate_dots(const float*, const float*, int64_t, int64_t, int64_t, double*, double*, void*, char* err,
                   int n) {
  return no(err, n);
}
int perk(const PerkModel&, const float*, const float*, int64_t, float*, float*, void*, char* err, int n) {
  return no(err, n);
}
int perk_inputs(const float*, int64_t, int64_t, int, int, const float*, int64_t, const float*, int64_t, float*,
                int64_t, void*, char* err, int n) {
  return no(err, n);
}
int perk_moments(const PerkModel&, const float*, const double*, int64_t, int64_t, float, double*, double*, double*,
                 void*, char* err, int n) {
  return no(err, n);
}
int noise_add(float*, int64_t, int64_t, double, const NoiseKey&, void*, char* err, int n) { return no(err, n); }
int add(double*, const double*, int64_t, void*, char* err, int n) { return no(err, n); }
std::size_t bytes_per_problem(const EventStream&, const Tissue&) { return 0; }

}  // namespace cuda
}  // namespace blochsim
