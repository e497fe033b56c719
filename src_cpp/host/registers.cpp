// Host instantiations of the device's register kernels (epg/registers.hpp),
// so that the cross-member shifts, truncation, order-0 sources and the tail
// in memory that the GPU runs are tested on machines without one.  Not used
// for speed.  Team 1 holds 32 orders (real path) or 16 (complex) in one
// member, as the GPU's warp kernel does; teams 4 and 5 hold 16 or 8 per
// member over four members (the block kernel's templates with few enough
// orders that the test cases cross members and, with team 5, run into the
// tail in memory that the tail kernel keeps for any K); team 8 holds 8
// orders a member over four on either path (the narrow warp kernel's
// teams).  The Jacobian's
// teams of four hold 8 orders each (4 on the complex path) on duals of two
// directions, as the device's Jacobian kernels do, and team 5 the orders
// past them in a tail (the tail Jacobian kernel).
#include <blochsim/epg/registers.hpp>
#include <blochsim/host/interrupt.hpp>
#include <blochsim/epg/jacobian.hpp>
#include <blochsim/pools/lanes.hpp>
#include <blochsim/pools/registers.hpp>

#include <algorithm>
#include <vector>

#include "dispatch.hpp"

namespace blochsim {

int host_forward_registers(const EventStream& s, const Tissue& t, float* out, int team) noexcept {
  return guarded([&]() -> int {
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
    if (team == 8)  // the narrow warp kernel's 8 orders a member (forward.cuh)
      return s.real_path ? epg::forward_registers_host<vfloat4, 8, false>(s, t, out)
                         : epg::forward_registers_host<vfloat4, 8, true>(s, t, out);
    return bad_threads;
  });
}

int host_jacobian_registers(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                            float* jac, const float* seeds, int team) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t);
    if (v != ok) return v;
    const int d = validate_directions(fields, n_dirs);
    if (d != ok) return d;
    if (team != 4 && team != 5) return bad_threads;
    // as the device's Jacobian teams (cuda/jacobian.cuh jacobian_device): M0
    // from the unscaled signal, the further directions two to a team (the
    // device's grid of direction groups, here one group after another) with 8
    // orders a member (4 on the complex path), and with team 5 the orders
    // past the members' in a tail
    auto group = [&](const int* f, int m, float* j, const float* sd) {
      if (team == 5)
        return s.real_path ? epg::jacobian_registers_host<vfloat4, 2, 8, false, true>(s, t, f, m, out, j, sd)
                           : epg::jacobian_registers_host<vfloat4, 2, 4, true, true>(s, t, f, m, out, j, sd);
      return s.real_path ? epg::jacobian_registers_host<vfloat4, 2, 8, false>(s, t, f, m, out, j, sd)
                         : epg::jacobian_registers_host<vfloat4, 2, 4, true>(s, t, f, m, out, j, sd);
    };
    const int64_t ns = s.n_samples;
    if (dual_directions(fields, n_dirs) <= 2) return group(fields, n_dirs, jac, seeds);
    for (int j0 = 0; j0 < n_dirs; j0 += 2) {
      const int m = n_dirs - j0 < 2 ? n_dirs - j0 : 2;
      std::vector<float> part(static_cast<size_t>(t.n * m * ns * 2));
      const int st = group(fields + j0, m, part.data(), seeds ? seeds + j0 : nullptr);
      if (st != ok) return st;
      for (int64_t i = 0; i < t.n; ++i)
        for (int j = 0; j < m; ++j)
          std::copy_n(part.data() + (i * m + j) * ns * 2, ns * 2, jac + (i * n_dirs + j0 + j) * ns * 2);
    }
    return ok;
  });
}

int host_pooled_registers(const EventStream& s, const Tissue& t, const Pools& p, float* out) noexcept {
  return guarded([&]() -> int {
    const int v = validate(s, t, true);
    if (v != ok) return v;
    const int vp = validate_pools(s, t, p);
    if (vp != ok) return vp;
    const bool real = pooled_real_path(s, t, p);
    switch (pooled_team_kind(p)) {
      case 1:
        return real ? pooled_team_host<vfloat4, 1, true, true>(s, t, p, out)
                    : pooled_team_host<vfloat4, 1, true, false>(s, t, p, out);
      case 2:
        return real ? pooled_team_host<vfloat4, 2, false, true>(s, t, p, out)
                    : pooled_team_host<vfloat4, 2, false, false>(s, t, p, out);
      case 3: return pooled_team_host<vfloat4, 2, true, false>(s, t, p, out);
      default: return bad_pools;
    }
  });
}

}  // namespace blochsim
