"""The field table holds every consumer in the C++ core: a program that puts
one more tissue field before the standard ones (every field's number moves
by one, the pool fields too) computes what the standard table computes, and
the closed forms of a CPMG train, through the host's forward, Jacobian,
adjoint and pooled entries.  ARCHITECTURE.md's recipe for a new tissue
property relies on this."""

import shutil
import subprocess

import numpy as np
import pytest

from cpp_build import extra_flags, include_dir

SOURCE = r"""
#ifdef EXTRA_FIELD
// a field no physics reads, first: every other field's number moves by one
#define BLOCHSIM_TISSUE_FIELDS(X) X(extra, "extra", "", 0.25f, SP) BLOCHSIM_STANDARD_TISSUE_FIELDS(X)
#endif
#include <blochsim/blochsim.hpp>
#include <cstdio>
#include <vector>

using namespace blochsim;

int main() {
  // 90 at phase 90, then 8 echoes of [tau, shift, 180, tau, shift, read]
  const int echoes = 8;
  const int ne = 1 + 2 * echoes;
  std::vector<int32_t> iv(ne, 0), sb(ne, 0), sa(ne, 0), slot(ne, 0);
  std::vector<uint32_t> flags(ne, 0);
  std::vector<float> flip(ne, 0.0f), phase(ne, 0.0f), rx(ne, 0.0f);
  iv[0] = -1;
  flags[0] = event_rf;
  flip[0] = 1.5707963267948966f;
  phase[0] = 1.5707963267948966f;
  for (int k = 0; k < echoes; ++k) {
    const int a = 1 + 2 * k, b = a + 1;
    sb[a] = 1, flags[a] = event_rf, flip[a] = 3.14159265358979f;
    sb[b] = 1, flags[b] = event_readout, slot[b] = k;
  }
  double tau = 0.005;
  EventStream s;
  s.n_events = ne;
  s.interval = iv.data();
  s.flags = flags.data();
  s.shift_before = sb.data();
  s.shift_after = sa.data();
  s.flip_rad = flip.data();
  s.phase_rad = phase.data();
  s.rx_phase_rad = rx.data();
  s.slot = slot.data();
  s.n_intervals = 1;
  s.duration_s = &tau;
  s.n_samples = echoes;
  s.states = 2 * echoes + 2;

  const int n = 3;
  float T1[n] = {1.0f, 0.8f, 1.5f}, T2[n] = {0.05f, 0.08f, 0.12f}, M0[n] = {1.0f, 0.7f, 1.3f};
  float extra[n] = {7.0f, -3.0f, 11.0f};
  Tissue t;
  t.n = n;
  t[field_T1] = {T1, 1, 0.0f};
  t[field_T2] = {T2, 1, 0.0f};
  t[field_M0] = {M0, 1, 0.0f};
#ifdef EXTRA_FIELD
  t[field_extra] = {extra, 1, 0.0f};
  std::printf("table %d %s %s %d %d\n", tissue_fields, field_table[field_T1].name, field_table[0].name,
              field_bound_fraction == tissue_fields, int(field_table[field_bound_T2_s].fallback * 1e6f + 0.5f));
#else
  (void)extra;
  std::printf("table %d %s %s %d %d\n", tissue_fields + 1, field_table[field_T1].name, "extra",
              field_bound_fraction == tissue_fields, int(field_table[field_bound_T2_s].fallback * 1e6f + 0.5f));
#endif
  std::vector<float> out(2 * n * echoes), jac(2 * n * 3 * echoes);
  int st = host::forward_status(s, t, out.data(), 2);
  std::printf("forward %d", st);
  for (float x : out) std::printf(" %.7g", x);
  std::printf("\n");
  // T2, M0 and T1 directions (T1 moves nothing an ideal CPMG echo shows)
  const int fields[3] = {field_T2, field_M0, field_T1};
  st = host::jacobian_status(s, t, fields, 3, out.data(), jac.data(), 2);
  std::printf("jacobian %d", st);
  for (float x : jac) std::printf(" %.7g", x);
  std::printf("\n");
#ifdef EXTRA_FIELD
  const int along_extra[2] = {field_extra, field_T2};
  std::vector<float> jx(2 * n * 2 * echoes);
  st = host::jacobian_status(s, t, along_extra, 2, out.data(), jx.data(), 2);
  double most = 0.0;
  for (int i = 0; i < n; ++i)
    for (int q = 0; q < 2 * echoes; ++q) most = std::max(most, double(std::abs(jx[(i * 2 + 0) * 2 * echoes + q])));
  std::printf("extra %d %.3g\n", st, most);
#else
  std::printf("extra 0 0\n");
#endif
  // reverse mode: L = sum Re(s), cotangent 1 on every sample
  std::vector<float> cot(2 * n * echoes, 0.0f);
  for (int q = 0; q < n * echoes; ++q) cot[2 * q] = 1.0f;
  std::vector<double> ev(4 * ne, 0.0);
  std::vector<float> tg(n * 2, 0.0f);
  const int tdirs[2] = {field_T2, field_M0};
  st = host::adjoint_status(s, t, tdirs, 2, cot.data(), ev.data(), tg.data(), 2);
  std::printf("adjoint %d", st);
  for (float x : tg) std::printf(" %.7g", x);
  std::printf("\n");
  // pools: a semisolid pool and pool B, their Jacobian along a pool field
  float fb = 0.1f, kb = 10.0f, fB = 0.15f, kB = 20.0f;
  Pools p;
  p.bound = 1;
  p.n_exchanging = 1;
  p[field_bound_fraction] = {&fb, 0, 0.0f};
  p[field_bound_exchange_hz] = {&kb, 0, 0.0f};
  p.exchanging(0)[pool_fraction] = {&fB, 0, 0.0f};
  p.exchanging(0)[pool_exchange_hz] = {&kB, 0, 0.0f};
  const int pfields[2] = {field_bound_fraction, field_pool_first + pool_fraction};
  const float seeds[2] = {1.0f, 1.0f};
  std::vector<float> pj(2 * n * 2 * echoes);
  st = host::pooled_status(s, t, p, pfields, 2, seeds, out.data(), pj.data(), 2);
  std::printf("pooled %d", st);
  for (float x : out) std::printf(" %.7g", x);
  for (float x : pj) std::printf(" %.7g", x);
  std::printf("\n");
  return 0;
}
"""


def _build_and_run(tmp_path, name, defines):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    src = tmp_path / f"{name}.cpp"
    src.write_text(SOURCE)
    exe = tmp_path / name
    r = subprocess.run([cxx, "-O1", "-std=c++17", *defines, f"-I{include_dir()}", "-pthread", *extra_flags(), str(src),
                        "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120).stdout.splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines}


def _complex(values, shape):
    a = np.array(values, dtype=np.float64)
    return (a[0::2] + 1j * a[1::2]).reshape(shape)


def test_a_field_added_to_the_table_reaches_every_host_consumer(tmp_path):
    base = _build_and_run(tmp_path, "standard", [])
    more = _build_and_run(tmp_path, "extra", ["-DEXTRA_FIELD"])
    # the table: ten fields, T1 now second, the pool fields after the tissue's
    assert more["table"] == ["10", "T1_s", "extra", "1", "12"]
    assert base["table"] == ["10", "T1_s", "extra", "1", "12"]
    for entry in ("forward", "jacobian", "adjoint", "pooled"):
        assert base[entry][0] == "0" and more[entry][0] == "0", entry
        np.testing.assert_allclose(np.array(more[entry][1:], float), np.array(base[entry][1:], float), rtol=0,
                                   atol=0, err_msg=entry)
    assert more["extra"] == ["0", "0"]  # no physics reads the new field: its derivatives are exactly zero

    # the closed forms of the ideal CPMG train: s_k = M0 e^{-2 k tau / T2} (CPMG phase: real)
    n, echoes, tau = 3, 8, 0.005
    T2 = np.array([0.05, 0.08, 0.12])[:, None]
    M0 = np.array([1.0, 0.7, 1.3])[:, None]
    t = 2 * tau * np.arange(1, echoes + 1)[None, :]
    s = _complex(base["forward"][1:], (n, echoes))
    np.testing.assert_allclose(np.abs(s), M0 * np.exp(-t / T2), rtol=2e-5, atol=1e-6)
    J = _complex(base["jacobian"][1:], (n, 3, echoes))
    phase = s / np.abs(s)
    np.testing.assert_allclose((J[:, 0] / phase).real, M0 * t / T2**2 * np.exp(-t / T2), rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose((J[:, 1] / phase).real, np.exp(-t / T2), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.abs(J[:, 2]), 0.0, atol=1e-5)
    # the adjoint's tissue gradient of L = sum Re(s) is the Jacobian summed
    tg = np.array(base["adjoint"][1:], float).reshape(n, 2)
    np.testing.assert_allclose(tg, np.stack([J[:, 0].real.sum(-1), J[:, 1].real.sum(-1)], axis=-1), rtol=1e-4,
                               atol=1e-5)
