"""Estimators (SPEC §5–6) against oracles written here: PERK's map composed
in float64 NumPy (features, then regression) and its central differences;
the inverse of the inversion-recovery closed form; SciPy's least squares;
Monte-Carlo scatter; known dictionary atoms and complex scales."""
import pathlib
import runpy

import numpy as np
import pytest
from scipy.optimize import least_squares

from blochsim import _core
from blochsim.estimators import PERK, DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import InversionRecoverySimulator, MRFSimulator, SpinEchoSimulator

TE = np.arange(10.0, 170.0, 10.0)


def _se():
    return SpinEchoSimulator(TE=TE, TR=5000.0)


def _noisy(s, sd, seed):
    rng = np.random.default_rng(seed)
    return s + sd * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))


# --------------------------------------------------------------------------
# PERK: the fused kernel

def _composed(perk, s, known=()):
    """PERK's estimate in float64 NumPy: inputs, features, regression."""
    m = perk._model
    s = np.asarray(s, dtype=np.complex128)
    v = np.abs(s) if perk.input_mode == "magnitude" else np.stack([s.real, s.imag], -1).reshape(*s.shape[:-1], -1)
    if perk.normalize:
        v = v / np.linalg.norm(v, axis=-1, keepdims=True)
    if perk._basis is not None:
        v = v @ perk._basis  # the principal coordinates of the training inputs
    x = np.concatenate([v] + [np.asarray(k, dtype=np.float64)[..., None] for k in known], axis=-1)
    z = np.cos(x @ m["omega"].astype(np.float64).T + m["phase"])
    p = len(perk.names)
    return m["offset"][:p].astype(np.float64) + z @ m["weight"][:p].astype(np.float64).T


def test_fused_kernel_equals_composed_numpy():
    rng = np.random.default_rng(0)
    n, d, F, p = 301, 37, 203, 3
    x = rng.standard_normal((n, d)).astype(np.float32)
    om = (rng.standard_normal((F, d)) / np.sqrt(d)).astype(np.float32)
    ph = rng.uniform(0, 2 * np.pi, F).astype(np.float32)
    W = (0.1 * rng.standard_normal((p, F))).astype(np.float32)
    off = rng.standard_normal(p).astype(np.float32)
    out = np.empty((n, p), np.float32)
    _core.perk(om, ph, W, off, x, out, threads=2)
    ref = off + np.cos(x.astype(np.float64) @ om.T.astype(np.float64) + ph) @ W.T.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=0, atol=3e-6 * np.max(np.abs(ref)))
    # the pullback: -Omega^T (sin(u) * (W^T g)), and the map on the way
    g = rng.standard_normal((n, p)).astype(np.float32)
    xbar, out2 = np.empty_like(x), np.empty_like(out)
    _core.perk(om, ph, W, off, x, out2, g=g, xbar=xbar, threads=1)
    u = x.astype(np.float64) @ om.T.astype(np.float64) + ph
    xref = (-np.sin(u) * (g.astype(np.float64) @ W.astype(np.float64))) @ om.astype(np.float64)
    np.testing.assert_allclose(xbar, xref, rtol=0, atol=3e-6 * np.max(np.abs(xref)))
    np.testing.assert_array_equal(out2, out)


def test_fused_kernel_far_arguments():
    """The lanes' sine and cosine hold where Omega x + b is large."""
    d, F = 4, 64
    x = np.full((16, d), 1.0, np.float32)
    om = np.linspace(-900.0, 900.0, F * d).reshape(F, d).astype(np.float32)
    ph = np.zeros(F, np.float32)
    W = np.eye(1, F, dtype=np.float32) * 0 + np.linspace(-1, 1, F, dtype=np.float32)
    out = np.empty((16, 1), np.float32)
    _core.perk(om, ph, W, np.zeros(1, np.float32), x, out, threads=1)
    ref = np.cos(om.astype(np.float64).sum(1)) @ W[0].astype(np.float64)
    np.testing.assert_allclose(out[:, 0], ref, atol=2e-4)


@pytest.mark.parametrize("mode,normalize,subspace", [("cartesian", False, None), ("cartesian", True, None),
                                                     ("magnitude", True, None), ("magnitude", False, "auto"),
                                                     ("cartesian", True, "auto")])
def test_perk_map_and_pullback_against_composed_numpy(mode, normalize, subspace):
    sim = _se()
    perk = PERK(sim, n_features=300, complex_mode=mode, normalize=normalize, feature_seed=3, subspace=subspace)
    perk.fit(noise_std=0.01, samples=3000, T1=(600.0, 1400.0), T2=(30.0, 150.0),
             M0=(0.5, 1.5))
    rng = np.random.default_rng(2)
    s = _noisy(sim.simulate(T1=rng.uniform(700, 1300, 7), T2=rng.uniform(40, 140, 7), M0=1.1), 0.01, 4)
    s = s * np.exp(1j * rng.uniform(0, 2 * np.pi, (7, 1)))  # a phase per voxel
    maps = perk.map(s)
    ref = _composed(perk, s)
    # float32 inputs; principal coordinates turn the features faster (one
    # shorter length scale), so their single-precision phases round more
    tol = 2e-5 if subspace is None else 2e-4
    for i, k in enumerate(perk.names):
        np.testing.assert_allclose(maps[k], ref[:, i], rtol=tol, atol=tol * np.max(np.abs(ref[:, i])))
    # pullback of L = sum_k c_k . map_k against central differences of the
    # composed float64 map along a random complex direction
    cot = {k: rng.standard_normal(7) for k in perk.names}
    maps2, pullback = perk.vjp(s)
    sbar = pullback(cot)
    assert sbar.shape == s.shape and sbar.dtype == np.complex64
    delta = rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)
    h = 1e-5

    def loss(x):
        r = _composed(perk, x)
        return sum(np.sum(cot[k] * r[:, i]) for i, k in enumerate(perk.names))

    fd = (loss(s + h * delta) - loss(s - h * delta)) / (2 * h)
    # the pullback runs in single precision (the features' phases and their
    # cosines' derivatives in float32, summed over 300 features)
    np.testing.assert_allclose(np.sum(np.real(np.conj(sbar) * delta)), fd, rtol=3e-4)


def test_perk_known_parameters_are_inputs():
    sim = _se()
    perk = PERK(sim, n_features=300, complex_mode="magnitude", feature_seed=1, subspace=None)
    perk.fit(noise_std=0.002, samples=4000, known="T1", T1=(500.0, 2000.0), T2=(30.0, 150.0), M0=(0.5, 1.5))
    assert perk.names == ["T2", "M0"] and perk.known == ("T1",)
    s = sim.simulate(T1=np.array([800.0, 1500.0]), T2=np.array([60.0, 100.0]), M0=1.0)
    maps = perk.map(s, known={"T1": np.array([800.0, 1500.0])})
    ref = _composed(perk, s, known=[np.array([800.0, 1500.0])])
    np.testing.assert_allclose(maps["T2"], ref[:, 0], rtol=2e-5)
    # the pullback goes to the signals; the known values are held fixed
    _, pullback = perk.vjp(s, known={"T1": np.array([800.0, 1500.0])})
    assert pullback({"T2": np.ones(2)}).shape == s.shape


# --------------------------------------------------------------------------
# PERK: learning

def test_perk_learns_t2_and_m0_no_worse_than_the_dictionary():
    """A noisy multi-echo train: PERK's T2 and M0 errors are small, its T2
    error no worse than dictionary matching's on the same data, and its
    learned uncertainty close to its actual error."""
    sim = _se()
    sd = 0.005
    rng = np.random.default_rng(7)
    T2 = rng.uniform(30.0, 180.0, 1500)
    M0 = rng.uniform(0.6, 1.4, 1500)
    s = _noisy(sim.simulate(T1=1000.0, T2=T2, M0=M0), sd, 11)
    perk = PERK(sim, n_features=500, complex_mode="magnitude").fit(
        noise_std=sd, samples=20000, seed=3, uncertainty=True, T1=1000.0, T2=(20.0, 200.0), M0=(0.5, 1.5))
    m = perk.map(s, uncertainty=True)
    err_t2 = np.sqrt(np.mean((m["T2"] - T2) ** 2))
    err_m0 = np.sqrt(np.mean((m["M0"] - M0) ** 2))
    assert err_t2 < 1.5 and err_m0 < 0.01
    dm = DictionaryMatcher(sim).fit(T1=1000.0, T2=np.linspace(20.0, 200.0, 721))
    err_dm = np.sqrt(np.mean((dm.map(s)["T2"] - T2) ** 2))
    assert err_t2 <= 1.05 * err_dm
    assert 0.6 < np.mean(m["T2_std"]) / err_t2 < 1.5


def test_loss_on_perk_maps_pulls_back_to_the_flip_train():
    """L = sum (T2_hat - T2)^2 over a few voxels of an FSE train, through
    PERK's pullback and the simulator's adjoint, against central
    differences of the whole chain (simulate, then map) in the flips."""
    from blochsim.simulators import FSESimulator
    flips = np.linspace(120.0, 180.0, 12)
    fse = FSESimulator(ESP=8.0, flip=flips)
    perk = PERK(fse, n_features=300, complex_mode="magnitude", feature_seed=2, subspace=None).fit(
        noise_std=0.002, samples=5000, T1=1000.0, T2=(30.0, 200.0), M0=(0.5, 1.5))
    tissue = dict(T1=1000.0, T2=np.array([50.0, 90.0, 140.0]), M0=1.0)

    def loss(f):
        return float(np.sum((perk.map(fse.simulate(flip=f, **tissue))["T2"].astype(np.float64) - tissue["T2"]) ** 2))

    s, pull_signal = fse.vjp("flip", flip=flips, **tissue)
    maps, pull_maps = perk.vjp(s)
    grad = pull_signal(pull_maps({"T2": 2 * (maps["T2"] - tissue["T2"])}))["flip"]
    h = 0.5
    for i in (0, 5, 11):
        up, dn = flips.copy(), flips.copy()
        up[i] += h
        dn[i] -= h
        fd = (loss(up) - loss(dn)) / (2 * h)
        np.testing.assert_allclose(grad[i], fd, rtol=0.02, atol=1e-3 * np.max(np.abs(grad)))


# --------------------------------------------------------------------------
# Dictionary matching

MRF = MRFSimulator(flip=np.linspace(10.0, 60.0, 100), TR=10.0, states=16)
T1G, T2G = np.geomspace(300.0, 3000.0, 40), np.geomspace(20.0, 300.0, 30)


@pytest.mark.parametrize("options", [{}, {"rank": 12}, {"groups": 25, "search": 3}, {"chunk": 97}])
def test_dictionary_finds_atoms_and_complex_scales(options):
    dm = DictionaryMatcher(MRF, **options).fit(T1=T1G, T2=T2G)
    i1, i2 = np.array([3, 17, 30, 39]), np.array([5, 9, 20, 0])
    scale = np.array([1.5 * np.exp(0.3j), 0.7, 2.0j, 0.2])
    s = MRF.simulate(T1=T1G[i1], T2=T2G[i2]) * scale[:, None]
    m = dm.map(s)
    np.testing.assert_allclose(m["T1"], T1G[i1])
    np.testing.assert_allclose(m["T2"], T2G[i2])
    np.testing.assert_allclose(m["M0"], scale, rtol=2e-5)
    np.testing.assert_allclose(m["score"], 1.0, rtol=2e-5)
    top = dm.match(s, k=4)
    assert top["index"].shape == (4, 4)
    assert np.all(np.diff(top["score"], axis=1) <= 1e-7)
    np.testing.assert_array_equal(top["index"][:, 0], m["index"])


def test_dictionary_given_atoms_and_voxel_shape():
    atoms = MRF.simulate(T1=T1G[:5], T2=80.0)
    dm = DictionaryMatcher(MRF).fit(dictionary=(atoms, {"T1": T1G[:5]}))
    s = np.stack([atoms[[1, 4]], atoms[[0, 2]]])  # (2, 2, contrasts)
    m = dm.map(s)
    assert m["T1"].shape == (2, 2)
    np.testing.assert_allclose(m["T1"], T1G[:5][[[1, 4], [0, 2]]])
    # a null atom is skipped, and indices still count the given rows
    atoms[1] = 0
    m = DictionaryMatcher(MRF).fit(dictionary=(atoms, {"T1": T1G[:5]})).map(atoms[[4, 2]])
    np.testing.assert_array_equal(m["index"], [4, 2])


# --------------------------------------------------------------------------
# Lookup table

def test_lookup_inverts_the_inversion_recovery_closed_form():
    TI = 400.0
    sim = InversionRecoverySimulator(TI=[TI])
    lut = LookupTable(sim).fit(T1=np.linspace(100.0, 4000.0, 4000))
    T1 = np.array([150.0, 577.0, 1234.5, 3900.0])
    x = 1 - 2 * np.exp(-TI / T1)  # the closed form, inverted below
    np.testing.assert_allclose(lut.map(x[:, None])["T1"], -TI / np.log((1 - x) / 2), rtol=1e-4)
    # outside the table's values: NaN
    assert np.isnan(lut.map(np.array([[1.5]]))["T1"][0])


def test_lookup_keeps_the_longest_monotonic_run():
    """|IR| falls to the null at T1 = TI/ln 2 and rises after it: the table
    keeps the longer side."""
    TI = 300.0
    sim = InversionRecoverySimulator(TI=[TI])
    lut = LookupTable(sim, feature=lambda s: np.abs(s[:, 0])).fit(T1=np.linspace(100.0, 3000.0, 3000))
    null = TI / np.log(2)
    assert lut.valid[0] >= null - 2.0 and lut.valid[1] == 3000.0
    T1 = 2000.0
    m = lut.map(np.array([[abs(1 - 2 * np.exp(-TI / T1))]]))
    np.testing.assert_allclose(m["T1"], T1, rtol=1e-4)


# --------------------------------------------------------------------------
# Non-linear least squares

def test_least_squares_matches_scipy():
    sim = SpinEchoSimulator(TE=np.arange(10.0, 170.0, 20.0), TR=5000.0)
    y = _noisy(sim.simulate(T1=1000.0, T2=np.array([45.0, 60.0, 120.0]), M0=1.5), 0.01, 1)
    nls = NonlinearLeastSquares(sim).fit(T1=1000.0, T2=(10.0, 300.0), M0=(0.1, 3.0))
    m = nls.map(y)
    for v in range(3):
        def res(th):
            r = sim.simulate(T1=1000.0, T2=th[0], M0=th[1]).astype(np.complex128) - y[v]
            return np.concatenate([r.real, r.imag])

        ref = least_squares(res, [155.0, 1.55], bounds=([10.0, 0.1], [300.0, 3.0]), xtol=1e-14, ftol=1e-14,
                            gtol=1e-14).x
        np.testing.assert_allclose([m["T2"][v], m["M0"][v]], ref, rtol=1e-6)


def test_least_squares_on_a_played_sequence_and_bounds():
    """MRF (the EPG engine's Jacobians); a bound that binds stays put."""
    y = MRF.simulate(T1=np.array([900.0, 1500.0]), T2=np.array([70.0, 40.0]))
    nls = NonlinearLeastSquares(MRF).fit(T1=(300.0, 3000.0), T2=(20.0, 60.0), init={"T1": 1000.0, "T2": 50.0})
    m = nls.map(y)
    np.testing.assert_allclose(m["T1"][1], 1500.0, rtol=1e-4)
    np.testing.assert_allclose(m["T2"][1], 40.0, rtol=1e-4)
    assert m["T2"][0] == 60.0  # the true 70 is outside: the fit rests on the bound


def test_least_squares_standard_error_agrees_with_monte_carlo():
    sim = SpinEchoSimulator(TE=np.arange(10.0, 170.0, 20.0), TR=5000.0)
    sd = 0.01
    clean = sim.simulate(T1=1000.0, T2=80.0, M0=1.0)
    y = _noisy(np.broadcast_to(clean, (600, clean.shape[-1])), sd, 5)
    m = NonlinearLeastSquares(sim).fit(noise_std=sd, T1=1000.0, T2=(10.0, 300.0), M0=(0.1, 3.0)).map(y)
    for k in ("T2", "M0"):
        np.testing.assert_allclose(np.mean(m[k + "_se"]), np.std(m[k]), rtol=0.1)


# --------------------------------------------------------------------------
# Refusals

ESTIMATORS = [
    lambda: PERK(_se(), n_features=50),
    lambda: DictionaryMatcher(_se()),
    lambda: LookupTable(InversionRecoverySimulator(TI=[400.0])),
    lambda: NonlinearLeastSquares(_se()),
]


@pytest.mark.parametrize("make", ESTIMATORS)
def test_map_before_fit_is_refused(make):
    with pytest.raises(RuntimeError, match="fit"):
        make().map(np.ones((3, 16), np.complex64))


@pytest.mark.parametrize("make", ESTIMATORS)
def test_unknown_parameter_names_are_refused(make):
    with pytest.raises(TypeError, match="T7"):
        make().fit(T7=(1.0, 2.0))


@pytest.mark.parametrize("make", [ESTIMATORS[0], ESTIMATORS[3]])
def test_ranges_with_low_not_below_high_are_refused(make):
    with pytest.raises(ValueError, match=r"range of T2 needs low < high, got \(200.0, 20.0\)"):
        make().fit(T1=1000.0, T2=(200.0, 20.0), M0=(0.5, 1.5))
    with pytest.raises(ValueError, match="range of M0"):
        make().fit(T1=1000.0, T2=(20.0, 200.0), M0=(1.0, 1.0))


def _fitted():
    sim = _se()
    return [PERK(sim, n_features=50).fit(samples=200, T1=1000.0, T2=(20.0, 200.0)),
            DictionaryMatcher(sim).fit(T1=1000.0, T2=np.linspace(20.0, 200.0, 10)),
            NonlinearLeastSquares(sim).fit(T1=1000.0, T2=(20.0, 200.0)),
            LookupTable(InversionRecoverySimulator(TI=[400.0])).fit(T1=np.linspace(100.0, 3000.0, 50))]


def test_mismatched_contrast_counts_are_refused():
    for est in _fitted():
        with pytest.raises(ValueError, match="signals have 15 contrasts"):
            est.map(np.ones((2, 15), np.complex64))


def test_non_finite_signals_are_refused():
    for est in _fitted():
        bad = np.ones((3, est.contrasts), np.complex64)
        bad[2, 0] = np.nan
        with pytest.raises(ValueError, match=r"signals are not finite at voxel \(2,\)"):
            est.map(bad)


def test_other_refusals():
    sim = _se()
    with pytest.raises(ValueError, match="complex_mode must be one of"):
        PERK(sim, complex_mode="polar")
    with pytest.raises(ValueError, match="known parameter 'T1' needs a"):
        PERK(sim, n_features=50).fit(known="T1", T1=1000.0, T2=(20.0, 200.0))
    perk = PERK(sim, n_features=50).fit(samples=200, known="T1", T1=(500.0, 1500.0), T2=(20.0, 200.0))
    with pytest.raises(ValueError, match=r"known must give exactly \['T1'\]"):
        perk.map(np.ones((2, 16), np.complex64))
    with pytest.raises(ValueError, match="uncertainty=True needs fit"):
        perk.map(np.ones((2, 16), np.complex64), known={"T1": 1000.0}, uncertainty=True)
    with pytest.raises(ValueError, match="no parameter to estimate"):
        PERK(sim, n_features=50).fit(T1=1000.0, T2=80.0)
    dm = DictionaryMatcher(sim).fit(T1=1000.0, T2=np.linspace(20.0, 200.0, 10))
    with pytest.raises(ValueError, match="k = 11 exceeds the 10 atoms"):
        dm.match(np.ones((1, 16), np.complex64), k=11)
    with pytest.raises(ValueError, match="exactly one unknown"):
        LookupTable(sim).fit(T1=np.linspace(500, 900, 5), T2=np.linspace(20, 90, 5))
    with pytest.raises(ValueError, match="feature is not finite at T1 = 3000.0"):
        LookupTable(InversionRecoverySimulator(TI=[400.0]),
                    feature=lambda x: np.where(np.real(x[:, 0]) > 0, np.real(x[:, 0]), np.nan)).fit(
            T1=np.array([500.0, 3000.0]))
    with pytest.raises(ValueError, match="reduces them"):
        LookupTable(sim).fit(T1=1000.0, T2=np.linspace(20.0, 200.0, 10))
    with pytest.raises(ValueError, match="init names 'T1'"):
        NonlinearLeastSquares(sim).fit(init={"T1": 900.0}, T1=1000.0, T2=(20.0, 200.0))


def test_mrf_maps_example_runs(capsys):
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mrf_maps.py"
    runpy.run_path(str(path), run_name="example")["main"](12)
    out = capsys.readouterr().out
    for name in ("PERK", "dictionary", "least squares", "lookup"):
        assert name in out


def test_perk_log_parameters_cover_decades():
    """T2 over 10-2000 ms drawn and regressed in its logarithm maps short and
    long T2 alike against the closed form's truth; uniform draws over the
    same range lose the short ones.  The pullback of a log-scaled map is
    the map's, by central differences."""
    te = np.arange(10.0, 330.0, 10.0)
    sim = SpinEchoSimulator(TE=te, TR=1e6)
    T2 = np.array([15.0, 40.0, 80.0, 300.0, 1200.0])
    s = sim.simulate(T1=1000.0, T2=T2, M0=1.0)
    logp = PERK(sim, n_features=800).fit(noise_std=1e-4, samples=20000, log=("T2",), T2=(10.0, 2000.0),
                                         M0=(0.8, 1.2), T1=1000.0)
    lin = PERK(sim, n_features=800).fit(noise_std=1e-4, samples=20000, T2=(10.0, 2000.0), M0=(0.8, 1.2),
                                        T1=1000.0)
    err_log = np.abs(logp.map(s)["T2"] - T2) / T2
    err_lin = np.abs(lin.map(s)["T2"] - T2) / T2
    assert err_log.max() < 0.05, err_log
    assert err_lin[:2].max() > 2 * err_log[:2].max()
    maps, pull = logp.vjp(s)
    g = pull({"T2": np.ones(len(T2))})
    d = np.zeros_like(s)
    d[:, 3] = 1e-3
    fd = (logp.map(s + d)["T2"] - logp.map(s - d)["T2"]) / 2e-3
    np.testing.assert_allclose(g[:, 3].real, fd, rtol=0.05, atol=0.05 * np.abs(fd).max())
    with pytest.raises(ValueError, match="log parameter"):
        PERK(sim).fit(log=("T1",), T2=(10.0, 2000.0), T1=1000.0)


def test_perk_pickles_without_its_device_copies():
    """A fitted PERK travels to Dask workers by pickle; the device copies of
    its arrays stay behind (made again where needed)."""
    import pickle
    sim = SpinEchoSimulator(TE=np.arange(10.0, 170.0, 10.0), TR=5000.0)
    perk = PERK(sim, n_features=200).fit(noise_std=0.005, samples=2048, T1=1000.0, T2=(20.0, 200.0),
                                         M0=(0.5, 1.5))
    s = sim.simulate(T1=1000.0, T2=np.array([40.0, 90.0, 150.0]), M0=1.0)
    want = perk.map(s)
    perk._device_model = perk._training_device = (lambda: None)  # what cannot be pickled
    kept = pickle.loads(pickle.dumps(perk))
    assert kept._device_model is None and not hasattr(kept, "_training_device")
    for k, v in kept.map(s).items():
        np.testing.assert_array_equal(v, want[k])
