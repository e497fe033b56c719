// The device backend's launcher, behind a plain C++ header (no CUDA types),
// so that the Cython extension is the same with and without CUDA.
#pragma once

#include <blochsim/events.hpp>

namespace blochsim {
namespace cuda {

// 1 if the device backend is compiled and a device is usable; otherwise 0,
// with the reason written into why (at most n bytes, NUL-terminated).
int available(char* why, int n);

}  // namespace cuda
}  // namespace blochsim
