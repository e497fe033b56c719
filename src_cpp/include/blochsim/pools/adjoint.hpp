// Reverse mode of the pooled EPG (pools/pools.hpp): the gradient of a real loss of
// the samples with respect to every event's parameters (summed over the
// problems) and to tissue and pool properties (per problem), for one
// problem at a time in double precision.
//
// The method is epg/adjoint.hpp's: the state after each event is real-affine in
// the state before it, so the adjoint lambda_e = dL/dx_e is the transpose
// of the event's linear part applied to lambda_{e+1}, plus each readout's
// g M0 e^{i rx} at every liquid pool's F+_0 (the readout sums them).  With
// the pairing <lambda, x> = Re sum conj(lambda) x, a complex-linear map M
// has the transpose M^H:
//   - interval: F+ <- P F+, F- <- conj(P) F-, Z <- L Z + r (order 0), so
//     lambda_F+ <- P^H lambda_F+, lambda_F- <- P^T lambda_F-,
//     lambda_Z <- L^T lambda_Z;
//   - hard pulse, per pool: the 3 × 3 rotation's conjugate transpose;
//   - exact pulse, per order: M^H of its d × d matrix;
//   - semisolid saturation: a real symmetric map per order (a scaling, or
//     2 × 2 with dipolar order), its own transpose; inversion: a real
//     scaling;
//   - shifts and spoils: as epg/adjoint.hpp.
// The gradient with respect to a parameter of event e is
// <lambda_{e+1}, d x_{e+1} / dp> plus its readout's Re(conj(g) ds/dp): the
// event is played once on dual numbers from its starting state, seeded in
// its own parameters (the interval's duration, the flip, the phase, the
// pulse's duration and offset) and in the tissue directions.  A tissue
// property also moves the equilibrium the problem starts from (the pool
// fractions), which adds <lambda_0, d x_0 / dtheta>.
//
// Memory is bounded by checkpointing, as epg/adjoint.hpp: a state every C =
// ceil(sqrt(events)) events, and one segment of C states replayed at a time.
#pragma once

#include <cmath>
#include <cstdint>

#include "../dual.hpp"
#include "player.hpp"

namespace blochsim {

// Event-gradient columns of the pooled adjoint: dL / d(interval duration_s,
// flip_rad, phase_rad, rx_phase_rad, pulse duration_s, pulse offset_hz).
// The first four are epg/adjoint.hpp's EventGradient.
enum PooledEventGradient : int {
  pgrad_duration = 0,
  pgrad_flip,
  pgrad_phase,
  pgrad_rx,
  pgrad_rf_duration,
  pgrad_rf_offset,
  pooled_event_gradients
};

// The per-event play runs on duals of W directions, in passes over the flat
// list of directions: the event parameters asked for (bits of a mask over
// the pooled_event_dirs parameters, in the order of EventSeeds) and then the
// tissue directions.  Four a pass (pooled_adjoint_width) costs no more than
// wider passes and shares the pooled Jacobian's exponentials on duals.
constexpr int pooled_event_dirs = 5;
constexpr unsigned pooled_all_event_dirs = (1u << pooled_event_dirs) - 1;
constexpr int pooled_adjoint_width = 4;

BLOCHSIM_HD inline int pooled_event_count(unsigned mask) {
  int c = 0;
  for (int j = 0; j < pooled_event_dirs; ++j) c += (mask >> j) & 1u;
  return c;
}

// Passes of the per-event play for the event parameters of mask and n_tdirs
// tissue directions, W a pass (at least one: the readout's phase and the
// adjoint itself need none, but the sweep runs once).
BLOCHSIM_HD inline int pooled_adjoint_passes(unsigned mask, int n_tdirs, int W) {
  const int total = pooled_event_count(mask) + n_tdirs;
  return total > 0 ? (total + W - 1) / W : 1;
}

inline namespace BLOCHSIM_ISA {

// Doubles of one problem's adjoint workspace, on duals of W directions.
BLOCHSIM_HD inline int64_t pooled_adjoint_workspace(const EventStream& s, const Pools& p, unsigned mask, int n_tdirs,
                                                    int W) {
  const int64_t x = pool_state_size(s, p), ops = pool_operator_size(s, p);
  int64_t c = static_cast<int64_t>(std::sqrt(static_cast<double>(s.n_events)));
  while (c * c < s.n_events) ++c;
  if (c < 1) c = 1;
  const int64_t n_ckpt = (s.n_events + c - 1) / c;
  // state, adjoint, checkpoints and their bands, a segment and its bands,
  // the operators; the dual state and each pass's dual operators
  return x * (2 + n_ckpt + c) + n_ckpt + c + ops + (W + 1) * (x + pooled_adjoint_passes(mask, n_tdirs, W) * ops);
}

// The adjoint of problem i of t with the pools of p.
//   mask: the event parameters (bit j: EventSeeds' j-th) whose columns are
//     computed; the others stay as they are (the readout phase's always is);
//   fields[0 .. n_tdirs): tissue fields (0 .. 8 the Tissue fields,
//     PoolField for the pools) whose gradient is written to tgrad[j] (per
//     SI unit);
//   cot: this problem's cotangent, n_samples complex64 interleaved;
//   rows (n_events, pooled_event_gradients): the event gradients, added to.
// work holds pooled_adjoint_workspace(s, p, mask, n_tdirs, W) doubles.
template <int W>
BLOCHSIM_HD inline void pooled_adjoint_problem(const EventStream& s, const Tissue& t, const Pools& p,
                                               const LineshapeTable& ls, int64_t i, unsigned mask,
                                               const int* fields, int n_tdirs, const float* cot, double* work, double* rows,
                                               float* tgrad) {
  using D = Dual<double, W>;
  const int64_t nev = s.n_events;
  const int64_t xs = pool_state_size(s, p), os = pool_operator_size(s, p);
  int64_t C = static_cast<int64_t>(std::sqrt(static_cast<double>(nev)));
  while (C * C < nev) ++C;
  if (C < 1) C = 1;
  const int64_t n_ckpt = (nev + C - 1) / C;
  double* const xw = work;
  double* const lw = xw + xs;
  double* const ckpt = lw + xs;
  double* const seg = ckpt + xs * n_ckpt;
  double* const ckband = seg + xs * C;
  double* const segband = ckband + n_ckpt;
  double* const fops = segband + C;
  D* const dx = reinterpret_cast<D*>(fops + os);
  D* const dops = dx + xs;
  const int passes = pooled_adjoint_passes(mask, n_tdirs, W);

  PoolPlayer<double> fw(s, p, ls, pool_tissue<double>(t, p, i, nullptr, 0, nullptr),
                        reinterpret_cast<Cx<double>*>(xw), fops);
  fw.forget_operators();
  fw.equilibrium();
  const int n = fw.n, m = fw.m, K = fw.K, d = fw.d;
  const double M0 = fw.q.M0;

  // pass g carries the flat directions [g W, (g + 1) W): the event
  // parameters of mask (event_dir), then the tissue fields (-1: not a
  // tissue field)
  int event_dir[pooled_event_dirs];
  int n_ev = 0;
  for (int j = 0; j < pooled_event_dirs; ++j)
    if ((mask >> j) & 1u) event_dir[n_ev++] = j;
  const int total = n_ev + n_tdirs;
  auto tissue_of = [&](int g, int q) {
    const int flat = g * W + q;
    return flat >= n_ev && flat < total ? flat - n_ev : -1;
  };
  int pass_fields[W];
  auto pass_player = [&](int g) {
    for (int q = 0; q < W; ++q) pass_fields[q] = tissue_of(g, q) >= 0 ? fields[tissue_of(g, q)] : -1;
    PoolPlayer<D> pl(s, p, ls, pool_tissue<D>(t, p, i, pass_fields, W, nullptr), reinterpret_cast<Cx<D>*>(dx),
                     dops + g * os);
    int dir[pooled_event_dirs] = {-1, -1, -1, -1, -1};
    for (int j = 0; j < n_ev; ++j)
      if (j / W == g) dir[event_dir[j]] = j % W;
    pl.es.duration = dir[0];
    pl.es.flip = dir[1];
    pl.es.phase = dir[2];
    pl.es.rf_duration = dir[3];
    pl.es.rf_offset = dir[4];
    return pl;
  };
  for (int g = 0; g < passes; ++g) pass_player(g).forget_operators();

  // first pass: checkpoints
  for (int64_t e = 0; e < nev; ++e) {
    if (e % C == 0) {
      for (int64_t l = 0; l < xs; ++l) ckpt[xs * (e / C) + l] = xw[l];
      ckband[e / C] = fw.band;
    }
    fw.event(e, [](int32_t, const Cx<double>&) {});
  }

  Cx<double>* const lam = reinterpret_cast<Cx<double>*>(lw);
  // the adjoint state's orders, as the player's (all K of them)
  PoolPlayer<double> lp(s, p, ls, fw.q, lam, fops);
  lp.band = K;
  using Order = typename PoolPlayer<double>::Order;
  Cx<double>* const lfp = lam;
  Cx<double>* const lfm = lam + n * K;
  Cx<double>* const lz = lam + 2 * n * K;
  for (int64_t l = 0; l < xs; ++l) lw[l] = 0.0;
  double tacc[pool_field_count];
  for (int j = 0; j < n_tdirs; ++j) tacc[j] = 0.0;

  auto shift_transpose = [&](int dir) {
    for (int j = 0; j < n; ++j) {
      Cx<double>* up = (dir > 0 ? lfp : lfm) + j * K;
      Cx<double>* dn = (dir > 0 ? lfm : lfp) + j * K;
      // forward: up_k <- up_{k-1}, dn_k <- dn_{k+1}, then up_0 <- conj(dn_0)
      const Cx<double> u0 = up[0];
      for (int k = 0; k + 1 < K; ++k) up[k] = up[k + 1];
      up[K - 1] = {0.0, 0.0};
      for (int k = K - 1; k >= 1; --k) dn[k] = dn[k - 1];
      dn[0] = {0.0, 0.0};
      if (K > 1) dn[1] = dn[1] + conj(u0);
    }
  };

  for (int64_t c0 = ((nev - 1) / C) * C; nev > 0 && c0 >= 0; c0 -= C) {
    const int64_t c1 = c0 + C < nev ? c0 + C : nev;
    for (int64_t l = 0; l < xs; ++l) xw[l] = ckpt[xs * (c0 / C) + l];
    fw.band = static_cast<int>(ckband[c0 / C]);
    for (int64_t e = c0; e < c1; ++e) {
      for (int64_t l = 0; l < xs; ++l) seg[xs * (e - c0) + l] = xw[l];
      segband[e - c0] = fw.band;
      if (e + 1 < c1) fw.event(e, [](int32_t, const Cx<double>&) {});
    }
    for (int64_t e = c1 - 1; e >= c0; --e) {
      const uint32_t f = s.flags[e];
      const double* xe = seg + xs * (e - c0);
      double gr = 0.0, gi = 0.0;
      if (f & event_readout) {
        gr = cot[2 * s.slot[e]];
        gi = cot[2 * s.slot[e] + 1];
      }
      // <lambda_{e+1}, d x_{e+1} / dp> and the readout's term, per pass
      double* row = rows + e * pooled_event_gradients;
      for (int g = 0; g < passes; ++g) {
        PoolPlayer<D> pl = pass_player(g);
        for (int64_t l = 0; l < xs; ++l) {
          dx[l] = D(xe[l]);
        }
        pl.band = static_cast<int>(segband[e - c0]);
        Cx<D> sample{D(0.0), D(0.0)};
        pl.event(e, [&](int32_t, const Cx<D>& v) { sample = v; });
        double acc[W];
        for (int q = 0; q < W; ++q) acc[q] = gr * sample.re.d[q] + gi * sample.im.d[q];
        for (int64_t l = 0; l < xs; ++l) {
          const double lv = lw[l];
          if (lv != 0.0)
            for (int q = 0; q < W; ++q) acc[q] += lv * dx[l].d[q];
        }
        // the event parameters (in EventSeeds order) to their columns
        constexpr int column[pooled_event_dirs] = {pgrad_duration, pgrad_flip, pgrad_phase, pgrad_rf_duration,
                                                   pgrad_rf_offset};
        for (int q = 0; q < W; ++q) {
          const int flat = g * W + q;
          if (flat < n_ev)
            row[column[event_dir[flat]]] += acc[q];
          else if (flat < total)
            tacc[flat - n_ev] += acc[q];
        }
        if (g == 0 && (f & event_readout))  // ds/drx = -i s
          row[pgrad_rx] += gr * sample.im.v - gi * sample.re.v;
      }
      // back through the spoil or the shifts after
      if (f & event_spoil) {
        for (int64_t l = 0; l < 2 * n * K; ++l) lam[l] = {0.0, 0.0};
      } else {
        const int32_t sa = s.shift_after[e];
        for (int c = 0; c < (sa > 0 ? sa : -sa); ++c) shift_transpose(sa > 0 ? 1 : -1);
      }
      if (f & event_readout) {
        // lambda at each F+_0 += g M0 e^{i rx}
        const double rx = s.rx_phase_rad[e];
        const Cx<double> add{M0 * (gr * std::cos(rx) - gi * std::sin(rx)), M0 * (gr * std::sin(rx) + gi * std::cos(rx))};
        for (int j = 0; j < n; ++j) lfp[j * K] = lfp[j * K] + add;
      }
      // the transposes, on every order of the adjoint state
      if (f & event_inversion) {
        const double minus_eta = -fw.q.eta;
        lp.each([&](int, Order& o) {
          for (int j = 0; j < n; ++j) {
            o.cr[j] *= minus_eta;
            o.ci[j] *= minus_eta;
          }
        });
      }
      if (f & event_driven) {  // M^H
        Cx<double> *Md, *c;
        fw.driven_ops(s.driven[e], Md, c);
        double mh[2 * max_driven_size * max_driven_size];
        for (int a = 0; a < d; ++a)
          for (int l = 0; l < d; ++l) {
            mh[2 * (a * d + l)] = Md[l * d + a].re;
            mh[2 * (a * d + l) + 1] = -Md[l * d + a].im;
          }
        lp.each([&](int, Order& o) {
          pool_drive<false>([&](int a) { return mh[a]; }, [](int) { return 0.0; }, false, o, n, m);
        });
      }
      if (f & event_rf) {
        const PoolRotation<double> R = fw.rotation(e);
        lp.each([&](int, Order& o) {
          for (int j = 0; j < n; ++j) R.transpose(o.ar[j], o.ai[j], o.br[j], o.bi[j], o.cr[j], o.ci[j]);
        });
      }
      SemisolidSaturation<double> sat;  // symmetric: its own transpose
      if (fw.saturation(e, sat)) lp.each([&](int, Order& o) { sat.template apply<false>(o, n); });
      const int32_t sb = s.shift_before[e];
      for (int c = 0; c < (sb > 0 ? sb : -sb); ++c) shift_transpose(sb > 0 ? 1 : -1);
      if (s.interval[e] >= 0) {  // P^H on F+ (so P^T on F-), L^T on Z
        Cx<double>* P;
        double *L, *r;
        fw.interval_ops(s.interval[e], P, L, r);
        typename PoolPlayer<double>::Step st;
        st.n = n;
        st.m = m;
        for (int j = 0; j < n; ++j)
          for (int l = 0; l < n; ++l) {
            st.P[2 * (j * n + l)] = P[l * n + j].re;
            st.P[2 * (j * n + l) + 1] = -P[l * n + j].im;
          }
        for (int j = 0; j < m; ++j)
          for (int l = 0; l < m; ++l) st.L[j * m + l] = L[l * m + j];
        lp.transform([&](int, const Order& o, Order& x) { st.relax(o, x, false); });
      }
    }
  }
  // the equilibrium's dependence on the tissue: Z_0 of pool j at f_j
  for (int g = 0; g < passes; ++g) {
    for (int q = 0; q < W; ++q) pass_fields[q] = tissue_of(g, q) >= 0 ? fields[tissue_of(g, q)] : -1;
    const PoolTissue<D> qd = pool_tissue<D>(t, p, i, pass_fields, W, nullptr);
    for (int q = 0; q < W; ++q) {
      const int j = tissue_of(g, q);
      if (j < 0) continue;
      for (int l = 0; l < m; ++l) tacc[j] += lz[l * K].re * qd.f[l].d[q];
    }
  }
  for (int j = 0; j < n_tdirs; ++j) tgrad[j] = static_cast<float>(tacc[j]);
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
