// Host instantiations of the device's kernels (epg_registers.hpp, and the
// interleaved planes of the plane kernel), so that the cross-member shifts,
// truncation and order-0 sources the GPU runs are tested on machines without
// one.  Not used for speed.  The orders per member are those of the GPU's
// warp kernel (team 1: 32 real, 16 complex) and block kernel (team 4: 16
// real, 8 complex); team 2 is the plane kernel's store.
#include <vector>

#include <blochsim/epg_registers.hpp>

#include "dispatch.hpp"

namespace blochsim {
namespace {

// The plane kernel's store on the host: the planes of all problems
// interleaved, row r of problem i at work[r * n + i], one problem at a time.
template <bool Complex>
int forward_interleaved(const EventStream& s, const Tissue& t, float* out) {
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  const int64_t ws = epg::PlaneStore<float, true>::workspace(s);
  std::vector<float> work(static_cast<size_t>(ws * t.n));
  for (int64_t p = 0; p < t.n; ++p) {
    const epg::LaneTissue<float> lt = epg::gather<float>(t, &p);
    epg::PlaneStore<float, Complex, true> st;
    st.template init<float>(sr, lt, work.data() + p, t.n);
    epg::LaneSink<float> sink{out, p, t.n, s.n_samples};
    epg::play<float, Complex>(sr, t, lt, st, sink);
  }
  return ok;
}

}  // namespace

int host_forward_registers(const EventStream& s, const Tissue& t, float* out, int team) {
  const int v = validate(s, t);
  if (v != ok) return v;
  if (team == 1)
    return s.real_path ? epg::forward_registers_host<float, 32, false>(s, t, out)
                       : epg::forward_registers_host<float, 16, true>(s, t, out);
  if (team == 2) return s.real_path ? forward_interleaved<false>(s, t, out) : forward_interleaved<true>(s, t, out);
  if (team == 4)
    return s.real_path ? epg::forward_registers_host<vfloat4, 16, false>(s, t, out)
                       : epg::forward_registers_host<vfloat4, 8, true>(s, t, out);
  return bad_threads;
}

}  // namespace blochsim
