// The pooled EPG on the device: forward, Jacobian and adjoint kernels, the
// upload of tissue and pool properties, and the pooled entries.
#pragma once

#include "../pools/adjoint.hpp"
#include "../pools/lanes.hpp"
#include "../pools/player.hpp"
#include "../pools/pools.hpp"
#include "../pools/registers.hpp"
#include "forward.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

// One thread a problem of the pooled EPG (pools/pools.hpp pooled_block with
// V = float): its state and operators in device memory, element i of the
// problems of a launch interleaved (stride `count`), so that a warp's loads
// coalesce.
// (A template, like pooled_from_host, so that only programs that call it
// compile it.)
template <class V>
__global__ void pooled_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, int64_t first, int64_t count,
                              V* work, float* out, int* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int st = pooled_block<V>(s, t, p, ls, first + i, work + i, count, out);
  if (st != ok) atomicExch(status, st);
}

// One thread a problem: the operator table of pools/registers.hpp
// (pooled_table), value j of problem first + c at table[j * count + c].
// (Templates, like pooled_from_host, so that only programs that call them
// compile them.)
template <int Unused = 0>
__global__ void pooled_table_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, int64_t first,
                                    int64_t count, float* table) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  pooled_table(s, t, p, ls, first + c, table + c, count);
}

// A team of T lanes of a warp a problem (pools/registers.hpp PooledTeam),
// 32 / T teams a warp; the spare lanes replay their warp's last team's
// problem, the teams past the last problem replay that one, and neither
// writes.
template <int N, bool Bound, bool Real>
__global__ void __launch_bounds__(128) pooled_team_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls,
                                                          int64_t first, int64_t count, const float* table,
                                                          float* out, int T) {
  constexpr int R = pooled_team_orders<N, Bound, Real>();
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Seat at = seat(g / 32, static_cast<int>(g % 32), 32, T, 32 / T, count);
  PooledTeam<float, N, Bound, R, Real, WarpTeam<false>> st;
  DeviceSink sink{reinterpret_cast<float2*>(out) + (first + at.problem) * s.n_samples, at.writer};
  st.play(s, t, p, ls, first + at.problem, table + at.problem, count,
          WarpTeam<false>{at.rank, T, at.rank * R, at.last, SharedRecords{nullptr, 0, 0}}, sink);
}

// The pooled forward's kernels on stream st, for the stream s (host) and
// its upload ds, and the device properties dt, dp and lineshape table dl
// (their values checked; only their configuration is read here), into dout (device),
// kernel failures into *status: a register team a problem
// (pools/registers.hpp) for the pools it is compiled for and up to 32
// members' orders, its operator table formed first by pooled_table_kernel;
// else one thread a problem, its state in device memory (pooled_kernel).
// Launches of as many problems as fit in half the free memory; their
// buffers are freed in the stream's order.
template <class V = float>
inline int pooled_forward_launches(const EventStream& s, const EventStream& ds, const Tissue& dt, const Pools& dp,
                                   const LineshapeTable& dl, float* dout, int* status, cudaStream_t st, char* err,
                                   int n) {
  constexpr int threads = 128;
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const bool real = pooled_real_path(ds, dt, dp);
  const int kind = pooled_team_kind(dp);
  const int R = pooled_team_orders_of(kind, real);
  const bool team = kind != 0 && ds.states <= 32 * R;
  const int64_t per = team ? std::max<int64_t>(1, pooled_table_floats(s, dp)) * static_cast<int64_t>(sizeof(float))
                           : pool_block_workspace(s, dp) * static_cast<int64_t>(sizeof(V));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(dt.n, static_cast<int64_t>(free_b / 2) / per));
  void* work = nullptr;
  BLOCHSIM_CUDA(pool_malloc(&work, static_cast<size_t>(chunk * per), st), "cudaMallocFromPoolAsync (workspace)");
  auto check = [&](const char* what) -> int {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return ok;
    cudaFreeAsync(work, st);
    return fail(e, what, err, n);
  };
  for (int64_t first = 0; first < dt.n; first += chunk) {
    const int64_t count = std::min<int64_t>(chunk, dt.n - first);
    if (!team) {
      const unsigned blocks = static_cast<unsigned>((count + threads - 1) / threads);
      pooled_kernel<V><<<blocks, threads, 0, st>>>(ds, dt, dp, dl, first, count, static_cast<V*>(work), dout, status);
      const int c = check("pooled_kernel launch");
      if (c != ok) return c;
      continue;
    }
    float* table = static_cast<float*>(work);
    pooled_table_kernel<0><<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, st>>>(
        ds, dt, dp, dl, first, count, table);
    int c = check("pooled_table_kernel launch");
    if (c != ok) return c;
    const int T = (ds.states + R - 1) / R, per_warp = 32 / T;
    const int64_t warps = (count + per_warp - 1) / per_warp;
    const unsigned blocks = static_cast<unsigned>((warps * 32 + threads - 1) / threads);
    auto go = [&](auto kernel) {
      kernel<<<blocks, threads, 0, st>>>(ds, dt, dp, dl, first, count, table, dout, T);
    };
    if (kind == 1 && real) go(pooled_team_kernel<1, true, true>);
    else if (kind == 1) go(pooled_team_kernel<1, true, false>);
    else if (kind == 2 && real) go(pooled_team_kernel<2, false, true>);
    else if (kind == 2) go(pooled_team_kernel<2, false, false>);
    else go(pooled_team_kernel<2, true, false>);
    c = check("pooled_team_kernel launch");
    if (c != ok) return c;
  }
  BLOCHSIM_CUDA(cudaFreeAsync(work, st), "cudaFreeAsync");
  return ok;
}

// Directions of one pass of the pooled Jacobian kernel.
struct PooledDirs {
  int field[4];
  float seed[4];
  int n;       // directions of this pass (<= 4)
  int first;   // their first column in jac
  int total;   // columns of jac
};

// One thread a problem of the pooled Jacobian (pools/pools.hpp pooled_problem on
// Dual<double, N>), its workspace contiguous (per values of S a thread).
template <int N>
__global__ void pooled_jacobian_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, PooledDirs dirs,
                                       int64_t first, int64_t count, Dual<double, N>* work, int64_t per, float* out,
                                       float* jac) {
  using S = Dual<double, N>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  const int64_t i = first + c, ns = s.n_samples;
  pooled_problem<S>(s, t, p, ls, i, dirs.field, dirs.n, dirs.seed, work + c * per,
                    [&](int32_t slot, const Cx<S>& v) {
                      float* o = out + (i * ns + slot) * 2;
                      o[0] = static_cast<float>(v.re.v);
                      o[1] = static_cast<float>(v.im.v);
                      for (int j = 0; j < dirs.n; ++j) {
                        float* d = jac + ((i * dirs.total + dirs.first + j) * ns + slot) * 2;
                        d[0] = static_cast<float>(v.re.d[j]);
                        d[1] = static_cast<float>(v.im.d[j]);
                      }
                    });
}

// Copies the present properties of t and p (host arrays of length t.n or 1)
// into the device buffer buf at offsets after `used` bytes, pointing dt and
// dp at them.
inline void place_properties(const Tissue& t, const Pools& p, Tissue& dt, Pools& dp, std::vector<unsigned char>& h,
                             std::vector<std::pair<Property*, size_t>>& where) {
  auto one = [&](const Property& src, Property& dst) {
    dst = src;
    if (!src.data) return;
    const int64_t count = src.stride == 0 ? 1 : t.n;
    where.emplace_back(&dst, put(h, src.data, count));
  };
  dt = t;
  dp = p;
  for (int f = 0; f < tissue_fields; ++f) one(t[f], dt[f]);
  for (int f = tissue_fields; f < pool_field_count; ++f) one(p[f], dp[f]);
}

// Checks a pooled entry's stream, tissue and pools: their values too for
// host arrays (values), only their configuration for device arrays (their
// values were checked before they reached the device).  0 or a Status.
inline int checked_pools(const EventStream& s, const Tissue& t, const Pools& p, bool values) {
  const int v = validate(s, t, true);
  if (v != ok) return v;
  return values ? validate_pools(s, t, p) : validate_pool_config(s, t, p);
}

// Where put_lineshape placed the super-Lorentzian table in a staging vector.
struct LineshapeAt {
  size_t g, dg_dt;
};

// Appends the host's super-Lorentzian table to the staging vector h.
inline LineshapeAt put_lineshape(std::vector<unsigned char>& h) {
  const LineshapeTable hl = host_lineshape_table();
  const size_t g = put(h, hl.g, lineshape_detail::table_points);
  return {g, put(h, hl.dg_dt, lineshape_detail::table_points)};
}

// The table put_lineshape placed at `at`, read from the device copy b of
// the staging vector.
inline LineshapeTable lineshape_at(const unsigned char* b, LineshapeAt at) {
  LineshapeTable dl = host_lineshape_table();
  dl.g = reinterpret_cast<const double*>(b + at.g);
  dl.dg_dt = reinterpret_cast<const double*>(b + at.dg_dt);
  return dl;
}

// Moves the tissue and pool properties of t and p (host arrays) and the
// super-Lorentzian table into one device buffer *props (the caller frees
// it), and points dt, dp and dl at it.
inline cudaError_t upload_pool_inputs(const Tissue& t, const Pools& p, cudaStream_t st, void** props, Tissue& dt,
                                      Pools& dp, LineshapeTable& dl) {
  std::vector<unsigned char> h;
  std::vector<std::pair<Property*, size_t>> where;
  place_properties(t, p, dt, dp, h, where);
  const LineshapeAt ls = put_lineshape(h);
  cudaError_t e = pool_malloc(props, h.size(), st);
  if (e != cudaSuccess) return e;
  e = cudaMemcpyAsync(*props, h.data(), h.size(), cudaMemcpyHostToDevice, st);
  if (e != cudaSuccess) return e;
  // the staging vector must outlive the copy
  e = cudaStreamSynchronize(st);
  unsigned char* b = static_cast<unsigned char*>(*props);
  for (auto& w : where) w.first->data = reinterpret_cast<const float*>(b + w.second);
  dl = lineshape_at(b, ls);
  return e;
}

// Tissue directions of the pooled adjoint kernel.
struct PooledAdjointDirs {
  int field[pool_field_count];
  int n;
  unsigned mask;  // the event parameters computed
};

// One thread a problem of the pooled adjoint (pools/adjoint.hpp on duals of
// W directions): its event gradients into its own row block of `rows`
// (count, n_events, pooled_event_gradients), summed afterwards in order.
template <int W>
__global__ void pooled_adjoint_kernel(EventStream s, Tissue t, Pools p, LineshapeTable ls, PooledAdjointDirs dirs,
                                      int64_t first, int64_t count, double* work, int64_t per, const float* cot,
                                      double* rows, float* tgrad) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= count) return;
  const int64_t i = first + c, m = s.n_events * pooled_event_gradients;
  double* r = rows + c * m;
  for (int64_t j = 0; j < m; ++j) r[j] = 0.0;
  pooled_adjoint_problem<W>(s, t, p, ls, i, dirs.mask, dirs.field, dirs.n, cot + i * s.n_samples * 2, work + c * per, r,
                            tgrad + i * dirs.n);
}

// acc[j] += rows[c m + j] for c = 0 .. count - 1, one at a time, so that
// the total is summed in problem order whatever the launches' sizes (a
// template, like the kernels above, compiled only where called).
template <class T>
__global__ void sum_rows_kernel(const T* rows, int64_t count, int64_t m, T* acc) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= m) return;
  T sum = acc[j];
  for (int64_t c = 0; c < count; ++c) sum += rows[c * m + j];
  acc[j] = sum;
}

}  // namespace detail

// The pooled Jacobian's launches on the device: device properties dt, dp
// (n problems), the packed stream ds, outputs dout (n, s.n_samples) and
// djac (n, n_dirs, s.n_samples) complex64 on the device; one thread a
// problem in double precision (pooled_problem on duals), four directions a
// pass (every pass on four-direction duals, one kernel for all counts), in
// launches of as many problems as fit in a quarter of the free memory.
// Ordered on st.
template <int Unused = 0>
inline int pooled_jacobian_launches(const EventStream& ds, int64_t n_problems, const Tissue& dt, const Pools& dp,
                                    const LineshapeTable& dl, const int* fields, int n_dirs, const float* seeds,
                                    float* dout, float* djac, cudaStream_t st, char* err, int n) {
  using namespace detail;
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_CUDA(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  constexpr int threads = 128;
  for (int d0 = 0; d0 < n_dirs; d0 += 4) {
    PooledDirs dirs{};
    dirs.n = std::min(4, n_dirs - d0);
    dirs.first = d0;
    dirs.total = n_dirs;
    for (int j = 0; j < dirs.n; ++j) {
      dirs.field[j] = fields[d0 + j];
      dirs.seed[j] = seeds ? seeds[d0 + j] : 1.0f;
    }
    const int64_t per_vals = pool_workspace(ds, dp);
    using S = Dual<double, 4>;
    const int64_t per = per_vals * static_cast<int64_t>(sizeof(S));
    // a quarter of the free memory: the kernel's local memory (the
    // exponentials' scratch on duals) is reserved at launch
    const int64_t chunk =
        std::max<int64_t>(1, std::min<int64_t>(n_problems, static_cast<int64_t>(free_b / 4) / per));
    S* jw = nullptr;
    BLOCHSIM_CUDA(pool_malloc(reinterpret_cast<void**>(&jw), static_cast<size_t>(chunk * per), st),
                  "cudaMallocFromPoolAsync (Jacobian workspace)");
    for (int64_t first = 0; first < n_problems; first += chunk) {
      const int64_t count = std::min<int64_t>(chunk, n_problems - first);
      const unsigned blocks = static_cast<unsigned>((count + threads - 1) / threads);
      pooled_jacobian_kernel<4><<<blocks, threads, 0, st>>>(ds, dt, dp, dl, dirs, first, count, jw, per_vals, dout,
                                                            djac);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) {
        cudaFreeAsync(jw, st);
        return fail(e, "pooled_jacobian_kernel launch", err, n);
      }
    }
    BLOCHSIM_CUDA(cudaFreeAsync(jw, st), "cudaFreeAsync");
  }
  return ok;
}

// The directions of a pooled Jacobian, checked: each a pooled direction.
inline int check_pooled_directions(const int* fields, int n_dirs, const float* jac) {
  if (n_dirs < 0 || (n_dirs > 0 && (!fields || !jac))) return bad_shape;
  for (int j = 0; j < n_dirs; ++j)
    if (!pooled_direction(fields[j])) return bad_shape;
  return ok;
}

// In the pooled entries below: a CUDA call that fails ends the entry
// through its finish(), with the error's message.
#define BLOCHSIM_POOLED_TRY(call, what)                                   \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    if (e_ != cudaSuccess) return finish(fail(e_, what, err, n));          \
  } while (0)

// The forward pooled EPG on the device for host inputs and output: the
// stream, the tissue and pool properties (host arrays of length t.n or 1)
// and out ((t.n, s.n_samples) complex64, host) are moved through the
// device, in launches of as many problems as fit in half the free memory.
// Synchronous.  Returns 0, a blochsim Status, or cuda_error_base +
// cudaError_t with a message in err (n bytes).
//
// With n_dirs > 0 it also writes the Jacobian jac ((t.n, n_dirs, s.n_samples)
// complex64, host), fields and seeds as host::pooled_status, by one thread a
// problem in double precision (pooled_problem on duals), four directions a
// pass (every pass on four-direction duals, one kernel for all counts).
template <class V = float>
inline int pooled_from_host(const EventStream& s, const Tissue& t, const Pools& p, float* out, char* err = nullptr,
                            int n = 0, const int* fields = nullptr, int n_dirs = 0, const float* seeds = nullptr,
                            float* jac = nullptr) {
  using namespace detail;
  const int v = checked_pools(s, t, p, true);
  if (v != ok) return say(v, err, n);
  const int vd = check_pooled_directions(fields, n_dirs, jac);
  if (vd != ok) return say(vd, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  no_stale_error();
  cudaStream_t st = nullptr;
  BLOCHSIM_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceStream d;
  void* props = nullptr;
  float* dout = nullptr;
  float* djac = nullptr;
  int* status = nullptr;
  int r = ok;
  auto finish = [&](int result) {
    if (dout) cudaFreeAsync(dout, st);
    if (djac) cudaFreeAsync(djac, st);
    if (props) cudaFreeAsync(props, st);
    if (status) cudaFreeAsync(status, st);
    if (d.buf) cudaFreeAsync(d.buf, st);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    return result;
  };
  r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  Tissue dt;
  Pools dp;
  LineshapeTable dl;
  BLOCHSIM_POOLED_TRY(upload_pool_inputs(t, p, st, &props, dt, dp, dl), "upload of the tissue");
  const size_t out_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(s.n_samples) * 8;
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dout), out_bytes, st), "cudaMallocFromPoolAsync (output)");
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&status), sizeof(int), st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemsetAsync(status, 0, sizeof(int), st), "cudaMemsetAsync");
  const size_t jac_bytes = out_bytes * static_cast<size_t>(n_dirs);
  if (n_dirs > 0)
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&djac), jac_bytes, st),
                        "cudaMallocFromPoolAsync (Jacobian)");
  if (n_dirs > 0) {
    r = pooled_jacobian_launches(d.ds, t.n, dt, dp, dl, fields, n_dirs, seeds, dout, djac, st, err, n);
    if (r != ok) return finish(r);
  }
  if (n_dirs == 0) {
    r = pooled_forward_launches<V>(s, d.ds, dt, dp, dl, dout, status, st, err, n);
    if (r != ok) return finish(r);
  }
  int hs = 0;
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(&hs, status, sizeof(int), cudaMemcpyDeviceToHost, st), "copy of the status");
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(out, dout, out_bytes, cudaMemcpyDeviceToHost, st), "copy of the output");
  if (n_dirs > 0)
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(jac, djac, jac_bytes, cudaMemcpyDeviceToHost, st), "copy of the Jacobian");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled_kernel");
  if (hs != ok) return finish(say(hs, err, n));
  return finish(ok);
}

// The forward pooled EPG for device properties: t and p point at device
// arrays (length t.n or 1, float32 SI values, already checked: fractions
// each >= 0 and summing to at most 1, rates >= 0, times > 0; only the
// configuration is checked here), out at (t.n, s.n_samples) complex64 on
// the device; s is a host stream.  Ordered on `stream`, and synchronous
// with it (the kernels' status is read back).  Returns 0, a blochsim
// Status, or cuda_error_base + cudaError_t with a message in err.
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
//
// With n_dirs > 0 it also writes the Jacobian jac ((t.n, n_dirs,
// s.n_samples) complex64, device), fields and seeds as pooled_from_host.
template <int Unused = 0>
inline int pooled_device(const EventStream& s, const Tissue& t, const Pools& p, float* out, cudaStream_t stream,
                         char* err = nullptr, int n = 0, const int* fields = nullptr, int n_dirs = 0,
                         const float* seeds = nullptr, float* jac = nullptr) {
  using namespace detail;
  const int v = checked_pools(s, t, p, false);
  if (v != ok) return say(v, err, n);
  const int vd = check_pooled_directions(fields, n_dirs, jac);
  if (vd != ok) return say(vd, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  no_stale_error();
  cudaStream_t st = stream;
  DeviceStream d;
  void* props = nullptr;
  int* status = nullptr;
  auto finish = [&](int result) {
    if (props) cudaFreeAsync(props, st);
    if (d.buf) cudaFreeAsync(d.buf, st);
    return result;
  };
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  // the super-Lorentzian table and the status word
  std::vector<unsigned char> h;
  const LineshapeAt ls = put_lineshape(h);
  const int zero = 0;
  const size_t o_status = put(h, &zero, 1);
  BLOCHSIM_POOLED_TRY(pool_malloc(&props, h.size(), st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(props, h.data(), h.size(), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  unsigned char* b = static_cast<unsigned char*>(props);
  const LineshapeTable dl = lineshape_at(b, ls);
  status = reinterpret_cast<int*>(b + o_status);
  r = n_dirs > 0 ? pooled_jacobian_launches(d.ds, t.n, t, p, dl, fields, n_dirs, seeds, out, jac, st, err, n)
                 : pooled_forward_launches<float>(s, d.ds, t, p, dl, out, status, st, err, n);
  if (r != ok) {
    cudaStreamSynchronize(st);
    return finish(r);
  }
  int hs = 0;
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(&hs, status, sizeof(int), cudaMemcpyDeviceToHost, st), "copy of the status");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled kernels");
  return finish(hs != ok ? say(hs, err, n) : ok);
}

// Checks the tissue directions of a pooled adjoint into dirs.
inline int pooled_adjoint_directions(const int* fields, int n_tdirs, unsigned mask, bool grads,
                                     detail::PooledAdjointDirs& dirs) {
  if (mask > pooled_all_event_dirs || n_tdirs < 0 || n_tdirs > pool_field_count || (n_tdirs > 0 && (!fields || !grads)))
    return bad_shape;
  dirs = detail::PooledAdjointDirs{};
  dirs.mask = mask;
  dirs.n = n_tdirs;
  for (int j = 0; j < n_tdirs; ++j) {
    if (!pooled_direction(fields[j])) return bad_shape;
    for (int l = 0; l < j; ++l)
      if (fields[l] == fields[j]) return bad_shape;
    dirs.field[j] = fields[j];
  }
  return ok;
}

// The pooled adjoint's launches: device properties dt, dp (n problems),
// the packed stream ds (s its host form), the cotangent dcot (n,
// s.n_samples) complex64 and the tissue gradients dtg (n, dirs.n) float32
// on the device; the event gradients summed in problem order into the host
// array ev_grad (s.n_events, pooled_event_gradients).  One thread a
// problem in double precision, the per-event play on duals of W
// directions, launches of as many problems as fit in a quarter of the free
// memory.  Synchronous with st.
template <int W = pooled_adjoint_width>
inline int pooled_adjoint_launches(const EventStream& s, const EventStream& ds, int64_t n_problems, const Tissue& dt,
                                   const Pools& dp, const LineshapeTable& dl, const detail::PooledAdjointDirs& dirs,
                                   const float* dcot, float* dtg, double* ev_grad, cudaStream_t st, char* err, int n) {
  using namespace detail;
  const int64_t m = s.n_events * pooled_event_gradients;
  double *work = nullptr, *rows = nullptr, *acc = nullptr;
  auto finish = [&](int result) {
    for (void* q : {static_cast<void*>(work), static_cast<void*>(rows), static_cast<void*>(acc)})
      if (q) cudaFreeAsync(q, st);
    cudaStreamSynchronize(st);
    return result;
  };
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&acc), static_cast<size_t>(m) * 8, st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemsetAsync(acc, 0, static_cast<size_t>(m) * 8, st), "cudaMemsetAsync");
  size_t free_b = 0, total_b = 0;
  BLOCHSIM_POOLED_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  // The kernel's stack (its duals in double precision: over 100 kB a
  // thread) is reserved at launch for every thread the device can hold, so
  // it comes out of the free memory before the workspace's quarter.
  cudaFuncAttributes fa{};
  BLOCHSIM_POOLED_TRY(cudaFuncGetAttributes(&fa, pooled_adjoint_kernel<W>), "cudaFuncGetAttributes");
  int dev = 0, sms = 0, per_sm = 0;
  BLOCHSIM_POOLED_TRY(cudaGetDevice(&dev), "cudaGetDevice");
  BLOCHSIM_POOLED_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  BLOCHSIM_POOLED_TRY(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev),
                      "cudaDeviceGetAttribute");
  const size_t stacks = fa.localSizeBytes * static_cast<size_t>(sms) * static_cast<size_t>(per_sm);
  const size_t spare = free_b > stacks ? free_b - stacks : 0;
  const int64_t per = pooled_adjoint_workspace(s, dp, dirs.mask, dirs.n, W);
  const int64_t per_bytes = (per + m) * 8;
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(n_problems, static_cast<int64_t>(spare / 4) / per_bytes));
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&work), static_cast<size_t>(chunk * per) * 8, st),
                      "cudaMallocFromPoolAsync (adjoint workspace)");
  BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&rows), static_cast<size_t>(chunk * m) * 8, st),
                      "cudaMallocFromPoolAsync (event gradients)");
  constexpr int threads = 64;
  for (int64_t first = 0; first < n_problems; first += chunk) {
    const int64_t count = std::min<int64_t>(chunk, n_problems - first);
    pooled_adjoint_kernel<W><<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, st>>>(
        ds, dt, dp, dl, dirs, first, count, work, per, dcot, rows, dtg);
    BLOCHSIM_POOLED_TRY(cudaGetLastError(), "pooled_adjoint_kernel launch");
    sum_rows_kernel<double><<<static_cast<unsigned>((m + 255) / 256), 256, 0, st>>>(rows, count, m, acc);
    BLOCHSIM_POOLED_TRY(cudaGetLastError(), "sum_rows_kernel launch");
  }
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(ev_grad, acc, static_cast<size_t>(m) * 8, cudaMemcpyDeviceToHost, st),
                      "copy of the event gradients");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "pooled_adjoint_kernel");
  return finish(ok);
}

// Reverse mode with pools on the device for host inputs and outputs
// (host::pooled_adjoint_status's counterpart, same arguments and results);
// pooled_adjoint_launches does the work, so the result does not depend on
// the launch size.  Synchronous.
template <int W = pooled_adjoint_width>
inline int pooled_adjoint_from_host(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                    int n_tdirs, const float* cot, double* ev_grad, float* tgrad,
                                    char* err = nullptr, int n = 0, unsigned mask = pooled_all_event_dirs) {
  using namespace detail;
  const int v = checked_pools(s, t, p, true);
  if (v != ok) return say(v, err, n);
  PooledAdjointDirs dirs;
  const int vd = pooled_adjoint_directions(fields, n_tdirs, mask, t.n == 0 || tgrad, dirs);
  if (vd != ok) return say(vd, err, n);
  const int64_t m = s.n_events * pooled_event_gradients;
  for (int64_t j = 0; j < m; ++j) ev_grad[j] = 0.0;
  if (s.n_events == 0 || t.n == 0) {
    for (int64_t j = 0; j < t.n * n_tdirs; ++j) tgrad[j] = 0.0f;
    return ok;
  }
  no_stale_error();
  cudaStream_t st = nullptr;
  BLOCHSIM_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  DeviceStream d;
  void* props = nullptr;
  float *dcot = nullptr, *dtg = nullptr;
  auto finish = [&](int result) {
    for (void* q : {static_cast<void*>(dcot), static_cast<void*>(dtg), props, d.buf})
      if (q) cudaFreeAsync(q, st);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    return result;
  };
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  Tissue dt;
  Pools dp;
  LineshapeTable dl;
  BLOCHSIM_POOLED_TRY(upload_pool_inputs(t, p, st, &props, dt, dp, dl), "upload of the tissue");
  const size_t cot_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(s.n_samples) * 8;
  const size_t tg_bytes = static_cast<size_t>(t.n) * static_cast<size_t>(n_tdirs) * 4;
  if (cot_bytes > 0) {
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dcot), cot_bytes, st), "cudaMallocFromPoolAsync (cotangent)");
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(dcot, cot, cot_bytes, cudaMemcpyHostToDevice, st), "copy of the cotangent");
  }
  if (tg_bytes > 0)
    BLOCHSIM_POOLED_TRY(pool_malloc(reinterpret_cast<void**>(&dtg), tg_bytes, st), "cudaMallocFromPoolAsync (gradient)");
  r = pooled_adjoint_launches<W>(s, d.ds, t.n, dt, dp, dl, dirs, dcot, dtg, ev_grad, st, err, n);
  if (r != ok) return finish(r);
  if (tg_bytes > 0)
    BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(tgrad, dtg, tg_bytes, cudaMemcpyDeviceToHost, st), "copy of the gradient");
  BLOCHSIM_POOLED_TRY(cudaStreamSynchronize(st), "copy of the gradient");
  return finish(ok);
}

// Reverse mode with pools for device properties: t and p point at device
// arrays (as pooled_device: values already checked), cot at the (t.n,
// s.n_samples) complex64 cotangent and tgrad at the (t.n, n_tdirs)
// float32 tissue gradients on the device; ev_grad (s.n_events,
// pooled_event_gradients) is a host array.  Ordered on `stream` and
// synchronous with it.
template <int W = pooled_adjoint_width>
inline int pooled_adjoint_device(const EventStream& s, const Tissue& t, const Pools& p, const int* fields,
                                 int n_tdirs, const float* cot, double* ev_grad, float* tgrad, cudaStream_t stream,
                                 char* err = nullptr, int n = 0, unsigned mask = pooled_all_event_dirs) {
  using namespace detail;
  const int v = checked_pools(s, t, p, false);
  if (v != ok) return say(v, err, n);
  PooledAdjointDirs dirs;
  const int vd = pooled_adjoint_directions(fields, n_tdirs, mask, t.n == 0 || tgrad, dirs);
  if (vd != ok) return say(vd, err, n);
  const int64_t m = s.n_events * pooled_event_gradients;
  for (int64_t j = 0; j < m; ++j) ev_grad[j] = 0.0;
  if (s.n_events == 0 || t.n == 0) return ok;
  no_stale_error();
  cudaStream_t st = stream;
  DeviceStream d;
  void* table = nullptr;
  auto finish = [&](int result) {
    if (table) cudaFreeAsync(table, st);
    if (d.buf) cudaFreeAsync(d.buf, st);
    cudaStreamSynchronize(st);
    return result;
  };
  int r = upload_stream(s, d, st, err, n);
  if (r != ok) return finish(r);
  std::vector<unsigned char> h;
  const LineshapeAt ls = put_lineshape(h);
  BLOCHSIM_POOLED_TRY(pool_malloc(&table, h.size(), st), "cudaMallocFromPoolAsync");
  BLOCHSIM_POOLED_TRY(cudaMemcpyAsync(table, h.data(), h.size(), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
  const LineshapeTable dl = lineshape_at(static_cast<unsigned char*>(table), ls);
  r = pooled_adjoint_launches<W>(s, d.ds, t.n, t, p, dl, dirs, cot, tgrad, ev_grad, st, err, n);
  return finish(r);
}

#undef BLOCHSIM_POOLED_TRY

}  // namespace cuda
}  // namespace blochsim
