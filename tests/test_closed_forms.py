"""Closed-form simulators against textbook equations and the played EPG."""
import numpy as np
import pytest

from blochsim import Delay, Excitation, Readout, Refocusing, Sequence, Simulator, Spoil
from blochsim.simulators import (InversionRecoverySimulator, SPGRSimulator, SpinEchoSimulator,
                                 TrueFISPSimulator, bSSFPSimulator)
from blochsim import bssfp_sim, ir_sim, se_sim, spgr_sim, truefisp_sim


def rel(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b))


def test_spgr_ernst_with_T2star_and_B0():
    flip = np.array([3.0, 10.0, 25.0])
    s = SPGRSimulator(flip=flip, TR=15.0, TE=4.0).simulate(T1=np.array([800.0, 1500.0]),
                                                         T2star=40.0, B0=12.0, M0=2.0)
    assert s.shape == (2, 3) and s.dtype == np.complex128
    a = np.radians(flip)
    for i, T1 in enumerate((800.0, 1500.0)):
        E1 = np.exp(-15.0 / T1)
        ref = 2.0 * np.sin(a) * (1 - E1) / (1 - np.cos(a) * E1) * np.exp(-4.0 / 40.0) \
            * np.exp(-2j * np.pi * 12.0 * 4e-3)
        assert rel(s[i], ref) < 1e-12


def test_spgr_matches_a_played_spoiled_train():
    flip, TR, T1 = 12.0, 10.0, 1000.0

    class Played(Simulator):
        def repetition(self, p):
            return Delay(TR) @ Spoil() @ Readout(-90.0) @ Excitation(flip)

    played = Played(repetitions=600).simulate(T1=T1, T2=100.0)
    closed = spgr_sim(flip=flip, TR=TR, T1=T1)
    assert abs(played[0] - closed[0]) < 1e-5 * abs(closed[0])


def test_float32_inputs_give_complex64():
    s = spgr_sim(flip=10.0, TR=10.0, T1=np.array([900.0], np.float32))
    assert s.dtype == np.complex64


def _bssfp_on_resonance(flip, TR, TE, T1, T2):
    # Scheffler & Hennig / Ernst-Anderson on-resonance balanced SSFP (180° alternation)
    a = np.radians(flip)
    E1, E2 = np.exp(-TR / T1), np.exp(-TR / T2)
    return np.sin(a) * (1 - E1) / (1 - (E1 - E2) * np.cos(a) - E1 * E2) * np.exp(-TE / T2)


def test_bssfp_on_resonance_textbook():
    flip = np.array([10.0, 30.0, 60.0, 90.0])
    T1, T2 = 1200.0, 100.0
    s = bssfp_sim(flip=flip, TR=5.0, T1=T1, T2=T2)
    ref = _bssfp_on_resonance(flip, 5.0, 2.5, T1, T2)
    assert rel(s, ref) < 1e-12


def _isochromat_bssfp(flip, TR, TE, T1, T2, B0, phase_inc, n_tr=4000):
    """Bloch iteration of one isochromat, RF phase advancing by phase_inc."""
    a = np.radians(flip)
    M = np.array([0.0, 0.0, 1.0])
    E1, E2 = np.exp(-TR / T1), np.exp(-TR / T2)
    th = 2 * np.pi * B0 * TR * 1e-3
    out = None
    for n in range(n_tr):
        phi = np.radians(phase_inc) * n
        ca, sa, cp, sp = np.cos(a), np.sin(a), np.cos(phi), np.sin(phi)
        Rz = np.array([[cp, -sp, 0], [sp, cp, 0], [0, 0, 1]])
        Rx = np.array([[1, 0, 0], [0, ca, -sa], [0, sa, ca]])
        M = Rz @ Rx @ Rz.T @ M
        if n == n_tr - 1:
            F = (M[0] + 1j * M[1]) * np.exp(-TE / T2) * np.exp(-2j * np.pi * B0 * TE * 1e-3)
            out = 1j * F * np.exp(-1j * phi)
        c, s = np.cos(th), np.sin(th)
        P = np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]])  # F+ -> F+ e^{-i th}
        M = P @ M
        M = np.array([E2 * M[0], E2 * M[1], E1 * M[2] + 1 - E1])
    return out


@pytest.mark.parametrize("B0,inc", [(0.0, 180.0), (37.0, 180.0), (-61.0, 180.0), (20.0, 0.0)])
def test_bssfp_off_resonance_against_isochromat(B0, inc):
    flip, TR, TE, T1, T2 = 40.0, 6.0, 3.0, 400.0, 60.0
    s = bssfp_sim(flip=flip, TR=TR, TE=TE, phase_inc=inc, T1=T1, T2=T2, B0=B0)
    ref = _isochromat_bssfp(flip, TR, TE, T1, T2, B0, inc)
    assert abs(s[0] - ref) < 1e-8


@pytest.mark.parametrize("B0", [0.0, 23.0])
def test_played_truefisp_reaches_the_bssfp_steady_state(B0):
    flip, TR, T1, T2 = 50.0, 5.0, 300.0, 80.0
    played = truefisp_sim(flip=flip, TR=TR, nshots=1500, T1=T1, T2=T2, B0=B0)
    closed = bssfp_sim(flip=flip, TR=TR, T1=T1, T2=T2, B0=B0)
    assert abs(played[-1] - closed[0]) < 2e-5 * abs(closed[0])
    if B0 == 0.0:
        assert abs(played[-1] - _bssfp_on_resonance(flip, TR, TR / 2, T1, T2)) < 2e-5


def test_truefisp_half_alpha_preparation_suppresses_oscillation():
    # with the alpha/2 preparation and T1 = T2 = infinity, on resonance, the
    # magnetisation is stored along the steady-state axis: constant signal sin(a/2)
    s = TrueFISPSimulator(flip=60.0, TR=4.0, nshots=50).simulate()
    np.testing.assert_allclose(s.real, np.sin(np.radians(30.0)), atol=1e-5)


def test_inversion_recovery_closed_form_and_played():
    TI = np.array([10.0, 200.0, 600.0, 1500.0])
    T1, eta = 800.0, 0.95
    s = ir_sim(TI=TI, T1=T1, inv_efficiency=eta)
    ref = 1 - (1 + eta) * np.exp(-TI / T1)
    assert rel(s, ref) < 1e-12
    # finite TR: a 90° readout at TI saturates Z; the played steady state agrees
    TR = 2000.0
    closed = InversionRecoverySimulator(TI=TI, TR=TR).simulate(T1=T1, inv_efficiency=eta)

    class IRrep(Simulator):
        protocol = {"TI": 0.0}
        tissue_properties = ("T1", "inv_efficiency")

        def repetition(self, p):
            from blochsim import Inversion, Pulse
            return Delay(TR - p["TI"]) @ Spoil() @ Readout(-90.0) @ Pulse(90.0) @ Delay(p["TI"]) @ Inversion()

    played = np.array([IRrep(repetitions=30).simulate(TI=ti, T1=T1, inv_efficiency=eta)[0] for ti in TI])
    assert rel(played, closed) < 1e-5


def test_spin_echo_closed_form_against_played_steady_state():
    TE = np.array([10.0, 40.0, 90.0])
    TR, T1, T2 = 700.0, 900.0, 70.0
    closed = se_sim(TE=TE, TR=TR, T1=T1, T2=T2)

    class SE(Simulator):
        protocol = {"TE": 10.0}

        def repetition(self, p):
            h = Delay(p["TE"] / 2)
            return Sequence([Excitation(90.0, 90.0), h, Refocusing(180.0), h, Readout(),
                             Delay(TR - p["TE"]), Spoil()])

    played = np.array([SE(repetitions=40).simulate(TE=te, T1=T1, T2=T2)[0] for te in TE])
    assert rel(played, closed) < 1e-5
    formula = (1 - 2 * np.exp(-(TR - TE / 2) / T1) + np.exp(-TR / T1)) * np.exp(-TE / T2)
    assert rel(closed, formula) < 1e-12
