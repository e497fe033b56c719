// CPMG echo train with the blochsim C++ API on the GPU: the same train as
// cpmg.cpp, with the tissue and the output in device memory and the
// simulation ordered on a CUDA stream.
//
//   cpmg_cuda [n_echoes=16] [esp_ms=10] [flip_deg=180]
//
// Build (nvcc on PATH):
//   nvcc -O2 -std=c++17 -arch=sm_90 -I$(python -c "import blochsim; print(blochsim.get_include())") \
//        cpmg_cuda.cu -o cpmg_cuda

#include <blochsim/cuda.cuh>

#include "cpmg_stream.hpp"

using namespace cpmg_example;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "cpmg_cuda: %s: %s\n", cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

int main(int argc, char** argv) {
  Args a;
  if (!parse_args(argc, argv, a) || argc > 4) {
    usage("cpmg_cuda");
    return 2;
  }
  const int ne = static_cast<int>(a.n_echoes);
  const CpmgStream c = build_cpmg(ne, a.esp_ms * 1e-3, a.flip_deg * blochsim::pi / 180.0);
  const blochsim::EventStream stream = c.view(ne);  // host arrays: copied by forward_device

  const std::vector<float> T2_s = T2_seconds();
  const float T1_s = T1_ms * 1e-3f;
  const std::size_t n = T2_s.size();

  cudaStream_t cs;
  CHECK(cudaStreamCreate(&cs));
  float *d_T2 = nullptr, *d_T1 = nullptr, *d_out = nullptr;
  CHECK(cudaMalloc(&d_T2, n * sizeof(float)));
  CHECK(cudaMalloc(&d_T1, sizeof(float)));
  CHECK(cudaMalloc(&d_out, n * ne * 2 * sizeof(float)));
  CHECK(cudaMemcpyAsync(d_T2, T2_s.data(), n * sizeof(float), cudaMemcpyHostToDevice, cs));
  CHECK(cudaMemcpyAsync(d_T1, &T1_s, sizeof(float), cudaMemcpyHostToDevice, cs));

  blochsim::Tissue tissue;  // device pointers
  tissue.n = static_cast<int64_t>(n);
  tissue[blochsim::field_T2] = {d_T2, 1, 0.0f};
  tissue[blochsim::field_T1] = {d_T1, 0, 0.0f};

  char err[256] = "";
  const int st = blochsim::cuda::forward_device(stream, tissue, d_out, cs, err, sizeof err);
  if (st != 0) {
    std::fprintf(stderr, "cpmg_cuda: %s\n", err);
    return 1;
  }
  std::vector<std::complex<float>> out(n * ne);
  CHECK(cudaMemcpyAsync(out.data(), d_out, out.size() * sizeof(out[0]), cudaMemcpyDeviceToHost, cs));
  CHECK(cudaStreamSynchronize(cs));
  print_table(a, out);
  CHECK(cudaFree(d_T2));
  CHECK(cudaFree(d_T1));
  CHECK(cudaFree(d_out));
  CHECK(cudaStreamDestroy(cs));
  return 0;
}
