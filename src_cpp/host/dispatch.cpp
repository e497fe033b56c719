// Host backend of the extension: the header-only kernels compiled once per
// x86-64 level through GCC function multiversioning (target_clones).  The
// kernels are force-inlined into these functions, so each clone carries a
// fully vectorised copy; the dynamic loader picks the clone once.
#include "dispatch.hpp"

#include <blochsim/host.hpp>

namespace blochsim {
namespace {

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define BLOCHSIM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BLOCHSIM_CLONES
#endif

BLOCHSIM_CLONES
int range_real(const EventStream& s, const Tissue& t, int64_t b0, int64_t b1, float* work, float* out) {
  return host::forward_range<false>(s, t, b0, b1, work, out);
}

BLOCHSIM_CLONES
int range_complex(const EventStream& s, const Tissue& t, int64_t b0, int64_t b1, float* work, float* out) {
  return host::forward_range<true>(s, t, b0, b1, work, out);
}

}  // namespace

int host_forward_dispatch(const EventStream& s, const Tissue& t, float* out, int threads) {
  return host::forward_status(s, t, out, threads, &range_real, &range_complex);
}

const char* host_isa() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
  return "x86-64";
#else
  return "generic";
#endif
}

}  // namespace blochsim
