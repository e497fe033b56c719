"""Diffusion and perfusion simulators (Stejskal-Tanner, the diffusion tensor,
ASL) against the played PGSE, the axially symmetric ADC and the convolution
integral written here."""
import numpy as np
import pytest

from blochsim import Delay, Dephase, Excitation, Readout, Refocusing, Simulator
from blochsim.simulators import ASLSimulator, DiffusionSimulator, DiffusionTensorSimulator
from protocol_oracles import _jacobian_matches_differences


class PGSE(Simulator):
    """A pulsed-gradient spin echo through the EPG engine: two narrow
    gradient lobes (one shift each) Delta apart around the refocusing
    pulse; diffusion acts on the dephased orders (SPEC §2)."""
    protocol = {"TE": 80.0, "Delta": 30.0}
    tissue_properties = ("T1", "T2", "M0", "D")

    def preparation(self, p):
        return Excitation(90.0, phase=90.0)

    def repetition(self, p):
        half, t1 = p["TE"] / 2, p["TE"] / 2 - p["Delta"] / 2
        t2 = half + p["Delta"] / 2
        return (Readout() @ Delay(p["TE"] - t2) @ Dephase() @ Delay(t2 - half) @ Refocusing(180.0)
                @ Delay(half - t1) @ Dephase() @ Delay(t1))


@pytest.mark.parametrize("b", [0.0, 500.0, 1000.0, 2500.0])
def test_diffusion_stejskal_tanner_against_the_played_pgse(b):
    """Narrow lobes of wavenumber dk, Delta apart: b = dk^2 Delta."""
    TE, Delta, voxel = 80.0, 30.0, 1e-3
    dk = np.sqrt(b * 1e6 / (Delta * 1e-3))  # rad/m from b in s/mm^2
    t = dict(T1=1000.0, T2=np.array([60.0, 90.0]), D=np.array([0.7, 2.0]), M0=1.1)
    played = PGSE(TE=TE, Delta=Delta, crusher_dephasing_rad=max(dk * voxel, 1e-9), voxel_size_m=voxel,
                  states=4).simulate(**t)
    closed = DiffusionSimulator(b=b, TE=TE).simulate(T2=t["T2"], D=t["D"], M0=t["M0"])
    np.testing.assert_allclose(np.abs(played[:, -1]), np.abs(closed[:, 0]), rtol=2e-6)


def _dirs(n, seed):
    g = np.random.default_rng(seed).normal(size=(n, 3))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def test_diffusion_tensor_against_the_axially_symmetric_adc_and_the_played_pgse():
    """A fibre along u with diffusivities l_par and l_perp: the ADC along g
    is l_perp + (l_par - l_perp)(g.u)^2; one direction played through the
    EPG as a PGSE with that D."""
    u = np.array([0.3, -0.5, 0.81])
    u /= np.linalg.norm(u)
    l_par, l_perp = 1.8, 0.35
    D = l_perp * np.eye(3) + (l_par - l_perp) * np.outer(u, u)
    t = dict(T2=70.0, M0=1.2, Dxx=D[0, 0], Dyy=D[1, 1], Dzz=D[2, 2], Dxy=D[0, 1], Dxz=D[0, 2], Dyz=D[1, 2])
    g = _dirs(30, 3)
    b = np.linspace(0.0, 3000.0, 30)
    s = DiffusionTensorSimulator(b=b, directions=g, TE=80.0).simulate(**t)
    adc = l_perp + (l_par - l_perp) * (g @ u) ** 2
    np.testing.assert_allclose(s.real, 1.2 * np.exp(-80.0 / 70.0) * np.exp(-1e-3 * b * adc), rtol=1e-12)
    # the isotropic tensor is the scalar Stejskal-Tanner signal
    iso = DiffusionTensorSimulator(b=b, directions=g, TE=80.0, TR=3000.0).simulate(
        T1=900.0, T2=70.0, Dxx=0.8, Dyy=0.8, Dzz=0.8)
    np.testing.assert_allclose(iso, DiffusionSimulator(b=b, TE=80.0, TR=3000.0).simulate(T1=900.0, T2=70.0, D=0.8),
                               rtol=1e-12)
    Delta, voxel, j = 30.0, 1e-3, 20
    dk = np.sqrt(b[j] * 1e6 / (Delta * 1e-3))
    played = PGSE(TE=80.0, Delta=Delta, crusher_dephasing_rad=dk * voxel, voxel_size_m=voxel, states=4).simulate(
        T1=1000.0, T2=70.0, D=adc[j], M0=1.2)
    np.testing.assert_allclose(abs(played[-1]), s[j].real, rtol=2e-6)


def test_diffusion_tensor_fit_recovers_the_tensor_and_the_jacobian():
    rng = np.random.default_rng(5)
    b = np.concatenate([[0.0, 0.0], np.full(20, 1000.0), np.full(20, 2000.0)])
    g = np.concatenate([np.eye(3)[:2], _dirs(20, 1), _dirs(20, 2)])
    sim = DiffusionTensorSimulator(b=b, directions=g, TE=80.0)
    Q = np.linalg.qr(rng.normal(size=(5, 3, 3)))[0]
    lam = rng.uniform(0.2, 2.0, size=(5, 3))
    D = np.einsum("vij,vj,vkj->vik", Q, lam, Q)
    t = dict(T2=np.full(5, 70.0), M0=rng.uniform(0.5, 2.0, 5), Dxx=D[:, 0, 0], Dyy=D[:, 1, 1], Dzz=D[:, 2, 2],
             Dxy=D[:, 0, 1], Dxz=D[:, 0, 2], Dyz=D[:, 1, 2])
    fit = sim.fit_tensor(sim.simulate(**t))
    for k in ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz"):
        np.testing.assert_allclose(fit[k], t[k], atol=1e-10, err_msg=k)
    np.testing.assert_allclose(fit["S0"], t["M0"] * np.exp(-80.0 / 70.0), rtol=1e-10)
    names = ("Dxx", "Dxy", "T2")
    s, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-6, rtol=1e-6, atol=1e-12)


def test_diffusion_tensor_refusals():
    with pytest.raises(ValueError, match="needs directions"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], TE=80.0)
    with pytest.raises(ValueError, match=r"directions must have shape \(2, 3\)"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], directions=np.ones((3, 3)), TE=80.0)
    with pytest.raises(ValueError, match="zero row at b > 0"):
        DiffusionTensorSimulator(b=[0.0, 1000.0], directions=np.zeros((2, 3)), TE=80.0)
    sim = DiffusionTensorSimulator(b=[0.0, 1000.0], directions=[[0.0, 0.0, 1.0]] * 2, TE=80.0)
    with pytest.raises(ValueError, match="Dxx must be >= 0"):
        sim.simulate(T2=70.0, Dxx=-0.1, Dyy=1.0, Dzz=1.0)
    with pytest.raises(TypeError, match="Dzz"):
        sim.simulate(T2=70.0, Dxx=1.0, Dyy=1.0)
    with pytest.raises(ValueError, match="do not determine the tensor"):
        sim.fit_tensor(np.ones(2))
    with pytest.raises(ValueError, match="signals must end in 2 contrasts"):
        sim.fit_tensor(np.ones(3))


def test_diffusion_with_repetition_jacobian_and_refusals():
    sim = DiffusionSimulator(b=[0.0, 800.0, 1600.0], TE=70.0, TR=3000.0)
    t = dict(T1=np.array([900.0, 1400.0]), T2=80.0, D=np.array([0.5, 1.5]), M0=1.3)
    s = sim.simulate(**t)
    se = (1 - 2 * np.exp(-(3000.0 - 35.0) / t["T1"]) + np.exp(-3000.0 / t["T1"])) * np.exp(-70.0 / 80.0)
    np.testing.assert_allclose(s, 1.3 * se[:, None] * np.exp(-1e-3 * np.outer(t["D"], [0.0, 800.0, 1600.0])),
                               rtol=1e-13)
    names = ("T1", "T2", "D", "M0")
    _, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J)
    with pytest.raises(TypeError, match="needs tissue property 'T1' with a TR"):
        sim.simulate(T2=80.0, D=1.0)
    with pytest.raises(ValueError, match="b"):
        DiffusionSimulator(b=[-1.0], TE=70.0)


def _buxton_quad(t_ms, labeling, tau_ms, alpha, T1b_ms, lam, CBF, ATT_ms, T1_ms, M0):
    """Buxton's convolution integral by quadrature, from its definition."""
    from scipy.integrate import quad
    f = CBF / 6000.0
    t, tau, att, T1b = t_ms * 1e-3, tau_ms * 1e-3, ATT_ms * 1e-3, T1b_ms * 1e-3
    k = 1 / (T1_ms * 1e-3) + f / lam

    def c(tp):
        return alpha * (np.exp(-att / T1b) if labeling == "pcasl" else np.exp(-tp / T1b))

    hi = min(t, att + tau)
    if hi <= att:
        return 0.0
    val = quad(lambda tp: c(tp) * np.exp(-(t - tp) * k), att, hi, epsabs=0, epsrel=1e-12)[0]
    return 2 * M0 / lam * f * val


@pytest.mark.parametrize("labeling", ["pcasl", "pasl"])
def test_asl_against_the_convolution_integral(labeling):
    times = np.array([200.0, 700.0, 1500.0, 2200.0, 3500.0])
    tau = 1200.0 if labeling == "pasl" else 1800.0
    sim = ASLSimulator(times=times, labeling=labeling, tau=tau)
    for CBF, ATT, T1 in [(60.0, 900.0, 1300.0), (25.0, 1800.0, 1650.0)]:
        s = sim.simulate(CBF=CBF, ATT=ATT, T1=T1, M0=1.3)
        t_read = times + (tau if labeling == "pcasl" else 0.0)
        ref = [_buxton_quad(tr, labeling, tau, 0.85, 1650.0, 0.9, CBF, ATT, T1, 1.3) for tr in t_read]
        np.testing.assert_allclose(s.real, ref, rtol=1e-9, atol=1e-15)


def test_asl_pcasl_inverts_the_white_paper_formula():
    """Alsop et al. 2015 (MRM 73:102): with ATT <= PLD and tissue T1 =
    T1blood, CBF = 6000 λ ΔM e^{PLD/T1b} / (2 α T1b M0 (1 - e^{-τ/T1b})),
    exact up to the f/λ term of T1app."""
    PLD, tau, T1b = 1800.0, 1800.0, 1650.0
    dM = ASLSimulator(times=[PLD], tau=tau).simulate(CBF=50.0, ATT=1200.0, M0=1.0).real[0]
    cbf = 6000 * 0.9 * dM * np.exp(PLD / T1b) / (2 * 0.85 * T1b * 1e-3 * (1 - np.exp(-tau / T1b)))
    np.testing.assert_allclose(cbf, 50.0, rtol=0.02)


def test_asl_jacobian_and_refusals():
    sim = ASLSimulator(times=[300.0, 1000.0, 2500.0])
    t = dict(CBF=np.array([40.0, 70.0]), ATT=np.array([800.0, 1500.0]), T1=1400.0, M0=1.2)
    names = ("CBF", "ATT", "T1", "M0")
    _, J = sim.jacobian(names, **t)
    _jacobian_matches_differences(sim, t, names, J, step=1e-5, rtol=1e-5, atol=1e-14)
    with pytest.raises(ValueError, match="labeling must be 'pcasl' or 'pasl'"):
        ASLSimulator(times=[1.0], labeling="vsasl")
    with pytest.raises(ValueError, match="CBF"):
        sim.simulate(CBF=-1.0)
