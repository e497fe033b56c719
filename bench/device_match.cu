// The fused matching kernel (cuda/match.cuh) through the C++ device API
// alone, for tuning: n signals against n atoms of dimension r (random
// complex, unit atoms, signals near a few atoms so that their lists fill as
// a dictionary's do), a few runs each on one stream, the median printed in
// seconds and TFLOP/s (8 flops a complex multiply-add); the best atoms of
// the first signals are checked against a double-precision brute force.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Isrc_cpp/include \
//        [-DBLOCHSIM_MATCH_TENSOR=0|1|2 -DBLOCHSIM_MATCH_STAGES=2|3|4 -DBLOCHSIM_MATCH_MIN_BLOCKS=2 ...] \
//        bench/device_match.cu -o device_match
//   ./device_match n r k [n r k ...]
#include <blochsim/cuda/match.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "device_match: %s: %s\n", cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

int main(int argc, char** argv) {
  for (int a = 1; a + 2 < argc; a += 3) {
    const int64_t n = std::atoll(argv[a]), r = std::atoll(argv[a + 1]);
    const int k = std::atoi(argv[a + 2]);
    std::mt19937_64 rng(42);
    std::normal_distribution<float> g;
    std::vector<float> atoms(2 * n * r), sig(2 * n * r);
    for (int64_t i = 0; i < n; ++i) {
      double e = 0.0;
      for (int64_t j = 0; j < 2 * r; ++j) {
        atoms[2 * r * i + j] = g(rng);
        e += double(atoms[2 * r * i + j]) * atoms[2 * r * i + j];
      }
      for (int64_t j = 0; j < 2 * r; ++j) atoms[2 * r * i + j] = float(atoms[2 * r * i + j] / std::sqrt(e));
    }
    for (int64_t i = 0; i < n; ++i)  // near atom (i * 7919) mod n, plus noise
      for (int64_t j = 0; j < 2 * r; ++j)
        sig[2 * r * i + j] = atoms[2 * r * ((i * 7919) % n) + j] + 0.3f * g(rng) / std::sqrt(float(r));
    float *da, *ds, *dp;
    int64_t* di;
    double* dd;
    CHECK(cudaMalloc(&da, atoms.size() * 4));
    CHECK(cudaMalloc(&ds, sig.size() * 4));
    CHECK(cudaMalloc(&dp, n * k * 4));
    CHECK(cudaMalloc(&di, n * k * 8));
    CHECK(cudaMalloc(&dd, n * k * 16));
    CHECK(cudaMemcpy(da, atoms.data(), atoms.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ds, sig.data(), sig.size() * 4, cudaMemcpyHostToDevice));
    blochsim::MatchProblem p;
    p.n = n;
    p.atoms = n;
    p.dim = r;
    p.k = k;
    p.signal = ds;
    p.atom = da;
    blochsim::MatchResult res;
    res.index = di;
    res.power = dp;
    res.dot = dd;
    char err[256] = "";
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int rep = 0; rep < 4; ++rep) {
      CHECK(cudaEventRecord(e0));
      if (blochsim::cuda::match_device(p, res, nullptr, err, sizeof err) != 0) {
        std::fprintf(stderr, "device_match: %s\n", err);
        return 1;
      }
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (rep > 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::vector<int64_t> idx(n * k);
    std::vector<float> pws(n * k);
    CHECK(cudaMemcpy(idx.data(), di, n * k * 8, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(pws.data(), dp, n * k * 4, cudaMemcpyDeviceToHost));
    int wrong = 0;
    double worst = 0.0;  // the largest relative error of a best power
    for (int64_t i = 0; i < std::min<int64_t>(n, 64); ++i) {
      double best = -1;
      int64_t at = -1;
      for (int64_t q = 0; q < n; ++q) {
        double re = 0, im = 0;
        for (int64_t j = 0; j < r; ++j) {
          const double ar = atoms[2 * (r * q + j)], ai = atoms[2 * (r * q + j) + 1];
          const double sr = sig[2 * (r * i + j)], si = sig[2 * (r * i + j) + 1];
          re += ar * sr + ai * si;
          im += ar * si - ai * sr;
        }
        if (re * re + im * im > best) {
          best = re * re + im * im;
          at = q;
        }
      }
      wrong += idx[i * k] != at;
      worst = std::max(worst, std::abs(pws[i * k] - best) / best);
    }
    const double s = ms[ms.size() / 2] / 1e3;
    std::printf("n %lld r %lld k %d: %.4f s, %.1f TFLOP/s, %d of 64 best differ from float64, power within %.1e\n",
                (long long)n, (long long)r, k, s, 8.0 * double(n) * double(n) * double(r) / s / 1e12, wrong, worst);
    cudaFree(da);
    cudaFree(ds);
    cudaFree(dp);
    cudaFree(di);
    cudaFree(dd);
  }
  return 0;
}
