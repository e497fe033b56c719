// Multi-direction dual numbers: a value and its derivatives along N
// directions, x = v + sum_j d[j] eps_j with eps_i eps_j = 0.  Every kernel
// template of epg/epg.hpp runs on them unchanged, so one pass over the events
// gives the signal and its derivative with respect to N tissue properties
// (forward-mode differentiation; Griewank & Walther, Evaluating
// Derivatives, 2nd ed., SIAM 2008, ch. 3).
//
// V is a lane type of tile.hpp (a float on the device, a vector of 16 floats
// on the host), a per-lane scalar (float, double), or itself a dual: a dual
// of duals carries mixed second derivatives (the adjoint's second order,
// epg/adjoint.hpp).  Lanes<Dual<V, N>> gives per-lane access as a dual of V's
// per-lane scalar.
#pragma once

#include <cmath>
#include <type_traits>

#include "tile.hpp"

namespace blochsim {
inline namespace BLOCHSIM_ISA {

template <class V, int N>
struct Dual;

// A dual's element type is its lanes' (so a constant converts through it).
template <class V, int N>
struct ElementOf<Dual<V, N>> {
  using type = typename ElementOf<V>::type;
};

template <class V, int N>
struct Dual {
  V v;
  V d[N];

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual() : v{} {
    for (int j = 0; j < N; ++j) d[j] = V{};
  }
  // a constant: no derivative
  template <class S, class = decltype(static_cast<typename ElementOf<V>::type>(S{}))>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual(S x) : v(V{} + static_cast<typename ElementOf<V>::type>(x)) {
    for (int j = 0; j < N; ++j) d[j] = V{};
  }
  // from another precision (float <-> double per-lane scalars)
  template <class W>
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE explicit Dual(const Dual<W, N>& x) : v(static_cast<V>(x.v)) {
    for (int j = 0; j < N; ++j) d[j] = static_cast<V>(x.d[j]);
  }

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual& operator+=(const Dual& b) {
    v += b.v;
    for (int j = 0; j < N; ++j) d[j] += b.d[j];
    return *this;
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual& operator-=(const Dual& b) {
    v -= b.v;
    for (int j = 0; j < N; ++j) d[j] -= b.d[j];
    return *this;
  }
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual& operator*=(const Dual& b) {
    for (int j = 0; j < N; ++j) d[j] = d[j] * b.v + v * b.d[j];
    v *= b.v;
    return *this;
  }
};

template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator+(Dual<V, N> a, const Dual<V, N>& b) {
  return a += b;
}
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator-(Dual<V, N> a, const Dual<V, N>& b) {
  return a -= b;
}
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator-(const Dual<V, N>& a) {
  Dual<V, N> r;
  r.v = -a.v;
  for (int j = 0; j < N; ++j) r.d[j] = -a.d[j];
  return r;
}
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator*(const Dual<V, N>& a, const Dual<V, N>& b) {
  Dual<V, N> r;
  r.v = a.v * b.v;
  for (int j = 0; j < N; ++j) r.d[j] = a.d[j] * b.v + a.v * b.d[j];
  return r;
}
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator/(const Dual<V, N>& a, const Dual<V, N>& b) {
  Dual<V, N> r;
  r.v = a.v / b.v;
  for (int j = 0; j < N; ++j) r.d[j] = (a.d[j] - r.v * b.d[j]) / b.v;
  return r;
}
// with a constant on either side (kept apart from the dual products: no
// derivative work for the constant)
#define BLOCHSIM_DUAL_SCALAR_OPS(S)                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator*(const Dual<V, N>& a, S b) {              \
    Dual<V, N> r;                                                                                \
    r.v = a.v * b;                                                                               \
    for (int j = 0; j < N; ++j) r.d[j] = a.d[j] * b;                                             \
    return r;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator*(S b, const Dual<V, N>& a) {              \
    return a * b;                                                                                \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator+(Dual<V, N> a, S b) {                     \
    a.v = a.v + b;                                                                               \
    return a;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator+(S b, Dual<V, N> a) {                     \
    a.v = a.v + b;                                                                               \
    return a;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator-(Dual<V, N> a, S b) {                     \
    a.v = a.v - b;                                                                               \
    return a;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator-(S b, const Dual<V, N>& a) {              \
    Dual<V, N> r = -a;                                                                           \
    r.v = r.v + b;                                                                               \
    return r;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator/(const Dual<V, N>& a, S b) {              \
    Dual<V, N> r;                                                                                \
    r.v = a.v / b;                                                                               \
    for (int j = 0; j < N; ++j) r.d[j] = a.d[j] / b;                                             \
    return r;                                                                                    \
  }                                                                                              \
  template <class V, int N>                                                                      \
  BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator/(S b, const Dual<V, N>& a) {              \
    Dual<V, N> r;                                                                                \
    r.v = b / a.v;                                                                               \
    for (int j = 0; j < N; ++j) r.d[j] = -(r.v * a.d[j]) / a.v;                                  \
    return r;                                                                                    \
  }
BLOCHSIM_DUAL_SCALAR_OPS(float)
BLOCHSIM_DUAL_SCALAR_OPS(double)
#undef BLOCHSIM_DUAL_SCALAR_OPS

// A lane vector with no derivative times a dual of such vectors (a
// coefficient constant along every direction): a third of a dual product.
// For lane vectors only; floats and doubles take the overloads above.
template <class V, int N, typename std::enable_if<!std::is_arithmetic<V>::value, int>::type = 0>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<V, N> operator*(const V& b, const Dual<V, N>& a) {
  Dual<V, N> r;
  r.v = b * a.v;
  for (int j = 0; j < N; ++j) r.d[j] = b * a.d[j];
  return r;
}

// Comparisons look at the value only (branches of the kernels do not depend
// on the derivatives); through every level of a dual of duals.
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE auto value_of(const Dual<V, N>& x) -> decltype(value_of(x.v)) {
  return value_of(x.v);
}

// Elementary functions of per-lane dual scalars: f(v) + f'(v) d.
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> chain(const Dual<S, N>& x, S f, S df) {
  Dual<S, N> r;
  r.v = f;
  for (int j = 0; j < N; ++j) r.d[j] = df * x.d[j];
  return r;
}
// (The calls are unqualified, so that S may itself be a dual.)
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> exp(const Dual<S, N>& x) {
  using std::exp;
  const S e = exp(x.v);
  return chain(x, e, e);
}
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> expm1(const Dual<S, N>& x) {
  using std::exp;
  using std::expm1;
  return chain(x, static_cast<S>(expm1(x.v)), static_cast<S>(exp(x.v)));
}
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> cos(const Dual<S, N>& x) {
  using std::cos;
  using std::sin;
  return chain(x, static_cast<S>(cos(x.v)), static_cast<S>(-sin(x.v)));
}
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> sin(const Dual<S, N>& x) {
  using std::cos;
  using std::sin;
  return chain(x, static_cast<S>(sin(x.v)), static_cast<S>(cos(x.v)));
}
// |x| with the derivative of x's sign (+1 at 0: flow at rest washes out
// forward)
template <class S, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE Dual<S, N> fabs(const Dual<S, N>& x) {
  using std::fabs;
  return chain(x, static_cast<S>(fabs(x.v)), static_cast<S>(value_of(x.v) < 0 ? -1.0f : 1.0f));
}

// Whether V is a dual (of any level).
template <class V>
struct IsDual {
  static constexpr bool value = false;
};
template <class V, int N>
struct IsDual<Dual<V, N>> {
  static constexpr bool value = true;
};

template <class V, int N>
struct Lanes<Dual<V, N>> {
  using B = Lanes<V>;
  static constexpr int width = B::width;
  using Scalar = Dual<typename B::Scalar, N>;
  using Double = Dual<typename B::Double, N>;
  template <class M>
  using Wide = Dual<typename B::template Wide<M>, N>;
  using ScalarD = Wide<double>;  // one lane of Double
  BLOCHSIM_HD static Scalar get(const Dual<V, N>& x, int l) {
    Scalar s;
    s.v = B::get(x.v, l);
    for (int j = 0; j < N; ++j) s.d[j] = B::get(x.d[j], l);
    return s;
  }
  BLOCHSIM_HD static void set(Dual<V, N>& x, int l, const Scalar& s) {
    B::set(x.v, l, s.v);
    for (int j = 0; j < N; ++j) B::set(x.d[j], l, s.d[j]);
  }
  BLOCHSIM_HD static ScalarD getd(const Double& x, int l) {
    ScalarD s;
    s.v = B::getd(x.v, l);
    for (int j = 0; j < N; ++j) s.d[j] = B::getd(x.d[j], l);
    return s;
  }
  BLOCHSIM_HD static void setd(Double& x, int l, const ScalarD& s) {
    B::setd(x.v, l, s.v);
    for (int j = 0; j < N; ++j) B::setd(x.d[j], l, s.d[j]);
  }
  BLOCHSIM_HD static Dual<V, N> narrow(const Double& x) {
    Dual<V, N> r;
    r.v = B::narrow(x.v);
    for (int j = 0; j < N; ++j) r.d[j] = B::narrow(x.d[j]);
    return r;
  }
  BLOCHSIM_HD static Double widen(const Dual<V, N>& x) {
    Double r;
    r.v = B::widen(x.v);
    for (int j = 0; j < N; ++j) r.d[j] = B::widen(x.d[j]);
    return r;
  }
  // every lane equal to the per-lane scalar s
  BLOCHSIM_HD static Dual<V, N> splat(const Scalar& s) {
    Dual<V, N> r;
    r.v = B::splat(s.v);
    for (int j = 0; j < N; ++j) r.d[j] = B::splat(s.d[j]);
    return r;
  }
};

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
