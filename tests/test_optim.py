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
