"""Preparation simulators (MP2RAGE, MPRAGE, MPnRAGE, Look-Locker, MOLLI) against
oracles written here: closed forms, the longitudinal recursion stepped pulse by
pulse, isochromats, and the same protocol played through the EPG engine."""
import numpy as np
import pytest

from blochsim import Delay, Inversion, Pulse, Readout, Simulator, Spoil
from blochsim.sequence import Sequence
from blochsim.simulators import (ll_sim, LookLockerSimulator, MOLLISimulator, mp2rage_sim, MP2RAGESimulator,
                                 MPnRAGESimulator, MPRAGESimulator)
from protocol_oracles import (MP2, _geometric_oracle, _stepped_oracle, _jacobian_matches_differences,
                              PlayedMP2RAGE, _molli_isochromat)


@pytest.mark.parametrize("T1", [300.0, 800.0, 1400.0, 3500.0])
def test_mp2rage_against_the_closed_form_and_the_stepped_recursion(T1):
    s = MP2RAGESimulator(**MP2).simulate(T1=T1)
    args = (T1, MP2["TI"], MP2["flip"], MP2["TR"], MP2["TR_gre"], MP2["n_readouts"])
    np.testing.assert_allclose(s, _geometric_oracle(*args), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s, _stepped_oracle(*args), rtol=1e-9, atol=1e-12)


def test_mp2rage_played_through_the_epg_engine():
    T1 = np.array([600.0, 1200.0, 2000.0])
    eta, B1 = 0.96, 0.9
    closed = MP2RAGESimulator(**MP2).simulate(T1=T1, inv_efficiency=eta, B1=B1, M0=1.3)
    played = PlayedMP2RAGE(repetitions=6, states=2).simulate(T1=T1, T2=50.0, inv_efficiency=eta, B1=B1, M0=1.3)
    c = MP2["n_readouts"] // 2
    centre = 1j * played[:, [c, MP2["n_readouts"] + c]]  # the readout after a phase-0 pulse is -i sin(a) Z
    np.testing.assert_allclose(centre, closed, atol=2e-6)


def test_mprage_and_mpnrage_blocks():
    one = MPRAGESimulator(TI=900.0, flip=8.0, TR=2300.0, TR_gre=7.0, n_readouts=176)
    np.testing.assert_allclose(one.simulate(T1=1000.0), _geometric_oracle(1000.0, 900.0, 8.0, 2300.0, 7.0, 176),
                               rtol=1e-12)
    three = MPnRAGESimulator(TI=[500.0, 1500.0, 2600.0], flip=[3.0, 4.0, 6.0], TR=4000.0, TR_gre=6.0,
                             n_readouts=100)
    s = three.simulate(T1=np.array([700.0, 1600.0]), inv_efficiency=0.9)
    assert s.shape == (2, 3)
    for v, T1 in enumerate([700.0, 1600.0]):
        np.testing.assert_allclose(s[v], _stepped_oracle(T1, [500.0, 1500.0, 2600.0], [3.0, 4.0, 6.0], 4000.0, 6.0,
                                                         100, eta=0.9), rtol=1e-9)
    # the Jacobian of three blocks against differences of the geometric oracle
    t = dict(T1=1300.0, B1=0.9, inv_efficiency=0.93)
    _, J = three.jacobian(("T1", "B1", "inv_efficiency"), **t)

    def oracle(T1, B1, inv_efficiency):
        return _geometric_oracle(T1, [500.0, 1500.0, 2600.0], [3.0, 4.0, 6.0], 4000.0, 6.0, 100, inv_efficiency, B1)

    for i, k in enumerate(t):
        h = 1e-6 * t[k]
        fd = (oracle(**{**t, k: t[k] + h}) - oracle(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=1e-6, atol=1e-12, err_msg=k)


def test_mp2rage_uni_is_free_of_m0_and_bounded():
    mp2 = MP2RAGESimulator(**MP2)
    T1 = np.geomspace(200.0, 4000.0, 50)
    u = mp2.uni(mp2.simulate(T1=T1, M0=3.7))
    np.testing.assert_allclose(u, mp2.uni(mp2.simulate(T1=T1)), rtol=1e-12)
    assert np.all(np.abs(u) <= 0.5)
    # Marques et al.: UNI falls monotonically with T1 over the brain's range
    assert np.all(np.diff(u[(T1 > 700) & (T1 < 3000)]) < 0)


def test_mp2rage_jacobian_against_differences():
    mp2 = MP2RAGESimulator(**MP2)
    t = dict(T1=np.array([800.0, 1500.0]), B1=0.9, inv_efficiency=0.95, M0=1.2)
    names = ("T1", "B1", "inv_efficiency", "M0")
    s, J = mp2.jacobian(names, **t)
    assert J.shape == (2, 4, 2)
    _jacobian_matches_differences(mp2, t, names, J)
    s2, J2 = mp2rage_sim(**MP2, T1=800.0, diff="T1")
    np.testing.assert_allclose(J2, mp2.jacobian("T1", T1=800.0)[1], rtol=1e-14)


@pytest.mark.parametrize("kw,match", [
    (dict(TI=[700.0, 600.0]), "TI must increase"),
    (dict(TI=[300.0, 2500.0]), r"TI\[0\] = 300 ms leaves no room"),
    (dict(TI=[700.0, 1500.0]), "readout blocks 0 and 1 overlap"),
    (dict(TR=3000.0), "ends at 3060 ms, after TR = 3000 ms"),
    (dict(TI=[700.0]), "MP2RAGESimulator takes 2 inversion time"),
    (dict(flip=[4.0, -5.0]), "flip"),
])
def test_mp2rage_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        MP2RAGESimulator(**{**MP2, **kw})


def _ll_recursion(T1, flip, spacing, n, TI, TR=None, eta=1.0, B1=1.0, repetitions=60):
    """Look-Locker stepped event by event: inversion, TI, then pulse
    (sampled), spacing, ...; repeated every TR until periodic."""
    a = np.radians(flip) * B1
    z, out = 1.0, []
    for _ in range(repetitions if TR is not None else 1):
        z = 1 + (-eta * z - 1) * np.exp(-TI / T1)
        out = []
        for k in range(n):
            out.append(np.sin(a) * z)
            z = z * np.cos(a)
            if k < n - 1:
                z = 1 + (z - 1) * np.exp(-spacing / T1)
        if TR is not None:
            z = 1 + (z - 1) * np.exp(-(TR - TI - (n - 1) * spacing) / T1)
    return np.array(out)


@pytest.mark.parametrize("TR", [None, 3000.0, 8000.0])
def test_look_locker_against_its_recursion(TR):
    ll = LookLockerSimulator(flip=7.0, spacing=90.0, n=25, TI=40.0, TR=TR)
    for T1 in (400.0, 1300.0):
        s = ll.simulate(T1=T1, inv_efficiency=0.92, B1=1.1, M0=0.8)
        np.testing.assert_allclose(s.real, 0.8 * _ll_recursion(T1, 7.0, 90.0, 25, 40.0, TR, 0.92, 1.1),
                                   rtol=1e-10, atol=1e-14)


def test_look_locker_recovers_at_the_apparent_t1():
    """Deichmann & Haase 1992: the samples recover towards their limit at
    1/T1* = 1/T1 - ln(cos a)/spacing."""
    flip, spacing, T1 = 10.0, 50.0, 1100.0
    s = LookLockerSimulator(flip=flip, spacing=spacing, n=200, TI=20.0).simulate(T1=T1).real
    t1_star = 1 / (1 / T1 - np.log(np.cos(np.radians(flip))) / spacing)
    a, E = np.radians(flip), np.exp(-spacing / T1)
    d = s - np.sin(a) * (1 - E) / (1 - np.cos(a) * E)  # distance from the limit
    np.testing.assert_allclose(d[1:] / d[:-1], np.exp(-spacing / t1_star), rtol=1e-9)


class PlayedLookLocker(Simulator):
    protocol = {"flip": 7.0, "spacing": 90.0, "n": 25, "TI": 40.0, "TR": 3000.0}
    tissue_properties = ("T1", "T2", "M0", "B1", "inv_efficiency")

    def repetition(self, p):
        ops = [Inversion(), Delay(p["TI"])]
        for k in range(p["n"]):
            ops += [Pulse(p["flip"]), Readout(), Spoil()]
            if k < p["n"] - 1:
                ops.append(Delay(p["spacing"]))
        ops.append(Delay(p["TR"] - p["TI"] - (p["n"] - 1) * p["spacing"]))
        return Sequence(ops)


def test_look_locker_played_through_the_epg_engine():
    T1 = np.array([500.0, 1500.0])
    closed = LookLockerSimulator(flip=7.0, spacing=90.0, n=25, TI=40.0, TR=3000.0).simulate(
        T1=T1, B1=0.95, inv_efficiency=0.9)
    played = PlayedLookLocker(repetitions=8, states=2).simulate(T1=T1, T2=60.0, B1=0.95, inv_efficiency=0.9)
    np.testing.assert_allclose(1j * played, closed, atol=2e-6)


def test_look_locker_jacobian_and_refusals():
    t = dict(T1=np.array([700.0, 1400.0]), B1=1.05, inv_efficiency=0.9, M0=1.1)
    names = ("T1", "B1", "inv_efficiency", "M0")
    s, J = ll_sim(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=2500.0, **t, diff=names)
    ll = LookLockerSimulator(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=2500.0)
    _jacobian_matches_differences(ll, t, names, J)
    with pytest.raises(ValueError, match="TR = 500 ms is shorter than the last pulse's time 910 ms"):
        LookLockerSimulator(flip=6.0, spacing=80.0, n=12, TI=30.0, TR=500.0)
    with pytest.raises(ValueError, match="spacing"):
        LookLockerSimulator(flip=6.0, spacing=0.0, n=12, TI=30.0)


@pytest.mark.parametrize("B0", [0.0, 45.0])
def test_molli_against_a_single_isochromat(B0):
    kw = dict(TI=[110.0, 190.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    t = dict(T1=1200.0, T2=48.0, B0=B0, B1=0.9, inv_efficiency=0.95)
    s = MOLLISimulator(**kw).simulate(**t)
    ref = _molli_isochromat([110.0, 190.0], 900.0, 35.0, 2.6, 36, ((5, 3), (3, 0)), 1200.0, 48.0, B0, 0.9, 0.95)
    np.testing.assert_allclose(s, ref, atol=3e-6)


def test_molli_refusals():
    with pytest.raises(ValueError, match="leaves no room"):
        MOLLISimulator(TI=[20.0, 200.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    with pytest.raises(ValueError, match="runs past the heartbeat"):
        MOLLISimulator(TI=[890.0, 200.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36)
    with pytest.raises(ValueError, match="scheme"):
        MOLLISimulator(TI=[110.0], RR=900.0, flip=35.0, TR=2.6, n_readouts=36, scheme=((0, 3),))
