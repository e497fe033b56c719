"""Steady-state simulators (DESPOT2, IR-bSSFP, DESS, fmSSFP, HSFP) and exact
steady states (repetitions='auto') against single isochromats, isochromat
ensembles and the closed forms."""
import numpy as np
import pytest

from blochsim import Dephase, Pulse, Readout, Simulator
from blochsim.simulators import (bSSFPSimulator, DESPOT1Simulator, DESPOT2Simulator, DESSSimulator,
                                 fmSSFPSimulator, HSFPSimulator, IRbSSFPSimulator, MP2RAGESimulator,
                                 TrueFISPSimulator)
from protocol_oracles import (MP2, _jacobian_matches_differences, PlayedMP2RAGE, _irbssfp_isochromat,
                              _dess_isochromats, _fmssfp_isochromat, _balanced_isochromat)


def test_despot2_against_the_bssfp_steady_state_and_its_fit():
    T1, T2, B1 = np.array([800.0, 1500.0]), np.array([50.0, 120.0]), np.array([0.9, 1.1])
    flips = np.array([10.0, 25.0, 40.0, 60.0])
    sim = DESPOT2Simulator(flip=flips, TR=5.0)
    s = sim.simulate(T1=T1, T2=T2, B1=B1)
    # Deoni 2003's bSSFP equation on resonance, the echo at TE = TR/2
    a = np.radians(flips) * B1[:, None]
    E1, E2 = np.exp(-5.0 / T1)[:, None], np.exp(-5.0 / T2)[:, None]
    deoni = (1 - E1) * np.sin(a) / (1 - (E1 - E2) * np.cos(a) - E1 * E2) * np.exp(-2.5 / T2[:, None])
    np.testing.assert_allclose(s.real, deoni, rtol=1e-12)
    for v in range(2):
        closed = bSSFPSimulator(flip=flips * B1[v], TR=5.0).simulate(T1=T1[v], T2=T2[v])
        np.testing.assert_allclose(s[v], closed, rtol=1e-10)
    played = TrueFISPSimulator(flip=flips[2], TR=5.0, nshots=3000).simulate(T1=T1, T2=T2, B1=B1)
    np.testing.assert_allclose(played[:, -1], s[:, 2], rtol=3e-4)
    fit = sim.fit(s, T1=T1, B1=B1)
    np.testing.assert_allclose(fit["T2"], T2, rtol=1e-8)
    np.testing.assert_allclose(fit["M0"], np.exp(-2.5 / T2), rtol=1e-8)
    _, J = sim.jacobian(("T2", "T1"), T1=T1, T2=T2, B1=B1)
    _jacobian_matches_differences(sim, dict(T1=T1, T2=T2, B1=B1), ("T2", "T1"), J)


def test_despot_refusals():
    with pytest.raises(ValueError, match="at least two flip angles"):
        DESPOT1Simulator(flip=[10.0], TR=5.0)
    with pytest.raises(ValueError, match="flip must be > 0 deg"):
        DESPOT1Simulator(flip=[0.0, 10.0], TR=5.0)
    with pytest.raises(ValueError, match="TE = 8 ms must be at most TR = 5 ms"):
        DESPOT1Simulator(flip=[5.0, 10.0], TR=5.0, TE=8.0)
    with pytest.raises(ValueError, match="signals must end in 2 flip angles"):
        DESPOT1Simulator(flip=[5.0, 10.0], TR=5.0).fit(np.ones(3))
    with pytest.raises(ValueError, match="T1 must be > 0"):
        DESPOT2Simulator(flip=[5.0, 10.0], TR=5.0).fit(np.ones(2), T1=-1.0)


@pytest.mark.parametrize("B0", [0.0, 37.0])
def test_irbssfp_against_a_single_isochromat(B0):
    t = dict(T1=1100.0, T2=85.0, B0=B0, B1=0.93, inv_efficiency=0.95, M0=1.2)
    s = IRbSSFPSimulator(flip=45.0, TR=5.0, nshots=200, TI=15.0).simulate(**t)
    ref = _irbssfp_isochromat(45.0, 5.0, 2.5, 200, 15.0, 1100.0, 85.0, B0, 0.93, 0.95, 1.2)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_irbssfp_reaches_the_balanced_steady_state():
    s = IRbSSFPSimulator(flip=40.0, TR=4.0, nshots=6000, TI=10.0).simulate(T1=600.0, T2=60.0)
    ss = bSSFPSimulator(flip=40.0, TR=4.0).simulate(T1=600.0, T2=60.0)
    np.testing.assert_allclose(s[-1], ss[..., 0], atol=2e-5)


@pytest.mark.parametrize("B0", [0.0, 9.0])
def test_dess_against_an_isochromat_ensemble(B0):
    t = dict(T1=800.0, T2=45.0, B0=B0, B1=0.95, M0=1.1)
    s = DESSSimulator(flip=35.0, TR=18.0, TE=4.0, repetitions=150).simulate(**t)
    ref = _dess_isochromats(35.0, 18.0, 4.0, 150, 800.0, 45.0, B0, 0.95, 1.1)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_dess_refusals():
    with pytest.raises(ValueError, match="TE = 10 ms must be at most TR/2 = 9 ms"):
        DESSSimulator(flip=30.0, TR=18.0, TE=10.0)


@pytest.mark.parametrize("sweep,B0", [(0.0, 0.0), (0.9, 0.0), (0.9, 31.0), (-2.0, 12.0)])
def test_fmssfp_against_a_single_isochromat(sweep, B0):
    s = fmSSFPSimulator(flip=35.0, TR=5.0, n=300, sweep=sweep).simulate(T1=900.0, T2=70.0, B0=B0, B1=1.05)
    ref = _fmssfp_isochromat(35.0, 5.0, 2.5, 300, 180.0, sweep, 900.0, 70.0, B0, 1.05)
    np.testing.assert_allclose(s, ref, atol=5e-6)


@pytest.mark.parametrize("inversion,B0", [(True, 0.0), (True, 23.0), (False, 8.0)])
def test_hsfp_against_a_single_isochromat(inversion, B0):
    flips = 5 + 60 * np.sin(np.linspace(0, np.pi, 250)) ** 2
    t = dict(T1=1100.0, T2=70.0, B0=B0, B1=0.92, **({"inv_efficiency": 0.96} if inversion else {}))
    s = HSFPSimulator(flip=flips, TR=4.5, TI=12.0, inversion=inversion).simulate(**t)
    ref = _balanced_isochromat(flips, 4.5, 2.25, 180.0, 1100.0, 70.0, B0, 0.92, 0.96 if inversion else None, 12.0)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_auto_repetitions_reach_the_closed_form_steady_state():
    T1 = np.array([600.0, 1200.0, 2000.0])
    closed = MP2RAGESimulator(**MP2).simulate(T1=T1, inv_efficiency=0.96)
    played = PlayedMP2RAGE(repetitions="auto", states=2).simulate(T1=T1, T2=50.0, inv_efficiency=0.96)
    c = MP2["n_readouts"] // 2
    np.testing.assert_allclose(1j * played[:, [c, MP2["n_readouts"] + c]], closed, atol=2e-6)
    # the Jacobian and the pullback play as many
    s, J = PlayedMP2RAGE(repetitions="auto", states=2).jacobian("T1", T1=T1, T2=50.0)
    assert J.shape == s.shape
    from blochsim.simulators import bSSFPSimulator, TrueFISPSimulator
    ss = TrueFISPSimulator(flip=40.0, TR=5.0, nshots=2, repetitions="auto").simulate(T1=800.0, T2=60.0)
    np.testing.assert_allclose(ss[-1], bSSFPSimulator(flip=40.0, TR=5.0).simulate(T1=800.0, T2=60.0)[..., 0],
                               atol=3e-5)


@pytest.mark.parametrize("T1,T2,flip,B0", [(800.0, 60.0, 40.0, 0.0), (3000.0, 2000.0, 4.0, 0.0),
                                            (1500.0, 300.0, 25.0, 23.0)])
def test_auto_repetitions_exact_fixed_point_of_a_train_that_never_winds(T1, T2, flip, B0):
    """bSSFP played with repetitions='auto' reaches the balanced steady
    state of the closed form exactly, also where it settles over thousands
    of TRs (T1 = 3 s, T2 = 2 s, 4°); the Jacobian and the flip/TR gradient
    against the closed form's."""
    from blochsim.simulators import bSSFPSimulator, TrueFISPSimulator
    played = TrueFISPSimulator(flip=flip, TR=5.0, nshots=2, repetitions="auto")
    closed = bSSFPSimulator(flip=flip, TR=5.0)
    t = dict(T1=T1, T2=T2, B0=B0)
    ref = closed.simulate(**t)[..., 0]
    np.testing.assert_allclose(played.simulate(**t)[-1], ref, rtol=2e-6, atol=2e-7)
    names = ("T1", "T2", "B0")
    _, J = played.jacobian(names, **t)
    _, Jc = closed.jacobian(names, **t)
    np.testing.assert_allclose(J[:, -1], Jc[:, 0], rtol=1e-5, atol=1e-9)
    s, pullback = played.vjp(("flip", "TR", "T2"), **t)
    g = pullback(np.array([0.0, 2 * s[-1]]))
    sc, pullback_c = closed.vjp(("flip", "TR", "T2"), **t)
    gc = pullback_c(2 * sc)
    for k in ("flip", "TR", "T2"):
        np.testing.assert_allclose(g[k], gc[k], rtol=1e-5, atol=1e-12, err_msg=k)


def test_exact_steady_state_gradients_of_a_long_balanced_train():
    """HSFP played to its periodic steady state (repetitions='auto', exact):
    the periodic adjoint's gradients in every flip and in TR (whose default
    TE = TR/2 follows it) against central differences of the played signal."""
    flips = 5 + 60 * np.sin(np.linspace(0, np.pi, 120)) ** 2
    sim = HSFPSimulator(flip=flips, TR=4.5, repetitions="auto", inversion=False)
    t = dict(T1=np.linspace(500.0, 2000.0, 6), T2=80.0, B0=np.linspace(-20.0, 20.0, 6))
    s, pullback = sim.vjp(("flip", "TR", "T1"), **t)
    g = pullback(2 * s)

    def loss(**kw):
        return np.sum(np.abs(sim.simulate(**{**t, **kw}).astype(complex)) ** 2)

    for i in (0, 40, 119):
        h = np.zeros(flips.size)
        h[i] = 0.05
        np.testing.assert_allclose(g["flip"][i], (loss(flip=flips + h) - loss(flip=flips - h)) / 0.1, rtol=2e-3,
                                   atol=2e-6)  # float32 signals
    np.testing.assert_allclose(g["TR"], (loss(TR=4.6) - loss(TR=4.4)) / 0.2, rtol=1e-2)  # a small gradient
    dT1 = np.zeros(6)
    dT1[2] = 20.0  # a wide step: the loss moves little with T1 and the signals are float32
    np.testing.assert_allclose(g["T1"][2], (loss(T1=t["T1"] + dT1) - loss(T1=t["T1"] - dT1)) / 40.0, rtol=2e-3)


class Nutation(Simulator):
    """A 37° pulse and a sample per repetition: without relaxation the
    magnetisation turns for ever."""
    def repetition(self, p):
        return Readout() @ Pulse(37.0)


class WindingNutation(Simulator):
    """The same with a gradient and its rewinder around the sample: played
    by the engine, which finds no end to it either."""
    def repetition(self, p):
        return Readout() @ Dephase(-1) @ Dephase() @ Pulse(37.0)


def test_auto_repetitions_refuse_a_train_that_never_settles():
    with pytest.raises(ValueError, match="does not settle to a periodic steady state .* modulus 1"):
        Nutation(repetitions="auto").simulate(T1=1e12, T2=1e12)
    with pytest.raises(ValueError, match="did not reach a periodic steady state within 65536 playings"):
        WindingNutation(repetitions="auto").simulate(T1=1e12, T2=1e12)
    with pytest.raises(ValueError, match="repetitions must be a positive integer or 'auto', got 'often'"):
        Nutation(repetitions="often")
