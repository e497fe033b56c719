// Forward-mode tissue Jacobians: the EPG event loop of epg.hpp played on
// multi-direction dual numbers (dual.hpp), so that one pass gives every
// sample and its derivative with respect to up to N tissue properties.
//
// Directions are tissue fields (TissueField, the order of Tissue and of
// LaneTissue); each direction's derivative is with respect to the field in
// its SI unit.  Jacobian layout: jac[((i * n_dirs + j) * n_samples + slot) *
// 2 + {0, 1}] = (Re, Im) of d sample / d field_j of problem i, complex64
// interleaved.
#pragma once

#include <type_traits>
#include <vector>

#include "dual.hpp"
#include "epg.hpp"
#include "epg_registers.hpp"

namespace blochsim {

// The tissue fields, in the order of Tissue.
enum TissueField : int {
  field_T1 = 0,
  field_T2,
  field_M0,
  field_B1,
  field_B1phase,
  field_B0,
  field_D,
  field_v,
  field_eta,
  tissue_fields
};

// Directions a dual of the Jacobian kernels carries for n_dirs requested
// ones (the kernels are compiled for these widths; the spare directions are
// left unseeded).
inline int dual_width(int n_dirs) { return n_dirs <= 1 ? 1 : n_dirs <= 2 ? 2 : n_dirs <= 4 ? 4 : tissue_fields; }

// The directions among fields[0 .. n_dirs) that the host's duals carry: all
// but M0, which only scales the readouts, so that d S / d M0 = S / M0 comes
// from the unscaled signal at no cost (host jacobian_block).
inline int dual_directions(const int* fields, int n_dirs) {
  int n = 0;
  for (int j = 0; j < n_dirs; ++j) n += fields[j] != field_M0;
  return n;
}

// Checks Jacobian directions: 1 to tissue_fields distinct tissue fields.
inline int validate_directions(const int* fields, int n_dirs) {
  if (n_dirs < 1 || n_dirs > tissue_fields) return bad_shape;
  for (int j = 0; j < n_dirs; ++j) {
    if (fields[j] < 0 || fields[j] >= tissue_fields) return bad_shape;
    for (int i = 0; i < j; ++i)
      if (fields[i] == fields[j]) return bad_shape;
  }
  return ok;
}

inline namespace BLOCHSIM_ISA {
namespace epg {

// Seeds direction j with the field f of every lane: d field_f / d dir_j =
// value (1: derivatives per the field's SI unit; the SI value of one public
// unit: derivatives per public unit).
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void seed(LaneTissue<Dual<V, N>>& lt, int f, int j, float value = 1.0f) {
  Dual<V, N>* fields[tissue_fields] = {&lt.T1, &lt.T2, &lt.M0, &lt.B1, &lt.B1phase,
                                       &lt.B0, &lt.D,  &lt.v,  &lt.eta};
  fields[f]->d[j] = splat<V>(value);
}

// Writes the samples of a lane vector of problems [first, first + width)
// and their n_dirs derivatives, skipping lanes past n.  The event loop plays
// with M0 = 1; the sink scales by each lane's M0 and takes the direction
// m0_dir (if >= 0) as the unscaled sample; output direction j is dual
// direction slot[j] otherwise.
template <class V, int N>
struct JacobianSink {
  float* out;
  float* jac;
  int64_t first, n, n_samples;
  int n_dirs, m0_dir;
  const int* slot;
  V m0;

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void write(int64_t s, const Dual<V, N>& re, const Dual<V, N>& im) {
    using LT = Lanes<V>;
    for (int l = 0; l < LT::width; ++l) {
      const int64_t p = first + l;
      if (p >= n) break;
      const float m = LT::get(m0, l), vr = LT::get(re.v, l), vi = LT::get(im.v, l);
      float* o = out + (p * n_samples + s) * 2;
      o[0] = m * vr;
      o[1] = m * vi;
      for (int j = 0; j < n_dirs; ++j) {
        float* d = jac + ((p * n_dirs + j) * n_samples + s) * 2;
        if (j == m0_dir) {
          d[0] = vr;
          d[1] = vi;
        } else {
          d[0] = m * LT::get(re.d[slot[j]], l);
          d[1] = m * LT::get(im.d[slot[j]], l);
        }
      }
    }
  }
};

// Jacobian of problems [first, first + width) of t along the fields
// fields[0 .. n_dirs) (dual_directions(fields, n_dirs) <= N), with all
// orders in `work` (PlaneStore<Dual<V, N>>::workspace(s) dual lane
// vectors).
template <class V, int N, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int jacobian_block(const EventStream& s, const Tissue& t, const int* fields,
                                                    int n_dirs, int64_t first, Dual<V, N>* work, float* out,
                                                    float* jac) {
  using T = Dual<V, N>;
  constexpr int W = Lanes<V>::width;
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  LaneTissue<T> lt = gather<T>(t, idx);
  int slot[tissue_fields];
  int m0_dir = -1, k = 0;
  for (int j = 0; j < n_dirs; ++j) {
    if (fields[j] == field_M0) {
      m0_dir = j;
      slot[j] = 0;
    } else {
      seed(lt, fields[j], k);
      slot[j] = k++;
    }
  }
  const V m0 = lt.M0.v;
  lt.M0 = T(1.0f);
  PlaneStore<T, Complex> st;
  st.template init<double>(s, lt, work);
  JacobianSink<V, N> sink{out, jac, first, t.n, s.n_samples, n_dirs, m0_dir, slot, m0};
  play<T, Complex>(s, t, lt, st, sink);
  return ok;
}

// The Jacobian of blocks [b0, b1) of lane vectors V (problems b W to
// (b + 1) W - 1) with a workspace of (1 + dual_width(dual_directions(fields,
// n_dirs))) PlaneStore workspaces of V: the dual width and the path picked
// at run time.  In the ISA namespace, so that each instruction-set build of
// the host kernels keeps its own instantiations.
template <class V>
inline int jacobian_range(const EventStream& s, const Tissue& t, const int* fields, int n_dirs, int64_t b0,
                          int64_t b1, void* work, float* out, float* jac) {
  auto blocks = [&](auto width, auto complex) {
    constexpr int N = decltype(width)::value;
    constexpr bool C = decltype(complex)::value;
    for (int64_t b = b0; b < b1; ++b) {
      const int st = jacobian_block<V, N, C>(s, t, fields, n_dirs, b * Lanes<V>::width,
                                             static_cast<Dual<V, N>*>(work), out, jac);
      if (st != ok) return st;
    }
    return static_cast<int>(ok);
  };
  auto on_path = [&](auto width) {
    return s.real_path ? blocks(width, std::false_type{}) : blocks(width, std::true_type{});
  };
  switch (dual_width(dual_directions(fields, n_dirs))) {
    case 1: return on_path(std::integral_constant<int, 1>{});
    case 2: return on_path(std::integral_constant<int, 2>{});
    case 4: return on_path(std::integral_constant<int, 4>{});
    default: return on_path(std::integral_constant<int, tissue_fields>{});
  }
}

// The tissue of problem p with directions fields[0 .. n_dirs) seeded (with
// seeds[j], or 1 without seeds), as one lane's dual scalars.
template <int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE LaneTissue<Dual<float, N>> seeded_tissue(const Tissue& t, int64_t p,
                                                                          const int* fields, int n_dirs,
                                                                          const float* seeds = nullptr) {
  LaneTissue<Dual<float, N>> lt = gather<Dual<float, N>>(t, &p);
  for (int j = 0; j < n_dirs; ++j) seed(lt, fields[j], j, seeds ? seeds[j] : 1.0f);
  return lt;
}

// Writes the samples of member 0 of a team (lane 0 of V) and its first
// n_dirs derivatives, for problem `problem`.
template <class V, int N>
struct TeamJacobianSink {
  float* out;
  float* jac;
  int64_t problem, n_samples;
  int n_dirs;
  void write(int64_t slot, const Dual<V, N>& re, const Dual<V, N>& im) {
    using LT = Lanes<V>;
    float* o = out + (problem * n_samples + slot) * 2;
    o[0] = LT::get(re.v, 0);
    o[1] = LT::get(im.v, 0);
    for (int j = 0; j < n_dirs; ++j) {
      float* d = jac + ((problem * n_dirs + j) * n_samples + slot) * 2;
      d[0] = LT::get(re.d[j], 0);
      d[1] = LT::get(im.d[j], 0);
    }
  }
};

// Host instantiation of the device's Jacobian register path (a team of
// Lanes<V>::width members holding R orders each, on duals of N
// directions), one problem at a time: the tests' view of the device
// Jacobian kernels.  K must be at most width * R.
template <class V, int N, int R, bool Complex>
inline int jacobian_registers_host(const EventStream& s, const Tissue& t, const int* fields, int n_dirs,
                                   float* out, float* jac) {
  using T = Dual<V, N>;
  using Team = LaneTeam<T, R>;
  constexpr int W = Lanes<V>::width;
  if (s.states > W * R) return states_exceed_team;
  if (n_dirs < 1 || n_dirs > N) return bad_shape;
  std::vector<EventRecord> records(static_cast<size_t>(s.n_events + 1));
  pack_events(s, records.data());
  EventStream sr = s;
  sr.records = records.data();
  using LT = Lanes<T>;
  for (int64_t p = 0; p < t.n; ++p) {
    const LaneTissue<Dual<float, N>> one = seeded_tissue<N>(t, p, fields, n_dirs);
    const LaneTissue<T> lt = {LT::splat(one.T1), LT::splat(one.T2),      LT::splat(one.M0),
                              LT::splat(one.B1), LT::splat(one.B1phase), LT::splat(one.B0),
                              LT::splat(one.D),  LT::splat(one.v),       LT::splat(one.eta)};
    RegisterStore<T, R, Complex, Team> st;
    st.init(sr, lt, Team{});
    TeamJacobianSink<V, N> sink{out, jac, p, s.n_samples, n_dirs};
    play<T, Complex>(sr, t, lt, st, sink);
  }
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
