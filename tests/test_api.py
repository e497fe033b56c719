"""The public API: shapes, dtypes, composition, playings, packing, the main job."""
import os
import subprocess
import sys

import numpy as np
import pytest

import blochsim
from blochsim import Delay, Pulse, Readout, Sequence, Simulator, Spoil
from blochsim.simulators import FSESimulator, MRFSimulator, SPGRSimulator, StimulatedEchoSimulator, bSSFPSimulator


def test_spec_example_shapes():
    fse = FSESimulator(ESP=5.0, TR=3000.0)
    s = fse.simulate(flip=np.full(48, 180.0), T1=1000.0, T2=[80.0, 110.0])
    assert s.shape == (2, 48) and s.dtype == np.complex64


def test_voxel_broadcasting():
    T1 = np.array([[800.0], [1200.0], [2000.0]])
    T2 = np.array([50.0, 90.0])
    s = FSESimulator(ESP=5.0).simulate(flip=np.full(6, 150.0), T1=T1, T2=T2)
    assert s.shape == (3, 2, 6)
    for i in range(3):
        for j in range(2):
            one = FSESimulator(ESP=5.0).simulate(flip=np.full(6, 150.0), T1=T1[i, 0], T2=T2[j])
            np.testing.assert_array_equal(s[i, j], one)


def test_scalar_voxel_and_M0_scaling():
    sim = MRFSimulator(flip=np.linspace(10, 50, 20), TR=10.0, states=16)
    s = sim.simulate(T1=1000.0, T2=80.0)
    assert s.shape == (20,)
    np.testing.assert_allclose(sim.simulate(T1=1000.0, T2=80.0, M0=np.array([2.0, -0.5])),
                               np.stack([2 * s, -0.5 * s]), rtol=1e-6)


def test_function_forms_equal_classes():
    f = np.full(10, 160.0)
    np.testing.assert_array_equal(blochsim.fse_sim(flip=f, ESP=6.0, T1=900.0, T2=70.0),
                                  FSESimulator(ESP=6.0).simulate(flip=f, T1=900.0, T2=70.0))
    fl = np.linspace(5, 40, 30)
    np.testing.assert_array_equal(blochsim.mrf_sim(flip=fl, TR=9.0, states=20, T1=900.0, T2=70.0),
                                  MRFSimulator(flip=fl, TR=9.0, states=20).simulate(T1=900.0, T2=70.0))
    np.testing.assert_array_equal(blochsim.spgr_sim(flip=10.0, TR=10.0, T1=900.0),
                                  SPGRSimulator(flip=10.0, TR=10.0).simulate(T1=900.0))
    np.testing.assert_array_equal(blochsim.bssfp_sim(flip=30.0, TR=5.0, T1=900.0, T2=70.0),
                                  bSSFPSimulator(flip=30.0, TR=5.0).simulate(T1=900.0, T2=70.0))
    assert blochsim.truefisp_sim(flip=30.0, TR=5.0, nshots=7).shape == (7,)
    assert blochsim.ir_sim(TI=[100.0, 200.0], T1=900.0).shape == (2,)
    assert blochsim.se_sim(TE=[10.0, 20.0, 30.0], TR=1000.0, T1=900.0, T2=80.0).shape == (3,)
    assert blochsim.ste_sim(TE=10.0, TM=50.0).shape == (2,)


def test_protocol_override_per_call():
    sim = FSESimulator(ESP=5.0, flip=np.full(4, 180.0))
    a = sim.simulate(T2=50.0)
    b = sim.simulate(T2=50.0, ESP=10.0)
    np.testing.assert_allclose(np.abs(b), np.exp(-np.arange(1, 5) * 10.0 / 50.0), rtol=1e-5)
    np.testing.assert_allclose(np.abs(a), np.exp(-np.arange(1, 5) * 5.0 / 50.0), rtol=1e-5)


def test_composition_reads_right_to_left_in_time():
    seq = Readout() @ Pulse(90.0)
    assert [type(o) for o in seq] == [Pulse, Readout]
    seq2 = Delay(1.0) @ seq
    assert [type(o) for o in seq2] == [Pulse, Readout, Delay]
    assert len(Pulse(10.0) ** 3) == 3


def test_custom_simulator_and_repetitions_record_the_last_playing():
    class Spoiled(Simulator):
        protocol = {"flip": 30.0, "TR": 20.0}
        tissue_properties = ("T1", "T2")

        def repetition(self, p):
            return Sequence([Pulse(p["flip"]), Readout(-90.0), Spoil(), Delay(p["TR"])])

    first = Spoiled().simulate(T1=500.0)
    np.testing.assert_allclose(first, [0.5], atol=1e-6)
    later = Spoiled(repetitions=3).simulate(T1=500.0)
    a, E1 = np.radians(30.0), np.exp(-20.0 / 500.0)
    mz = 1.0
    for _ in range(2):
        mz = E1 * np.cos(a) * mz + 1 - E1
    np.testing.assert_allclose(later, [np.sin(a) * mz], rtol=1e-6)


def test_packing_is_cached_per_shape_and_values_rebind():
    from blochsim.sequence import packing as seqmod

    sim = FSESimulator(ESP=5.0)
    before = len(seqmod._LAYOUTS)
    a = sim.simulate(flip=np.full(12, 180.0), T2=60.0)
    mid = len(seqmod._LAYOUTS)
    b = sim.simulate(flip=np.full(12, 120.0), T2=60.0)  # same shape, new values
    assert len(seqmod._LAYOUTS) == mid and mid <= before + 1
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(b, FSESimulator(ESP=5.0).simulate(flip=np.full(12, 120.0), T2=60.0))


def test_repeated_calls_reuse_the_checks_and_see_changed_values():
    """The checked protocol and packed stream of a call are reused by the
    next call with the same values, compared by value: a protocol array
    changed in place after construction, an override, and the off-axis
    switch (B0 present) each give the signal of a fresh simulator."""
    flip = np.linspace(10.0, 60.0, 40)
    sim = MRFSimulator(flip=flip, TR=10.0, states=16)
    a = sim.simulate(T1=800.0, T2=60.0)
    p1 = sim._protocol_values({})
    assert sim._protocol_values({}).key == p1.key  # the checks ran once for both
    np.testing.assert_array_equal(sim.simulate(T1=800.0, T2=60.0), a)
    flip[5] = 90.0  # the caller's array, changed after construction
    fresh = MRFSimulator(flip=flip.copy(), TR=10.0, states=16).simulate(T1=800.0, T2=60.0)
    np.testing.assert_array_equal(sim.simulate(T1=800.0, T2=60.0), fresh)
    assert not np.allclose(fresh, a)
    np.testing.assert_array_equal(
        sim.simulate(T1=800.0, T2=60.0, TR=12.0),
        MRFSimulator(flip=flip.copy(), TR=12.0, states=16).simulate(T1=800.0, T2=60.0))
    # B0 turns the call off the real path: same stream, other packed form
    b0 = sim.simulate(T1=800.0, T2=60.0, B0=np.array([0.0, 5.0]))
    np.testing.assert_array_equal(
        b0, MRFSimulator(flip=flip.copy(), TR=10.0, states=16).simulate(T1=800.0, T2=60.0, B0=np.array([0.0, 5.0])))
    np.testing.assert_array_equal(sim.simulate(T1=800.0, T2=60.0), fresh)


def test_a_changed_checked_protocol_keys_on_its_own_values():
    from blochsim._protocol import checked_key, protocol_key

    sim = MRFSimulator(flip=np.linspace(10.0, 60.0, 40), TR=10.0)
    p = sim._protocol_values({})
    assert checked_key(p)[0] == "given"
    for change in (lambda q: q.__setitem__("TI", 5.0), lambda q: q.update(TI=5.0), lambda q: q.pop("TI"),
                   lambda q: q.setdefault("extra", 1), lambda q: q.__delitem__("TI")):
        q = sim._protocol_values({})
        change(q)
        assert checked_key(q) == ("checked", protocol_key(q))
    q = sim._protocol_values({})
    q |= {"TI": 5.0}
    assert q.key is None


def test_default_states_follow_the_winding():
    s, p = FSESimulator(ESP=5.0).stream(flip=np.full(10, 180.0))
    assert s.total_shifts == 20
    s2, _ = StimulatedEchoSimulator(TE=10.0, TM=20.0).stream()
    assert s2.total_shifts == 3


def test_backends_and_includes():
    info = blochsim.backends()
    assert info["cpu"]["available"] is True
    assert isinstance(info["cuda"]["available"], bool)
    if not info["cuda"]["available"]:
        assert info["cuda"]["reason"]
    assert os.path.isfile(os.path.join(blochsim.get_include(), "blochsim", "blochsim.hpp"))
    assert os.path.isfile(os.path.join(blochsim.get_pkgconfig_dir(), "blochsim.pc"))


def test_import_is_light():
    code = ("import sys, blochsim; bad = [m for m in ('cupy', 'torch', 'scipy', 'numba') if m in sys.modules];"
            " print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(blochsim.__file__)))
    assert out.stdout.strip() == "[]"


def test_gil_is_released_for_concurrent_calls():
    from concurrent.futures import ThreadPoolExecutor

    sim = MRFSimulator(flip=np.linspace(5, 60, 100), TR=10.0, states=32, threads=1)
    T1 = np.linspace(300, 2000, 64)
    ref = sim.simulate(T1=T1, T2=50.0)
    with ThreadPoolExecutor(2) as ex:
        outs = list(ex.map(lambda _: sim.simulate(T1=T1, T2=50.0), range(4)))
    for o in outs:
        np.testing.assert_array_equal(o, ref)


def test_main_job_writes_a_dictionary(tmp_path):
    from blochsim.cli import main, reference_flips, reference_tissues

    out = tmp_path / "dict.npz"
    assert main(["--dictionary-only", "--atoms", "300", "--trs", "50", "--out", str(out), "--quiet",
                 "--device", "cpu"]) == 0
    d = np.load(out)
    assert d["signals"].shape == (300, 50) and d["signals"].dtype == np.complex64
    T1, T2 = reference_tissues(300)
    np.testing.assert_array_equal(d["T1_ms"], T1)
    sim = MRFSimulator(flip=reference_flips(50), TR=10.0, states=32)
    np.testing.assert_array_equal(d["signals"][:5], sim.simulate(T1=T1[:5], T2=T2[:5]))
    flips = reference_flips(500)
    assert flips.shape == (500,) and flips[0] == 5 and flips[249] == 60 and flips[-1] == 2


def test_main_job_console_entry(tmp_path):
    r = subprocess.run([sys.executable, "-m", "blochsim", "--dictionary-only", "--atoms", "40", "--trs", "20",
                        "--chunk", "16", "--out", str(tmp_path / "d.npz")], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "atoms/s" in r.stdout


def test_out_argument():
    sim = FSESimulator(ESP=5.0, flip=np.full(6, 150.0))
    T2 = np.array([40.0, 80.0, 120.0])
    out = np.full((3, 6), np.nan, np.complex64)
    r = sim.simulate(T2=T2, out=out)
    assert r is out
    np.testing.assert_array_equal(out, sim.simulate(T2=T2))
    with pytest.raises(ValueError, match=r"out must be .*shape \(3, 6\)"):
        sim.simulate(T2=T2, out=np.zeros((3, 5), np.complex64))
    with pytest.raises(ValueError, match=r"out must be .*complex64"):
        sim.simulate(T2=T2, out=np.zeros((3, 6), np.complex128))


def test_cuda_error_is_exported():
    import blochsim
    from blochsim import _core

    assert blochsim.CudaError is _core.CudaError
    assert issubclass(blochsim.CudaError, RuntimeError)


def test_jacobian_out_argument():
    sim = MRFSimulator(flip=np.linspace(5.0, 60.0, 40), TR=10.0, states=16)
    T1, T2 = np.array([500.0, 900.0, 1400.0]), np.array([40.0, 80.0, 120.0])
    s_ref, J_ref = sim.jacobian(("T1", "T2"), T1=T1, T2=T2)
    s = np.full((3, 40), np.nan, np.complex64)
    J = np.full((3, 2, 40), np.nan, np.complex64)
    rs, rJ = sim.jacobian(("T1", "T2"), T1=T1, T2=T2, out=(s, J))
    assert rs is s and rJ is J
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(J, J_ref)
    # one name: J shaped like the signal
    J1 = np.empty((3, 40), np.complex64)
    _, rJ1 = sim.jacobian("T2", T1=T1, T2=T2, out=(s, J1))
    assert rJ1 is J1
    np.testing.assert_array_equal(J1, J_ref[:, 1])
    with pytest.raises(ValueError, match=r"out\[1\] must be .*shape \(3, 2, 40\)"):
        sim.jacobian(("T1", "T2"), T1=T1, T2=T2, out=(s, J1))
    with pytest.raises(ValueError, match=r"out\[0\] must be .*complex64"):
        sim.jacobian(("T1", "T2"), T1=T1, T2=T2, out=(s.astype(np.complex128), J))
    with pytest.raises(TypeError, match=r"out must be a tuple \(signal, J\)"):
        sim.jacobian(("T1", "T2"), T1=T1, T2=T2, out=J)


def test_version_is_the_distributions():
    from importlib import metadata
    import pathlib
    import re

    assert blochsim.__version__ == metadata.version("blochsim")
    meson = pathlib.Path(__file__).resolve().parents[1] / "meson.build"
    if meson.exists():
        assert re.search(r"version: '([^']+)'", meson.read_text()).group(1) == blochsim.__version__
