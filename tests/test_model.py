"""blochsim.ModelOperator: the transforms against their closed forms
(logistic, softplus), the operator against the simulator it wraps, jvp and
the Jacobian against central differences, vjp through the dot-product test
<v, J dx> = <J^H v, dx>, the subspace and the amplitude, and every refusal."""
import numpy as np
import pytest

from blochsim import ModelOperator
from blochsim.simulators import FSESimulator, MRFSimulator
from blochsim.subspace import TemporalBasis


def _mrf():
    return MRFSimulator(flip=10.0 + 50.0 * np.sin(np.linspace(0.0, np.pi, 100)) ** 2, TR=10.0, states=16)


def _operator(**kw):
    sim = _mrf()
    b1 = np.array([[0.9, 1.0, 1.1], [1.05, 0.95, 1.0]])
    args = dict(bounds={"T1": (100.0, 4000.0), "T2": (5.0, None)}, scale={"T2": 50.0}, known={"B1": b1})
    args.update(kw)
    return sim, b1, ModelOperator(sim, ("T1", "T2"), **args)


def _values():
    return {"T1": np.array([[400.0, 900.0, 1500.0], [700.0, 2500.0, 1100.0]]),
            "T2": np.array([[30.0, 60.0, 120.0], [45.0, 200.0, 80.0]])}


def test_transforms_are_the_closed_forms():
    sim, b1, A = _operator(bounds={"T1": (100.0, 4000.0), "T2": (None, 500.0)}, scale={"T2": 50.0})
    z = np.linspace(-3, 3, 6).reshape(2, 3)
    x = np.stack([z, -z], -1)
    v = A.to_values(x)
    np.testing.assert_allclose(v["T1"], 100.0 + 3900.0 / (1.0 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_allclose(v["T2"], 500.0 - 50.0 * np.log(1.0 + np.exp(-z)), rtol=1e-12)
    # the lower bound and a free unknown
    _, _, B = _operator(bounds={"T2": (5.0, None)}, scale={"T1": 1000.0, "T2": 50.0})
    w = B.to_values(x)
    np.testing.assert_allclose(w["T1"], 1000.0 * z, rtol=1e-12)
    np.testing.assert_allclose(w["T2"], 5.0 + 50.0 * np.log(1.0 + np.exp(-z)), rtol=1e-12)
    # round trips, far into the softplus' linear part too
    for op in (A, B):
        vals = op.to_values(op.to_free({"T1": np.full((2, 3), 900.0), "T2": np.full((2, 3), 150.0)}))
        np.testing.assert_allclose(vals["T1"], 900.0, rtol=1e-12)
        np.testing.assert_allclose(vals["T2"], 150.0, rtol=1e-12)
    far = B.to_free({"T1": 1.0, "T2": 5.0 + 50.0 * 800.0})
    np.testing.assert_allclose(B.to_values(far)["T2"], 5.0 + 50.0 * 800.0, rtol=1e-12)
    # the start: the middle of two bounds, one scale inside one bound, 0 free
    start = A.to_values(A.initial())
    np.testing.assert_allclose(start["T1"], 2050.0)
    np.testing.assert_allclose(start["T2"], 450.0)
    np.testing.assert_allclose(A.to_values(A.initial({"T1": 700.0}))["T1"], 700.0)


def test_forward_is_the_simulator():
    sim, b1, A = _operator()
    vals = _values()
    x = A.to_free(vals)
    assert x.shape == (2, 3, 2)
    np.testing.assert_allclose(A.forward(x), sim.simulate(B1=b1, **vals), rtol=1e-6, atol=1e-8)


def test_jacobian_and_jvp_against_central_differences():
    sim, b1, A = _operator(amplitude=True)
    vals = dict(_values(), amplitude=np.array([[1.0 + 0.2j, 0.8, 1.2j], [0.5 - 0.5j, 1.0, 2.0]]))
    x = A.to_free(vals)
    s, J = A.jacobian(x)
    assert J.shape == (2, 3, 4, 100)
    np.testing.assert_allclose(s, A.forward(x), rtol=1e-6, atol=1e-8)
    h = 1e-3
    for j in range(4):
        e = np.zeros_like(x)
        e[..., j] = h
        fd = (A.forward(x + e) - A.forward(x - e)) / (2 * h)
        scale = np.max(np.abs(fd))
        assert np.max(np.abs(J[..., j, :] - fd)) <= 2e-3 * scale, j
    rng = np.random.default_rng(3)
    dx = rng.standard_normal(x.shape)
    fd = (A.forward(x + h * dx) - A.forward(x - h * dx)) / (2 * h)
    jv = A.jvp(x, dx)
    assert np.max(np.abs(jv - fd)) <= 2e-3 * np.max(np.abs(fd))


def test_vjp_is_the_adjoint_of_jvp():
    for kw in ({}, {"amplitude": True}):
        sim, b1, A = _operator(**kw)
        x = A.to_free(dict(_values(), amplitude=1.5 - 0.5j) if kw else _values())
        rng = np.random.default_rng(7)
        dx = rng.standard_normal(x.shape)
        v = rng.standard_normal((2, 3, 100)) + 1j * rng.standard_normal((2, 3, 100))
        lhs = np.sum((np.conj(v) * A.jvp(x, dx)).real)
        g = A.vjp(x, v)
        assert g.shape == x.shape and g.dtype.kind == "f"
        rhs = np.sum(g * dx)
        assert abs(lhs - rhs) <= 1e-5 * max(abs(lhs), 1.0)
    # the gradient of a least-squares loss against central differences
    y = A.forward(x) + 0.01
    loss = lambda x: 0.5 * np.sum(np.abs(A.forward(x) - y) ** 2)  # noqa: E731
    g = A.vjp(x, A.forward(x) - y)
    e = np.zeros_like(x)
    e[1, 2, 0] = 1e-3
    fd = (loss(x + e) - loss(x - e)) / 2e-3
    assert abs(g[1, 2, 0] - fd) <= 2e-3 * abs(fd) + 1e-9


def test_subspace_and_amplitude():
    sim, b1, A = _operator()
    T1, T2 = np.meshgrid(np.geomspace(200, 3000, 20), np.geomspace(10, 300, 15))
    basis = TemporalBasis.learn(sim.simulate(T1=T1.ravel(), T2=T2.ravel(), B1=1.0), rank=6)
    _, _, S = _operator(subspace=basis, amplitude=True)
    vals = dict(_values(), amplitude=2.0 * np.exp(0.3j))
    x = S.to_free(vals)
    c = S.forward(x)
    assert c.shape == (2, 3, 6)
    ref = 2.0 * np.exp(0.3j) * sim.simulate(B1=b1, **_values())
    np.testing.assert_allclose(c, ref @ basis.basis.conj(), rtol=1e-5, atol=1e-7)
    _, J = S.jacobian(x)
    _, Jfull = _operator(amplitude=True)[2].jacobian(x)
    np.testing.assert_allclose(J, Jfull @ basis.basis.conj(), rtol=1e-5, atol=1e-7)
    # the amplitude's columns are s and i s
    np.testing.assert_allclose(Jfull[..., 3, :], 1j * Jfull[..., 2, :], rtol=1e-12)


def test_fit_reaches_the_noise_limited_error():
    """SciPy's least_squares with the operator's Jacobian recovers T2 and the
    amplitude of a noisy spin-echo train voxel by voxel within a few
    standard errors (the Cramér-Rao bound from the Jacobian at the truth)."""
    from scipy.optimize import least_squares

    sim = FSESimulator(ESP=8.0, flip=np.full(24, 150.0))
    n = 40
    rng = np.random.default_rng(5)
    truth = {"T2": rng.uniform(40.0, 150.0, n), "amplitude": rng.uniform(0.5, 1.5, n) * np.exp(1j * rng.uniform(
        -np.pi, np.pi, n))}
    A = ModelOperator(sim, ("T2",), bounds={"T2": (5.0, 1000.0)}, amplitude=True, known={"T1": 1000.0}, shape=(n,))
    xt = A.to_free(truth)
    sigma = 0.005
    y = A.forward(xt) + sigma * (rng.standard_normal((n, 24)) + 1j * rng.standard_normal((n, 24)))
    errors = []
    for i in range(n):
        one = ModelOperator(sim, ("T2",), bounds={"T2": (5.0, 1000.0)}, amplitude=True, known={"T1": 1000.0},
                            shape=(1,))

        def residual(z, i=i, one=one):
            r = one.forward(z.reshape(1, 3))[0] - y[i]
            return np.concatenate([r.real, r.imag])

        def jac(z, one=one):
            J = one.jacobian(z.reshape(1, 3))[1][0].T
            return np.concatenate([J.real, J.imag])

        fit = least_squares(residual, one.initial(signals=y[i:i + 1]).ravel(), jac=jac, method="lm")
        T2 = one.to_values(fit.x.reshape(1, 3))["T2"][0]
        # the bound on T2 from the Jacobian in T2 itself at the truth
        Jt = sim.jacobian(("T2",), T1=1000.0, T2=truth["T2"][i])[1][0]
        st = sim.simulate(T1=1000.0, T2=truth["T2"][i])
        cols = np.stack([truth["amplitude"][i] * Jt, st, 1j * st], -1)
        F = np.concatenate([cols.real, cols.imag]).T @ np.concatenate([cols.real, cols.imag]) / sigma ** 2
        errors.append((T2 - truth["T2"][i]) / np.sqrt(np.linalg.inv(F)[0, 0]))
    errors = np.array(errors)
    assert np.sqrt(np.mean(errors ** 2)) < 1.5 and np.max(np.abs(errors)) < 4.0


def test_refusals():
    sim = _mrf()
    with pytest.raises(ValueError, match="unknown 'T3' is not a tissue property of MRFSimulator"):
        ModelOperator(sim, ("T3",))
    with pytest.raises(ValueError, match="unknowns must name at least one tissue property"):
        ModelOperator(sim, ())
    with pytest.raises(ValueError, match="unknowns repeat a name"):
        ModelOperator(sim, ("T1", "T1"))
    with pytest.raises(ValueError, match="M0 cannot also be an unknown"):
        ModelOperator(sim, ("M0", "T2"), amplitude=True)
    with pytest.raises(ValueError, match="'T2' is both an unknown and known"):
        ModelOperator(sim, ("T2",), known={"T2": 50.0})
    with pytest.raises(ValueError, match="known 'T3' is not a tissue property"):
        ModelOperator(sim, ("T2",), known={"T3": 1.0})
    with pytest.raises(ValueError, match="do not pass M0 in known"):
        ModelOperator(sim, ("T2",), amplitude=True, known={"M0": 1.0})
    with pytest.raises(ValueError, match="'T1' is not one of"):
        ModelOperator(sim, ("T2",), bounds={"T1": (1.0, 2.0)})
    with pytest.raises(ValueError, match=r"bounds of T2 must have low < high, got \(5.0, 5.0\)"):
        ModelOperator(sim, ("T2",), bounds={"T2": (5.0, 5.0)})
    with pytest.raises(ValueError, match="bounds of T2 must be finite numbers or None"):
        ModelOperator(sim, ("T2",), bounds={"T2": (np.nan, 5.0)})
    with pytest.raises(ValueError, match="scale of T2 must be a positive number, got -1"):
        ModelOperator(sim, ("T2",), scale={"T2": -1})
    with pytest.raises(TypeError, match="subspace must be a blochsim.subspace.TemporalBasis"):
        ModelOperator(sim, ("T2",), subspace=np.eye(3))
    A = ModelOperator(sim, ("T1", "T2"), bounds={"T2": (5.0, 500.0)}, known={"B1": np.ones(4)})
    assert A.shape == (4,)
    with pytest.raises(ValueError, match=r"x must have shape \(4, 2\) \(the maps' shape, then the 2 free variables\), "
                                         r"got \(4, 3\)"):
        A.forward(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="x must be finite"):
        A.forward(np.full((4, 2), np.nan))
    with pytest.raises(ValueError, match=r"dx must have shape \(4, 2\)"):
        A.jvp(np.zeros((4, 2)), np.zeros(2))
    x = A.to_free({"T1": 1000.0, "T2": 50.0})
    with pytest.raises(ValueError, match=r"v must have the signals' shape \(4,\) \+ \(samples,\), got \(3, 100\)"):
        A.vjp(x, np.zeros((3, 100)))
    with pytest.raises(ValueError, match=r"v must have the signals' shape \(4, 100\), got \(4, 99\)"):
        A.vjp(x, np.zeros((4, 99)))
    with pytest.raises(ValueError, match=r"T2 must lie strictly inside its bounds \(5.0, 500.0\), got 500.0"):
        A.to_free({"T1": 1000.0, "T2": 500.0})
    with pytest.raises(ValueError, match="values must hold T2"):
        A.to_free({"T1": 1000.0})
    B = ModelOperator(sim, ("T2",), bounds={"T2": (5.0, 500.0)}, amplitude=True, known={"T1": np.full(4, 1000.0)})
    with pytest.raises(ValueError, match=r"signals must have the signals' shape \(4, 100\), got \(4, 3\)"):
        B.initial(signals=np.ones((4, 3)))


def test_model_fit_example_reaches_the_crlb():
    """examples/model_fit.py: T1 and T2 fitted from noisy MRF images with
    least_squares land within the noise-limited error of the truth."""
    import pathlib
    import runpy

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "model_fit.py"
    est, truth, bound = runpy.run_path(str(path), run_name="example")["main"](20)
    for j, k in enumerate(("T1", "T2")):
        z = (est[k] - truth[k]) / bound[:, j]
        assert np.sqrt(np.mean(z ** 2)) < 1.4, k


def test_learned_basis_spans_the_models_evolutions():
    sim, b1, A = _operator(amplitude=True)
    basis = A.temporal_basis(rank=6, ranges={"T2": (10.0, 300.0)}, samples=2000)
    assert basis.basis.shape == (100, 6) and basis.energy.sum() > 0.999
    # evolutions of this model, drawn apart from the learning set, keep their energy
    x = A.to_free(dict(_values(), amplitude=1.3j))
    s = A.forward(x)
    kept = np.linalg.norm(basis.expand(basis.project(s))) / np.linalg.norm(s)
    assert kept > 0.999
    with pytest.raises(ValueError, match=r"T2 needs a range \(low < high, finite\) to draw from"):
        A.temporal_basis()

