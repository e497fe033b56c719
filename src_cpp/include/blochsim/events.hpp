// The event/tissue ABI: what a caller hands the kernels.
//
// A sequence is an unrolled stream of events (SPEC §2).  Event e owns the
// interval that precedes it and then, in this order: a shift before, an RF
// pulse or an inversion, a readout, and a shift after or a spoil.  The
// stream is structure-of-arrays so that it can be copied to a device as a
// handful of flat buffers; every pointer is read-only.
//
// Units are SI: seconds, radians, hertz, m^2/s, m/s, radians per metre.
#pragma once

#include <cmath>
#include <cstdint>

#include "config.hpp"

namespace blochsim {

enum EventFlag : uint32_t {
  event_rf = 1u,         // hard pulse: flip_rad, phase_rad
  event_inversion = 2u,  // Z <- -eta Z at every order
  event_readout = 4u,    // sample F+_0 into output slot `slot`
  event_spoil = 8u,      // F+, F- <- 0 at every order (wins over shift_after)
  event_saturation = 16u,  // an RF pulse that saturates the semisolid pool only (pools/pools.hpp)
  event_driven = 32u,      // an exact rectangular pulse (driven_table; pooled kernels only)
  event_dual = 64u,        // its saturation splits the power between +offset and -offset (pools/pools.hpp)
};

// The bits of an event record's flags above the EventFlag bits hold its
// pulse's transmit setting plus one (0: none; EventStream::transmit).
constexpr int transmit_flag_shift = 16;
constexpr int32_t max_transmit_settings = 65535;

// Columns of EventStream::rf_table for a pulse of flip a and phase phi.
enum RfTableField : int {
  rft_cos2_half,  // cos^2(a/2)
  rft_sin2_half,  // sin^2(a/2)
  rft_sin,        // sin(a)
  rft_cos,        // cos(a)
  rft_cos_phase,  // cos(phi)
  rft_sin_phase,  // sin(phi)
  rft_cos_rx,     // cos of the receiver phase of the event's readout
  rft_sin_rx,     // sin of the receiver phase
  rf_table_fields
};

// One event, as the kernels read it (EventStream::records).  rf is the
// event's rf_table row, computed from flip_rad, phase_rad and rx_phase_rad
// when the stream has no table; run is the count of the events from this one
// on that the fast path can play together (pack_events()).
struct alignas(16) EventRecord {
  int32_t interval, shift_before, shift_after, slot;
  int32_t run;
  uint32_t flags;
  float flip_rad, phase_rad;
  float rf[rf_table_fields];
};
static_assert(sizeof(EventRecord) == 64, "an event record is four 16-byte words");

struct EventStream {
  int64_t n_events = 0;
  const int32_t* interval = nullptr;      // (n_events,) index into duration_s, or -1
  const uint32_t* flags = nullptr;        // (n_events,) EventFlag bits
  const int32_t* shift_before = nullptr;  // (n_events,) orders of dephasing; sign = direction
  const int32_t* shift_after = nullptr;   // (n_events,)
  const float* flip_rad = nullptr;        // (n_events,) nominal flip (scaled by B1)
  const float* phase_rad = nullptr;       // (n_events,) RF phase (plus the transmit phase)
  const float* rx_phase_rad = nullptr;    // (n_events,) receiver phase
  const int32_t* slot = nullptr;          // (n_events,) output slot of a readout

  // Optional (n_events,) the transmit setting of each pulse (Tissue::
  // transmit), or -1; read only when the tissue holds settings, and then
  // every RF pulse names one.
  const int32_t* transmit = nullptr;

  int64_t n_intervals = 0;
  const double* duration_s = nullptr;     // (n_intervals,) distinct interval lengths

  // Optional (n_events, rf_table_fields) table of each pulse's rotation at
  // B1 = 1 and each readout's receiver phase (see RfTableField), computed
  // once per sequence in double precision, so that the event loop needs no
  // sincos; null: kernels compute it from flip_rad, phase_rad, rx_phase_rad.
  const float* rf_table = nullptr;

  // (n_events + 1,) the fields of each event in one 64-byte record (above),
  // for the register kernels, which read an event with four vector loads.
  // Derived from the fields above by pack_events(): the launchers that use
  // records fill it in (a value given by the caller is not used); null: the
  // kernels read the arrays above.
  const EventRecord* records = nullptr;

  // Optional (n_events,) per pulse: its duration (s), its offset from the
  // water resonance (Hz) and its power factor p = tau * int b^2 dt /
  // (int b dt)^2 (1 for a rectangle), for the saturation of the semisolid
  // pool (pools/pools.hpp); the single-pool kernels do not read them.  A null
  // rf_duration_s: pulses are instantaneous and deposit nothing; a null
  // offset or power: 0 Hz and 1.
  const float* rf_duration_s = nullptr;
  const float* rf_offset_hz = nullptr;
  const float* rf_power = nullptr;

  // Optional exact rectangular pulses, played by the pooled kernels only
  // (pools/pools.hpp): during such a pulse relaxation, exchange, off-resonance and
  // the semisolid pool's saturation act together with the RF field.  driven
  // (n_events,) is each event's row of driven_table or -1 (set exactly where
  // event_driven is); driven_table (n_driven, driven_fields) holds
  // duration_s, flip_rad, phase_rad and the pulse's offset from the water
  // resonance (Hz).
  const int32_t* driven = nullptr;
  int64_t n_driven = 0;
  const double* driven_table = nullptr;

  int64_t n_samples = 0;                  // output slots per problem
  int32_t states = 8;                     // K: orders 0 .. K-1

  // Crusher geometry: wavenumber of one shift, dk = crusher_dephasing_rad /
  // voxel_size_m.  0 when no geometry was given (then D and v must be absent).
  double dk_rad_per_m = 0.0;
  double voxel_size_m = 0.0;

  // Real-subspace verdict, decided once per sequence on the host: every RF
  // phase is common_phase_rad or common_phase_rad + pi and nothing off-axis
  // is on.  The state is then held as three real planes (SPEC §1).
  int32_t real_path = 0;
  float common_phase_rad = 0.0f;
};

// Whether event e is of the form the kernels' fast path plays (epg/epg.hpp
// play()): an RF pulse after its interval (or none), an optional readout,
// then exactly one shift up; no shift before, no spoil.
BLOCHSIM_HD inline bool simple_event(const EventStream& s, int64_t e) {
  const uint32_t f = s.flags[e];
  return (f & (event_spoil | event_inversion)) == 0 && (f & event_rf) != 0 && s.shift_before[e] == 0 &&
         s.shift_after[e] == 1;
}

// The flags of event e as its record holds them: with its pulse's transmit
// setting in the bits above the EventFlag bits.
BLOCHSIM_HD inline uint32_t record_flags(const EventStream& s, int64_t e) {
  const uint32_t f = s.flags[e];
  if (!s.transmit || !(f & event_rf) || s.transmit[e] < 0) return f;
  return f | (static_cast<uint32_t>(s.transmit[e] + 1) << transmit_flag_shift);
}

// Fills out (n_events + 1,) with the records of the stream
// (EventStream::records), the last a sentinel that does nothing, so that a
// kernel may fetch the record after the last event.
// The run count of event e is the number of consecutive simple events from e
// on that share e's interval and whether it reads out, so that the fast path
// plays a run of them with one set of interval coefficients and no branch
// between its events.
inline void pack_events(const EventStream& s, EventRecord* out) {
  out[s.n_events] = EventRecord{-1, 0, 0, 0, 0, 0u, 0.0f, 0.0f, {}};
  int32_t run = 0;
  for (int64_t e = s.n_events - 1; e >= 0; --e) {
    // a run keeps one transmit setting: the player loads it at the run's start
    const bool same = e + 1 < s.n_events && s.interval[e + 1] == s.interval[e] &&
                      ((record_flags(s, e + 1) ^ record_flags(s, e)) &
                       (event_readout | ~((1u << transmit_flag_shift) - 1u))) == 0;
    if (!simple_event(s, e))
      run = 0;
    else
      run = same && run > 0 ? (run < INT32_MAX ? run + 1 : run) : 1;
    EventRecord& r = out[e];
    r.interval = s.interval[e];
    r.shift_before = s.shift_before[e];
    r.shift_after = s.shift_after[e];
    r.slot = s.slot[e];
    r.run = run;
    r.flags = record_flags(s, e);
    r.flip_rad = s.flip_rad[e];
    r.phase_rad = s.phase_rad[e];
    if (s.rf_table) {
      for (int i = 0; i < rf_table_fields; ++i) r.rf[i] = s.rf_table[e * rf_table_fields + i];
    } else {
      const double a = s.flip_rad[e], phi = s.phase_rad[e], rx = s.rx_phase_rad[e];
      const double ch = std::cos(0.5 * a), sh = std::sin(0.5 * a);
      const double row[rf_table_fields] = {ch * ch,        sh * sh,       std::sin(a),    std::cos(a),
                                           std::cos(phi), std::sin(phi), std::cos(rx), std::sin(rx)};
      for (int i = 0; i < rf_table_fields; ++i) r.rf[i] = static_cast<float>(row[i]);
    }
  }
}

enum DrivenField : int { drv_duration_s, drv_flip_rad, drv_phase_rad, drv_offset_hz, driven_fields };

// The tissue and pool fields, declared once, in the two tables below:
// their order (the index a Jacobian or adjoint direction names, and the
// order of the planes the Python layer hands over), their SI names and
// units, the value an absent field takes, and which derivatives the kernels
// take along them.  The enums, field_table, Tissue and Pools are generated
// from these tables; the extension exports field_table to Python
// (_core.FIELD_TABLE).  Nothing else lists or numbers the fields: code
// names one (field_T1) or loops over all of them (tissue_fields).
//
// X(id, SI name, SI unit, fallback, flags); flags: S a direction of the
// single-pool Jacobian and adjoint, P of the pooled ones, SP both.
#define BLOCHSIM_STANDARD_TISSUE_FIELDS(X)       \
  X(T1, "T1_s", "s", 1.0e30f, SP)                \
  X(T2, "T2_s", "s", 1.0e30f, SP)                \
  X(M0, "M0", "", 1.0f, SP)                      \
  X(B1, "B1", "", 1.0f, SP)                      \
  X(B1phase, "B1phase_rad", "rad", 0.0f, SP)     \
  X(B0, "B0_hz", "Hz", 0.0f, SP)                 \
  X(D, "D_m2_s", "m^2/s", 0.0f, S)               \
  X(v, "v_m_s", "m/s", 0.0f, S)                  \
  X(eta, "inv_efficiency", "", 1.0f, SP)
// The table the core is built with.  A program may define its own
// BLOCHSIM_TISSUE_FIELDS before the first include (tests/test_cpp_fields.py
// puts a field before the standard ones, to hold every consumer to the
// table).
#ifndef BLOCHSIM_TISSUE_FIELDS
#define BLOCHSIM_TISSUE_FIELDS(X) BLOCHSIM_STANDARD_TISSUE_FIELDS(X)
#endif

// The semisolid pool's fields, then one block of BLOCHSIM_POOL_COLUMNS per
// exchanging pool B, C, D, E (the pool's letter L in its names).  An
// exchanging pool's T1_s or T2_s left absent takes free water's value
// (pools/pools.hpp), whatever its fallback here.
#define BLOCHSIM_BOUND_FIELDS(X)                          \
  X(bound_fraction, "bound_fraction", "", 0.0f, P)        \
  X(bound_exchange_hz, "bound_exchange_hz", "Hz", 0.0f, P) \
  X(bound_T1_s, "bound_T1_s", "s", 1.0f, P)               \
  X(bound_T2_s, "bound_T2_s", "s", 12.0e-6f, P)
#define BLOCHSIM_POOL_COLUMNS(X, L)                 \
  X(fraction, "pool" L "_fraction", "", 0.0f, P)    \
  X(exchange_hz, "pool" L "_exchange_hz", "Hz", 0.0f, P) \
  X(T1_s, "pool" L "_T1_s", "s", 0.0f, P)           \
  X(T2_s, "pool" L "_T2_s", "s", 0.0f, P)           \
  X(shift_hz, "pool" L "_shift_hz", "Hz", 0.0f, P)
#define BLOCHSIM_EXCHANGING_POOLS(X) X("B") X("C") X("D") X("E")
// The exchange network beyond the star (pools/pools.hpp): the first
// semisolid pool's dipolar order (its T1D; absent: none), a second
// semisolid pool, and one rate constant per pair of the pools after free
// water (free water's own pairs are the star's poolL_exchange_hz,
// bound_exchange_hz and bound2_exchange_hz).  A pair's pools are named in
// the order B, C, D, E, bound, bound2.
#define BLOCHSIM_NETWORK_FIELDS(X)                            \
  X(bound_T1D_s, "bound_T1D_s", "s", 0.0f, P)                 \
  X(bound2_fraction, "bound2_fraction", "", 0.0f, P)          \
  X(bound2_exchange_hz, "bound2_exchange_hz", "Hz", 0.0f, P)  \
  X(bound2_T1_s, "bound2_T1_s", "s", 1.0f, P)                 \
  X(bound2_T2_s, "bound2_T2_s", "s", 12.0e-6f, P)             \
  X(bound2_T1D_s, "bound2_T1D_s", "s", 0.0f, P)
// X(first pool, second pool) per pair, the pools as network codes
// (PoolCode: 1-4 the exchanging pools B-E, 5 bound, 6 bound2).
#define BLOCHSIM_PAIR_RATES(X)                                                                     \
  X(B, C) X(B, D) X(B, E) X(B, bound) X(B, bound2) X(C, D) X(C, E) X(C, bound) X(C, bound2) X(D, E) \
  X(D, bound) X(D, bound2) X(E, bound) X(E, bound2) X(bound, bound2)
#define BLOCHSIM_PAIR_FIELD(a, b, X) X(exchange_##a##_##b##_hz, "exchange_" #a "_" #b "_hz", "Hz", 0.0f, P)

#define BLOCHSIM_FIELD_ENUM(id, name, unit, fallback, flags) field_##id,
#define BLOCHSIM_COLUMN_ENUM(id, name, unit, fallback, flags) pool_##id,
#define BLOCHSIM_COUNT_POOL(L) +1

// Fields of Tissue, in its order.
enum TissueField : int { BLOCHSIM_TISSUE_FIELDS(BLOCHSIM_FIELD_ENUM) tissue_fields };

constexpr int max_exchanging_pools = 0 BLOCHSIM_EXCHANGING_POOLS(BLOCHSIM_COUNT_POOL);

// Columns of one exchanging pool (Pools::exchanging).
enum PoolColumn : int { BLOCHSIM_POOL_COLUMNS(BLOCHSIM_COLUMN_ENUM, "") pool_columns };

// Fields of Pools after the tissue's: the semisolid pool's, then
// pool_columns per exchanging pool B, C, D, E.
enum PoolField : int {
  field_before_pools = tissue_fields - 1,
  BLOCHSIM_BOUND_FIELDS(BLOCHSIM_FIELD_ENUM)
  field_pool_first,  // pool j (0 = B): field_pool_first + pool_columns * j + PoolColumn
  field_pool_last = field_pool_first + pool_columns * max_exchanging_pools - 1,
  BLOCHSIM_NETWORK_FIELDS(BLOCHSIM_FIELD_ENUM)
#define BLOCHSIM_PAIR_ENUM(a, b) BLOCHSIM_PAIR_FIELD(a, b, BLOCHSIM_FIELD_ENUM)
  BLOCHSIM_PAIR_RATES(BLOCHSIM_PAIR_ENUM)
#undef BLOCHSIM_PAIR_ENUM
  pool_field_count
};
// The first pair rate's field; pair j is field_pair_first + j.
constexpr int field_pair_first = field_exchange_B_C_hz;
// Pool codes of the network (BLOCHSIM_PAIR_RATES).
enum PoolCode : int { code_B = 1, code_C, code_D, code_E, code_bound, code_bound2 };
constexpr int pair_rates = pool_field_count - field_pair_first;
// Pool `side` (0 or 1) of pair rate j, as a PoolCode.
#define BLOCHSIM_PAIR_CODES(a, b) {code_##a, code_##b},
BLOCHSIM_HD constexpr int pair_code(int j, int side) {
  const int codes[][2] = {BLOCHSIM_PAIR_RATES(BLOCHSIM_PAIR_CODES)};
  return codes[j][side];
}
#undef BLOCHSIM_PAIR_CODES
#undef BLOCHSIM_FIELD_ENUM
#undef BLOCHSIM_COLUMN_ENUM
#undef BLOCHSIM_COUNT_POOL

// Field flags.
enum FieldFlag : uint32_t {
  field_single_pool_direction = 1u,  // a direction of the single-pool Jacobian and adjoint
  field_pooled_direction = 2u,       // a direction of the pooled Jacobian and adjoint
};

struct FieldInfo {
  const char* name;  // SI name, as the Python layer's units table names it
  const char* unit;  // SI unit
  float fallback;    // the value an absent field takes
  uint32_t flags;    // FieldFlag bits
};

namespace fields_detail {
constexpr uint32_t S = field_single_pool_direction, P = field_pooled_direction, SP = S | P;
}  // namespace fields_detail

#define BLOCHSIM_FIELD_INFO(id, name, unit, fallback, flags) {name, unit, fallback, fields_detail::flags},
#define BLOCHSIM_POOL_INFO(L) BLOCHSIM_POOL_COLUMNS(BLOCHSIM_FIELD_INFO, L)
inline constexpr FieldInfo field_table[pool_field_count] = {
    BLOCHSIM_TISSUE_FIELDS(BLOCHSIM_FIELD_INFO)
    BLOCHSIM_BOUND_FIELDS(BLOCHSIM_FIELD_INFO)
    BLOCHSIM_EXCHANGING_POOLS(BLOCHSIM_POOL_INFO)
    BLOCHSIM_NETWORK_FIELDS(BLOCHSIM_FIELD_INFO)
#define BLOCHSIM_PAIR_INFO(a, b) BLOCHSIM_PAIR_FIELD(a, b, BLOCHSIM_FIELD_INFO)
    BLOCHSIM_PAIR_RATES(BLOCHSIM_PAIR_INFO)
#undef BLOCHSIM_PAIR_INFO
};
#undef BLOCHSIM_POOL_INFO
#undef BLOCHSIM_FIELD_INFO

// Whether field f is a direction the pooled kernels differentiate along.
constexpr bool pooled_direction(int f) {
  return f >= 0 && f < pool_field_count && (field_table[f].flags & field_pooled_direction) != 0;
}

// One tissue property for n problems: element i is data[i * stride]
// (stride 0 broadcasts one value); a null pointer means the property is
// absent and `fallback` holds.
struct Property {
  const float* data = nullptr;
  int64_t stride = 0;
  float fallback = 0.0f;

  BLOCHSIM_HD float at(int64_t i) const { return data ? data[i * stride] : fallback; }
  BLOCHSIM_HD bool present() const { return data != nullptr; }
};

// Per-pulse transmit settings (parallel transmission with a shim per pulse
// or per waveform sample).  Problem i has the complex relative transmit
// sensitivity S_c of each channel c at sensitivity[i * stride + 2 c + {0,
// 1}] (Re, Im; stride 0: every problem alike); setting g drives the
// channels with U_gc at drive[2 (g channels + c) + {0, 1}].  A pulse
// naming setting g plays at the field B = sum_c S_c U_gc: |B| scales its
// flip (as B1) and arg B adds to its phase (as B1phase), in place of the
// tissue's B1 and B1phase.  For the Jacobian, the directions along B1 and
// B1phase are those of |B| and arg B of setting `seeded` (of none when it
// is -1).  The adjoint adds dL/d|B| and dL/d arg B of setting g for problem
// i into gradient[(i settings + g) * 2 + {0, 1}] when it is given (the
// caller zeroes it; one problem is one thread's, so no two write a row).
struct Transmit {
  int32_t settings = 0;
  int32_t channels = 0;
  const float* sensitivity = nullptr;
  int64_t stride = 0;
  const float* drive = nullptr;
  int32_t seeded = -1;
  float* gradient = nullptr;

  // |B| and arg B of setting g for problem i.
  BLOCHSIM_HD void field(int64_t i, int g, float& magnitude, float& phase) const {
    float re = 0.0f, im = 0.0f;
    const float* s = sensitivity + i * stride;
    const float* u = drive + 2 * static_cast<int64_t>(g) * channels;
    for (int c = 0; c < channels; ++c) {
      re += s[2 * c] * u[2 * c] - s[2 * c + 1] * u[2 * c + 1];
      im += s[2 * c] * u[2 * c + 1] + s[2 * c + 1] * u[2 * c];
    }
    magnitude = std::sqrt(re * re + im * im);
    // a null field's axis is at 0 (atan2 of signed zeros could give pi):
    // the derivatives there (_engine/transmit.py) count on it
    phase = magnitude > 0.0f ? std::atan2(im, re) : 0.0f;
  }
};

// The setting of the pulse of an event whose record flags are f, or -1.
BLOCHSIM_HD inline int transmit_setting(uint32_t f) { return static_cast<int>(f >> transmit_flag_shift) - 1; }

// The tissue: one Property per TissueField, indexed by field
// (t[field_T1]), each absent with its fallback until set; and the transmit
// settings, if any.
#define BLOCHSIM_ABSENT(id, name, unit, fallback, flags) {nullptr, 0, fallback},
struct Tissue {
  int64_t n = 0;  // problems (voxels or atoms)
  Property field[tissue_fields] = {BLOCHSIM_TISSUE_FIELDS(BLOCHSIM_ABSENT)};
  Transmit transmit;

  BLOCHSIM_HD Property& operator[](int f) { return field[f]; }
  BLOCHSIM_HD const Property& operator[](int f) const { return field[f]; }
};

// The Property of tissue field f (0 <= f < tissue_fields).
inline Property& tissue_property(Tissue& t, int f) { return t[f]; }

// Output layout: out[(i * n_samples + slot) * 2 + {0, 1}] = (Re, Im) of
// sample `slot` of problem i, complex64 interleaved.  Slots that no readout
// writes are left as the caller set them.

// Checks the stream against itself; kernels assume it passed.  Exact
// rectangular pulses (event_driven) are refused unless `pooled` (the kernels
// that play them); transmit settings unless `transmit` (the single-pool
// forward and Jacobian).
inline int validate(const EventStream& s, const Tissue& t, bool pooled = false, bool transmit = true) {
  if (s.states < 1) return bad_states;
  if (s.n_events < 0 || s.n_intervals < 0 || s.n_samples < 0 || t.n < 0) return bad_shape;
  if (s.n_events >= INT32_MAX) return too_many_events;
  if (s.n_events > 0 && (!s.interval || !s.flags || !s.shift_before || !s.shift_after ||
                         !s.flip_rad || !s.phase_rad || !s.rx_phase_rad || !s.slot))
    return bad_shape;
  if (s.n_intervals > 0 && !s.duration_s) return bad_shape;
  const Transmit& tx = t.transmit;
  if (tx.settings < 0 || tx.settings > max_transmit_settings || tx.seeded < -1 || tx.seeded >= tx.settings)
    return bad_transmit;
  if (tx.settings > 0 && (pooled || !transmit || tx.channels < 1 || !tx.sensitivity || !tx.drive || !s.transmit))
    return bad_transmit;
  for (int64_t e = 0; e < s.n_events; ++e) {
    if (tx.settings > 0 && (s.flags[e] & event_rf) && (s.transmit[e] < 0 || s.transmit[e] >= tx.settings))
      return bad_transmit;
    if (s.interval[e] < -1 || s.interval[e] >= s.n_intervals) return bad_interval_index;
    if ((s.flags[e] & event_readout) && (s.slot[e] < 0 || s.slot[e] >= s.n_samples))
      return bad_output_slot;
    if (s.flags[e] & event_driven) {
      if (!pooled) return driven_needs_pools;
      if (!s.driven || !s.driven_table || s.driven[e] < 0 || s.driven[e] >= s.n_driven) return bad_shape;
    }
  }
  return ok;
}

}  // namespace blochsim
