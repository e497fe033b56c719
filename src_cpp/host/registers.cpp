// Host instantiations of the device's register kernels (epg_registers.hpp),
// so that the cross-member shifts, truncation, order-0 sources and the tail
// in memory that the GPU runs are tested on machines without one.  Not used
// for speed.  The orders per member are those of the GPU's warp kernel (team
// 1: 32 real, 16 complex) and block kernel (team 4: 16 real, 8 complex);
// team 5 is the team of 4 with a tail in memory for any K (the tail kernel).
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
    return s.real_path ? epg::forward_tail_host<vfloat4, 16, false>(s, t, out)
                       : epg::forward_tail_host<vfloat4, 8, true>(s, t, out);
  if (team == 4)
    return s.real_path ? epg::forward_registers_host<vfloat4, 16, false>(s, t, out)
                       : epg::forward_registers_host<vfloat4, 8, true>(s, t, out);
  return bad_threads;
}

}  // namespace blochsim
