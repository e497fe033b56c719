// Compiler portability for the blochsim core.
//
// Every kernel header is compiled twice from one source: by the host compiler
// for the CPU backend and by nvcc for the device backend.  BLOCHSIM_HD marks
// the code both share; nothing under it throws or allocates.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BLOCHSIM_HD __host__ __device__
#define BLOCHSIM_FORCEINLINE __forceinline__
// Inlined on the device: with __noinline__ the pooled kernels' operators
// came out wrong on sm_90 (nvcc 13.0), while the host results were right.
#define BLOCHSIM_NOINLINE inline
#define BLOCHSIM_RESTRICT __restrict__
#define BLOCHSIM_LAMBDA_INLINE
#elif defined(__GNUC__) || defined(__clang__)
#define BLOCHSIM_HD
#define BLOCHSIM_FORCEINLINE inline __attribute__((always_inline))
#define BLOCHSIM_NOINLINE __attribute__((noinline))
#define BLOCHSIM_RESTRICT __restrict__
// on a lambda, after its parameters: GCC does not inline large lambdas of
// the kernels' event loops on lanes of duals by itself
#define BLOCHSIM_LAMBDA_INLINE __attribute__((always_inline))
#else
#define BLOCHSIM_HD
#define BLOCHSIM_FORCEINLINE inline
#define BLOCHSIM_NOINLINE
#define BLOCHSIM_RESTRICT
#define BLOCHSIM_LAMBDA_INLINE
#endif

// Marks a loop over the lanes of a tile as free of loop-carried dependences,
// so that the host compiler turns it into SIMD instructions.
#if defined(__CUDACC__)
#define BLOCHSIM_LANE_LOOP
#elif defined(__clang__)
#define BLOCHSIM_LANE_LOOP _Pragma("clang loop vectorize(enable)")
#elif defined(__GNUC__)
#define BLOCHSIM_LANE_LOOP _Pragma("GCC ivdep")
#else
#define BLOCHSIM_LANE_LOOP
#endif

// The kernels (tile.hpp, epg/epg.hpp) live in an inline namespace named after
// the instruction set they are compiled for, so that one program can link
// several builds of them (the extension links one per x86-64 level) without
// the linker merging their inline functions across instruction sets.
#ifndef BLOCHSIM_ISA
#define BLOCHSIM_ISA isa_default
#endif

// Full unrolling of the loops over a thread's registers (compile-time trip
// counts, so register arrays are indexed by constants only).
#if defined(__CUDA_ARCH__)
#define BLOCHSIM_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define BLOCHSIM_UNROLL
#elif defined(__clang__)
#define BLOCHSIM_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define BLOCHSIM_UNROLL _Pragma("GCC unroll 64")
#else
#define BLOCHSIM_UNROLL
#endif

namespace blochsim {

constexpr double pi = 3.14159265358979323846;

// Status codes returned by kernels and launchers; 0 is success.  The host
// launcher turns a non-zero code into a C++ exception (status_message says
// why), and Cython turns that into a Python exception.
enum Status : int {
  ok = 0,
  bad_states = 1,          // states < 1
  bad_interval_index = 2,  // an event names an interval outside the table
  bad_output_slot = 3,     // a readout writes outside [0, n_samples)
  bad_threads = 4,         // a thread count < 1
  bad_shape = 5,           // negative counts or a null array that is required
  no_cuda = 6,             // the device backend was not compiled
  states_exceed_team = 7,  // K larger than a register team holds (the host emulation of device teams)
  too_many_events = 8,     // n_events >= 2^31 - 1 (kernels index events in 32 bits)
  bad_pools = 9,           // a pool count, lineshape or pulse duration out of range
  bad_pool_fraction = 10,  // a pool fraction or rate < 0, fractions summing past 1, bound T1/T2 <= 0
  pools_without_motion = 11,  // D or v given with pools
  driven_needs_pools = 12,    // an exact rectangular pulse in a stream for the single-pool kernels
  out_of_memory = 13,         // the call's workspace does not fit the memory available
  interrupted = 14,           // the caller's poll (host/interrupt.hpp) asked the call to stop
  internal_error = 15,        // an unexpected C++ exception, caught at the entry
  bad_transmit = 16,          // a pulse's transmit setting outside the tissue's, or settings where the kernel takes none
};

// Launchers return cuda_error_base + the cudaError_t value for CUDA errors.
constexpr int cuda_error_base = 1000;

inline const char* status_message(int status) {
  switch (status) {
    case ok: return "ok";
    case bad_states: return "states must be >= 1";
    case bad_interval_index: return "an event's interval index is outside the interval table";
    case bad_output_slot: return "a readout's output slot is outside [0, n_samples)";
    case bad_threads: return "threads must be >= 1";
    case bad_shape: return "an array of the event stream or tissue is missing or has a negative length";
    case no_cuda: return "blochsim was built without CUDA";
    case states_exceed_team: return "states exceed what the register team holds";
    case too_many_events: return "a stream holds at most 2147483646 events";
    case bad_pools: return "pools: a pool count, lineshape or pulse duration is out of range";
    case bad_pool_fraction:
      return "pools: a fraction or exchange rate is negative, the fractions sum past 1, or a bound T1/T2 is <= 0";
    case pools_without_motion: return "pools: diffusion (D) and flow (v) are not modelled with pools";
    case driven_needs_pools:
      return "exact rectangular pulses (event_driven) are played by the pooled kernels only (host::pooled_status)";
    case out_of_memory:
      return "the call's workspace does not fit the memory available (fewer states, threads or problems a call)";
    case interrupted: return "interrupted";
    case internal_error: return "internal error: an unexpected C++ exception was caught";
    case bad_transmit:
      return "transmit settings: a pulse names a setting the tissue does not hold, or this kernel plays none "
             "(the pooled, moment-keyed and second-order kernels take one B1 per problem)";
    default: return "unknown blochsim status";
  }
}

}  // namespace blochsim
