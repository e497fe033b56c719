"""The C++ API's stream checks that Python cannot reach (SPEC §7-8): a
program built against the installed headers hands validate() streams the
Python layer never builds."""

import shutil
import subprocess

import pytest

import blochsim

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


def test_validate_refuses_streams_past_32_bit_event_indices(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    src = tmp_path / "limits.cpp"
    src.write_text(SOURCE)
    exe = tmp_path / "limits"
    r = subprocess.run([cxx, "-O1", "-std=c++17", f"-I{blochsim.get_include()}", "-pthread", str(src), "-o",
                        str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert out[0] == "8 a stream holds at most 2147483646 events"
    assert out[1] == "0"
