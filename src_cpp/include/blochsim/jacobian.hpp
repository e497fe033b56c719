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

#include "dual.hpp"
#include "epg.hpp"

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

inline namespace BLOCHSIM_ISA {
namespace epg {

// Seeds direction j with the field f of every lane: d field_f / d dir_j = 1.
template <class V, int N>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void seed(LaneTissue<Dual<V, N>>& lt, int f, int j) {
  Dual<V, N>* fields[tissue_fields] = {&lt.T1, &lt.T2, &lt.M0, &lt.B1, &lt.B1phase,
                                       &lt.B0, &lt.D,  &lt.v,  &lt.eta};
  fields[f]->d[j] = splat<V>(1.0f);
}

// Writes the samples of a lane vector of problems [first, first + width) and
// the first n_dirs of their derivatives, skipping lanes past n.
template <class V, int N>
struct JacobianSink {
  float* out;
  float* jac;
  int64_t first, n, n_samples;
  int n_dirs;

  BLOCHSIM_HD BLOCHSIM_FORCEINLINE void write(int64_t slot, const Dual<V, N>& re, const Dual<V, N>& im) {
    using LT = Lanes<V>;
    for (int l = 0; l < LT::width; ++l) {
      const int64_t p = first + l;
      if (p >= n) break;
      float* o = out + (p * n_samples + slot) * 2;
      o[0] = LT::get(re.v, l);
      o[1] = LT::get(im.v, l);
      for (int j = 0; j < n_dirs; ++j) {
        float* d = jac + ((p * n_dirs + j) * n_samples + slot) * 2;
        d[0] = LT::get(re.d[j], l);
        d[1] = LT::get(im.d[j], l);
      }
    }
  }
};

// Jacobian of problems [first, first + width) of t along the fields
// fields[0 .. n_dirs) (n_dirs <= N), with all orders in `work`
// (PlaneStore<Dual<V, N>>::workspace(s) dual lane vectors).
template <class V, int N, bool Complex>
BLOCHSIM_HD BLOCHSIM_FORCEINLINE int jacobian_block(const EventStream& s, const Tissue& t, const int* fields,
                                                    int n_dirs, int64_t first, Dual<V, N>* work, float* out,
                                                    float* jac) {
  using T = Dual<V, N>;
  constexpr int W = Lanes<V>::width;
  int64_t idx[W];
  lane_indices<W>(first, t.n, idx);
  LaneTissue<T> lt = gather<T>(t, idx);
  for (int j = 0; j < n_dirs; ++j) seed(lt, fields[j], j);
  PlaneStore<T, Complex> st;
  st.template init<double>(s, lt, work);
  JacobianSink<V, N> sink{out, jac, first, t.n, s.n_samples, n_dirs};
  play<T, Complex>(s, t, lt, st, sink);
  return ok;
}

}  // namespace epg
}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
