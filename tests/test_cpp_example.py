"""The C++ example (examples/cpp/cpmg.cpp) builds against the installed
headers and reproduces the Python host backend."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import blochsim

from cpp_build import extra_flags, include_dir

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cpp" / "cpmg.cpp"


def _compiler():
    return shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def cpmg(tmp_path_factory):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (g++ or c++) on PATH")
    if not EXAMPLE.is_file():
        pytest.skip(f"{EXAMPLE} not present (tests run outside the source tree)")
    exe = tmp_path_factory.mktemp("cpp_example") / "cpmg"
    cmd = [cxx, "-O2", "-std=c++17", f"-I{include_dir()}", "-pthread", *extra_flags(), str(EXAMPLE),
           "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"compiling {EXAMPLE} failed:\n{r.stderr}"
    return exe


def _run(exe, *args):
    r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _parse(text):
    """(T2 in ms, echo magnitudes of shape (tissues, echoes)) from the output."""
    t2 = None
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if parts[:2] == ["#", "T2_ms"]:
            t2 = np.array([float(x) for x in parts[2:]])
        elif parts and parts[0] == "echo":
            assert int(parts[1]) == len(rows) + 1
            rows.append([float(x) for x in parts[2:]])
    assert t2 is not None, text
    mag = np.array(rows).T
    assert mag.shape[0] == t2.size
    return t2, mag


def test_cpmg_example(cpmg):
    n, esp = 16, 10.0

    # Perfect refocusing: pure T2 decay.
    t2, mag = _parse(_run(cpmg, n, esp, 180, 2))
    assert mag.shape == (t2.size, n)
    expect = np.exp(-np.arange(1, n + 1)[None, :] * esp / t2[:, None])
    np.testing.assert_allclose(mag, expect, rtol=1e-5, atol=0)

    # The host Jacobian from C++: d|S_n|/dT2 = |S_n| n ESP / T2^2.
    out180 = _run(cpmg, n, esp, 180, 2)
    dmag = np.array([[float(x) for x in line.split()[2:]] for line in out180.splitlines()
                     if line.startswith("dmag_dT2")]).T
    np.testing.assert_allclose(dmag, expect * np.arange(1, n + 1)[None, :] * esp / t2[:, None] ** 2, rtol=1e-5)

    # Imperfect refocusing: stimulated echoes; parity with the Python API.
    out150 = _run(cpmg, n, esp, 150, 2)
    t2, mag = _parse(out150)
    ref = np.abs(blochsim.fse_sim(flip=np.full(n, 150.0), ESP=esp, T1=1000.0, T2=t2))
    np.testing.assert_allclose(mag, ref, rtol=1e-5, atol=0)

    # The host backend is bitwise independent of the thread count.
    assert _run(cpmg, n, esp, 150, 1) == _run(cpmg, n, esp, 150, 3)


def test_pkgconfig_cflags():
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        pytest.skip("pkg-config not on PATH")
    env = dict(os.environ, PKG_CONFIG_PATH=blochsim.get_pkgconfig_dir())
    r = subprocess.run([pkg_config, "--cflags", "blochsim"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    includes = [Path(f[2:]) for f in r.stdout.split() if f.startswith("-I")]
    assert includes, f"no -I flag in {r.stdout!r}"
    assert any((d / "blochsim" / "blochsim.hpp").is_file() for d in includes), r.stdout


def test_cuda_example_builds_and_matches_the_host(tmp_path):
    """examples/cpp/cpmg_cuda.cu compiles against the installed headers
    wherever nvcc is; with a usable GPU it reproduces the host backend."""
    nvcc = shutil.which("nvcc")
    src = EXAMPLE.with_name("cpmg_cuda.cu")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    if not src.is_file():
        pytest.skip(f"{src} not present (tests run outside the source tree)")
    exe = tmp_path / "cpmg_cuda"
    cmd = [nvcc, "-O2", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", f"-I{blochsim.get_include()}",
           str(src), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"compiling {src} failed:\n{r.stderr}"
    if not blochsim.backends()["cuda"]["available"]:
        return
    t2, mag = _parse(_run(exe, 16, 10.0, 150))
    ref = np.abs(blochsim.fse_sim(flip=np.full(16, 150.0), ESP=10.0, T1=1000.0, T2=t2))
    np.testing.assert_allclose(mag, ref, rtol=1e-5)
