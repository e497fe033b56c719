"""MR fingerprinting, FISP and bSSFP kinds, with B0 and pools: against a
Bloch–McConnell isochromat in float64 (the balanced train has no dephasing,
so one isochromat per off-resonance is exact) and an ensemble of dephased
isochromats (the FISP train's gradient, one order a TR, exact for an
ensemble of more isochromats than orders); derivatives against central
differences of the same oracles; refusals."""
import numpy as np
import pytest
from scipy.linalg import expm

from blochsim.simulators import MRFSimulator, mrf_sim

from pool_oracles import Oracle

N_TR = 40
FLIPS = np.concatenate([np.linspace(10, 70, N_TR // 2), np.linspace(70, 5, N_TR // 2)])
TRS = 9.0 + 3.0 * np.sin(np.linspace(0, 3 * np.pi, N_TR))           # ms, varying (Ma et al. 2013)
TISSUE = dict(T1=900.0, T2=70.0, M0=1.2, B1=0.93)
POOLS = dict(poolB_fraction=0.15, poolB_exchange=25.0, poolB_T1=600.0, poolB_T2=20.0, poolB_shift=-40.0,
             bound_fraction=0.1, bound_exchange=20.0, bound_T1=800.0)


def _matrices(o, flip, phase):
    """The oracle's pulse as a matrix on its state vector."""
    eye = np.eye(o.size)
    return np.stack([o.rotate(eye[:, i], flip, phase) for i in range(o.size)], axis=1)


def _oracle_of(t):
    pools = ()
    if "poolB_fraction" in t:
        pools = [(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])]
    bound = (t["bound_fraction"], t["bound_exchange"], t["bound_T1"]) if "bound_fraction" in t else None
    return Oracle(t["T1"], t["T2"], B0=t.get("B0", 0.0), pools=pools, bound=bound)


def _mrf_oracle(kind, flips, TR, TE, phases, TI, t, n_iso=None):
    """The MRF train in float64: one isochromat (bSSFP) or an ensemble of
    n_iso isochromats dephased by 2 pi j / n_iso at each TR's gradient
    (FISP); inversion of the liquid pools, TI, then per TR the pulse at its
    phase, TE, the sample (receiver at phase - 90° for bSSFP, -90° for
    FISP), the gradient (FISP) and the rest of the TR."""
    o = _oracle_of(t)
    n = len(flips)
    n_iso = 1 if kind == "bssfp" else (n_iso or 2 * n + 2)
    theta = 2 * np.pi * np.arange(n_iso) / n_iso
    X = np.repeat(o.invert(o.equilibrium())[:, None], n_iso, axis=1)
    X = expm(o.generator() * TI * 1e-3) @ X
    out = []
    for k in range(n):
        X = _matrices(o, flips[k] * t.get("B1", 1.0), phases[k]) @ X
        X = expm(o.generator() * TE[k] * 1e-3) @ X
        f = np.mean([o.transverse(X[:, j]) for j in range(n_iso)])
        rx = phases[k] - 90.0 if kind == "bssfp" else -90.0
        out.append(t.get("M0", 1.0) * f * np.exp(-1j * np.radians(rx)))
        if kind == "fisp":
            for j in range(o.n):
                fp = (X[3 * j] + 1j * X[3 * j + 1]) * np.exp(1j * theta)
                X[3 * j], X[3 * j + 1] = fp.real, fp.imag
        X = expm(o.generator() * (TR[k] - TE[k]) * 1e-3) @ X
    return np.array(out)


def _protocol(kind, TE=None, phases=None):
    te = TRS / 2 if (TE is None and kind == "bssfp") else (np.zeros(N_TR) if TE is None else np.broadcast_to(TE, (N_TR,)))
    if phases is None:
        phases = 180.0 * (np.arange(N_TR) % 2) if kind == "bssfp" else np.zeros(N_TR)
    return te, phases


@pytest.mark.parametrize("B0", [0.0, 13.0, -41.0, 55.5])
def test_bssfp_mrf_against_isochromat(B0):
    """The balanced train's off-resonance response, each B0 one voxel."""
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TI=20.0, kind="bssfp", states=8)
    s = sim.simulate(**TISSUE, B0=B0)
    te, ph = _protocol("bssfp")
    ref = _mrf_oracle("bssfp", FLIPS, TRS, te, ph, 20.0, {**TISSUE, "B0": B0})
    np.testing.assert_allclose(s, ref, atol=3e-6 * TISSUE["M0"])


@pytest.mark.parametrize("kind", ["bssfp", "fisp"])
def test_states_past_the_orders_a_train_reaches(kind):
    """A balanced train never shifts: played on one order whatever
    ``states`` says (orders past the shifts stay zero), with the same
    signal as the float64 oracle; a FISP train of N TRs reaches 1 + N."""
    t = {**TISSUE, "B0": 23.0}
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TI=20.0, kind=kind, states=2048)
    _, p = sim.stream()
    assert sim._stream_for(p, set(t))[2] == (1 if kind == "bssfp" else 1 + N_TR)
    te, ph = _protocol(kind)
    ref = _mrf_oracle(kind, FLIPS, TRS, te, ph, 20.0, t)
    np.testing.assert_allclose(sim.simulate(**t), ref, atol=3e-6 * TISSUE["M0"])


def test_bssfp_mrf_off_resonance_profile_over_voxels():
    """B0 across two periods of 1/TR as one call of voxels: the band
    structure of the balanced train (constant TR), sample by sample."""
    B0 = np.linspace(-1000.0 / 10.0, 1000.0 / 10.0, 21)
    sim = MRFSimulator(flip=FLIPS, TR=10.0, TE=4.0, kind="bssfp", states=8)
    s = sim.simulate(T1=1000.0, T2=100.0, B0=B0)
    ph = 180.0 * (np.arange(N_TR) % 2)
    for i, b in enumerate(B0):
        ref = _mrf_oracle("bssfp", FLIPS, np.full(N_TR, 10.0), np.full(N_TR, 4.0), ph, 0.0,
                          dict(T1=1000.0, T2=100.0, B0=b))
        np.testing.assert_allclose(s[i], ref, atol=3e-6, err_msg=f"B0 = {b}")
    # B0 and B0 + 1/TR see the same train; the echo, TE after each pulse,
    # differs by the precession over TE
    turn = np.exp(-2j * np.pi * 100.0 * 4.0e-3)
    np.testing.assert_allclose(s[10], s[0] * turn, atol=2e-6)
    np.testing.assert_allclose(s[20], s[10] * turn, atol=2e-6)


def test_bssfp_mrf_with_pools_and_b0_against_bloch_mcconnell():
    t = {**TISSUE, "B0": 17.0, **POOLS}
    phases = (50.0 * np.arange(N_TR)) % 360.0
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TE=3.5, TI=15.0, phases=phases, kind="bssfp", states=8)
    s = sim.simulate(**t)
    ref = _mrf_oracle("bssfp", FLIPS, TRS, np.full(N_TR, 3.5), phases, 15.0, t)
    np.testing.assert_allclose(s, ref, atol=3e-6 * t["M0"])


@pytest.mark.parametrize("pools", [False, True])
def test_fisp_mrf_with_b0_against_isochromat_ensemble(pools):
    """FISP with B0 (and an exchanging pool with a shift and the semisolid
    pool), echo times per TR: every order of the train kept."""
    t = {**TISSUE, "B0": 23.0, **(POOLS if pools else {})}
    TE = 1.0 + 0.5 * np.cos(np.arange(N_TR))
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TE=TE, TI=18.0, states=N_TR + 1)
    s = sim.simulate(**t)
    ref = _mrf_oracle("fisp", FLIPS, TRS, TE, np.zeros(N_TR), 18.0, t)
    np.testing.assert_allclose(s, ref, atol=3e-6 * t["M0"])


def test_fisp_default_is_the_sample_after_the_pulse():
    """No TE: the sample right after the pulse, as an explicit TE of 0."""
    a = MRFSimulator(flip=FLIPS, TR=TRS).simulate(**TISSUE, B0=9.0)
    b = MRFSimulator(flip=FLIPS, TR=TRS, TE=0.0).simulate(**TISSUE, B0=9.0)
    np.testing.assert_allclose(a, b, atol=1e-6)
    ref = _mrf_oracle("fisp", FLIPS, TRS, np.zeros(N_TR), np.zeros(N_TR), 0.0, {**TISSUE, "B0": 9.0})
    np.testing.assert_allclose(a, ref, atol=3e-6 * TISSUE["M0"])


def _central(kind, t, name, sim_kw, h_rel=1e-5):
    te, ph = sim_kw
    h = h_rel * max(abs(t[name]), 1.0)

    def f(v):
        return _mrf_oracle(kind, FLIPS, TRS, te, ph, 10.0, {**t, name: v})

    return (f(t[name] + h) - f(t[name] - h)) / (2 * h)


@pytest.mark.parametrize("kind", ["bssfp", "fisp"])
def test_mrf_jacobian_against_oracle_differences(kind):
    t = {**TISSUE, "B0": 11.0, **POOLS}
    names = ("T1", "T2", "M0", "B1", "B0", "poolB_shift", "poolB_fraction", "bound_fraction")
    te, ph = _protocol(kind, TE=None if kind == "bssfp" else 1.5)
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TI=10.0, kind=kind, states=N_TR + 1,
                       **({} if kind == "bssfp" else {"TE": 1.5}))
    s, J = sim.jacobian(names, **t)
    np.testing.assert_allclose(s, _mrf_oracle(kind, FLIPS, TRS, te, ph, 10.0, t), atol=3e-6 * t["M0"])
    for i, k in enumerate(names):
        fd = _central(kind, t, k, (te, ph))
        np.testing.assert_allclose(J[i], fd, rtol=0, atol=3e-4 * np.max(np.abs(fd)) + 1e-8, err_msg=k)


def test_bssfp_mrf_vjp_of_flips_and_TRs_against_oracle_differences():
    """The pullback of a loss of the signal onto each flip and each TR (a
    default TE follows its TR, at TR/2)."""
    t = {**TISSUE, "B0": 7.0}
    sim = MRFSimulator(flip=FLIPS, TR=TRS, TI=10.0, kind="bssfp", states=4)
    rng = np.random.default_rng(3)
    w = rng.standard_normal(N_TR) + 1j * rng.standard_normal(N_TR)
    _, pullback = sim.vjp(("flip", "TR"), **t)
    g = pullback(w)  # L = sum Re(conj(w) s): dL/dRe s + i dL/dIm s = w

    def loss(flips, trs):
        ph = 180.0 * (np.arange(N_TR) % 2)
        s = _mrf_oracle("bssfp", flips, trs, trs / 2, ph, 10.0, t)
        return np.real(np.conj(w) * s).sum()

    for name, base, step in (("flip", FLIPS, 1e-4), ("TR", TRS, 1e-5)):
        fd = np.empty(N_TR)
        for k in [0, 1, 7, 19, 20, 33, N_TR - 1]:
            e = np.zeros(N_TR)
            e[k] = step
            args = (FLIPS + e, TRS) if name == "flip" else (FLIPS, TRS + e)
            args_m = (FLIPS - e, TRS) if name == "flip" else (FLIPS, TRS - e)
            fd[k] = (loss(*args) - loss(*args_m)) / (2 * step)
            np.testing.assert_allclose(g[name][k], fd[k], rtol=2e-3, atol=2e-4 * np.abs(g[name]).max(),
                                       err_msg=f"{name}[{k}]")


def test_function_form_of_both_kinds():
    for kind in ("fisp", "bssfp"):
        a = mrf_sim(flip=FLIPS, TR=TRS, kind=kind, T1=800.0, T2=60.0, B0=5.0)
        b = MRFSimulator(flip=FLIPS, TR=TRS, kind=kind).simulate(T1=800.0, T2=60.0, B0=5.0)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kw, match", [
    (dict(kind="ssfp"), r"kind must be one of \('fisp', 'bssfp'\), got 'ssfp'"),
    (dict(kind="bssfp", TE=np.r_[np.full(N_TR - 1, 4.0), 30.0]), r"TE\[39\] = 30 ms must be at most TR\[39\]"),
    (dict(TE=-1.0), r"TE"),
    (dict(TE=np.ones(3)), r"TE"),
])
def test_mrf_refusals(kw, match):
    with pytest.raises(ValueError, match=match):
        MRFSimulator(flip=FLIPS, TR=TRS, **kw).simulate(T1=800.0, T2=60.0)
