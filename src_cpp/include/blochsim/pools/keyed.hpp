// The pooled EPG on a moment-keyed program (epg/keyed.hpp): one problem's
// pools (PoolPlayer's state, operators and event, pools/play.hpp) held in
// the program's slots instead of EPG orders, each shift replaced by the
// program's map.  A map's entry moves a component of every pool at once: an
// F entry the F+ or F- of each liquid pool, a Z entry the Z of each
// longitudinal family (the semisolid pool's among them).
#pragma once

#include "../epg/keyed.hpp"
#include "player.hpp"

namespace blochsim {

// Scalars of one problem's keyed pooled state: F+, F-, Z of each liquid
// pool and the other longitudinal families over max_slots slots, complex.
BLOCHSIM_HD inline int64_t keyed_pool_state_size(const KeyedProgram& k, const Pools& p) {
  const PoolLayout l = pool_layout(p);
  return static_cast<int64_t>(2 * l.n + l.m) * 2 * static_cast<int64_t>(k.max_slots);
}

// Scalars per problem of keyed_pooled_problem's workspace: two states (a
// map writes one from the other) and the operator tables.
BLOCHSIM_HD inline int64_t keyed_pool_workspace(const EventStream& s, const KeyedProgram& k, const Pools& p) {
  return 2 * keyed_pool_state_size(k, p) + pool_operator_size(s, p);
}

inline namespace BLOCHSIM_ISA {

// PoolPlayer over slots: K is the program's max_slots and band the slots
// the last map wrote; a shift applies the event's map before its pulse
// (map 2e) or after its readout (map 2e + 1).  A spoil is the map after
// its readout, which keeps the Z of each slot: the event's spoil flag is
// not passed on.
template <class S>
struct KeyedPoolPlayer : PoolPlayer<S> {
  using Base = PoolPlayer<S>;
  const KeyedProgram& k;
  Cx<S>* spare;     // the state a map writes
  int64_t map = 0;  // the map the next shift applies

  BLOCHSIM_HD KeyedPoolPlayer(const EventStream& s_, const KeyedProgram& k_, const Pools& p_,
                              const LineshapeTable& ls_, const PoolTissue<S>& q_, Cx<S>* x_, Cx<S>* spare_, S* ops_)
      : Base(s_, p_, ls_, q_, x_, ops_), k(k_), spare(spare_) {
    this->K = k.max_slots;
  }

  BLOCHSIM_HD uint32_t flags(int64_t e) const { return this->s.flags[e] & ~static_cast<uint32_t>(event_spoil); }
  BLOCHSIM_HD int32_t shift_before(int64_t e) {
    map = 2 * e;
    return k.slots[map] >= 0 ? 1 : 0;
  }
  BLOCHSIM_HD int32_t shift_after(int64_t e) {
    map = 2 * e + 1;
    return k.slots[map] >= 0 ? 1 : 0;
  }
  // Map `map` from the state into spare, which becomes the state.
  BLOCHSIM_HD void shift(int) {
    const int64_t K = this->K;
    const int n = this->n, families = 2 * n + this->m;
    const int64_t nn = k.slots[map];
    const Cx<S> czero{S(0.0), S(0.0)};
    for (int f = 0; f < families; ++f)
      for (int64_t j = 0; j < nn; ++j) spare[f * K + j] = czero;
    // component c (0 F+, 2 F-, 4 Z) of pool j: row c / 2 · n + j
    for (int64_t e = k.first[map]; e < k.first[map + 1]; ++e) {
      // the state is zeroed above: every entry adds (a written one too)
      const int32_t d = k.dst[e] & ~1, r = k.src[e];
      const bool conj_ = r < 0;
      const int32_t from = conj_ ? -1 - r : r;
      const Cx<S>* a = this->x + (from % 6 / 2) * n * K + from / 6;
      Cx<S>* b = spare + (d % 6 / 2) * n * K + d / 6;
      const int count = d % 6 == 4 ? this->m : n;
      for (int j = 0; j < count; ++j) {
        const Cx<S> v = a[j * K];
        b[j * K] = b[j * K] + (conj_ ? conj(v) : v);
      }
    }
    Cx<S>* t = this->x;
    this->x = spare;
    spare = t;
    this->band = static_cast<int>(nn);
  }
};

// Plays the keyed program for problem i; sink(slot, Cx<S> sample) takes
// each readout.  work holds keyed_pool_workspace(s, k, p) values of S.
template <class S, class Sink>
BLOCHSIM_HD inline void keyed_pooled_problem(const EventStream& s, const KeyedProgram& k, const Tissue& t,
                                             const Pools& p, const LineshapeTable& ls, int64_t i, const int* fields,
                                             int n_dirs, const float* seeds, S* work, Sink&& sink) {
  const int64_t state = keyed_pool_state_size(k, p);
  KeyedPoolPlayer<S> pl(s, k, p, ls, pool_tissue<S>(t, p, i, fields, n_dirs, seeds), reinterpret_cast<Cx<S>*>(work),
                        reinterpret_cast<Cx<S>*>(work + state), work + 2 * state);
  pl.forget_operators();
  pl.equilibrium();
  for (int64_t e = 0; e < s.n_events; ++e) pooled_event(s, e, pl, sink);
}

}  // namespace BLOCHSIM_ISA
}  // namespace blochsim
