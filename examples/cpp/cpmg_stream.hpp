// The CPMG train of the C++ examples (cpmg.cpp on the host, cpmg_cuda.cu on
// the GPU): argument parsing, the event stream built by hand, the tissues,
// and the printed table.
#pragma once

#include <blochsim/blochsim.hpp>

#include <complex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cpmg_example {

inline void usage(const char* prog) {
  std::fprintf(stderr, "usage: %s [n_echoes=16] [esp_ms=10] [flip_deg=180] [threads=2]\n", prog);
}

// Parse argv[i] into out if it is present; false on a malformed or
// out-of-range value.
inline bool parse_int(int argc, char** argv, int i, long lo, long hi, long& out) {
  if (i >= argc) return true;
  char* end = nullptr;
  const long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v < lo || v > hi) return false;
  out = v;
  return true;
}

inline bool parse_double(int argc, char** argv, int i, double lo, double hi, double& out) {
  if (i >= argc) return true;
  char* end = nullptr;
  const double v = std::strtod(argv[i], &end);
  if (end == argv[i] || *end != '\0' || !(v >= lo && v <= hi)) return false;
  out = v;
  return true;
}

// The event stream owns its arrays; blochsim::EventStream only points at them.
struct CpmgStream {
  std::vector<int32_t> interval, shift_before, shift_after, slot;
  std::vector<uint32_t> flags;
  std::vector<float> flip_rad, phase_rad, rx_phase_rad;
  std::vector<double> duration_s;

  void add(int32_t iv, int32_t before, uint32_t fl, float flip, float phase, int32_t after,
           int32_t out_slot) {
    interval.push_back(iv);
    shift_before.push_back(before);
    flags.push_back(fl);
    flip_rad.push_back(flip);
    phase_rad.push_back(phase);
    rx_phase_rad.push_back(0.0f);
    shift_after.push_back(after);
    slot.push_back(out_slot);
  }

  blochsim::EventStream view(int32_t n_echoes) const {
    blochsim::EventStream s;
    s.n_events = static_cast<int64_t>(flags.size());
    s.interval = interval.data();
    s.flags = flags.data();
    s.shift_before = shift_before.data();
    s.shift_after = shift_after.data();
    s.flip_rad = flip_rad.data();
    s.phase_rad = phase_rad.data();
    s.rx_phase_rad = rx_phase_rad.data();
    s.slot = slot.data();
    s.n_intervals = static_cast<int64_t>(duration_s.size());
    s.duration_s = duration_s.data();
    s.n_samples = n_echoes;
    // Every echo period shifts twice (one crusher each side of the pulse),
    // so after n echoes the highest populated order is 2n: keeping orders
    // 0 .. 2n loses no pathway and the simulation is exact.
    s.states = 2 * n_echoes + 1;
    // No crusher geometry: diffusion and flow are off.
    s.dk_rad_per_m = 0.0;
    s.voxel_size_m = 0.0;
    // The excitation (90 deg) and the refocusing pulses (0 deg) are a
    // quarter turn apart, not 0 or pi, so the real-subspace shortcut does not
    // apply: play the full complex state.
    s.real_path = 0;
    s.common_phase_rad = 0.0f;
    return s;
  }
};

// Event layout of the train:
//   event 0            90 deg excitation at phase 90 deg (about y), so the
//                      magnetisation lands on +x: F+_0 = -i e^{i pi/2} = 1.
//   per echo n (0-based), two events:
//     refocusing       ESP/2 of free evolution, one-order shift, pulse of
//                      flip A at phase 0 (about x), one-order shift.
//     readout          ESP/2 of free evolution, then sample F+_0 into slot n.
// The shifts model crusher gradients of equal area on both sides of each
// refocusing pulse: they dephase everything except the spin-echo pathways,
// which is how CPMG suppresses FIDs of imperfect refocusing pulses.
// Refocusing about x with the magnetisation along x satisfies the CPMG
// condition, so errors in A do not accumulate from echo to echo.
inline CpmgStream build_cpmg(int n_echoes, double esp_s, double flip_rad) {
  constexpr double deg = blochsim::pi / 180.0;
  CpmgStream c;
  c.duration_s = {0.5 * esp_s};  // the only interval: half an echo spacing
  const int32_t half = 0;
  c.add(-1, 0, blochsim::event_rf, static_cast<float>(90.0 * deg), static_cast<float>(90.0 * deg),
        0, 0);
  for (int32_t n = 0; n < n_echoes; ++n) {
    c.add(half, 1, blochsim::event_rf, static_cast<float>(flip_rad), 0.0f, 1, 0);
    c.add(half, 0, blochsim::event_readout, 0.0f, 0.0f, 0, n);
  }
  return c;
}

struct Args {
  long n_echoes = 16, threads = 2;
  double esp_ms = 10.0, flip_deg = 180.0;
};

// Command line: [n_echoes] [esp_ms] [flip_deg] [threads]; false if malformed.
inline bool parse_args(int argc, char** argv, Args& a) {
  return argc <= 5 && parse_int(argc, argv, 1, 1, 100000, a.n_echoes) &&
         parse_double(argc, argv, 2, 1e-6, 1e9, a.esp_ms) && parse_double(argc, argv, 3, 0.0, 360.0, a.flip_deg) &&
         parse_int(argc, argv, 4, 1, 4096, a.threads);
}

// Tissues: one problem each.  T2 varies per problem (stride 1); T1 is one
// value broadcast to all of them (stride 0).  Every other property is absent
// and takes its default (M0 = 1, B1 = 1, on resonance).
const std::vector<float> T2_ms = {50.0f, 80.0f, 120.0f};
constexpr float T1_ms = 1000.0f;

inline std::vector<float> T2_seconds() {
  std::vector<float> t;
  for (float t2 : T2_ms) t.push_back(t2 * 1e-3f);
  return t;
}

inline void print_table(const Args& a, const std::vector<std::complex<float>>& out) {
  const int ne = static_cast<int>(a.n_echoes);
  std::printf("# cpmg n_echoes=%ld esp_ms=%.9g flip_deg=%.9g T1_ms=%.9g\n", a.n_echoes, a.esp_ms, a.flip_deg,
              static_cast<double>(T1_ms));
  std::printf("# T2_ms");
  for (float t2 : T2_ms) std::printf(" %.9g", static_cast<double>(t2));
  std::printf("\n");
  for (int n = 0; n < ne; ++n) {
    std::printf("echo %d", n + 1);
    for (std::size_t i = 0; i < T2_ms.size(); ++i)
      std::printf(" %.8e", static_cast<double>(std::abs(out[i * static_cast<std::size_t>(ne) + n])));
    std::printf("\n");
  }
}

}  // namespace cpmg_example
