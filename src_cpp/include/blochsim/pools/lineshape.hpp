// Absorption lineshapes of the semisolid (bound) pool, for its saturation
// by RF (SPEC §3).
//
// A lineshape G(Δf) is returned in seconds, as a density over angular
// frequency (∫ G d(2πΔf) = 1).  With that normalisation the saturation rate
// of the bound pool under an RF field ω1 is W = π ω1² G(Δf) (Henkelman et
// al. 1993, MRM 29:759), which for the Lorentzian is exactly the Bloch
// equations' steady-state rate ω1² T2 / (1 + (2πΔf T2)²).  Every shape is
// T2 · g(x) with x = 2πΔf T2, so the tables below are in x alone.
//
//   lorentzian        g(x) = (1/π) / (1 + x²)
//   gaussian          g(x) = exp(−x²/2) / sqrt(2π)
//   super-lorentzian  g(x) = sqrt(2/π) ∫₀¹ exp(−2x²/(3u²−1)²) / |3u²−1| du
//                     (Morrison & Henkelman 1995, MRM 33:475)
//
// The super-Lorentzian integral diverges logarithmically at x = 0.  It is
// evaluated to about 1e-10 down to x_min = 1e-3 (13 Hz at bound_T2 = 12 µs;
// a table in ln x with cubic Hermite interpolation, the integral itself
// past the table), which covers the offsets CEST looks at (tens to hundreds
// of Hz from water).  Inside x_min it is continued by the even quadratic
// a + b x² matched to the integral in value and slope there, so that it
// stays finite on resonance.  `super-lorentzian-cutoff` is the classic
// form of Gloor, Scheffler and Bieri (2008, MRM 60:691): the same
// continuation from x_c = 2π · 1.5 kHz · 12 µs instead (1.5 kHz at
// bound_T2 = 12 µs), whose quadratic stays at 0.5–0.95 of the integral
// between 50 Hz and 1 kHz.
#pragma once

#include <cmath>
#include <vector>

#include "../config.hpp"

namespace blochsim {

enum Lineshape : int32_t {
  lineshape_super_lorentzian = 0,
  lineshape_lorentzian = 1,
  lineshape_gaussian = 2,
  lineshape_super_lorentzian_cutoff = 3,
  lineshape_count
};

inline namespace BLOCHSIM_ISA {
namespace lineshape_detail {

constexpr double x_min = 1.0e-3;
constexpr double x_cut = 2.0 * pi * 1.5e3 * 12.0e-6;
constexpr double x_table_max = 12.0;
constexpr int table_points = 4097;

// The super-Lorentzian integral and its x-derivative at x > 0.  The
// integrand's difficulty is the magic angle u0 = 1/sqrt(3), where 3u²−1
// vanishes; on each side of it u = u0 ∓ e^s turns the integral into a smooth
// one over s (|3u²−1| = 3 e^s (u + u0), du = e^s ds), integrated by
// composite Simpson from the s below which exp(−2x²/(3u²−1)²) underflows.
BLOCHSIM_HD inline void super_lorentzian_integral(double x, double& g, double& dg) {
  using std::exp;
  using std::log;
  using std::sqrt;
  const double u0 = 1.0 / sqrt(3.0);
  const double norm = sqrt(2.0 / pi);
  g = 0.0;
  dg = 0.0;
  for (int side = 0; side < 2; ++side) {
    const double s_hi = log(side == 0 ? u0 : 1.0 - u0);
    // |3u²−1| < 0.05 x there, so exp(−2x²/w²) < e^−800
    const double s_lo = log(0.05 * x / (3.0 * 2.0 * u0 + 3.0));
    if (s_lo >= s_hi) continue;
    const int n = 2000;  // even
    const double h = (s_hi - s_lo) / n;
    double sg = 0.0, sd = 0.0;
    for (int i = 0; i <= n; ++i) {
      const double s = s_lo + h * i;
      const double e = exp(s);
      const double u = side == 0 ? u0 - e : u0 + e;
      const double w = 3.0 * e * (u + u0);  // |3u² − 1|
      const double q = 2.0 * x * x / (w * w);
      const double f = exp(-q) / (3.0 * (u + u0));
      const double c = (i == 0 || i == n) ? 1.0 : (i % 2 ? 4.0 : 2.0);
      sg += c * f;
      sd += c * f * (-4.0 * x / (w * w));
    }
    g += sg * h / 3.0;
    dg += sd * h / 3.0;
  }
  g *= norm;
  dg *= norm;
}

// g and dg/d(ln x) on an even grid in ln x over [x_min, x_table_max].
struct SuperLorentzianTable {
  double t0, h;
  std::vector<double> g, dg_dt;
  SuperLorentzianTable() : g(table_points), dg_dt(table_points) {
    t0 = std::log(x_min);
    h = (std::log(x_table_max) - t0) / (table_points - 1);
    for (int i = 0; i < table_points; ++i) {
      const double x = std::exp(t0 + h * i);
      double v, d;
      super_lorentzian_integral(x, v, d);
      g[i] = v;
      dg_dt[i] = d * x;
    }
  }
};

inline const SuperLorentzianTable& super_lorentzian_table() {
  static const SuperLorentzianTable table;  // built once, thread-safe
  return table;
}

}  // namespace lineshape_detail

// The super-Lorentzian table as the kernels read it (host or device
// pointers): g and dg/d(ln x) at ln x = t0 + h i, i < table_points.
struct LineshapeTable {
  const double* g = nullptr;
  const double* dg_dt = nullptr;
  double t0 = 0.0, h = 0.0;
};

// The table of this process (host memory).
inline LineshapeTable host_lineshape_table() {
  const lineshape_detail::SuperLorentzianTable& tb = lineshape_detail::super_lorentzian_table();
  return {tb.g.data(), tb.dg_dt.data(), tb.t0, tb.h};
}

// The super-Lorentzian at x_min <= x < x_table_max from the table: g and
// dg/dx by cubic Hermite interpolation in t = ln x.
BLOCHSIM_HD inline void super_lorentzian_table_eval(double x, const LineshapeTable& tb, double& g, double& dg) {
  using std::log;
  using namespace lineshape_detail;
  const double t = (log(x) - tb.t0) / tb.h;
  int i = static_cast<int>(t);
  if (i > table_points - 2) i = table_points - 2;
  if (i < 0) i = 0;
  const double s = t - i, s2 = s * s, s3 = s2 * s;
  const double h00 = 2 * s3 - 3 * s2 + 1, h10 = s3 - 2 * s2 + s, h01 = -2 * s3 + 3 * s2, h11 = s3 - s2;
  const double p0 = tb.g[i], p1 = tb.g[i + 1], m0 = tb.dg_dt[i] * tb.h, m1 = tb.dg_dt[i + 1] * tb.h;
  g = h00 * p0 + h10 * m0 + h01 * p1 + h11 * m1;
  const double dgds = (6 * s2 - 6 * s) * p0 + (3 * s2 - 4 * s + 1) * m0 + (-6 * s2 + 6 * s) * p1 + (3 * s2 - 2 * s) * m1;
  dg = dgds / (tb.h * x);
}

// g(x) and dg/dx of lineshape `shape` at x = 2πΔf T2 (any sign; g is even),
// the super-Lorentzian from the table tb.
BLOCHSIM_HD inline void lineshape_eval(int shape, double x, const LineshapeTable& tb, double& g, double& dg) {
  using std::exp;
  using std::fabs;
  using std::log;
  using std::sqrt;
  const double ax = fabs(x), sign = x < 0 ? -1.0 : 1.0;
  if (shape == lineshape_lorentzian) {
    const double d = 1.0 + ax * ax;
    g = 1.0 / (pi * d);
    dg = sign * (-2.0 * ax / (pi * d * d));
    return;
  }
  if (shape == lineshape_gaussian) {
    g = exp(-0.5 * ax * ax) / sqrt(2.0 * pi);
    dg = sign * (-ax * g);
    return;
  }
  using namespace lineshape_detail;
  const double join = shape == lineshape_super_lorentzian_cutoff ? x_cut : x_min;
  if (ax < join) {
    // the even quadratic matched to the integral in value and slope at the join
    double gc, slope;
    super_lorentzian_table_eval(join, tb, gc, slope);
    const double b = slope / (2.0 * join), a = gc - b * join * join;
    g = a + b * ax * ax;
    dg = sign * 2.0 * b * ax;
    return;
  }
  if (ax >= x_table_max) {
    double d;
    super_lorentzian_integral(ax, g, d);
    dg = sign * d;
    return;
  }
  double d;
  super_lorentzian_table_eval(ax, tb, g, d);
  dg = sign * d;
}

// lineshape_eval with this process's table (host).
inline void lineshape_g(int shape, double x, double& g, double& dg) {
  lineshape_eval(shape, x, host_lineshape_table(), g, dg);
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
