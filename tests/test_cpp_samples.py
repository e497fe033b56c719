"""The host's samples reach their slots whatever order the readouts name
them in: the forward entry (the real path and the complex) stages a tile
of readouts and writes a tile of consecutive slots transposed, any other a
sample at a time.  The C++ example's CPMG train (examples/cpp), its echoes
written in order, in reverse, and with one slot written twice, for a count
of problems that leaves a part block, against the closed form
|s_k| = M0 exp(-k ESP / T2)."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cpp_build import extra_flags, include_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cpp"

SOURCE = r"""
#include "cpmg_stream.hpp"

#include <cstdio>
#include <vector>

using namespace blochsim;

// The example's CPMG train (ESP 10 ms, 180 degree refocusing) with echo k
// read into slot_of(k) of n_samples slots; unwritten slots keep -7.  real:
// the excitation at phase 0 too, every phase 0 or pi: the real path.
int run(const char* name, int echoes, int n_samples, int order, bool real) {
  cpmg_example::CpmgStream c = cpmg_example::build_cpmg(echoes, 0.01, pi);
  for (int k = 0; k < echoes; ++k)
    c.slot[2 + 2 * k] = order == 0 ? k : order == 1 ? echoes - 1 - k : (k < echoes - 1 ? k : k - 1);
  if (real) c.phase_rad[0] = 0.0f;
  EventStream s = c.view(n_samples);
  s.real_path = real;

  const int n = 37;  // two blocks of 16 and a part block
  std::vector<float> T2(n), M0(n);
  for (int i = 0; i < n; ++i) {
    T2[i] = 0.02f + 0.005f * i;
    M0[i] = 0.5f + 0.03f * i;
  }
  const float T1 = 1.0f;
  Tissue t;
  t.n = n;
  t[field_T1] = {&T1, 0, 0.0f};
  t[field_T2] = {T2.data(), 1, 0.0f};
  t[field_M0] = {M0.data(), 1, 0.0f};
  std::vector<float> out(2 * n * n_samples, -7.0f);
  const int st = host::forward_status(s, t, out.data(), 2);
  std::printf("%s %d", name, st);
  for (float x : out) std::printf(" %.8g", x);
  std::printf("\n");
  return st;
}

int main() {
  run("in_order", 40, 40, 0, false);
  run("reversed", 40, 40, 1, false);
  run("twice", 40, 40, 2, false);
  run("short", 5, 5, 0, false);
  run("real_in_order", 40, 40, 0, true);
  run("real_reversed", 40, 40, 1, true);
  return 0;
}
"""


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    tmp = tmp_path_factory.mktemp("samples")
    src = tmp / "samples.cpp"
    src.write_text(SOURCE)
    exe = tmp / "samples"
    r = subprocess.run([cxx, "-O1", "-std=c++17", f"-I{include_dir()}", f"-I{EXAMPLES}", "-pthread", *extra_flags(),
                        str(src), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    got = {}
    for line in lines:
        name, st, *values = line.split()
        assert st == "0", (name, st)
        a = np.array(values, dtype=np.float64)
        got[name] = a[0::2] + 1j * a[1::2]
    return got


def _closed_form(echoes):
    i = np.arange(37)
    T2, M0 = (0.02 + 0.005 * i)[:, None], (0.5 + 0.03 * i)[:, None]
    return M0 * np.exp(-0.01 * np.arange(1, echoes + 1)[None, :] / T2)


@pytest.mark.parametrize("name, echoes", [("in_order", 40), ("short", 5), ("real_in_order", 40)])
def test_echoes_in_slot_order(samples, name, echoes):
    s = samples[name].reshape(37, echoes)
    np.testing.assert_allclose(np.abs(s), _closed_form(echoes), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("path", ["", "real_"])
def test_echoes_in_reverse_slot_order(samples, path):
    s = samples[path + "reversed"].reshape(37, 40)
    np.testing.assert_allclose(np.abs(s[:, ::-1]), _closed_form(40), rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(s[:, ::-1], samples[path + "in_order"].reshape(37, 40))


def test_a_slot_written_twice_keeps_the_later_sample(samples):
    s = samples["twice"].reshape(37, 40)
    expect = _closed_form(40)
    np.testing.assert_allclose(np.abs(s[:, :38]), expect[:, :38], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.abs(s[:, 38]), expect[:, 39], rtol=2e-5, atol=1e-6)  # echo 40 wins
    np.testing.assert_array_equal(s[:, 39], -7 - 7j)  # never written: left as it was
