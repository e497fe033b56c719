// The reference workload (SPEC §9) through the C++ device API alone: the
// kernel without the Python layer, for tuning the device templates.  Each
// size runs a few times on one stream and the median is printed; the first
// problems are checked against the host backend of the same headers.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include \
//        [-DBLOCHSIM_WARP_ORDERS_REAL=16 ...] bench/device_kernel.cu -o device_kernel
//   ./device_kernel [atoms ...]      reference workload, real and complex paths
//   ./device_kernel states           real path at 1e5 atoms over a range of K
//   ./device_kernel jacobian [atoms ...]   the Jacobian (jacobian_device) in
//                                    (T1, T2), (T1, T2, M0) and (T1, T2, B1, eta)
#include <blochsim/cuda.cuh>
#include <blochsim/host.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "device_kernel: %s: %s\n", cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace {

constexpr int n_tr = 500;

// Inversion, then per TR: pulse, sample, one shift, relaxation over TR
// (the event layout the Python MRF simulator packs).
struct Mrf {
  std::vector<int32_t> interval, shift_before, shift_after, slot;
  std::vector<uint32_t> flags;
  std::vector<float> flip_rad, phase_rad, rx_phase_rad, rf_table;
  std::vector<double> duration_s{0.010};

  explicit Mrf(bool quadratic_phase) {
    auto add = [&](int32_t iv, uint32_t fl, double flip, double phase, int32_t after, int32_t sl) {
      interval.push_back(iv);
      shift_before.push_back(0);
      flags.push_back(fl);
      flip_rad.push_back(static_cast<float>(flip));
      phase_rad.push_back(static_cast<float>(phase));
      rx_phase_rad.push_back(static_cast<float>(-blochsim::pi / 2));
      shift_after.push_back(after);
      slot.push_back(sl);
      const double row[blochsim::rf_table_fields] = {
          std::pow(std::cos(flip / 2), 2), std::pow(std::sin(flip / 2), 2), std::sin(flip), std::cos(flip),
          std::cos(phase), std::sin(phase), std::cos(-blochsim::pi / 2), std::sin(-blochsim::pi / 2)};
      for (double v : row) rf_table.push_back(static_cast<float>(v));
    };
    add(-1, blochsim::event_inversion, 0, 0, 0, 0);
    for (int j = 0; j < n_tr; ++j) {
      const double deg = j < 250 ? 5.0 + 55.0 * j / 249.0 : 60.0 - 58.0 * (j - 250) / 249.0;
      const double phase_deg = quadratic_phase ? 0.5 * 117.0 * j * (j + 1) : 0.0;
      add(j == 0 ? -1 : 0, blochsim::event_rf | blochsim::event_readout, deg * blochsim::pi / 180.0,
          std::fmod(phase_deg, 360.0) * blochsim::pi / 180.0, 1, j);
    }
    add(0, 0u, 0, 0, 0, 0);
  }

  blochsim::EventStream view(bool real_path, int32_t states = 32) const {
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
    s.n_intervals = 1;
    s.duration_s = duration_s.data();
    s.rf_table = rf_table.data();
    s.n_samples = n_tr;
    s.states = states;
    s.real_path = real_path ? 1 : 0;
    return s;
  }
};

// T1 = geomspace(200, 3000, g), T2 = geomspace(10, 300, g) on a meshgrid,
// the first n taken (seconds).
void tissues(int64_t n, std::vector<float>& T1, std::vector<float>& T2) {
  int64_t g = 1;
  while (g * g < n) ++g;
  T1.resize(n);
  T2.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const double a = g > 1 ? double(i / g) / double(g - 1) : 0.0, b = g > 1 ? double(i % g) / double(g - 1) : 0.0;
    T1[i] = static_cast<float>(0.2 * std::pow(15.0, a));
    T2[i] = static_cast<float>(0.01 * std::pow(30.0, b));
  }
}

// The host backend's result (host.hpp is host code only: nvcc's device
// pass sees a stub).
void host_forward(const blochsim::EventStream& s, const blochsim::Tissue& t, float* out) {
#if !defined(__CUDA_ARCH__)
  blochsim::host::forward(s, t, out, 2);
#endif
}

// The reference tissues of n atoms in device memory, with room for the
// output.
struct DeviceProblem {
  int64_t n;
  std::vector<float> T1, T2;
  float *dT1 = nullptr, *dT2 = nullptr, *dout = nullptr;
  blochsim::Tissue t;

  explicit DeviceProblem(int64_t atoms) : n(atoms) {
    tissues(n, T1, T2);
    CHECK(cudaMalloc(&dT1, n * sizeof(float)));
    CHECK(cudaMalloc(&dT2, n * sizeof(float)));
    CHECK(cudaMalloc(&dout, n * n_tr * 2 * sizeof(float)));
    CHECK(cudaMemcpy(dT1, T1.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dT2, T2.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    t.n = n;
    t[blochsim::field_T1] = {dT1, 1, 0.0f};
    t[blochsim::field_T2] = {dT2, 1, 0.0f};
  }
  ~DeviceProblem() {
    cudaFree(dT1);
    cudaFree(dT2);
    cudaFree(dout);
  }
};

// Median milliseconds of `call` (a device API call on cs returning a
// status; `what` names it) over `reps` runs after one warm-up.
template <class Call>
double median_of(const char* what, cudaStream_t cs, int reps, Call&& call) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  char err[256] = {0};
  for (int rep = 0; rep <= reps; ++rep) {
    CHECK(cudaEventRecord(a, cs));
    const int r = call(err, static_cast<int>(sizeof err));
    if (r != 0) {
      std::fprintf(stderr, "device_kernel: %s: %d %s\n", what, r, err);
      std::exit(1);
    }
    CHECK(cudaEventRecord(b, cs));
    CHECK(cudaEventSynchronize(b));
    float m = 0;
    CHECK(cudaEventElapsedTime(&m, a, b));
    if (rep > 0) ms.push_back(m);
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median milliseconds of forward_device over `reps` runs after one warm-up.
double median_ms(const blochsim::EventStream& s, const DeviceProblem& p, cudaStream_t cs, int reps) {
  return median_of("forward_device", cs, reps, [&](char* err, int n) {
    return blochsim::cuda::forward_device(s, p.t, p.dout, cs, err, n);
  });
}

// The host backend's signal and Jacobian (host code only, as host_forward).
void host_jacobian(const blochsim::EventStream& s, const blochsim::Tissue& t, const int* fields, int n_dirs,
                   float* out, float* jac) {
#if !defined(__CUDA_ARCH__)
  blochsim::host::jacobian_status(s, t, fields, n_dirs, out, jac, 2);
#endif
}

// Median milliseconds of jacobian_device along fields[0 .. n_dirs) and the
// largest difference of the first problems' Jacobians from the host
// backend's, relative to the largest host value of each column.
double jacobian_ms(const blochsim::EventStream& s, const DeviceProblem& p, const int* fields, int n_dirs,
                   cudaStream_t cs, int reps, double* rel) {
  float* djac = nullptr;
  CHECK(cudaMalloc(&djac, p.n * n_dirs * n_tr * 2 * sizeof(float)));
  const double med = median_of("jacobian_device", cs, reps, [&](char* err, int n) {
    return blochsim::cuda::jacobian_device(s, p.t, fields, n_dirs, p.dout, djac, cs, err, n);
  });
  const int64_t nc = std::min<int64_t>(p.n, 64);
  const size_t per = static_cast<size_t>(n_dirs) * n_tr * 2;
  std::vector<float> dev(nc * per), host(nc * per), hout(nc * n_tr * 2);
  CHECK(cudaMemcpy(dev.data(), djac, dev.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(djac));
  blochsim::Tissue th = p.t;
  th.n = nc;
  th[blochsim::field_T1] = {p.T1.data(), 1, 0.0f};
  th[blochsim::field_T2] = {p.T2.data(), 1, 0.0f};
  host_jacobian(s, th, fields, n_dirs, hout.data(), host.data());
  *rel = 0;
  for (int j = 0; j < n_dirs; ++j) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < nc; ++i)
      for (int k = 0; k < n_tr * 2; ++k) {
        const size_t at = (i * n_dirs + j) * n_tr * 2 + k;
        num = std::max(num, double(std::fabs(dev[at] - host[at])));
        den = std::max(den, double(std::fabs(host[at])));
      }
    *rel = std::max(*rel, den > 0 ? num / den : num);
  }
  return med;
}

int jacobians(const std::vector<int64_t>& sizes, cudaStream_t cs) {
  using namespace blochsim;
  std::printf("jacobian: %d directions a team, orders a lane real %d, complex %d\n", BLOCHSIM_JACOBIAN_DIRS,
              BLOCHSIM_JACOBIAN_ORDERS_REAL, BLOCHSIM_JACOBIAN_ORDERS_COMPLEX);
  const int sets[3][4] = {{field_T1, field_T2}, {field_T1, field_T2, field_M0}, {field_T1, field_T2, field_B1, field_eta}};
  const int counts[3] = {2, 3, 4};
  const char* names[3] = {"T1,T2", "T1,T2,M0", "T1,T2,B1,eta"};
  for (int path = 0; path < 2; ++path) {
    const bool real_path = path == 0;
    const Mrf mrf(!real_path);
    const EventStream s = mrf.view(real_path);
    for (int64_t n : sizes) {
      const DeviceProblem p(n);
      const double fwd = median_ms(s, p, cs, 5);
      for (int k = 0; k < 3; ++k) {
        double rel = 0;
        const double med = jacobian_ms(s, p, sets[k], counts[k], cs, 5, &rel);
        std::printf("%-8s n=%-8lld %-13s median %8.3f ms  %8.2f M atoms/s  %.2fx forward  max|dev-host|/max|host| %.2e\n",
                    real_path ? "real" : "complex", static_cast<long long>(n), names[k], med, n / med * 1e-3,
                    med / fwd, rel);
      }
    }
  }
  return 0;
}

// Atoms/s of the real path at 1e5 atoms for K on both sides of the kernel
// boundaries (one thread, warp teams of 2 ... 32 lanes, block teams, then
// planes), 500 events; atoms x K / s shows the cost per order.
int states_sweep(cudaStream_t cs) {
  const Mrf mrf(false);
  const DeviceProblem p(100000);
  for (int K : {32, 33, 48, 64, 65, 96, 97, 128, 256, 512, 513, 768, 1024, 1025, 1536, 2048, 4096, 8192, 8193, 16384}) {
    const double med = median_ms(mrf.view(true, K), p, cs, K > 4096 ? 1 : 3);
    const double rate = p.n / med * 1e-3;
    std::printf("states %5d  median %9.3f ms  %9.3f M atoms/s  %9.1f M atom-orders/s\n", K, med, rate,
                rate * K);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes;
  int sweep = 0;  // "states": the real path at 1e5 atoms over K instead
  bool jac = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "states")
      sweep = 1;
    else if (std::string(argv[i]) == "jacobian")
      jac = true;
    else
      sizes.push_back(std::atoll(argv[i]));
  }
  if (sizes.empty()) sizes = {100000, 1000000};
  cudaStream_t cs;
  CHECK(cudaStreamCreate(&cs));
  if (sweep) return states_sweep(cs);
  if (jac) return jacobians(sizes, cs);
  std::printf("warp orders per thread: real %d, complex %d\n", BLOCHSIM_WARP_ORDERS_REAL,
              BLOCHSIM_WARP_ORDERS_COMPLEX);
  for (int path = 0; path < 2; ++path) {
    const bool real_path = path == 0;
    const Mrf mrf(!real_path);
    const blochsim::EventStream s = mrf.view(real_path);
    for (int64_t n : sizes) {
      const DeviceProblem p(n);
      const double med = median_ms(s, p, cs, 5);
      // the first problems against the host backend
      const int64_t nc = std::min<int64_t>(n, 256);
      std::vector<float> dev(nc * n_tr * 2), host(nc * n_tr * 2);
      CHECK(cudaMemcpy(dev.data(), p.dout, dev.size() * sizeof(float), cudaMemcpyDeviceToHost));
      blochsim::Tissue th = p.t;
      th.n = nc;
      th[blochsim::field_T1] = {p.T1.data(), 1, 0.0f};
      th[blochsim::field_T2] = {p.T2.data(), 1, 0.0f};
      host_forward(s, th, host.data());
      double num = 0, den = 0;
      for (size_t i = 0; i < host.size(); ++i) {
        num = std::max(num, double(std::fabs(dev[i] - host[i])));
        den = std::max(den, double(std::fabs(host[i])));
      }
      std::printf("%-8s n=%-8lld median %8.3f ms  %8.2f M atoms/s  max|dev-host|/max|host| %.2e\n",
                  real_path ? "real" : "complex", static_cast<long long>(n), med, n / med * 1e-3, num / den);
    }
  }
  return 0;
}
