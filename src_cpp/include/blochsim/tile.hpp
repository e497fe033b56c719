// The tile runtime: lane vectors and (orders, lanes) planes shared by the
// host and the device instantiation of every kernel.
//
// Kernels are written over a lane type V that holds one float per problem
// of a block: on the host V is a 16-wide GCC/Clang vector (one AVX-512
// register, two AVX2 registers, four SSE registers), so every arithmetic
// expression on V is a SIMD instruction over 16 problems; on the device V is
// a plain float and one thread holds one problem.  Lanes<V> says how many
// problems V holds and gives element access for the few per-lane steps
// (gathering tissue values, writing samples).
#pragma once

#include "config.hpp"

#include <cstring>
#include <utility>

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__))
#define BLOCHSIM_X86_INTRINSICS 1
#include <immintrin.h>
#endif

namespace blochsim {
inline namespace BLOCHSIM_ISA {

template <class V>
struct Lanes;

template <>
struct Lanes<float> {
  static constexpr int width = 1;
  using Double = double;
  using Scalar = float;  // one lane's value
  template <class M>
  using Wide = M;  // one lane's value in the precision M
  BLOCHSIM_HD static float splat(float s) { return s; }
  BLOCHSIM_HD static float get(const float& v, int) { return v; }
  BLOCHSIM_HD static void set(float& v, int, float x) { v = x; }
  BLOCHSIM_HD static double getd(const double& v, int) { return v; }
  BLOCHSIM_HD static void setd(double& v, int, double x) { v = x; }
  BLOCHSIM_HD static float narrow(const double& d) { return static_cast<float>(d); }
  BLOCHSIM_HD static double widen(const float& v) { return static_cast<double>(v); }
};

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define BLOCHSIM_HAVE_VECTOR_LANES 1
#if defined(__GNUC__) && !defined(__clang__)
// The lane vectors never cross an ABI boundary by value (kernels are
// inlined into their entry functions), so GCC's note that 64-byte vector
// returns depend on -mavx512f does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
// 16 floats (64 bytes) and 16 doubles; element access by subscript.
typedef float vfloat16 __attribute__((vector_size(64)));
typedef double vdouble16 __attribute__((vector_size(128)));
typedef float vfloat4 __attribute__((vector_size(16)));
typedef double vdouble4 __attribute__((vector_size(32)));
typedef float vfloat8 __attribute__((vector_size(32)));
typedef double vdouble8 __attribute__((vector_size(64)));

// The lanes of a GCC vector of W floats (F), with its double-precision
// twin (D).
template <class F, class D, int W>
struct VectorLanes {
  static constexpr int width = W;
  using Double = D;
  using Scalar = float;
  template <class M>
  using Wide = M;
  BLOCHSIM_FORCEINLINE static F splat(float s) { return F{} + s; }
  BLOCHSIM_FORCEINLINE static float get(const F& v, int l) { return v[l]; }
  BLOCHSIM_FORCEINLINE static void set(F& v, int l, float x) { v[l] = x; }
  BLOCHSIM_FORCEINLINE static double getd(const D& v, int l) { return v[l]; }
  BLOCHSIM_FORCEINLINE static void setd(D& v, int l, double x) { v[l] = x; }
  BLOCHSIM_FORCEINLINE static F narrow(const D& d) { return __builtin_convertvector(d, F); }
  BLOCHSIM_FORCEINLINE static D widen(const F& v) { return __builtin_convertvector(v, D); }
};
template <>
struct Lanes<vfloat16> : VectorLanes<vfloat16, vdouble16, 16> {};
template <>
struct Lanes<vfloat8> : VectorLanes<vfloat8, vdouble8, 8> {};
template <>
struct Lanes<vfloat4> : VectorLanes<vfloat4, vdouble4, 4> {};
#endif

// Whether any lane of a exceeds the same lane of b (the test that guards a
// rare per-lane step, such as a top-k insertion).
BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool any_greater(float a, float b) { return a > b; }
#if defined(BLOCHSIM_HAVE_VECTOR_LANES)
template <class V>
BLOCHSIM_FORCEINLINE bool any_greater(V a, V b) {
#if defined(BLOCHSIM_X86_INTRINSICS) && defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return _mm512_cmp_ps_mask((__m512)a, (__m512)b, _CMP_GT_OQ) != 0;
#endif
#if defined(BLOCHSIM_X86_INTRINSICS) && defined(__AVX__)
  if constexpr (sizeof(V) == 32) return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, (__m256)b, _CMP_GT_OQ)) != 0;
#endif
#if defined(BLOCHSIM_X86_INTRINSICS) && defined(__SSE__)
  if constexpr (sizeof(V) == 16) return _mm_movemask_ps(_mm_cmpgt_ps((__m128)a, (__m128)b)) != 0;
#endif
  bool any = false;
  for (int l = 0; l < Lanes<V>::width; ++l) any |= a[l] > b[l];
  return any;
}
#endif

// The element type of a lane type (itself for a scalar).
template <class V>
struct ElementOf {
  using type = V;
};
#if defined(BLOCHSIM_HAVE_VECTOR_LANES)
template <>
struct ElementOf<vfloat16> {
  using type = float;
};
template <>
struct ElementOf<vfloat8> {
  using type = float;
};
template <>
struct ElementOf<vfloat4> {
  using type = float;
};
template <>
struct ElementOf<vdouble8> {
  using type = double;
};
template <>
struct ElementOf<vdouble16> {
  using type = double;
};
template <>
struct ElementOf<vdouble4> {
  using type = double;
};
#endif

// The value of a per-lane scalar or lane vector (dual.hpp adds its duals'
// values).
BLOCHSIM_HD BLOCHSIM_FORCEINLINE float value_of(float x) { return x; }
BLOCHSIM_HD BLOCHSIM_FORCEINLINE double value_of(double x) { return x; }
#if defined(BLOCHSIM_HAVE_VECTOR_LANES)
BLOCHSIM_FORCEINLINE vfloat16 value_of(vfloat16 x) { return x; }
BLOCHSIM_FORCEINLINE vfloat8 value_of(vfloat8 x) { return x; }
BLOCHSIM_FORCEINLINE vfloat4 value_of(vfloat4 x) { return x; }
BLOCHSIM_FORCEINLINE vdouble8 value_of(vdouble8 x) { return x; }
BLOCHSIM_FORCEINLINE vdouble16 value_of(vdouble16 x) { return x; }
BLOCHSIM_FORCEINLINE vdouble4 value_of(vdouble4 x) { return x; }
#endif

// A lane vector with every lane equal to x.
template <class V>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE V splat(float x) {
  V v{};
  return v + x;
}

template <class D>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE D splatd(double x) {
  D v{};
  return v + x;
}

// The register transpose of a tile (host compilers; the CUDA front end's
// host pass writes samples one at a time).
#if defined(BLOCHSIM_HAVE_VECTOR_LANES) && !defined(__CUDACC__)
#define BLOCHSIM_TILE_TRANSPOSE 1
namespace tile_detail {
// Lanes I... of the concatenation a b (GCC's __builtin_shuffle predates its
// __builtin_shufflevector, which clang has).
template <class F, int... I>
BLOCHSIM_FORCEINLINE F shuffle2(const F& a, const F& b) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, I...);
#else
  typedef int Mask __attribute__((vector_size(sizeof(F))));
  return __builtin_shuffle(a, b, Mask{I...});
#endif
}
// One stage of a W x W transpose held as W rows of W lanes: rows a (row
// bit B clear) and b (row bit B set) exchange that bit of the row index
// with the same bit of the lane index.  Hi: the new row b, else the new a.
template <bool Hi, int B, class F, int... L>
BLOCHSIM_FORCEINLINE F tile_exchange(const F& a, const F& b, std::integer_sequence<int, L...>) {
  constexpr int W = sizeof...(L);
  return shuffle2<F, (Hi ? ((L >> B) & 1 ? W + L : L | (1 << B)) : ((L >> B) & 1 ? W + (L ^ (1 << B)) : L))...>(
      a, b);
}
template <int B, class F, int W>
BLOCHSIM_FORCEINLINE void tile_stage(F (&r)[W]) {
  using Seq = std::make_integer_sequence<int, W>;
  for (int i = 0; i < W; ++i) {
    if (i & (1 << B)) continue;
    const F a = r[i], b = r[i | (1 << B)];
    r[i] = tile_exchange<false, B>(a, b, Seq{});
    r[i | (1 << B)] = tile_exchange<true, B>(a, b, Seq{});
  }
}
template <class F, int W, int... B>
BLOCHSIM_FORCEINLINE void tile_transpose(F (&r)[W], std::integer_sequence<int, B...>) {
  (tile_stage<B>(r), ...);
}
// The low (Hi = false) or high half of a and b interleaved: a0 b0 a1 b1 ...
template <bool Hi, class F, int... L>
BLOCHSIM_FORCEINLINE F tile_interleave(const F& a, const F& b, std::integer_sequence<int, L...>) {
  constexpr int W = sizeof...(L);
  return shuffle2<F, ((L & 1 ? W : 0) + (Hi ? W / 2 : 0) + L / 2)...>(a, b);
}
constexpr int log2_of(int w) { return w <= 1 ? 0 : 1 + log2_of(w / 2); }
}  // namespace tile_detail

// Rows re[k], im[k] (lane l: problem l's sample k) written as lanes rows of
// 2 W floats, row l at out + l * stride: re[0][l], im[0][l], re[1][l], ...
// The tile is transposed in registers (log2 W stages of W two-source
// shuffles) and each row goes out as two unaligned vector stores.
template <class F, int W>
BLOCHSIM_FORCEINLINE void tile_write_rows(F (&re)[W], F (&im)[W], int lanes, float* out, int64_t stride) {
  static_assert(W == Lanes<F>::width, "a square tile of one lane vector a row");
  using Bits = std::make_integer_sequence<int, tile_detail::log2_of(W)>;
  tile_detail::tile_transpose(re, Bits{});
  tile_detail::tile_transpose(im, Bits{});
  using Seq = std::make_integer_sequence<int, W>;
  for (int l = 0; l < lanes; ++l) {
    const F lo = tile_detail::tile_interleave<false>(re[l], im[l], Seq{});
    const F hi = tile_detail::tile_interleave<true>(re[l], im[l], Seq{});
    std::memcpy(out + l * stride, &lo, sizeof(F));
    std::memcpy(out + l * stride + W, &hi, sizeof(F));
  }
}
#endif

// Samples of a block of problems staged a tile at a time: each readout's
// (re, im) lane vectors go in as one row of the tile, and a tile of W
// readouts of consecutive slots goes out transposed (tile_write_rows), each
// problem's W samples as 2 W contiguous floats, instead of 2 W scalar
// stores into W output rows per readout.  W = 1 (the device's one problem
// a thread) writes every sample as it comes.
template <class V>
struct SampleTile {
  static constexpr int W = Lanes<V>::width;
  V re[W], im[W];
  int64_t slot[W];
  int count = 0;

  // Stages one readout; true when the tile is full.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE bool push(int64_t s, const V& r, const V& i) {
    re[count] = r;
    im[count] = i;
    slot[count] = s;
    return ++count == W;
  }

  // Writes the staged readouts for the block's first min(left, W)
  // problems (left: the problems from the block's first to the call's
  // last), sample (l, slot) at base + l row + 2 slot (re, then im), then
  // empties the tile.  A tile of W consecutive slots is transposed; any
  // other is written a sample at a time in the order it was staged (a later
  // readout of a slot wins, as unstaged).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void flush(float* base, int64_t row, int64_t left) {
    const int lanes = static_cast<int>(left < W ? left : W);
#if defined(BLOCHSIM_TILE_TRANSPOSE)
    if constexpr (W > 1) {
      bool consecutive = count == W;
      for (int k = 1; k < count; ++k) consecutive &= slot[k] == slot[0] + k;
      if (consecutive) {
        tile_write_rows(re, im, lanes, base + 2 * slot[0], row);
        count = 0;
        return;
      }
    }
#endif
    for (int k = 0; k < count; ++k)
      for (int l = 0; l < lanes; ++l) {
        float* o = base + l * row + 2 * slot[k];
        o[0] = Lanes<V>::get(re[k], l);
        o[1] = Lanes<V>::get(im[k], l);
      }
    count = 0;
  }
};

// One real component of one EPG family (say Re F+) for a block of problems:
// row k holds order k of every lane.  Layout (orders,) of V.
template <class V>
struct Plane {
  V* BLOCHSIM_RESTRICT p;

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE V& operator[](int k) const { return p[k]; }

  // Zero orders [k0, k1).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void zero(int k0, int k1) const {
    for (int k = k0; k < k1; ++k) p[k] = V{};
  }

  // Row k takes row k-1 for k in [1, min(band, K-1)]; row 0 is left for the
  // caller.  Rows at or above `band` are zero on entry.
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_up(int band, int K) const {
    const int top = band < K ? band : K - 1;
    for (int k = top; k >= 1; --k) p[k] = p[k - 1];
  }

  // Row k takes row k+1 over [0, band - 1); row band - 1 becomes zero (it
  // takes row `band`, which is zero or past K - 1).
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void shift_down(int band) const {
    for (int k = 0; k + 1 < band; ++k) p[k] = p[k + 1];
    p[band - 1] = V{};
  }
};

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
