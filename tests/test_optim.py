"""Precision bounds (blochsim.optim) against Fisher information written out
by hand for a mono-exponential decay."""
import numpy as np
import pytest

from blochsim import optim
from blochsim.simulators import FSESimulator


def test_crlb_of_a_perfect_cpmg_against_the_hand_written_fisher_information():
    # |s_n| = M0 e^{-t_n/T2} (180-degree refocusing): with ds/dM0 = s/M0 and
    # ds/dT2 = t_n/T2^2 s, F = (1/sigma^2) sum_n [[e^2, M0 t e^2/T2^2],
    # [M0 t e^2/T2^2, M0^2 t^2 e^2/T2^4]], e = e^{-t_n/T2}
    ESP, T2, M0, sigma2 = 8.0, 70.0, 1.0, 1e-4
    s, J = FSESimulator(ESP=ESP, flip=np.full(24, 180.0)).jacobian(("M0", "T2"), T2=T2, M0=M0)
    t = ESP * np.arange(1, 25)
    e2 = np.exp(-2 * t / T2)
    F = np.array([[np.sum(e2), np.sum(M0 * t * e2) / T2 ** 2],
                  [np.sum(M0 * t * e2) / T2 ** 2, np.sum(M0 ** 2 * t ** 2 * e2) / T2 ** 4]]) / sigma2
    np.testing.assert_allclose(optim.fisher_information(J, sigma2), F, rtol=1e-5)
    np.testing.assert_allclose(optim.crlb(J, sigma2), np.diag(np.linalg.inv(F)), rtol=1e-5)
    np.testing.assert_allclose(optim.crlb(J, sigma2, full=True), np.linalg.inv(F), rtol=1e-5)


def test_crlb_over_voxels_and_a_property_without_information():
    sim = FSESimulator(ESP=8.0, flip=np.full(16, 180.0))
    T2 = np.array([[40.0, 80.0], [120.0, 200.0]])
    s, J = sim.jacobian(("T2", "T1"), T1=1000.0, T2=T2)  # a perfect CPMG does not see T1
    b = optim.crlb(J, 1e-4)
    assert b.shape == (2, 2, 2)
    assert np.all(np.isinf(b[..., 1]))
    one = optim.crlb(sim.jacobian(("T2",), T1=1000.0, T2=T2)[1], 1e-4)
    assert one.shape == (2, 2, 1) and np.all(np.isfinite(one))
    # longer T2 is estimated less precisely in absolute terms from 16 echoes of 8 ms
    assert one[1, 1, 0] > one[0, 0, 0]


def test_crlb_refusals():
    J = np.ones((3, 2, 10), np.complex64)
    with pytest.raises(ValueError, match=r"noise_variance must be a finite number > 0, got 0"):
        optim.crlb(J, 0)
    with pytest.raises(ValueError, match=r"J must have shape \(\*voxels, n, samples\), got shape \(10,\)"):
        optim.crlb(np.ones(10), 1.0)


# ---------------------------------------------------------------------------
# SequenceDesign

def _bright(s):
    """L = -sum |s|^2 and its cotangent."""
    return -float(np.sum(np.abs(s) ** 2)), -2 * s


def test_design_gradient_against_finite_differences_of_the_cost():
    # the perfect-CPMG echo train e^{-n ESP/T2} gives the cost in closed form:
    # L(ESP) = -sum_n e^{-2 n ESP/T2} - lam ESP^2 with a penalty lam ESP^2
    T2, n = 80.0, np.arange(1, 13)
    fse = FSESimulator(ESP=6.0, flip=np.full(12, 180.0))
    lam = 1e-3
    pen = lambda p: (lam * float(p["ESP"]) ** 2, {"ESP": 2 * lam * p["ESP"]})
    d = optim.SequenceDesign(fse, {"ESP": (2.0, 20.0)}, _bright, {"T1": 1000.0, "T2": T2}, penalty=pen)
    value, g = d.value_and_gradient(np.array([6.0]))
    assert abs(value - (-np.sum(np.exp(-2 * n * 6.0 / T2)) + lam * 36.0)) < 1e-5
    exact = np.sum(2 * n / T2 * np.exp(-2 * n * 6.0 / T2)) + 2 * lam * 6.0
    assert g.shape == (1,) and abs(g[0] - exact) < 1e-5 * abs(exact)


def test_design_drives_a_brightness_cost_to_the_flip_bound():
    # the echo energy of a CPMG train grows with the refocusing flip: the
    # optimum of -sum |s|^2 is the upper bound (180 degrees) everywhere
    fse = FSESimulator(ESP=8.0, flip=np.full(8, 120.0))
    d = optim.SequenceDesign(fse, {"flip": (60.0, 180.0)}, _bright, {"T1": 1000.0, "T2": 80.0})
    r = d.run(maxiter=30)
    assert r["protocol"]["flip"].shape == (8,)
    np.testing.assert_allclose(r["protocol"]["flip"], 180.0, atol=0.5)
    assert r["cost"] < d.history[0]


def test_the_fse_design_example_improves_the_t2_bound():
    # the example optimises the summed T2 Cramér-Rao bound (second order)
    # within its RF power budget
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "fse_t2_design.py"
    spec = importlib.util.spec_from_file_location("fse_t2_design", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    start = np.full(ex.N_ECHOES, 110.0)
    d, r = ex.design(start)
    flip = r["protocol"]["flip"]
    assert r["cost"] < 0.7 * d.history[0]
    assert np.all(ex.t2_bound(flip) < 0.9 * ex.t2_bound(start))
    assert np.sum((flip / 180) ** 2) < ex.BUDGET * 1.01


def test_crlb_cost_refusals():
    with pytest.raises(ValueError, match="at least one"):
        optim.CRLBCost(())
    with pytest.raises(ValueError, match="noise_variance must be a finite number > 0, got 0"):
        optim.CRLBCost(("T2",), noise_variance=0)
    with pytest.raises(ValueError, match="weights name 'T1', which is not in diff"):
        optim.CRLBCost(("M0", "T2"), weights={"T1": 1.0})
    with pytest.raises(ValueError, match="J has 3 properties, CRLBCost was given 2"):
        optim.CRLBCost(("M0", "T2"))(np.ones((4, 3, 10), complex))


def test_design_refusals():
    fse = FSESimulator(ESP=8.0, flip=np.full(8, 120.0))
    tissue = {"T1": 1000.0, "T2": 80.0}
    with pytest.raises(ValueError, match="at least one"):
        optim.SequenceDesign(fse, {}, _bright, tissue)
    with pytest.raises(ValueError, match=r"bounds of 'flip' need low < high, got \(180.0, 60.0\)"):
        optim.SequenceDesign(fse, {"flip": (180.0, 60.0)}, _bright, tissue)
    with pytest.raises(TypeError, match="no protocol parameter 'bogus'"):
        optim.SequenceDesign(fse, {"bogus": (0.0, 1.0)}, _bright, tissue)
