"""The C++ API's stream checks that Python cannot reach (SPEC §7-8): a
program built against the installed headers hands validate() streams the
Python layer never builds."""

import shutil
import subprocess

import pytest

from cpp_build import extra_flags, include_dir


SOURCE = r"""
#include <blochsim/blochsim.hpp>
#include <cstdio>

int main() {
  int32_t none = -1, zero = 0;
  uint32_t f = 0;
  float x = 0.0f;
  blochsim::EventStream s;
  s.interval = &none;  // no interval
  s.shift_before = s.shift_after = s.slot = &zero;
  s.flags = &f;
  s.flip_rad = s.phase_rad = s.rx_phase_rad = &x;
  blochsim::Tissue t;
  // event indices are 32-bit in the kernels: refused before any array is read
  s.n_events = INT32_MAX;
  const int big = blochsim::validate(s, t);
  std::printf("%d %s\n", big, blochsim::status_message(big));
  s.n_events = 1;
  std::printf("%d\n", blochsim::validate(s, t));
  return 0;
}
"""


def _run_program(tmp_path, name, source):
    """Build source against the installed headers and return its output lines."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    src = tmp_path / f"{name}.cpp"
    src.write_text(source)
    exe = tmp_path / name
    r = subprocess.run([cxx, "-O1", "-std=c++17", f"-I{include_dir()}", "-pthread", *extra_flags(), str(src), "-o",
                        str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.splitlines()


def test_validate_refuses_streams_past_32_bit_event_indices(tmp_path):
    out = _run_program(tmp_path, "limits", SOURCE)
    assert out[0] == "8 a stream holds at most 2147483646 events"
    assert out[1] == "0"


POOLED = r"""
#include <blochsim/blochsim.hpp>
#include <cstdio>

// A 90-degree pulse read at once, on free water and one exchanging pool,
// through the C++ API's pooled entry (host::pooled_status).
int main() {
  int32_t iv = -1, zero = 0;
  uint32_t f = blochsim::event_rf | blochsim::event_readout;
  float flip = 1.5707963267948966f, nought = 0.0f;
  blochsim::EventStream s;
  s.n_events = 1;
  s.interval = &iv;
  s.shift_before = s.shift_after = s.slot = &zero;
  s.flags = &f;
  s.flip_rad = &flip;
  s.phase_rad = s.rx_phase_rad = &nought;
  s.n_samples = 1;
  s.states = 4;
  float T1 = 1.0f, T2 = 0.05f, fb = 0.3f, kb = 20.0f, too_much = 0.8f, negative = -1.0f, D = 1e-9f;
  blochsim::Tissue t;
  t.n = 1;
  t[blochsim::field_T1].data = &T1;
  t[blochsim::field_T2].data = &T2;
  blochsim::Pools p;
  p.n_exchanging = 1;
  p.exchanging(0)[blochsim::pool_fraction].data = &fb;
  p.exchanging(0)[blochsim::pool_exchange_hz].data = &kb;
  float out[2] = {0.0f, 0.0f};
  int st = blochsim::host::pooled_status(s, t, p, nullptr, 0, nullptr, out, nullptr, 1);
  std::printf("%d %.6f %.6f\n", st, out[0], out[1]);
  p.bound = 1;
  p[blochsim::field_bound_fraction].data = &too_much;  // 0.3 + 0.8 > 1
  st = blochsim::host::pooled_status(s, t, p, nullptr, 0, nullptr, out, nullptr, 1);
  std::printf("%d %s\n", st, blochsim::status_message(st));
  p[blochsim::field_bound_fraction].data = &fb;
  p[blochsim::field_bound_exchange_hz].data = &negative;
  std::printf("%d\n", blochsim::host::pooled_status(s, t, p, nullptr, 0, nullptr, out, nullptr, 1));
  p[blochsim::field_bound_exchange_hz].data = &kb;
  t[blochsim::field_D].data = &D;
  st = blochsim::host::pooled_status(s, t, p, nullptr, 0, nullptr, out, nullptr, 1);
  std::printf("%d %s\n", st, blochsim::status_message(st));
  t[blochsim::field_D].data = nullptr;
  // an exact rectangular pulse is refused by the single-pool kernels
  uint32_t driven_flag = blochsim::event_driven;
  int32_t row = 0;
  double table[blochsim::driven_fields] = {1e-3, 1.0, 0.0, 0.0};
  s.flags = &driven_flag;
  s.driven = &row;
  s.n_driven = 1;
  s.driven_table = table;
  st = blochsim::host::forward_status(s, t, out, 1);
  std::printf("%d %s\n", st, blochsim::status_message(st));
  return 0;
}
"""


def test_pooled_entry_and_its_refusals(tmp_path):
    out = _run_program(tmp_path, "pooled", POOLED)
    # from equilibrium, both pools tipped by 90° at phase 0: F+ = -i (f_a + f_b)
    assert out[0] == "0 0.000000 -1.000000"
    assert out[1].startswith("10 pools: a fraction or exchange rate is negative, the fractions sum past 1")
    assert out[2] == "10"
    assert out[3] == "11 pools: diffusion (D) and flow (v) are not modelled with pools"
    assert out[4].startswith("12 exact rectangular pulses (event_driven) are played by the pooled kernels only")


POOLED_ADJOINT = r"""
#include <blochsim/blochsim.hpp>
#include <cstdio>

// Reverse mode through the C++ API's pooled entry: a 60-degree pulse read at
// once on free water, an exchanging pool and a semisolid pool.
int main() {
  int32_t iv = -1, zero = 0;
  uint32_t f = blochsim::event_rf | blochsim::event_readout;
  float flip = 1.0471975511965976f, nought = 0.0f;
  blochsim::EventStream s;
  s.n_events = 1;
  s.interval = &iv;
  s.shift_before = s.shift_after = s.slot = &zero;
  s.flags = &f;
  s.flip_rad = &flip;
  s.phase_rad = s.rx_phase_rad = &nought;
  s.n_samples = 1;
  s.states = 4;
  float T1 = 1.0f, T2 = 0.05f, fB = 0.3f, kB = 20.0f, fb = 0.2f, kb = 10.0f;
  blochsim::Tissue t;
  t.n = 1;
  t[blochsim::field_T1].data = &T1;
  t[blochsim::field_T2].data = &T2;
  blochsim::Pools p;
  p.n_exchanging = 1;
  p.exchanging(0)[blochsim::pool_fraction].data = &fB;
  p.exchanging(0)[blochsim::pool_exchange_hz].data = &kB;
  p.bound = 1;
  p[blochsim::field_bound_fraction].data = &fb;
  p[blochsim::field_bound_exchange_hz].data = &kb;
  const int fields[2] = {blochsim::field_bound_fraction, blochsim::field_pool_first + blochsim::pool_fraction};
  float cot[2] = {0.0f, 1.0f};  // g = i
  double ev[blochsim::pooled_event_gradients];
  float tg[2];
  int st = blochsim::host::pooled_adjoint_status(s, t, p, fields, 2, cot, ev, tg, 1);
  std::printf("%d %.6f %.6f %.6f %.6f\n", st, ev[blochsim::pgrad_flip], ev[blochsim::pgrad_rx], tg[0], tg[1]);
  st = blochsim::host::pooled_adjoint_status(s, t, p, fields, 2, cot, ev, tg, 0);
  std::printf("%d\n", st);
  return 0;
}
"""


def test_pooled_adjoint_entry_against_the_closed_form(tmp_path):
    out = _run_program(tmp_path, "pooled_adjoint", POOLED_ADJOINT)
    # s = -i sin(a) (f_a + f_B) = -i sin(a) (1 - f_b); with g = i, L = Re(conj(g) s):
    # dL/da = -(1 - f_b) cos(a), dL/drx = 0, dL/df_b = sin(a), dL/df_B = 0
    st, flip, rx, d_fb, d_fB = out[0].split()
    assert st == "0"
    np = pytest.importorskip("numpy")
    np.testing.assert_allclose(float(flip), -0.8 * 0.5, atol=1e-6)
    np.testing.assert_allclose(float(rx), 0.0, atol=1e-6)
    np.testing.assert_allclose(float(d_fb), np.sin(np.pi / 3), atol=1e-6)
    np.testing.assert_allclose(float(d_fB), 0.0, atol=1e-6)
    assert out[1] == "4"  # zero threads: bad_threads


RELIABLE = r"""
#include <blochsim/blochsim.hpp>
#include <cstdio>

// The C++ entries return statuses: zero problems write nothing and succeed,
// a workspace that cannot fit is refused before it is allocated, and a poll
// installed by the caller stops a call.
static int calls = 0;
static int stop_now(void*) { return ++calls >= 1; }

int main() {
  int32_t iv = 0, zero = 0, one = 1;
  uint32_t f = blochsim::event_rf | blochsim::event_readout;
  float flip = 0.5f, nought = 0.0f;
  double dur = 1e-3;
  blochsim::EventStream s;
  s.n_events = 1;
  s.interval = &iv;
  s.shift_before = s.slot = &zero;
  s.shift_after = &one;
  s.flags = &f;
  s.flip_rad = &flip;
  s.phase_rad = s.rx_phase_rad = &nought;
  s.n_intervals = 1;
  s.duration_s = &dur;
  s.n_samples = 1;
  s.states = 4;
  blochsim::Tissue t;  // n = 0: no problems, no arrays
  int field = 0;
  double ev[8] = {};
  blochsim::Pools p;
  std::printf("%d %d %d %d %d\n", blochsim::host::forward_status(s, t, nullptr, 2),
              blochsim::host::jacobian_status(s, t, &field, 1, nullptr, nullptr, 2),
              blochsim::host::adjoint_status(s, t, &field, 1, nullptr, ev, nullptr, 2),
              blochsim::host::pooled_status(s, t, p, nullptr, 0, nullptr, nullptr, nullptr, 2),
              blochsim::host::pooled_adjoint_status(s, t, p, nullptr, 0, nullptr, ev, nullptr, 2));
  // a billion states: refused before allocating
  float T1 = 1.0f, T2 = 0.1f;
  float out[2];
  t.n = 1;
  t[blochsim::field_T1].data = &T1;
  t[blochsim::field_T2].data = &T2;
  s.states = 1000000000;
  const int big = blochsim::host::forward_status(s, t, out, 2);
  std::printf("%d %.3g\n", big, blochsim::host::workspace_bytes(blochsim::host::Entry::forward, s, 1, 2));
  bool threw = false;
  try {
    blochsim::host::forward(s, t, out, 2);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  std::printf("%d\n", threw ? 1 : 0);
  // a poll that asks to stop: a long call (a 2000-pulse train, many problems) returns interrupted
  static int32_t ivs[2000], zeros[2000], ones[2000];
  static uint32_t fs[2000];
  static float flips[2000], noughts[2000];
  for (int e = 0; e < 2000; ++e) {
    ivs[e] = 0, zeros[e] = 0, ones[e] = 1, fs[e] = blochsim::event_rf, flips[e] = 0.3f, noughts[e] = 0.0f;
  }
  fs[1999] |= blochsim::event_readout;
  s.n_events = 2000;
  s.interval = ivs;
  s.shift_before = s.slot = zeros;
  s.shift_after = ones;
  s.flags = fs;
  s.flip_rad = flips;
  s.phase_rad = s.rx_phase_rad = noughts;
  s.states = 16;
  static float T1s[200000], T2s[200000];
  static float outs[400000];
  for (int i = 0; i < 200000; ++i) T1s[i] = 1.0f, T2s[i] = 0.1f;
  t.n = 200000;
  t[blochsim::field_T1].data = T1s;
  t[blochsim::field_T1].stride = 1;
  t[blochsim::field_T2].data = T2s;
  t[blochsim::field_T2].stride = 1;
  int st;
  {
    blochsim::InterruptScope scope(&stop_now, nullptr);
    st = blochsim::host::forward_status(s, t, outs, 2);
  }
  t.n = 100;
  std::printf("%d %d\n", st, blochsim::host::forward_status(s, t, outs, 2));
  return 0;
}
"""


def test_entries_return_statuses_for_empty_huge_and_interrupted_calls(tmp_path):
    out = _run_program(tmp_path, "reliable", RELIABLE)
    assert out[0] == "0 0 0 0 0"
    status, need = out[1].split()
    assert status == "13" and float(need) > 1e11  # out_of_memory; a billion states x 16 lanes x 2 threads
    assert out[2] == "1"  # host::forward throws std::bad_alloc for it
    assert out[3] == "14 0"  # interrupted, then a call without the poll succeeds
