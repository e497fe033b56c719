"""Derivatives with pools (SPEC §3, §4): the pooled Jacobian and reverse mode
against central differences of the oracles of ``pool_oracles``."""
import numpy as np
import pytest

from blochsim.simulators import CESTSimulator, MRFSimulator, MTSimulator

from pool_oracles import (CEST_TISSUE, EVERY_TISSUE, EveryEvent, FIDAll, MTTrain, Oracle, POOLED, _central,
                          _cest_oracle, _every_event_oracle, _fid_oracle, _mt_oracle)


@pytest.mark.parametrize("name", ["T1", "T2", "M0", "B1", "B0", "bound_fraction", "bound_exchange", "bound_T1",
                                  "bound_T2", "poolB_fraction", "poolB_exchange", "poolB_T1", "poolB_T2",
                                  "poolB_shift"])
def test_jacobian_against_central_differences(name):
    sim = MTTrain(states=16)
    s, J = sim.jacobian(name, **POOLED)
    v = POOLED[name]
    # the signal is single precision: a step wide enough for its round-off
    h = 1e-2 * abs(v)
    up = sim.simulate(**{**POOLED, name: v + h}).astype(np.complex128)
    dn = sim.simulate(**{**POOLED, name: v - h}).astype(np.complex128)
    fd = (up - dn) / (2 * h)
    scale = np.max(np.abs(fd))
    assert scale > 0
    np.testing.assert_allclose(J, fd, atol=3e-3 * scale + 2e-4)


def test_jacobian_in_passes_equals_single_directions():
    names = ("T1", "T2", "bound_fraction", "bound_exchange", "poolB_fraction", "poolB_shift", "B1")
    sim = MTTrain(states=16)
    s, J = sim.jacobian(names, **POOLED)
    assert J.shape == (len(names), 12)
    np.testing.assert_allclose(s, sim.simulate(**POOLED), atol=2e-6)
    for i, k in enumerate(names):
        np.testing.assert_allclose(J[i], sim.jacobian(k, **POOLED)[1], rtol=1e-6, atol=1e-7)


def test_jacobian_of_exchanging_fid_against_oracle_differences():
    """d signal / d poolB_exchange and poolB_shift against central
    differences of the float64 oracle."""
    base = dict(T1=900.0, T2=50.0, poolB_fraction=0.3, poolB_exchange=20.0, poolB_T2=10.0, poolB_T1=500.0,
                poolB_shift=100.0)
    sim = FIDAll(dt=1.0, n=8)
    _, J = sim.jacobian(("poolB_exchange", "poolB_shift"), **base)

    def oracle(k, sh):
        o = Oracle(900.0, 50.0, pools=[(0.3, k, 500.0, 10.0, sh)])
        return _fid_oracle(o, 90.0, 0.0, 1.0, 8)

    dk = (oracle(20.01, 100.0) - oracle(19.99, 100.0)) / 0.02
    ds = (oracle(20.0, 100.01) - oracle(20.0, 99.99)) / 0.02
    np.testing.assert_allclose(J[0], dk, atol=2e-6)
    np.testing.assert_allclose(J[1], ds, atol=2e-6)


def test_threads_do_not_change_results():
    T1 = np.linspace(500, 1500, 7)
    a = MTTrain(states=16, threads=1).simulate(**{**POOLED, "T1": T1})
    b = MTTrain(states=16, threads=3).simulate(**{**POOLED, "T1": T1})
    np.testing.assert_array_equal(a, b)
    assert a.shape == (7, 12)


def test_voxel_arrays_broadcast():
    f = np.array([[0.05], [0.1], [0.2]])
    k = np.array([10.0, 30.0])
    s = MTTrain(states=16).simulate(**{**POOLED, "bound_fraction": f, "bound_exchange": k})
    assert s.shape == (3, 2, 12)
    one = MTTrain(states=16).simulate(**{**POOLED, "bound_fraction": 0.1, "bound_exchange": 30.0})
    np.testing.assert_array_equal(s[1, 1], one)


def test_vjp_against_oracle_differences_for_every_event_value_and_pool_property():
    """Every protocol value (exact pulse flip, duration, phase and offset;
    flips, phases, saturating durations and offsets; TR; receiver phase) and
    every tissue and pool property, against central differences of the
    float64 oracle."""
    sim = EveryEvent(lineshape="lorentzian", states=4)
    T1 = np.array([900.0, 1400.0])
    tissue = {**EVERY_TISSUE, "T1": T1}
    p = dict(EveryEvent.protocol)
    names = tuple(p) + tuple(EVERY_TISSUE)
    s, pullback = sim.vjp(names, **tissue)
    rng = np.random.default_rng(3)
    w = (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)).astype(np.complex64)
    g = pullback(w)

    def loss(pp, tt):
        total = 0.0
        for v, T1v in enumerate(T1):
            total += np.sum(np.real(np.conj(w[v]) * _every_event_oracle(pp, {**tt, "T1": T1v})))
        return total

    np.testing.assert_allclose(s, [_every_event_oracle(p, {**EVERY_TISSUE, "T1": v}) for v in T1], atol=3e-6)
    for k in p:
        h = 1e-4 * max(np.max(np.abs(p[k])), 1.0)
        fd = _central(lambda v: loss({**p, k: v if np.ndim(p[k]) else float(v)}, EVERY_TISSUE), p[k], h)
        assert np.shape(g[k]) == np.shape(p[k])
        np.testing.assert_allclose(g[k], fd, rtol=2e-4, atol=1e-7 * max(np.max(np.abs(fd)), 1.0), err_msg=k)
    for k in EVERY_TISSUE:
        v0 = tissue[k]
        h = 1e-5 * max(np.max(np.abs(v0)), 1e-3)
        if k == "T1":
            fd = np.array([(_every_event_oracle(p, {**EVERY_TISSUE, "T1": T + h})
                            - _every_event_oracle(p, {**EVERY_TISSUE, "T1": T - h})) / (2 * h) for T in T1])
            fd = np.sum(np.real(np.conj(w) * fd), axis=-1)
        else:
            fd = _central(lambda v: loss(p, {**EVERY_TISSUE, k: float(v)}), v0, h)
        assert np.shape(g[k]) == np.shape(v0)
        np.testing.assert_allclose(g[k], fd, rtol=2e-4, atol=1e-6 * max(np.max(np.abs(fd)), 1e-3), err_msg=k)


def test_vjp_with_dephasing_equals_the_jacobian_and_differences():
    """MRF-type train with shifts, both pool kinds: the tissue gradient
    equals the contraction of the Jacobian (itself pinned against
    differences above), and the flip and TR gradients match central
    differences of the signal."""
    flip = np.concatenate([np.linspace(10, 60, 12), np.linspace(60, 5, 12)])
    sim = MRFSimulator(flip=flip, TR=9.0, TI=20.0, states=12)
    t = {**{k: v for k, v in POOLED.items() if k != "B0"}, "T2": np.array([50.0, 90.0])}
    names = ("T1", "T2", "M0", "B1", "bound_fraction", "bound_exchange", "bound_T2", "poolB_fraction",
             "poolB_exchange", "poolB_shift")
    s, pullback = sim.vjp(("flip", "TR") + names, **t)
    rng = np.random.default_rng(5)
    w = rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)
    g = pullback(w)
    _, J = sim.jacobian(names, **t)
    for i, k in enumerate(names):
        ref = np.real(np.conj(w) * J[:, i]).sum(axis=-1)
        np.testing.assert_allclose(g[k], ref if np.ndim(t[k]) else ref.sum(), rtol=1e-4, atol=1e-8, err_msg=k)

    def loss(**kw):
        return np.sum(np.real(np.conj(w) * sim.simulate(**t, **kw).astype(np.complex128)))

    for j in (0, 7, 20):
        up, dn = flip.copy(), flip.copy()
        up[j] += 0.05
        dn[j] -= 0.05
        fd = (loss(flip=up) - loss(flip=dn)) / 0.1
        np.testing.assert_allclose(g["flip"][j], fd, rtol=5e-3, atol=2e-5)
    fd = (loss(TR=9.02) - loss(TR=8.98)) / 0.04
    np.testing.assert_allclose(g["TR"], fd, rtol=5e-3)


def test_cest_vjp_against_oracle_differences():
    offsets = np.array([-3.5, -1.0, 0.5, 3.5])
    proto = dict(B1sat=1.2, n_pulses=3, pulse_duration=40.0, pulse_delay=10.0)
    cest = CESTSimulator(offsets=offsets, field_strength=3.0, normalize=False, **proto)
    names = ("B1sat", "pulse_duration", "pulse_delay", "offsets", "B0", "poolB_exchange", "bound_fraction", "T1")
    z, pullback = cest.vjp(names, **CEST_TISSUE)
    w = np.array([1.0, -2.0, 0.5, 3.0])
    g = pullback(w)

    def loss(off=offsets, b1=1.2, tp=40.0, td=10.0, **t):
        return np.sum(w * np.real(_cest_oracle(off, 3.0, b1, 3, tp, td, {**CEST_TISSUE, **t})))

    fd = {"B1sat": _central(lambda v: loss(b1=float(v)), 1.2, 1e-5),
          "pulse_duration": _central(lambda v: loss(tp=float(v)), 40.0, 1e-4),
          "pulse_delay": _central(lambda v: loss(td=float(v)), 10.0, 1e-4),
          "offsets": _central(lambda v: loss(off=v), offsets, 1e-5)}
    for k in ("B0", "poolB_exchange", "bound_fraction", "T1"):
        v0 = CEST_TISSUE[k]
        fd[k] = _central(lambda v: loss(**{k: float(v)}), v0, 1e-5 * max(abs(v0), 1.0))
    for k in names:
        assert np.shape(g[k]) == np.shape(fd[k]), k
        np.testing.assert_allclose(g[k], fd[k], rtol=3e-4, atol=1e-6 * np.max(np.abs(fd[k])), err_msg=k)


def test_mt_vjp_against_oracle_differences():
    t = dict(T1=1000.0, T2=60.0, B0=5.0, B1=1.1, bound_fraction=0.15, bound_exchange=30.0, bound_T1=1000.0,
             bound_T2=0.012)
    base = dict(flip=12.0, TR=30.0, mt_flip=500.0, mt_duration=8.0, mt_offset=1500.0)
    sim = MTSimulator(n_tr=40, **base)
    s, pullback = sim.vjp(tuple(base) + ("bound_fraction", "bound_exchange"), **t)
    g = pullback(np.array([1.0 - 0.5j], dtype=np.complex64))

    def loss(**kw):
        a = {**base, **{k: v for k, v in kw.items() if k in base}}
        tt = {**t, **{k: v for k, v in kw.items() if k in t}}
        v = _mt_oracle(a["flip"], a["TR"], a["mt_flip"], a["mt_duration"], a["mt_offset"], 40, tt)
        return v.real * 1.0 + v.imag * -0.5

    np.testing.assert_allclose(s, [_mt_oracle(12.0, 30.0, 500.0, 8.0, 1500.0, 40, t)], atol=2e-6)
    for k in g:
        v0 = {**base, **t}[k]
        h = 1e-5 * abs(v0)
        fd = (loss(**{k: v0 + h}) - loss(**{k: v0 - h})) / (2 * h)
        np.testing.assert_allclose(g[k], fd, rtol=3e-4, atol=1e-9, err_msg=k)


def test_pooled_vjp_threads_do_not_change_results():
    T1 = np.linspace(500, 1500, 9)
    flip = np.linspace(20, 60, 10)
    out = []
    for threads in (1, 3):
        sim = MRFSimulator(flip=flip, TR=8.0, states=8, threads=threads)
        s, pullback = sim.vjp(("flip", "T1", "bound_fraction"), **{**{k: v for k, v in POOLED.items() if k != "B0"}, "T1": T1})
        out.append(pullback(np.ones_like(s)))
    for k in out[0]:
        np.testing.assert_array_equal(out[0][k], out[1][k])


def test_pooled_vjp_refusals():
    sim = MRFSimulator(flip=np.full(4, 30.0), TR=8.0)
    with pytest.raises(ValueError, match="vjp with respect to 'bound_T1' needs bound_T1 passed"):
        sim.vjp("bound_T1", T1=1000.0, T2=80.0, bound_fraction=0.1)
    s, pullback = sim.vjp("flip", T1=1000.0, T2=80.0, bound_fraction=0.1)
    with pytest.raises(ValueError, match="cotangent must have the signal's shape"):
        pullback(np.ones(3))
    with pytest.raises(ValueError, match=r"pool fractions sum to 1.2 > 1 at voxel \(\)"):
        sim.vjp("flip", T1=1000.0, T2=80.0, bound_fraction=0.6, poolB_fraction=0.6)
    cest = CESTSimulator(offsets=[1.0, 2.0])
    with pytest.raises(ValueError, match="vjp with respect to 'B0' needs B0 passed"):
        cest.vjp("B0", T1=1000.0, T2=80.0)
    z, pullback = cest.vjp("B1sat", T1=1000.0, T2=80.0)
    with pytest.raises(ValueError, match=r"cotangent must have the signal's shape \(2,\)"):
        pullback(np.ones((2, 1)))
