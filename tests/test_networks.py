"""Exchange networks beyond the star and dipolar order (SPEC §3), against a
float64 Bloch–McConnell(–Provotorov) integration written in the tests
(network_oracles.py): pair rates between any pools, a second semisolid
pool, single- and dual-offset saturation of a pool with T1D, exact
rectangular pulses, their Jacobians and protocol gradients."""
import numpy as np
import pytest

from blochsim import Delay, Pulse, Readout, RectPulse, Saturation, Simulator, Spoil
from blochsim.sequence import Sequence
from blochsim.simulators import MTSimulator
from network_oracles import NetworkOracle
from pool_oracles import _central


class NetworkTrain(Simulator):
    """Saturating pulses (alternating offsets, or dual), then hard pulses
    with readouts, an exact rectangular pulse and a spoiler."""
    protocol = {"dual": False, "offset": 4000.0, "sat_flip": 300.0, "n_sat": 4, "TR": 5.0, "alternate": True}

    def preparation(self, p):
        ops = []
        for i in range(p["n_sat"]):
            sign = (-1) ** i if p["alternate"] else 1
            ops += [Saturation(p["sat_flip"], 4.0, offset=p["offset"] * sign, dual=p["dual"]), Delay(4.0)]
        return Sequence(ops)

    def repetition(self, p):
        ops = []
        for i in range(6):
            ops += [Pulse(30.0 + 7 * i, phase=(29.0 * i * i) % 360), Readout(), Delay(p["TR"] + i)]
            if i == 2:
                ops += [RectPulse(120.0, 2.0, phase=30.0, offset=150.0), Readout(), Spoil(), Delay(3.0)]
        return Sequence(ops)


def train_oracle(o, p, M0=1.0):
    x = o.equilibrium()
    for i in range(p["n_sat"]):
        sign = (-1) ** i if p["alternate"] else 1
        x = o.saturate(x, p["sat_flip"], 4.0, offset=p["offset"] * sign, dual=p["dual"])
        x = o.evolve(x, 4.0)
    out = []
    for i in range(6):
        x = o.rotate(x, 30.0 + 7 * i, (29.0 * i * i) % 360)
        out.append(o.transverse(x))
        x = o.evolve(x, p["TR"] + i)
        if i == 2:
            x = o.rect(x, 120.0, 2.0, 30.0, 150.0)
            out.append(o.transverse(x))
            x = o.evolve(o.spoil(x), 3.0)
    return M0 * np.array(out)


# Networks of 3 to 5 pools, each (tissue, oracle arguments).
NETWORKS = {
    # three liquid pools, B and C exchanging with each other too
    "liquid-chain": (dict(T1=1100.0, T2=80.0, B0=4.0, poolB_fraction=0.15, poolB_T1=500.0, poolB_T2=20.0,
                          poolB_shift=25.0, poolB_exchange=5.0, poolC_fraction=0.1, poolC_T1=700.0, poolC_T2=40.0,
                          poolC_shift=-40.0, poolC_exchange=0.0, exchange_B_C=30.0),
                     dict(liquid=[(0.15, 500.0, 20.0, 25.0), (0.1, 700.0, 40.0, -40.0)],
                          rates={("A", "B"): 5.0, ("A", "C"): 0.0, ("B", "C"): 30.0})),
    # the white-matter shape: water, myelin water, two semisolid pools, ihMT in the first
    "four-pool": (dict(T1=1000.0, T2=70.0, B0=6.0, B1=0.93, poolB_fraction=0.12, poolB_T1=400.0, poolB_T2=15.0,
                       poolB_shift=20.0, poolB_exchange=2.0, bound_fraction=0.1, bound_T1=900.0, bound_T2=0.012,
                       bound_exchange=0.0, bound2_fraction=0.06, bound2_T1=700.0, bound2_T2=0.009,
                       bound2_exchange=15.0, exchange_B_bound=40.0, exchange_bound_bound2=8.0, exchange_B_bound2=3.0,
                       bound_T1D=6.0),
                  dict(liquid=[(0.12, 400.0, 15.0, 20.0)],
                       semisolid=[(0.1, 900.0, 0.012, 6.0), (0.06, 700.0, 0.009, None)],
                       rates={("A", "B"): 2.0, ("A", "bound"): 0.0, ("A", "bound2"): 15.0, ("B", "bound"): 40.0,
                              ("bound", "bound2"): 8.0, ("B", "bound2"): 3.0}, B1=0.93)),
    # five pools: three liquid, two semisolid, both with dipolar order, every kind of pair
    "five-pool": (dict(T1=1200.0, T2=90.0, B0=-9.0, poolB_fraction=0.08, poolB_T1=450.0, poolB_T2=18.0,
                       poolB_exchange=12.0, poolC_fraction=0.05, poolC_T1=800.0, poolC_T2=30.0, poolC_shift=60.0,
                       poolC_exchange=4.0, bound_fraction=0.09, bound_T1=1000.0, bound_T2=0.011, bound_exchange=25.0,
                       bound2_fraction=0.04, bound2_T1=600.0, bound2_T2=0.014, bound2_exchange=6.0,
                       bound_T1D=4.0, bound2_T1D=9.0, exchange_B_C=20.0, exchange_C_bound=7.0,
                       exchange_B_bound2=11.0, exchange_bound_bound2=3.0),
                  dict(liquid=[(0.08, 450.0, 18.0, 0.0), (0.05, 800.0, 30.0, 60.0)],
                       semisolid=[(0.09, 1000.0, 0.011, 4.0), (0.04, 600.0, 0.014, 9.0)],
                       rates={("A", "B"): 12.0, ("A", "C"): 4.0, ("A", "bound"): 25.0, ("A", "bound2"): 6.0,
                              ("B", "C"): 20.0, ("C", "bound"): 7.0, ("B", "bound2"): 11.0,
                              ("bound", "bound2"): 3.0})),
}


def _oracle(tissue, args):
    return NetworkOracle(tissue["T1"], tissue["T2"], tissue.get("B0", 0.0), **args)


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_networks_against_bloch_mcconnell_provotorov(name, dual):
    """3-5 pools with arbitrary pair rates, dipolar order under single- and
    dual-offset saturation: within 1e-5 of M0, one voxel (the one-problem
    player) and a block of voxels (the lanes)."""
    tissue, args = NETWORKS[name]
    sim = NetworkTrain(dual=dual)
    ref = train_oracle(_oracle(tissue, args), {**NetworkTrain.protocol, "dual": dual})
    np.testing.assert_allclose(sim.simulate(**tissue), ref, atol=1e-5)
    block = sim.simulate(**{k: np.full(19, v) for k, v in tissue.items()})
    np.testing.assert_allclose(block, np.broadcast_to(ref, block.shape), atol=1e-5)


def test_dipolar_order_makes_single_and_dual_saturation_differ():
    """ihMT's premise: with dipolar order, dual-offset saturation of the same
    energy saturates more than single-offset (the first read's signal,
    -i times the saturated Z, is smaller); without it, the same."""
    base = dict(T1=1000.0, T2=70.0, bound_fraction=0.12, bound_exchange=30.0, bound_T1=1000.0, bound_T2=0.012)
    z = {}
    for t1d in (None, 20.0):
        t = base if t1d is None else {**base, "bound_T1D": t1d}
        z[t1d] = [-NetworkTrain(dual=d, n_sat=20, alternate=False).simulate(**t)[0].imag for d in (False, True)]
    assert abs(z[None][0] - z[None][1]) < 1e-5
    assert z[20.0][0] - z[20.0][1] > 5e-3


def test_zero_rates_and_absent_pools_give_the_star():
    """A network whose extra pair rates are zero plays the star's physics
    (through the network players), within float32 round-off."""
    star = dict(T1=900.0, T2=60.0, poolB_fraction=0.1, poolB_exchange=20.0, poolB_T2=10.0, bound_fraction=0.1,
                bound_exchange=25.0)
    a = NetworkTrain().simulate(**star)
    b = NetworkTrain().simulate(**star, exchange_B_bound=0.0)
    np.testing.assert_allclose(b, a, atol=2e-6)


JAC_NAMES = ("exchange_B_bound", "exchange_bound_bound2", "exchange_B_bound2", "bound_T1D", "bound2_fraction",
             "bound2_exchange", "bound2_T1", "bound2_T2", "bound_T2", "poolB_exchange", "T1")


def test_network_jacobian_against_oracle_differences():
    """jacobian() along every pair rate and the new pool properties, against
    central differences of the float64 oracle."""
    tissue, args = NETWORKS["four-pool"]
    p = {**NetworkTrain.protocol, "dual": False}
    sim = NetworkTrain()
    s, J = sim.jacobian(JAC_NAMES, **tissue)
    _check_columns(J, JAC_NAMES, tissue, p)


def _check_columns(J, names, tissue, p, where=""):
    """Each Jacobian column J[i] (one voxel) against the four-pool oracle's
    central differences at ``tissue`` along names[i]."""
    for i, k in enumerate(names):
        h = 1e-4 * abs(tissue[k])

        def at(v):
            t = {**tissue, k: v}
            return train_oracle(_oracle(t, _args_of(t)), p)

        fd = (at(tissue[k] + h) - at(tissue[k] - h)) / (2 * h)
        np.testing.assert_allclose(J[i], fd, rtol=2e-3, atol=2e-6 * max(np.abs(fd).max(), 1e-3), err_msg=k + where)


def _args_of(t):
    """The four-pool oracle's arguments for the tissue t."""
    return dict(liquid=[(t["poolB_fraction"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])],
                semisolid=[(t["bound_fraction"], t["bound_T1"], t["bound_T2"], t["bound_T1D"]),
                           (t["bound2_fraction"], t["bound2_T1"], t["bound2_T2"], None)],
                rates={("A", "B"): t["poolB_exchange"], ("A", "bound"): t["bound_exchange"],
                       ("A", "bound2"): t["bound2_exchange"], ("B", "bound"): t["exchange_B_bound"],
                       ("bound", "bound2"): t["exchange_bound_bound2"], ("B", "bound2"): t["exchange_B_bound2"]},
                B1=t["B1"])


@pytest.mark.parametrize("dual", [False, True])
def test_network_vjp_against_oracle_differences(dual):
    """vjp() along the protocol (saturation flip and offset, TR) and the
    network's rates, in one adjoint sweep, against central differences of
    the oracle."""
    tissue, _ = NETWORKS["four-pool"]
    p = {**NetworkTrain.protocol, "dual": dual}
    sim = NetworkTrain(dual=dual)
    names = ("sat_flip", "offset", "TR", "exchange_B_bound", "bound_T1D")
    s, pullback = sim.vjp(names, **tissue)
    rng = np.random.default_rng(5)
    w = (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)).astype(np.complex64)
    g = pullback(w)

    def loss(pp, tt):
        return float(np.sum(np.real(np.conj(w) * train_oracle(_oracle(tt, _args_of(tt)), pp))))

    for k in names:
        if k in p:
            h = 1e-4 * abs(p[k])
            fd = (loss({**p, k: p[k] + h}, tissue) - loss({**p, k: p[k] - h}, tissue)) / (2 * h)
        else:
            h = 1e-4 * abs(tissue[k])
            fd = (loss(p, {**tissue, k: tissue[k] + h}) - loss(p, {**tissue, k: tissue[k] - h})) / (2 * h)
        np.testing.assert_allclose(g[k], fd, rtol=2e-3, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("tissue, message", [
    (dict(bound_fraction=0.1, exchange_B_bound=3.0), "exchange_B_bound was given without poolB_fraction"),
    (dict(bound2_fraction=0.1), "bound2_fraction was given without bound_fraction"),
    (dict(bound_T1D=5.0), "bound_T1D was given without bound_fraction"),
    (dict(bound_fraction=0.1, bound_T1D=0.0), "bound_T1D must be > 0"),
    (dict(bound_fraction=0.1, bound_T1D=np.nan), "bound_T1D"),
    (dict(poolB_fraction=0.1, bound_fraction=0.1, exchange_B_bound=-1.0), "exchange_B_bound must be >= 0"),
    (dict(bound_fraction=0.6, bound2_fraction=0.5), "pool fractions sum to 1.1"),
])
def test_network_refusals(tissue, message):
    with pytest.raises(ValueError, match=message):
        NetworkTrain().simulate(T1=1000.0, T2=80.0, **tissue)


def test_dual_must_be_a_bool():
    with pytest.raises(TypeError, match="dual of a Saturation must be a bool"):
        Saturation(300.0, 4.0, offset=5000.0, dual="yes")


def _mt_oracle(o, flip, TR, mt_flip, mt_dur, mt_off, n_tr, segments):
    """MTSimulator's last sample, TR by TR, the MT pulse as ``segments``
    exact parts alternating in offset (one part: the single pulse)."""
    x = o.equilibrium()
    for _ in range(n_tr):
        x = o.rotate(x, flip)
        sample = 1j * o.transverse(x)
        x = o.evolve(o.spoil(x), TR - mt_dur)
        phase = 0.0
        for k in range(segments):
            off = mt_off * (1 - 2 * (k % 2)) if segments > 1 else mt_off
            x = o.rect(x, mt_flip / segments, mt_dur / segments, phase % 360.0, off)
            phase += 360.0 * off * mt_dur / segments * 1e-3
        x = o.spoil(x)
    return sample


@pytest.mark.parametrize("mode", ["single", "dual"])
def test_mt_simulator_ihmt_against_the_oracle(mode):
    """MTSimulator with a semisolid pool carrying dipolar order and a
    network, single and (frequency-alternating) dual MT pulses, against the
    oracle's exact pulses; dual saturates more (ihMT)."""
    t = dict(T1=1000.0, T2=60.0, B0=5.0, B1=1.1, bound_fraction=0.12, bound_exchange=25.0, bound_T1=1000.0,
             bound_T2=0.012, bound_T1D=6.0, poolB_fraction=0.1, poolB_T2=15.0, poolB_T1=500.0, poolB_exchange=3.0,
             exchange_B_bound=30.0)
    o = NetworkOracle(1000.0, 60.0, 5.0, liquid=[(0.1, 500.0, 15.0, 0.0)], semisolid=[(0.12, 1000.0, 0.012, 6.0)],
                      rates={("A", "bound"): 25.0, ("A", "B"): 3.0, ("B", "bound"): 30.0}, B1=1.1)
    kw = dict(flip=10.0, TR=30.0, mt_flip=600.0, mt_duration=8.0, mt_offset=6000.0, n_tr=25)
    sim = MTSimulator(**kw, mt_mode=mode, mt_segments=8)
    ref = _mt_oracle(o, 10.0, 30.0, 600.0, 8.0, 6000.0, 25, 8 if mode == "dual" else 1)
    np.testing.assert_allclose(sim.simulate(**t), [ref], atol=1e-5)
    if mode == "dual":
        single = MTSimulator(**kw).simulate(**t)
        assert single[0].real - sim.simulate(**t)[0].real > 2e-3


def test_mt_mode_refusals():
    with pytest.raises(ValueError, match="mt_mode must be 'single' or 'dual', got 'both'"):
        MTSimulator(flip=10.0, TR=30.0, mt_mode="both")
    with pytest.raises(ValueError, match="mt_segments must be even"):
        MTSimulator(flip=10.0, TR=30.0, mt_mode="dual", mt_segments=3)
    with pytest.raises(ValueError, match="must hold whole cycles of the offset, got 1.5"):
        MTSimulator(flip=10.0, TR=30.0, mt_mode="dual", mt_offset=1500.0, mt_duration=8.0, mt_segments=8)


def test_white_matter_preset_is_a_network_and_plays():
    """The preset's pools: free water holds 0.75 of M0, myelin water
    exchanges with the myelin semisolid, which free water does not touch;
    it plays through the oracle's physics on the train."""
    from blochsim.presets import white_matter_four_pool

    wm = white_matter_four_pool()
    assert 1 - wm["poolB_fraction"] - wm["bound_fraction"] - wm["bound2_fraction"] == pytest.approx(0.75)
    assert wm["bound_exchange"] == 0.0 and wm["exchange_B_bound"] > 0 and "bound_T1D" in wm
    assert "bound_T1D" not in white_matter_four_pool(ihmt=False)
    o = NetworkOracle(wm["T1"], wm["T2"], liquid=[(wm["poolB_fraction"], wm["poolB_T1"], wm["poolB_T2"], 0.0)],
                      semisolid=[(wm["bound_fraction"], wm["bound_T1"], wm["bound_T2"], wm["bound_T1D"]),
                                 (wm["bound2_fraction"], wm["bound2_T1"], wm["bound2_T2"], None)],
                      rates={("A", "B"): wm["poolB_exchange"], ("B", "bound"): wm["exchange_B_bound"],
                             ("A", "bound2"): wm["bound2_exchange"]})
    p = dict(NetworkTrain.protocol)
    np.testing.assert_allclose(NetworkTrain().simulate(**wm), train_oracle(o, p), atol=1e-5)


def test_network_jacobian_per_voxel_on_lanes():
    """A block of voxels with their own T1, pair rate and T1D: each voxel's
    Jacobian (the lanes of duals carry one voxel a lane) against the
    oracle's central differences at that voxel."""
    tissue, _ = NETWORKS["four-pool"]
    T1 = np.array([700.0, 1000.0, 1400.0])
    kBb = np.array([10.0, 40.0, 90.0])
    T1D = np.array([2.0, 6.0, 12.0])
    t = {**tissue, "T1": T1, "exchange_B_bound": kBb, "bound_T1D": T1D}
    names = ("T1", "exchange_B_bound", "bound_T1D", "bound2_fraction")
    s, J = NetworkTrain().jacobian(names, **t)
    p = dict(NetworkTrain.protocol)
    for v in range(3):
        one = {**tissue, "T1": T1[v], "exchange_B_bound": kBb[v], "bound_T1D": T1D[v]}
        np.testing.assert_allclose(s[v], train_oracle(_oracle(one, _args_of(one)), p), atol=1e-5)
        _check_columns(J[v], names, one, p, f" at voxel {v}")


# Four saturating pulses (flip deg, duration ms, offset Hz, dual), each
# differing from another in one value only (the offset, dual, the flip),
# played in an order that returns to each after others; swapping any one
# for its neighbour moves a read by more than 7e-5 of M0 in the oracle.
SATURATIONS = ((300.0, 4.0, 4000.0, False), (600.0, 4.0, 1500.0, False), (600.0, 4.0, 1500.0, True),
               (450.0, 4.0, 4000.0, False))
CYCLE = (0, 1, 2, 0, 3, 2, 1, 3, 0, 2, 2, 1)


class SaturationCycle(Simulator):
    """Each saturation of CYCLE followed by a read and a spoiler."""
    protocol = {}

    def repetition(self, p):
        ops = []
        for i in CYCLE:
            flip, dur, off, dual = SATURATIONS[i]
            ops += [Saturation(flip, dur, offset=off, dual=dual), Delay(3.0), Pulse(25.0), Readout(), Delay(2.0),
                    Spoil()]
        return Sequence(ops)


def test_network_saturations_that_recur_against_the_oracle():
    """Saturations that recur among others, on a block of voxels with their
    own B0 and B1 (the lanes keep the last two formed and reuse them): every
    read within 1e-5 of M0 of the oracle's, voxel by voxel."""
    tissue, _ = NETWORKS["four-pool"]
    B0 = np.linspace(-40.0, 40.0, 19)
    B1 = np.linspace(0.8, 1.15, 19)
    s = SaturationCycle().simulate(**{**tissue, "B0": B0, "B1": B1})
    for v in (0, 7, 18):
        one = {**tissue, "B0": B0[v], "B1": B1[v]}
        o = _oracle(one, _args_of(one))
        x, ref = o.equilibrium(), []
        for i in CYCLE:
            flip, dur, off, dual = SATURATIONS[i]
            x = o.evolve(o.saturate(x, flip, dur, offset=off, dual=dual), 3.0)
            x = o.rotate(x, 25.0)
            ref.append(o.transverse(x))
            x = o.spoil(o.evolve(x, 2.0))
        np.testing.assert_allclose(s[v], ref, atol=1e-5, err_msg=f"voxel {v}")


STARS = {
    # free water and the semisolid pool (no dipolar order)
    "mt": (dict(bound_fraction=0.12, bound_exchange=30.0, bound_T1=1000.0, bound_T2=0.012),
           dict(semisolid=[(0.12, 1000.0, 0.012, None)], rates={("A", "bound"): 30.0})),
    # with an exchanging liquid pool beside it
    "Bmt": (dict(bound_fraction=0.1, bound_exchange=25.0, bound_T1=900.0, bound_T2=0.011, poolB_fraction=0.12,
                 poolB_T1=400.0, poolB_T2=15.0, poolB_exchange=10.0),
            dict(liquid=[(0.12, 400.0, 15.0, 0.0)], semisolid=[(0.1, 900.0, 0.011, None)],
                 rates={("A", "bound"): 25.0, ("A", "B"): 10.0})),
}


@pytest.mark.parametrize("name", sorted(STARS))
def test_dual_saturation_of_the_star_off_resonance(name):
    """A dual-offset saturation of the star's semisolid pool (no dipolar
    order) off resonance: half the power at each of +offset and -offset,
    which differ once B0 is not zero; against the oracle, one voxel and a
    block of voxels with their own B0, and the (B0, bound_fraction)
    Jacobian against the oracle's central differences."""
    extra, args = STARS[name]
    p = {**NetworkTrain.protocol, "dual": True, "offset": 700.0, "sat_flip": 600.0, "alternate": False}
    sim = NetworkTrain(dual=True, offset=700.0, sat_flip=600.0, alternate=False)

    def ref(B0, fraction=extra["bound_fraction"]):
        semi = [(fraction,) + args["semisolid"][0][1:]]
        return train_oracle(NetworkOracle(1000.0, 70.0, B0, **{**args, "semisolid": semi}), p)

    single = train_oracle(NetworkOracle(1000.0, 70.0, 150.0, **args), {**p, "dual": False})
    assert np.abs(ref(150.0) - single).max() > 1e-4  # the two sides differ
    np.testing.assert_allclose(sim.simulate(T1=1000.0, T2=70.0, B0=150.0, **extra), ref(150.0), atol=1e-5)
    B0 = np.array([-150.0, 0.0, 60.0, 150.0])
    block = sim.simulate(T1=1000.0, T2=70.0, B0=B0, **extra)
    for v in range(len(B0)):
        np.testing.assert_allclose(block[v], ref(B0[v]), atol=1e-5, err_msg=f"B0 = {B0[v]}")
    s, J = sim.jacobian(("B0", "bound_fraction"), T1=1000.0, T2=70.0, B0=150.0, **extra)
    f = extra["bound_fraction"]
    np.testing.assert_allclose(J[0], (ref(150.05) - ref(149.95)) / 0.1, atol=2e-6)
    np.testing.assert_allclose(J[1], (ref(150.0, f + 1e-4) - ref(150.0, f - 1e-4)) / 2e-4, atol=2e-4)


class RealNetworkTrain(Simulator):
    """Pulses at phases 0 and 180° only, single- and dual-offset
    saturations and spoilers: with no B0 or chemical shift, SPEC §1's real
    subspace."""
    protocol = {}

    def repetition(self, p):
        ops = []
        for i in range(8):
            if i % 2 == 0:
                ops += [Saturation(500.0, 6.0, offset=3000.0, dual=i % 4 == 0), Delay(6.0)]
            ops += [Pulse(20.0 + 9 * i), Readout(), Delay(3.0), Pulse(40.0 + 5 * i, phase=180.0), Readout(),
                    Delay(4.0 + i), Spoil()]
        return Sequence(ops)


def real_train_oracle(o):
    x, out = o.equilibrium(), []
    for i in range(8):
        if i % 2 == 0:
            x = o.evolve(o.saturate(x, 500.0, 6.0, offset=3000.0, dual=i % 4 == 0), 6.0)
        x = o.rotate(x, 20.0 + 9 * i)
        out.append(o.transverse(x))
        x = o.rotate(o.evolve(x, 3.0), 40.0 + 5 * i, 180.0)
        out.append(o.transverse(x))
        x = o.spoil(o.evolve(x, 4.0 + i))
    return np.array(out)


@pytest.mark.parametrize("name", ["four-pool", "five-pool"])
def test_network_on_the_real_planes(name):
    """A network with no B0, B1 phase or chemical shift under pulses at 0
    and 180° plays on the real planes: against the oracle within 1e-5 of
    M0 (a block of voxels with their own T1 and B1), and equal to the
    complex planes (B0 given as zeros) to float32 round-off."""
    tissue, args = NETWORKS[name]
    tissue = {k: v for k, v in tissue.items() if k not in ("B0", "poolB_shift", "poolC_shift")}
    args = {**args, "liquid": [lq[:3] + (0.0,) for lq in args["liquid"]]}
    T1 = np.linspace(700.0, 1500.0, 19)
    B1 = np.linspace(0.85, 1.1, 19)
    t = {**tissue, "T1": T1, "B1": B1}
    sim = RealNetworkTrain()
    s = sim.simulate(**t)
    for v in (0, 9, 18):
        o = NetworkOracle(T1[v], tissue["T2"], 0.0, **{**args, "B1": B1[v]})
        np.testing.assert_allclose(s[v], real_train_oracle(o), atol=1e-5, err_msg=f"voxel {v}")
    np.testing.assert_allclose(s, sim.simulate(**t, B0=np.zeros(19)), atol=2e-6)


def test_network_jacobian_on_the_real_planes():
    """jacobian() of the four-pool network on the real planes (no B0 or
    chemical shift) against the oracle's central differences, on a block
    of voxels with their own T1 and T1D; equal to the complex planes' (B0
    given as zeros) to float32 round-off."""
    tissue, _ = NETWORKS["four-pool"]
    tissue = {**{k: v for k, v in tissue.items() if k not in ("B0", "poolB_shift")}}
    T1 = np.array([700.0, 1000.0, 1400.0])
    T1D = np.array([3.0, 6.0, 12.0])
    names = ("T1", "B1", "exchange_B_bound", "bound_T1D", "bound2_fraction")
    sim = RealNetworkTrain()
    s, J = sim.jacobian(names, **{**tissue, "T1": T1, "bound_T1D": T1D})
    s0, J0 = sim.jacobian(names, **{**tissue, "T1": T1, "bound_T1D": T1D}, B0=np.zeros(3))
    np.testing.assert_allclose(J, J0, atol=2e-6 * np.abs(J0).max())
    for v in range(3):
        one = {**tissue, "T1": T1[v], "bound_T1D": T1D[v], "poolB_shift": 0.0}
        for i, k in enumerate(names):
            h = 1e-4 * abs(one[k])

            def at(x):
                t = {**one, k: x}
                return real_train_oracle(NetworkOracle(t["T1"], t["T2"], 0.0, **_args_of(t)))

            fd = (at(one[k] + h) - at(one[k] - h)) / (2 * h)
            np.testing.assert_allclose(J[v, i], fd, rtol=2e-3, atol=2e-6 * max(np.abs(fd).max(), 1e-3),
                                       err_msg=f"{k} at voxel {v}")


@pytest.mark.parametrize("name", sorted(STARS))
def test_star_saturations_that_recur_against_the_oracle(name):
    """The same cycle of saturations on the star (its fixed-count lanes keep
    the last two formed too), a block of voxels with their own B0 and B1,
    against the oracle within 1e-5 of M0."""
    extra, args = STARS[name]
    B0 = np.linspace(-60.0, 60.0, 17)
    B1 = np.linspace(0.8, 1.15, 17)
    s = SaturationCycle().simulate(T1=1000.0, T2=70.0, B0=B0, B1=B1, **extra)
    for v in (0, 5, 16):
        o = NetworkOracle(1000.0, 70.0, B0[v], **{**args, "B1": B1[v]})
        x, ref = o.equilibrium(), []
        for i in CYCLE:
            flip, dur, off, dual = SATURATIONS[i]
            x = o.rotate(o.evolve(o.saturate(x, flip, dur, offset=off, dual=dual), 3.0), 25.0)
            ref.append(o.transverse(x))
            x = o.spoil(o.evolve(x, 2.0))
        np.testing.assert_allclose(s[v], ref, atol=1e-5, err_msg=f"voxel {v}")
