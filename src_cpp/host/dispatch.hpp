// Entry points of the host backend as compiled into the Python extension.
#pragma once

#include <blochsim/events.hpp>

namespace blochsim {

// Forward EPG of every problem of t on `threads` threads; returns a Status.
// The block kernels are built for several x86-64 levels and the best one the
// CPU supports is chosen at load time.
int host_forward_dispatch(const EventStream& s, const Tissue& t, float* out, int threads);

// Name of the instruction set the block kernels run with ("x86-64-v4", ...).
const char* host_isa();

}  // namespace blochsim
