"""Every x86-64 level's host kernels (4 lanes on the baseline's SSE, 8 on
AVX2, 16 on AVX-512), forced one at a time by $BLOCHSIM_HOST_ISA in a
child process: each against an isochromat ensemble and against the others,
over voxel counts that leave partial blocks of every width; and the
variable's refusals.  (CI also runs the physics tests once per level.)"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import blochsim

LEVELS = ("x86-64", "x86-64-v3", "x86-64-v4")

# The children run outside the source tree, so that they import the
# installed package rather than the checkout's blochsim/ folder.

CHILD = r"""
import json, sys
import numpy as np
import blochsim
from blochsim.simulators import FLASHSimulator, MRFSimulator
from blochsim.cli import reference_flips

out = {"cpu": blochsim.backends()["cpu"]}
if out["cpu"]["available"]:
    rng = np.random.default_rng(3)
    n = 37  # partial blocks of 4, 8 and 16 lanes
    T1, T2 = rng.uniform(300.0, 2000.0, n), rng.uniform(20.0, 200.0, n)
    B1 = rng.uniform(0.8, 1.1, n)
    flash = FLASHSimulator(flip=np.linspace(5.0, 30.0, 40), TR=9.0, TE=4.0, rf_spoiling=117.0)
    mrf = MRFSimulator(flip=reference_flips(120), TR=10.0, states=16)
    t = dict(T1=T1, T2=T2, B1=B1)
    mt = dict(bound_fraction=0.1, bound_exchange=20.0)
    s, J = mrf.jacobian(("T1", "T2"), **t)
    smt, Jmt = mrf.jacobian(("T1", "T2"), **t, **mt)
    g = mrf.vjp("T2", **t)[1](2 * s)
    out.update(flash=flash.simulate(**t), mrf=s, jac=J, mt=smt, jac_mt=Jmt, mt_forward=mrf.simulate(**t, **mt),
               grad=g["T2"])
    out = {k: (v if k == "cpu" else [np.real(v).tolist(), np.imag(v).tolist()]) for k, v in out.items()}
json.dump(out, sys.stdout)
"""


def _child(level):
    env = dict(os.environ, BLOCHSIM_HOST_ISA=level)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600,
                       cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    return d.pop("cpu"), {k: np.array(v[0]) + 1j * np.array(v[1]) for k, v in d.items()}


@pytest.fixture(scope="module")
def levels():
    runs = {}
    for level in LEVELS:
        cpu, res = _child(level)
        if cpu["available"]:
            assert cpu["isa"] == level
            assert cpu["lanes"] == {"x86-64": 4, "x86-64-v3": 8, "x86-64-v4": 16}[level]
            runs[level] = res
        else:
            assert f"BLOCHSIM_HOST_ISA='{level}'" in cpu["reason"]
    if not runs:
        pytest.skip("no x86-64 level kernels in this build")
    return runs


def test_every_level_against_isochromats(levels):
    from protocol_oracles import _flash_isochromats

    rng = np.random.default_rng(3)
    T1, T2 = rng.uniform(300.0, 2000.0, 37), rng.uniform(20.0, 200.0, 37)
    B1 = rng.uniform(0.8, 1.1, 37)
    for v in (0, 5, 36):
        ref = _flash_isochromats(np.linspace(5.0, 30.0, 40), 9.0, 4.0, 40, 117.0, T1[v], T2[v], B1[v], N=256)
        for level, res in levels.items():
            np.testing.assert_allclose(res["flash"][v], ref, atol=5e-6, err_msg=level)


def test_levels_agree(levels):
    names = list(levels)
    ref = levels[names[-1]]
    for level in names[:-1]:
        for k, v in levels[level].items():
            scale = np.max(np.abs(ref[k])) or 1.0
            np.testing.assert_allclose(v, ref[k], atol=2e-5 * scale, err_msg=f"{level} {k}")


def test_the_variable_refused_by_name():
    env = dict(os.environ, BLOCHSIM_HOST_ISA="avx9000")
    code = ("import blochsim, numpy as np\n"
            "from blochsim.simulators import MRFSimulator\n"
            "print(blochsim.backends()['cpu'])\n"
            "MRFSimulator(flip=[10.0] * 3, TR=10.0).simulate(T1=1000.0, T2=80.0)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tempfile.gettempdir())
    assert r.returncode != 0
    assert "'available': False" in r.stdout
    assert ("RuntimeError: BLOCHSIM_HOST_ISA='avx9000' is not one of 'x86-64', 'x86-64-v3', 'x86-64-v4'" in r.stderr
            or "this build has one level, 'generic'" in r.stderr)


def test_the_variable_refused_for_estimators():
    env = dict(os.environ, BLOCHSIM_HOST_ISA="avx9000")
    code = ("import numpy as np\n"
            "from blochsim.estimators._common import _threads\n"
            "_threads(None)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tempfile.gettempdir())
    assert r.returncode != 0 and "BLOCHSIM_HOST_ISA='avx9000'" in r.stderr


def test_this_process_reports_its_level():
    cpu = blochsim.backends()["cpu"]
    if os.environ.get("BLOCHSIM_HOST_ISA"):
        pytest.skip("a level is forced")
    assert cpu["available"] and cpu["reason"] == ""
    assert cpu["lanes"] == {"x86-64": 4, "x86-64-v3": 8, "x86-64-v4": 16, "generic": 4}[cpu["isa"]]

