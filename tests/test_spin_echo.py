"""Spin-echo simulators (multi-echo SE, hyperecho) against closed forms and
isochromat ensembles written here."""
import numpy as np
import pytest

from blochsim.simulators import HyperechoSimulator, MultiEchoSESimulator
from protocol_oracles import _pulse, _jacobian_matches_differences


def test_mese_ideal_refocusing_decays_at_t2_and_below_180_adds_stimulated_echoes():
    sim = MultiEchoSESimulator(n_echoes=16, ESP=10.0)
    s = sim.simulate(T1=1000.0, T2=np.array([40.0, 90.0]), M0=2.0)
    te = 10.0 * np.arange(1, 17)
    np.testing.assert_allclose(np.abs(s), 2.0 * np.exp(-te / np.array([[40.0], [90.0]])), rtol=2e-5)
    # second echo after two alpha refocusings (ideal crushers, ESP = 20 ms):
    # the spin echo sin^4(a/2) e^{-40/T2} plus the stimulated echo
    # (1/2) sin^2 a, transverse for 20 ms and stored on Z for 20 ms
    a = np.radians(150.0)
    second = np.sin(a / 2) ** 4 * np.exp(-40.0 / 60.0) + 0.5 * np.sin(a) ** 2 * np.exp(-20.0 / 60.0 - 20.0 / 1000.0)
    s = MultiEchoSESimulator(n_echoes=2, ESP=20.0, refocusing=150.0).simulate(T1=1000.0, T2=60.0)
    np.testing.assert_allclose(abs(s[1]), second, rtol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        MultiEchoSESimulator(n_echoes=4, ESP=10.0, flip=np.full(4, 180.0))
    t = dict(T1=np.array([900.0, 1400.0]), T2=np.array([50.0, 110.0]), B1=np.array([0.8, 0.95]))
    sim = MultiEchoSESimulator(n_echoes=12, ESP=9.0)
    _, J = sim.jacobian(("T2", "B1"), **t)
    _jacobian_matches_differences(sim, t, ("T2", "B1"), J, step=1e-3, rtol=5e-3, atol=2e-4)  # float32 differences


def _crushed_train_isochromats(exc_flip, exc_phase, flips, phases, ESP, T1, T2, B0=0.0, B1=1.0, N=128):
    """A crushed spin-echo train by N isochromats: the excitation, then per
    echo ESP/2 of relaxation and precession, a crusher (dephasing 2 pi j/N),
    the refocusing pulse, the same crusher, ESP/2, and the echo averaged."""
    theta = 2 * np.pi * np.arange(N) / N
    m = np.zeros((3, N))
    m[2] = 1.0

    def rotate(m, flip, phase):
        return _pulse(np.radians(flip) * B1, np.radians(phase)) @ m

    def free(m, t):
        fp = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.stack([fp.real, fp.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    def crush(m):
        fp = (m[0] + 1j * m[1]) * np.exp(1j * theta)
        return np.stack([fp.real, fp.imag, m[2]])

    m, out = rotate(m, exc_flip, exc_phase), []
    for f, ph in zip(flips, phases):
        m = free(crush(rotate(crush(free(m, ESP / 2)), f, ph)), ESP / 2)
        out.append(np.mean(m[0] + 1j * m[1]))
    return np.array(out)


@pytest.mark.parametrize("B0", [0.0, 13.0])
def test_hyperecho_every_echo_against_an_isochromat_ensemble(B0):
    rng = np.random.default_rng(7)
    flips, phases = rng.uniform(20.0, 170.0, 5), rng.uniform(0.0, 360.0, 5)
    s = HyperechoSimulator(flip=flips, phases=phases, ESP=6.0).simulate(T1=900.0, T2=70.0, B0=B0, B1=0.95)
    train = np.concatenate([flips, [180.0], flips[::-1]])
    train_phases = np.concatenate([phases, [0.0], 180.0 - phases[::-1]])
    ref = _crushed_train_isochromats(90.0, 90.0, train, train_phases, 6.0, 900.0, 70.0, B0, 0.95)
    np.testing.assert_allclose(s, ref, atol=3e-6)


@pytest.mark.parametrize("seed,B0,exc_phase", [(1, 0.0, 90.0), (2, 25.0, 90.0), (3, -7.0, 20.0)])
def test_hyperecho_refocuses_every_pathway(seed, B0, exc_phase):
    """Hennig & Scheffler 2001: without relaxation the hyperecho holds the
    whole excited magnetisation, whatever the flips, phases and
    off-resonance, while the echoes before it do not."""
    rng = np.random.default_rng(seed)
    flips, phases = rng.uniform(10.0, 170.0, 7), rng.uniform(0.0, 360.0, 7)
    s = HyperechoSimulator(flip=flips, phases=phases, ESP=6.0, exc_phase=exc_phase).simulate(
        T1=1e12, T2=1e12, B0=B0)
    assert s.shape == (15,)
    np.testing.assert_allclose(abs(s[-1]), 1.0, atol=3e-6)
    assert np.all(np.abs(s[:-1]) < 0.999)
    # with T2 decay alone the hyperecho is the plain spin echo's (the
    # pathways spend different times in Z, where T1 = inf keeps them)
    with_t2 = HyperechoSimulator(flip=np.full(7, 180.0), ESP=6.0).simulate(T1=1e12, T2=80.0)
    np.testing.assert_allclose(abs(with_t2[-1]), np.exp(-15 * 6.0 / 80.0), rtol=1e-5)


def test_hyperecho_jacobian_against_differences():
    rng = np.random.default_rng(4)
    sim = HyperechoSimulator(flip=rng.uniform(60.0, 170.0, 6), phases=rng.uniform(0.0, 360.0, 6), ESP=6.0)
    t = dict(T1=np.array([900.0, 1500.0]), T2=np.array([60.0, 100.0]), B1=np.array([0.9, 1.05]))
    _, J = sim.jacobian(("T2", "B1"), **t)
    _jacobian_matches_differences(sim, t, ("T2", "B1"), J, step=1e-3, rtol=5e-3, atol=2e-4)  # float32 differences
