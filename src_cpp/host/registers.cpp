// Host instantiations of the device's register kernels (epg_registers.hpp),
// so that the cross-member shifts, truncation, order-0 sources and the tail
// in memory that the GPU runs are tested on machines without one.  Not used
// for speed.  Team 1 holds 32 orders (real path) or 16 (complex) in one
// member, as the GPU's warp kernel does; teams 4 and 5 hold 16 or 8 per
// member over four members (the block kernel's templates with few enough
// orders that the test cases cross members and, with team 5, run into the
// tail in memory that the tail kernel keeps for any K).
#include <blochsim/epg_registers.hpp>

#include "dispatch.hpp"

namespace blochsim {

int host_forward_registers(const EventStream& s, const Tissue& t, float* out, int team) {
  const int v = validate(s, t);
  if (v != ok) return v;
  if (team == 1)
    return s.real_path ? epg::forward_registers_host<float, 32, false>(s, t, out)
                       : epg::forward_registers_host<float, 16, true>(s, t, out);
  if (team == 5)
    return s.real_path ? epg::forward_registers_host<vfloat4, 16, false, true>(s, t, out)
                       : epg::forward_registers_host<vfloat4, 8, true, true>(s, t, out);
  if (team == 4)
    return s.real_path ? epg::forward_registers_host<vfloat4, 16, false>(s, t, out)
                       : epg::forward_registers_host<vfloat4, 8, true>(s, t, out);
  return bad_threads;
}

}  // namespace blochsim
