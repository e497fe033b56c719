"""The exchange simulators (CEST and MT, ``blochsim.simulators.exchange``),
with hard and shaped saturation, against the Bloch–McConnell oracles of
``pool_oracles``."""
import numpy as np
import pytest
from scipy.linalg import expm

from blochsim.simulators import CESTSimulator, MTSimulator

from pool_oracles import (CEST_TISSUE, Oracle, _FakeDeviceArray, _central, _cest_oracle, _shaped_cest_oracle,
                          oracle_lineshape)


def test_cest_z_spectrum_against_expm():
    offsets = np.array([-20.0, -3.5, -1.0, 0.0, 0.4, 2.0, 3.5, 5.0, 50.0])
    cest = CESTSimulator(offsets=offsets, field_strength=3.0, B1sat=1.2, n_pulses=4, pulse_duration=50.0,
                         pulse_delay=10.0, normalize=False)
    z = cest.simulate(**CEST_TISSUE)
    assert z.shape == (9,)
    np.testing.assert_allclose(z, _cest_oracle(offsets, 3.0, 1.2, 4, 50.0, 10.0, CEST_TISSUE), atol=3e-6)
    # water is saturated on resonance; the pool makes the spectrum asymmetric
    assert abs(z[3]) < 0.1 and abs(z[0]) > 0.5
    assert z[6].real < z[1].real - 0.01


def test_cest_voxels_and_jacobian():
    offsets = np.linspace(-5, 5, 11)
    cest = CESTSimulator(offsets=offsets, B1sat=1.0, pulse_duration=200.0)
    T1 = np.array([1000.0, 1500.0])
    t = {**CEST_TISSUE, "T1": T1}
    z = cest.simulate(**t)
    assert z.shape == (2, 11)
    np.testing.assert_allclose(z[1], cest.simulate(**{**CEST_TISSUE, "T1": 1500.0}), rtol=1e-6)
    names = ("poolB_exchange", "B0", "T1")
    s, J = cest.jacobian(names, **t)
    assert J.shape == (2, 3, 11)
    for i, k in enumerate(names):
        v = np.asarray(t[k], dtype=float)
        h = 1e-2 * np.maximum(np.abs(v), 1.0)
        fd = (cest.simulate(**{**t, k: v + h}).astype(complex) - cest.simulate(**{**t, k: v - h}).astype(complex))
        fd /= 2 * (h if np.ndim(h) == 0 else h[:, None])
        np.testing.assert_allclose(J[:, i], fd, atol=3e-3 * np.max(np.abs(fd)) + 1e-6, err_msg=k)


def test_mt_simulator_against_tr_recursion():
    t = dict(T1=1000.0, T2=60.0, B0=5.0, B1=1.1, bound_fraction=0.15, bound_exchange=30.0, bound_T1=1000.0,
             bound_T2=0.012)
    flip, TR, mt_flip, mt_dur, mt_off, n = 12.0, 30.0, 500.0, 8.0, 1500.0, 60
    s = MTSimulator(flip=flip, TR=TR, mt_flip=mt_flip, mt_duration=mt_dur, mt_offset=mt_off, n_tr=n).simulate(**t)
    o = Oracle(1000.0, 60.0, B0=5.0 - mt_off, bound=(0.15, 30.0, 1000.0))
    w1 = np.radians(mt_flip) * 1.1 / (mt_dur * 1e-3)
    W = np.pi * w1 ** 2 * oracle_lineshape("super-lorentzian", mt_off - 5.0, 0.012)
    mt = expm(o.generator(w1=w1, W=W) * mt_dur * 1e-3)
    free = Oracle(1000.0, 60.0, B0=5.0, bound=(0.15, 30.0, 1000.0))
    x = free.equilibrium()
    for i in range(n):
        x = free.rotate(x, flip * 1.1)
        sample = 1j * free.transverse(x)
        x[:2] = 0.0
        x = free.evolve(x, TR - mt_dur)
        x = mt @ x  # Z only after the spoiler: the frame does not matter
        x[:2] = 0.0
    np.testing.assert_allclose(s, [sample], atol=2e-6)
    ref = MTSimulator(flip=flip, TR=TR, mt_flip=0.0, n_tr=n).simulate(**t)
    assert 0.2 < 1 - abs(s[0]) / abs(ref[0]) < 0.8


def test_cest_and_mt_refusals():
    with pytest.raises(TypeError, match="needs protocol parameter 'offsets'"):
        CESTSimulator().simulate(T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="field_strength must be > 0"):
        CESTSimulator(offsets=[1.0], field_strength=0.0)
    with pytest.raises(ValueError, match="pulse_duration must be > 0"):
        CESTSimulator(offsets=[1.0], pulse_duration=0.0)
    with pytest.raises(ValueError, match="mt_duration must be < TR"):
        MTSimulator(flip=10.0, TR=5.0, mt_duration=8.0)
    with pytest.raises(ValueError, match="second order is not available"):
        MTSimulator(flip=10.0, TR=30.0).jacobian_vjp("T1", "flip", T1=1000.0, T2=60.0)


@pytest.mark.parametrize("kind", ["gauss", "sinc"])
def test_shaped_cest_pulses_against_expm_per_segment(kind):
    u = np.linspace(-1, 1, 24)
    shape = np.exp(-(2 * u) ** 2) if kind == "gauss" else np.sinc(3 * u)  # the sinc has negative lobes
    offsets = np.array([-3.5, -1.0, 0.0, 1.5, 3.5])
    cest = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0,
                         pulse_shape=shape, normalize=False)
    z = cest.simulate(**CEST_TISSUE)
    np.testing.assert_allclose(z, _shaped_cest_oracle(offsets, 3.0, 1.5, shape, 3, 40.0, 8.0, CEST_TISSUE),
                               atol=3e-6)
    # the same B1 rms saturates water on resonance less deeply than a rectangle, off it differently
    rect = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0, normalize=False)
    assert np.max(np.abs(z - rect.simulate(**CEST_TISSUE))) > 1e-3
    # a constant shape is the rectangle
    flat = CESTSimulator(offsets=offsets, B1sat=1.5, n_pulses=3, pulse_duration=40.0, pulse_delay=8.0,
                         pulse_shape=np.full(5, 2.0), normalize=False)
    np.testing.assert_allclose(flat.simulate(**CEST_TISSUE), rect.simulate(**CEST_TISSUE), atol=2e-6)


def test_shaped_cest_vjp_against_oracle_differences():
    u = np.linspace(-1, 1, 12)
    shape = np.exp(-(2 * u) ** 2)
    offsets = np.array([-3.5, 0.5, 3.5])
    cest = CESTSimulator(offsets=offsets, B1sat=1.2, n_pulses=2, pulse_duration=30.0, pulse_delay=5.0,
                         pulse_shape=shape, normalize=False)
    z, pullback = cest.vjp(("B1sat", "pulse_duration", "poolB_exchange"), **CEST_TISSUE)
    w = np.array([1.0, -0.5, 2.0])
    g = pullback(w)

    def loss(b1=1.2, tp=30.0, **t):
        return np.sum(w * np.real(_shaped_cest_oracle(offsets, 3.0, b1, shape, 2, tp, 5.0, {**CEST_TISSUE, **t})))

    np.testing.assert_allclose(g["B1sat"], _central(lambda v: loss(b1=float(v)), 1.2, 1e-5), rtol=3e-4)
    np.testing.assert_allclose(g["pulse_duration"], _central(lambda v: loss(tp=float(v)), 30.0, 1e-4), rtol=3e-4)
    np.testing.assert_allclose(g["poolB_exchange"],
                               _central(lambda v: loss(poolB_exchange=float(v)), CEST_TISSUE["poolB_exchange"],
                                        1e-3), rtol=3e-4)


def test_shaped_cest_refusals():
    with pytest.raises(ValueError, match="pulse_shape must be a non-empty 1-D array"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.ones((2, 2)))
    with pytest.raises(ValueError, match="pulse_shape must be finite and not zero everywhere"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.zeros(4))
    with pytest.raises(TypeError, match="cannot differentiate with respect to 'pulse_shape'"):
        CESTSimulator(offsets=[1.0], pulse_shape=np.ones(4)).vjp("pulse_shape", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match="CESTSimulator takes NumPy tissue arrays.*T1 is a device array"):
        CESTSimulator(offsets=[1.0]).simulate(T1=_FakeDeviceArray(), T2=80.0)
