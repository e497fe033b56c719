// Tissue Jacobians on the device: the warp kernel on duals, its sinks, the
// block and tail kernels for more states, and jacobian_device().
#pragma once

#include "../epg/jacobian.hpp"
#include "forward.cuh"

namespace blochsim {
namespace cuda {

namespace detail {

// ---------------------------------------------------------------------------
// Tissue Jacobians: the warp kernel on duals (epg/jacobian.hpp), tangents in
// split form.  One launch covers every direction: the grid's y index is a
// group of up to jacobian_dirs dual directions, and each team carries its
// problem's value with its group's tangents, so that no team holds more than
// jacobian_dirs of them (duals of eight directions in one team, 2 orders a
// lane, spilled and ran 7x slower than pairs: bench/NOTES.md v0.7).  The
// loop plays with M0 = 1 and the sink scales by M0, so M0 is no dual
// direction (d S / d M0 is the unscaled sample, written by group 0 with the
// signal).

#ifndef BLOCHSIM_JACOBIAN_DIRS
#define BLOCHSIM_JACOBIAN_DIRS 2
#endif
#ifndef BLOCHSIM_JACOBIAN_ORDERS_REAL
#define BLOCHSIM_JACOBIAN_ORDERS_REAL 8
#endif
#ifndef BLOCHSIM_JACOBIAN_ORDERS_COMPLEX
#define BLOCHSIM_JACOBIAN_ORDERS_COMPLEX 4
#endif
#ifndef BLOCHSIM_JACOBIAN_MIN_BLOCKS
#define BLOCHSIM_JACOBIAN_MIN_BLOCKS 1
#endif
// Dual directions a team carries, orders a lane, and the blocks per SM
// the kernel's register budget is sized for (compile-time: -D to tune with
// bench/device_tune_jacobian.sh; the layouts measured are in bench/NOTES.md
// v0.8, none faster than these).
constexpr int jacobian_dirs = BLOCHSIM_JACOBIAN_DIRS;
constexpr int jacobian_min_blocks = BLOCHSIM_JACOBIAN_MIN_BLOCKS;
template <bool Complex>
BLOCHSIM_HD constexpr int jacobian_orders() {
  return Complex ? BLOCHSIM_JACOBIAN_ORDERS_COMPLEX : BLOCHSIM_JACOBIAN_ORDERS_REAL;
}

struct Directions {
  int n;       // dual directions of the call
  int total;   // output columns of the call: the stride of jac's rows
  int m0_col;  // the output column of M0, or -1
  int field[tissue_fields];
  int col[tissue_fields];     // the output column of dual direction j
  float seed[tissue_fields];  // d field / d direction
  float m0_seed;              // d M0 / d its column
};

// Member 0 of a team writes its group's derivatives of its problem's
// samples, and group 0 the samples and d / d M0, through the warp's stage:
// row 0 the samples, row 1 d / d M0, row 2 + j the group's tangent j.
constexpr int jacobian_rows = 2 + jacobian_dirs;
struct JacobianStagedSink : StagedRows<jacobian_rows> {
  static constexpr int ND = jacobian_dirs;
  float m0, m0_seed;
  // Points the lane's rows of the stage at their outputs (null: not written).
  BLOCHSIM_HD void rows(float2* row, float2* jrow, int64_t n_samples, const Directions& dirs, int first, bool writer,
                        bool values) {
    stage->row[lane] = writer && values ? row : nullptr;
    stage->row[32 + lane] = writer && values && dirs.m0_col >= 0 ? jrow + dirs.m0_col * n_samples : nullptr;
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j)
      stage->row[(2 + j) * 32 + lane] = writer && first + j < dirs.n ? jrow + dirs.col[first + j] * n_samples : nullptr;
  }
  BLOCHSIM_HD void write(int64_t slot, const Dual<float, ND>& re, const Dual<float, ND>& im) {
    put(0, m0 * re.v, m0 * im.v);
    put(1, m0_seed * re.v, m0_seed * im.v);
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j) put(2 + j, m0 * re.d[j], m0 * im.d[j]);
    next(slot);
  }
};

// The same, a store per readout and row (the paths not staged).
struct JacobianDeviceSink {
  static constexpr int ND = jacobian_dirs;
  float2* row;   // the problem's samples
  float2* jrow;  // its (total, n_samples) derivatives
  int64_t n_samples;
  const Directions* dirs;
  int first;  // the group's first dual direction
  float m0;
  bool writer, values;
  BLOCHSIM_HD void write(int64_t slot, const Dual<float, ND>& re, const Dual<float, ND>& im) {
    if (!writer) return;
    if (values) {
      row[slot] = make_float2(m0 * re.v, m0 * im.v);
      if (dirs->m0_col >= 0)
        jrow[dirs->m0_col * n_samples + slot] = make_float2(dirs->m0_seed * re.v, dirs->m0_seed * im.v);
    }
BLOCHSIM_UNROLL
    for (int j = 0; j < ND; ++j)
      if (first + j < dirs->n)
        jrow[dirs->col[first + j] * n_samples + slot] = make_float2(m0 * re.d[j], m0 * im.d[j]);
  }
};

#ifndef BLOCHSIM_JACOBIAN_STAGED
#define BLOCHSIM_JACOBIAN_STAGED 1
#endif
// Which paths stage the Jacobian's rows: 1 the real, 2 the complex, 3 both.
// Staging makes d / d M0 free on the real path and costs the complex path
// 12 % (bench/NOTES.md v0.9), which is issue-bound as the forward's.
template <bool Complex>
BLOCHSIM_HD constexpr bool jacobian_staged() {
  return (BLOCHSIM_JACOBIAN_STAGED & (Complex ? 2 : 1)) != 0;
}

template <bool Complex>
__global__ void __launch_bounds__(warp_block, jacobian_min_blocks) jacobian_kernel(EventStream s, Tissue t,
                                                             const __grid_constant__ Directions dirs, float* out,
                                                             float* jac, int T, int32_t window) {
  // (dirs is read in place: __grid_constant__ lets the kernel take the
  // parameter's address without a copy to local memory)
  constexpr int ND = jacobian_dirs;
  using D = Dual<float, ND>;
  constexpr int R = jacobian_orders<Complex>();
  extern __shared__ __align__(16) unsigned char shared[];
  const BlockShared sm{shared, window, static_cast<int>(blockDim.x)};
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Seat at = seat(g / 32, static_cast<int>(g % 32), 32, T, 32 / T, t.n);
  const int first = static_cast<int>(blockIdx.y) * ND;
  const int count = dirs.n - first < ND ? dirs.n - first : ND;
  epg::LaneTissue<D> lt = epg::seeded_tissue<ND>(t, at.problem, dirs.field + first, count, dirs.seed + first);
  const float m0 = lt[field_M0].v;
  lt[field_M0] = D(1.0f);
  epg::SplitStore<epg::RegisterStore<D, R, Complex, WarpTeam<false>>, float, ND, Complex> st;
  st.directions(dirs.field + first, count);
  st.init(s, lt, WarpTeam<false>{at.rank, T, at.rank * R, at.last, sm.records()});
  float2* row = reinterpret_cast<float2*>(out) + at.problem * s.n_samples;
  float2* jrow = reinterpret_cast<float2*>(jac) + at.problem * dirs.total * s.n_samples;
  if constexpr (jacobian_staged<Complex>()) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    JacobianStagedSink sink{{sm.stage<jacobian_rows>(static_cast<int>(threadIdx.x / 32)), lane, 0}, m0, dirs.m0_seed};
    sink.rows(row, jrow, s.n_samples, dirs, first, at.writer, blockIdx.y == 0);
    epg::play<D, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
    if (sink.count > 0) sink.flush();
  } else {
    JacobianDeviceSink sink{row, jrow, s.n_samples, &dirs, first, m0, at.writer, blockIdx.y == 0};
    epg::play<D, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
  }
}

// Teams of a block, for the states a warp team does not hold: T threads of
// jacobian_orders() each, `per` teams a block (block_kind), boundary orders
// through shared memory; with Tail one team of blockDim.x threads a block,
// problem first + blockIdx.x, the orders past its registers in `scratch`
// (ws dual elements per problem and group of directions).  The grid's y
// index is the group of directions, as in jacobian_kernel.
constexpr int jacobian_block_threads = 256;
// floats a thread passes to its neighbour at once: a dual of jacobian_dirs
constexpr int jacobian_exchange_width = jacobian_dirs + 1;

template <bool Complex, bool Tail>
__global__ void __launch_bounds__(jacobian_block_threads)
    jacobian_block_kernel(EventStream s, Tissue t, const __grid_constant__ Directions dirs, float* out, float* jac,
                          int T, int per, Dual<float, jacobian_dirs>* scratch, int64_t first_problem, int64_t ws,
                          int32_t window) {
  constexpr int ND = jacobian_dirs;
  using D = Dual<float, ND>;
  constexpr int R = jacobian_orders<Complex>();
  extern __shared__ __align__(16) unsigned char shared[];
  const int tid = threadIdx.x;
  const BlockShared sm{shared, window, static_cast<int>(blockDim.x), jacobian_exchange_width};
  Seat at;
  if (Tail) {
    T = blockDim.x;
    at = {first_problem + blockIdx.x, tid, tid == T - 1, tid == 0};
  } else {
    at = seat(blockIdx.x, tid, blockDim.x, T, per, t.n);
  }
  const int first = static_cast<int>(blockIdx.y) * ND;
  const int count = dirs.n - first < ND ? dirs.n - first : ND;
  epg::LaneTissue<D> lt = epg::seeded_tissue<ND>(t, at.problem, dirs.field + first, count, dirs.seed + first);
  const float m0 = lt[field_M0].v;
  lt[field_M0] = D(1.0f);
  const BlockTeam team{at.rank, T, at.rank * R, tid, at.last, sm.exchange(), sm.records()};
  JacobianDeviceSink sink{reinterpret_cast<float2*>(out) + at.problem * s.n_samples,
                          reinterpret_cast<float2*>(jac) + at.problem * dirs.total * s.n_samples,
                          s.n_samples, &dirs, first, m0, at.writer, blockIdx.y == 0};
  if constexpr (Tail) {
    epg::SplitStore<epg::TailStore<D, R, Complex, BlockTeam>, float, ND, Complex> st;
    st.directions(dirs.field + first, count);
    st.init(s, lt, team, scratch + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * ws);
    epg::play<D, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
  } else {
    epg::SplitStore<epg::RegisterStore<D, R, Complex, BlockTeam>, float, ND, Complex> st;
    st.directions(dirs.field + first, count);
    st.init(s, lt, team);
    epg::play<D, Complex>(s, t, lt, st, sink, epg::LaneProblems{at.problem, 0});
  }
}

// Launches the block or tail Jacobian kernel of path Complex for K orders.
template <bool Complex>
inline int launch_jacobian_blocks(const EventStream& ds, const Tissue& t, const Directions& dirs, float* out,
                                  float* jac, cudaStream_t st, char* err, int n) {
  using D = Dual<float, jacobian_dirs>;
  constexpr int R = jacobian_orders<Complex>();
  const int32_t w = window_records(ds);
  const unsigned groups = static_cast<unsigned>(std::max(1, (dirs.n + jacobian_dirs - 1) / jacobian_dirs));
  const int T = (ds.states + R - 1) / R;
  if (T <= jacobian_block_threads) {
    const int per = jacobian_block_threads / T;
    const int threads = (per * T + 31) / 32 * 32;
    const size_t smem = BlockShared::bytes(w, threads, 0, jacobian_exchange_width);
    const dim3 grid(static_cast<unsigned>((t.n + per - 1) / per), groups);
    BLOCHSIM_CUDA(allow_shared(jacobian_block_kernel<Complex, false>, smem), "cudaFuncSetAttribute");
    jacobian_block_kernel<Complex, false><<<grid, threads, smem, st>>>(ds, t, dirs, out, jac, T, per, nullptr, 0, 0, w);
    BLOCHSIM_CUDA(cudaGetLastError(), "jacobian_block_kernel launch");
    return ok;
  }
  constexpr int TT = jacobian_block_threads;
  const int64_t ws = epg::TailStore<D, R, Complex, BlockTeam>::workspace(ds.states, TT);
  const size_t smem = BlockShared::bytes(w, TT, 0, jacobian_exchange_width);
  BLOCHSIM_CUDA(allow_shared(jacobian_block_kernel<Complex, true>, smem), "cudaFuncSetAttribute");
  return tail_chunks(t.n, ws * static_cast<int64_t>(sizeof(D)) * groups, st, err, n,
                     [&](int64_t first, int64_t count, void* scratch) {
                       const dim3 grid(static_cast<unsigned>(count), groups);
                       jacobian_block_kernel<Complex, true><<<grid, TT, smem, st>>>(
                           ds, t, dirs, out, jac, TT, 1, static_cast<D*>(scratch), first, ws, w);
                       BLOCHSIM_CUDA(cudaGetLastError(), "jacobian_block_kernel (tail) launch");
                       return static_cast<int>(ok);
                     });
}

// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
inline int launch_jacobian(const EventStream& ds, const Tissue& t, const Directions& dirs, float* out,
                           float* jac, cudaStream_t st, char* err, int n) {
  no_stale_error();
  const bool cplx = !ds.real_path;
  const int R = cplx ? jacobian_orders<true>() : jacobian_orders<false>();
  const int T = (ds.states + R - 1) / R;
  if (T > 32)
    return cplx ? launch_jacobian_blocks<true>(ds, t, dirs, out, jac, st, err, n)
                : launch_jacobian_blocks<false>(ds, t, dirs, out, jac, st, err, n);
  const int32_t w = window_records(ds);
  const int per = 32 / T;
  const int64_t warps = (t.n + per - 1) / per;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + warp_block - 1) / warp_block);
  const size_t smem =
      BlockShared::bytes(w, warp_block, jacobian_staged<false>() || jacobian_staged<true>() ? sizeof(WarpStage<jacobian_rows>) : 0);
  const dim3 grid(blocks, static_cast<unsigned>(std::max(1, (dirs.n + jacobian_dirs - 1) / jacobian_dirs)));
  if (cplx) {
    BLOCHSIM_CUDA(allow_shared(jacobian_kernel<true>, smem), "cudaFuncSetAttribute");
    jacobian_kernel<true><<<grid, warp_block, smem, st>>>(ds, t, dirs, out, jac, T, w);
  } else {
    BLOCHSIM_CUDA(allow_shared(jacobian_kernel<false>, smem), "cudaFuncSetAttribute");
    jacobian_kernel<false><<<grid, warp_block, smem, st>>>(ds, t, dirs, out, jac, T, w);
  }
  BLOCHSIM_CUDA(cudaGetLastError(), "jacobian_kernel launch");
  return ok;
}

}  // namespace detail

// Signal and tissue Jacobian on the device: out as forward_device, jac
// (t.n, n_dirs, s.n_samples) complex64 interleaved (device pointers), the
// derivative of each sample with respect to tissue field fields[j]
// (TissueField) in its SI unit, for 1 <= n_dirs <= tissue_fields distinct
// fields, in one launch: M0 comes with the signal, and the other
// directions are spread over teams of jacobian_dirs each (each team plays
// its problem's value with them).  With seeds, direction j is seeded
// d field / d direction = seeds[j] (the SI value of one public unit gives
// derivatives per public unit).  Any K: a warp team up to 32 threads of
// jacobian_orders(), a block team up to jacobian_block_threads, past them
// the orders beyond the block's registers in device memory.  Ordered on
// `stream`, not synchronised.
// (A template, so that only a translation unit that calls it instantiates
// its kernels.)
template <int Unused = 0>
inline int jacobian_device(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, float* out,
                           float* jac, cudaStream_t stream, char* err = nullptr, int n = 0,
                           const float* seeds = nullptr) {
  const int v = validate(s, t);
  if (v != ok) return detail::say(v, err, n);
  const int dv = validate_directions(fields, n_dirs);
  if (dv != ok) return detail::say(dv, err, n);
  if (t.n == 0 || s.n_samples == 0) return ok;
  detail::DeviceStream d;
  int r = detail::upload_stream(s, d, stream, err, n);
  if (r != ok) return r;
  const epg::DirectionSlots ds(fields, n_dirs, seeds);
  detail::Directions dirs{};
  dirs.n = ds.n_duals;
  dirs.total = n_dirs;
  dirs.m0_col = ds.m0_col;
  dirs.m0_seed = ds.m0_seed;
  for (int j = 0; j < ds.n_duals; ++j) {
    dirs.col[j] = ds.col[j];
    dirs.field[j] = ds.duals[j];
    dirs.seed[j] = ds.dseeds[j];
  }
  r = detail::launch_jacobian(d.ds, t, dirs, out, jac, stream, err, n);
  const cudaError_t e = cudaFreeAsync(d.buf, stream);
  if (r != ok) return r;
  if (e != cudaSuccess) return detail::fail(e, "cudaFreeAsync", err, n);
  return ok;
}

}  // namespace cuda
}  // namespace blochsim
