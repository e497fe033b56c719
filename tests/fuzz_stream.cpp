// Fuzz driver of the C++ API: random event streams, tissue and pools (valid
// and not: bad indices, slots, flags, state counts, NaN and infinite values,
// missing arrays, empty problems) through validate() and every host entry.
// Each entry must return a status (never crash, never read or write out of
// bounds); tests/sanitize.sh builds this under AddressSanitizer and
// UndefinedBehaviorSanitizer.
//
//   fuzz_stream [iterations] [seed]
#include <blochsim/blochsim.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  int between(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }
  bool chance(int percent) { return between(0, 99) < percent; }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // an ordinary value in [lo, hi], or now and then an edge
  double value(double lo, double hi) {
    if (chance(8)) {
      const double edges[] = {0.0, -1.0, 1e-30, 1e30, std::numeric_limits<double>::quiet_NaN(),
                              std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
      return edges[between(0, 6)];
    }
    return lo + (hi - lo) * uniform();
  }
};

struct Case {
  std::vector<int32_t> interval, shift_before, shift_after, slot, driven;
  std::vector<uint32_t> flags;
  std::vector<float> flip, phase, rx, rf_table, rf_duration, rf_offset, rf_power;
  std::vector<double> duration, driven_table;
  blochsim::EventStream s;
};

void make_stream(Rng& r, Case& c) {
  const int ne = r.between(0, 40), ni = r.between(0, 5);
  c.s = blochsim::EventStream{};
  c.s.n_events = ne;
  c.s.n_intervals = ni;
  c.s.n_samples = r.between(0, 6);
  // mostly what validate() accepts, so that the kernels run; now and then not
  const int states[] = {1, 2, 5, 16, 33, 0, -1};
  c.s.states = states[r.chance(95) ? r.between(0, 4) : r.between(5, 6)];
  c.interval.resize(ne);
  c.shift_before.resize(ne);
  c.shift_after.resize(ne);
  c.slot.resize(ne);
  c.flags.resize(ne);
  c.flip.resize(ne);
  c.phase.resize(ne);
  c.rx.resize(ne);
  c.driven.assign(ne, -1);
  for (int e = 0; e < ne; ++e) {
    c.interval[e] = r.chance(99) ? r.between(-1, ni - 1) : r.between(-2, ni);
    c.shift_before[e] = r.between(-3, 3);
    c.shift_after[e] = r.between(-3, 3);
    c.slot[e] = r.chance(99) && c.s.n_samples > 0 ? r.between(0, static_cast<int>(c.s.n_samples) - 1)
                                                   : r.between(-1, static_cast<int>(c.s.n_samples));
    c.flags[e] = static_cast<uint32_t>(r.between(0, 31)) | (r.chance(2) ? blochsim::event_driven : 0u);
    c.flip[e] = static_cast<float>(r.value(-7.0, 7.0));
    c.phase[e] = static_cast<float>(r.value(-7.0, 7.0));
    c.rx[e] = static_cast<float>(r.value(-7.0, 7.0));
  }
  c.duration.resize(ni);
  for (int i = 0; i < ni; ++i) c.duration[i] = r.value(0.0, 0.02);
  c.s.interval = c.interval.data();
  c.s.shift_before = c.shift_before.data();
  c.s.shift_after = c.shift_after.data();
  c.s.slot = c.slot.data();
  c.s.flags = c.flags.data();
  c.s.flip_rad = c.flip.data();
  c.s.phase_rad = c.phase.data();
  c.s.rx_phase_rad = c.rx.data();
  c.s.duration_s = ni ? c.duration.data() : nullptr;
  if (r.chance(30)) {
    c.rf_table.resize(static_cast<size_t>(ne) * blochsim::rf_table_fields);
    for (auto& v : c.rf_table) v = static_cast<float>(r.value(-1.0, 1.0));
    c.s.rf_table = c.rf_table.data();
  }
  if (r.chance(40)) {
    c.rf_duration.resize(ne);
    c.rf_offset.resize(ne);
    c.rf_power.resize(ne);
    for (int e = 0; e < ne; ++e) {
      c.rf_duration[e] = static_cast<float>(r.value(0.0, 0.01));
      c.rf_offset[e] = static_cast<float>(r.value(-2000.0, 2000.0));
      c.rf_power[e] = static_cast<float>(r.value(0.5, 2.0));
    }
    c.s.rf_duration_s = c.rf_duration.data();
    c.s.rf_offset_hz = c.rf_offset.data();
    c.s.rf_power = c.rf_power.data();
  }
  if (r.chance(30)) {
    const int nd = r.between(0, 3);
    c.driven_table.resize(static_cast<size_t>(nd) * blochsim::driven_fields);
    for (auto& v : c.driven_table) v = r.value(0.0, 0.005);
    for (int e = 0; e < ne; ++e)
      if (c.flags[e] & blochsim::event_driven) c.driven[e] = r.between(-1, nd);
    c.s.driven = c.driven.data();
    c.s.n_driven = nd;
    c.s.driven_table = nd ? c.driven_table.data() : nullptr;
  }
  c.s.dk_rad_per_m = r.chance(30) ? r.value(0.0, 1e4) : 0.0;
  c.s.voxel_size_m = c.s.dk_rad_per_m != 0.0 ? 1e-3 : 0.0;
  c.s.real_path = r.chance(50) ? 1 : 0;
  c.s.common_phase_rad = static_cast<float>(r.value(-3.2, 3.2));
}

struct Planes {
  std::vector<std::vector<float>> data;
  void set(Rng& r, blochsim::Property& p, int64_t n, double lo, double hi) {
    if (!r.chance(60)) return;  // absent: the fallback
    const int64_t m = r.chance(30) ? 1 : n;
    if (m == 0) return;
    data.emplace_back(static_cast<size_t>(m));
    for (auto& v : data.back()) v = static_cast<float>(r.value(lo, hi));
    p.data = data.back().data();
    p.stride = m == 1 ? 0 : 1;
  }
};

void make_tissue(Rng& r, blochsim::Tissue& t, Planes& planes, int64_t n) {
  t = blochsim::Tissue{};
  t.n = n;
  planes.set(r, t[blochsim::field_T1], n, 0.05, 3.0);
  planes.set(r, t[blochsim::field_T2], n, 0.005, 0.3);
  planes.set(r, t[blochsim::field_M0], n, 0.0, 2.0);
  planes.set(r, t[blochsim::field_B1], n, 0.0, 1.5);
  planes.set(r, t[blochsim::field_B1phase], n, -1.0, 1.0);
  planes.set(r, t[blochsim::field_B0], n, -200.0, 200.0);
  planes.set(r, t[blochsim::field_D], n, 0.0, 3e-9);
  planes.set(r, t[blochsim::field_v], n, -0.1, 0.1);
  planes.set(r, t[blochsim::field_eta], n, 0.5, 1.0);
}

void make_pools(Rng& r, blochsim::Pools& p, Planes& planes, int64_t n) {
  p = blochsim::Pools{};
  p.n_exchanging = r.between(-1, 5);
  p.bound = r.between(0, 1);
  p.lineshape = r.between(-1, 4);
  planes.set(r, p[blochsim::field_bound_fraction], n, 0.0, 0.2);
  planes.set(r, p[blochsim::field_bound_exchange_hz], n, 0.0, 50.0);
  planes.set(r, p[blochsim::field_bound_T1_s], n, 0.5, 1.5);
  planes.set(r, p[blochsim::field_bound_T2_s], n, 5e-6, 2e-5);
  for (int j = 0; j < blochsim::max_exchanging_pools; ++j) {
    blochsim::Property* pool = p.exchanging(j);
    planes.set(r, pool[blochsim::pool_fraction], n, 0.0, 0.1);
    planes.set(r, pool[blochsim::pool_exchange_hz], n, 0.0, 500.0);
    planes.set(r, pool[blochsim::pool_T1_s], n, 0.5, 1.5);
    planes.set(r, pool[blochsim::pool_T2_s], n, 0.005, 0.1);
    planes.set(r, pool[blochsim::pool_shift_hz], n, -500.0, 500.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 1000;
  Rng r{argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0x9E3779B97F4A7C15ull};
  if (r.s == 0) r.s = 1;
  long accepted = 0, refused = 0;
  int seen[64] = {};
  for (long it = 0; it < iterations; ++it) {
    Case c;
    make_stream(r, c);
    blochsim::Tissue t;
    Planes planes;
    const int64_t n = r.between(0, 37);
    make_tissue(r, t, planes, n);
    const int threads = r.between(0, 2);
    const int64_t ns = c.s.n_samples;
    // the cotangent has room for adjoint2's rows of ns + 1 (its stride may exceed ns)
    std::vector<float> out(static_cast<size_t>(n * ns * 2) + 2), jac, cot(static_cast<size_t>(n * (ns + 1) * 2) + 2);
    for (auto& v : cot) v = static_cast<float>(r.value(-1.0, 1.0));
    const int v = blochsim::validate(c.s, t);
    (v == blochsim::ok ? accepted : refused) += 1;

    int st = blochsim::host::forward_status(c.s, t, out.data(), threads);
    seen[st & 63] = 1;

    int fields[blochsim::pool_field_count];
    const int nd = r.between(0, 4);
    for (int j = 0; j < nd; ++j) fields[j] = r.between(-1, 9);
    jac.assign(static_cast<size_t>(n * (nd ? nd : 1) * ns * 2) + 2, 0.0f);
    float seeds[blochsim::pool_field_count];
    for (int j = 0; j < nd; ++j) seeds[j] = static_cast<float>(r.value(0.5, 2.0));
    st = blochsim::host::jacobian_status(c.s, t, fields, nd, out.data(), jac.data(), threads,
                                         r.chance(50) ? seeds : nullptr);
    seen[st & 63] = 1;

    std::vector<double> ev(static_cast<size_t>(c.s.n_events) * blochsim::pooled_event_gradients + 1);
    std::vector<float> tgrad(static_cast<size_t>(n * (nd ? nd : 1)) + 1);
    st = blochsim::host::adjoint_status(c.s, t, fields, nd, cot.data(), ev.data(), tgrad.data(), threads);
    seen[st & 63] = 1;
    st = blochsim::host::adjoint2_status(c.s, t, r.between(-1, 9), cot.data(), ns + r.between(-1, 1), ev.data(),
                                         threads);
    seen[st & 63] = 1;

    blochsim::Pools p;
    make_pools(r, p, planes, n);
    int pf[blochsim::pool_field_count];
    const int npd = r.between(0, 5);
    for (int j = 0; j < npd; ++j) pf[j] = r.between(-1, blochsim::pool_field_count);
    jac.assign(static_cast<size_t>(n * (npd ? npd : 1) * ns * 2) + 2, 0.0f);
    st = blochsim::host::pooled_status(c.s, t, p, pf, npd, nullptr, out.data(), npd ? jac.data() : nullptr, threads);
    seen[st & 63] = 1;
    tgrad.assign(static_cast<size_t>(n * (npd ? npd : 1)) + 1, 0.0f);
    st = blochsim::host::pooled_adjoint_status(c.s, t, p, pf, npd, cot.data(), ev.data(), tgrad.data(), threads,
                                               static_cast<unsigned>(r.between(0, 40)));
    seen[st & 63] = 1;
  }
  int kinds = 0;
  for (int k = 0; k < 64; ++k) kinds += seen[k];
  std::printf("iterations %ld accepted %ld refused %ld statuses %d\n", iterations, accepted, refused, kinds);
  return 0;
}
