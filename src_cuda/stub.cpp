// The launcher when blochsim is built without CUDA: it reports why.
#include "launcher.hpp"

#include <cstdio>

namespace blochsim {
namespace cuda {

int available(char* why, int n) {
  if (why && n > 0) std::snprintf(why, static_cast<size_t>(n), "%s", status_message(no_cuda));
  return 0;
}

}  // namespace cuda
}  // namespace blochsim
