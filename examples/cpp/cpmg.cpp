// CPMG echo train with the blochsim C++ API (host backend).
//
//   cpmg [n_echoes=16] [esp_ms=10] [flip_deg=180] [threads=2]
//
// Builds the event stream of a CPMG train by hand, simulates it for a few
// tissues and prints one line per echo:
//
//   echo <n> <|S| tissue 1> <|S| tissue 2> ...
//
// Lines starting with '#' describe the run.  With flip_deg = 180 every echo
// is a perfect spin echo and |S_n| = exp(-n ESP / T2); below 180 stimulated
// echo pathways add T1 weighting and the familiar early-echo oscillation.

#include "cpmg_stream.hpp"

#include <exception>

using namespace cpmg_example;

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, a)) {
    usage("cpmg");
    return 2;
  }
  const std::vector<float> T2_s = T2_seconds();
  const float T1_s = T1_ms * 1e-3f;
  blochsim::Tissue tissue;
  tissue.n = static_cast<int64_t>(T2_s.size());
  tissue.T2_s = {T2_s.data(), 1, 0.0f};
  tissue.T1_s = {&T1_s, 0, 0.0f};

  const int ne = static_cast<int>(a.n_echoes);
  const CpmgStream c = build_cpmg(ne, a.esp_ms * 1e-3, a.flip_deg * blochsim::pi / 180.0);
  const blochsim::EventStream stream = c.view(ne);

  // One complex sample per (tissue, echo), tissue-major.
  std::vector<std::complex<float>> out(static_cast<std::size_t>(tissue.n * stream.n_samples));
  try {
    blochsim::host::forward(stream, tissue, reinterpret_cast<float*>(out.data()), static_cast<int>(a.threads));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpmg: %s\n", e.what());
    return 1;
  }
  print_table(a, out);
  return 0;
}
