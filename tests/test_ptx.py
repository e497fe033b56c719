"""Static parallel transmission (B1 complex with a channel axis, shim
weights): against an isochromat Bloch integration in float64 written here
(hard pulses as right-handed rotations about an axis in the transverse
plane at the pulse's phase plus arg of the voxel's field, SPEC §2's
convention: a 90° pulse at phase 0 takes +z to -y), its Jacobian with
respect to the channel maps and the pullback with respect to the maps and
the shim weights against central differences of that integration, and
every refusal."""
import numpy as np
import pytest

from blochsim import Dephase, Delay, Pulse, Readout, Sequence, Simulator
from blochsim.simulators import MRFSimulator

N_TR = 40


class _SpoiledTrain(Simulator):
    """Per TR: a pulse (RF-spoiled phases), a readout, one shift, relaxation."""

    protocol = {"flip": np.full(N_TR, 30.0), "phases": np.zeros(N_TR), "TR": 8.0}
    tissue_properties = ("T1", "T2", "M0", "B1")

    def repetition(self, p):
        ops = []
        for a, ph in zip(p["flip"], p["phases"]):
            ops += [Pulse(float(a), float(ph)), Readout(), Dephase(1), Delay(p["TR"])]
        return Sequence(ops)


FLIPS = 15.0 + 45.0 * np.sin(np.linspace(0.0, np.pi, N_TR)) ** 2
PHASES = 0.5 * 117.0 * np.arange(N_TR) * (np.arange(N_TR) + 1) % 360.0
T1, T2, TR = 800.0, 60.0, 8.0


def _rotation(alpha, psi):
    """Right-handed rotation by alpha about (cos psi, sin psi, 0)."""
    n = np.array([np.cos(psi), np.sin(psi), 0.0])
    K = np.array([[0, -n[2], n[1]], [n[2], 0, -n[0]], [-n[1], n[0], 0]])
    return np.eye(3) + np.sin(alpha) * K + (1 - np.cos(alpha)) * K @ K


def _isochromats(B, t2=T2, n_iso=256):
    """The train's samples for a voxel whose field is the complex B: the
    mean of n_iso isochromats dephased evenly by each shift, float64."""
    theta = 2 * np.pi * np.arange(n_iso) / n_iso
    M = np.zeros((3, n_iso))
    M[2] = 1.0
    E1, E2 = np.exp(-TR / T1), np.exp(-TR / t2)
    out = []
    for a, ph in zip(FLIPS, PHASES):
        M = _rotation(np.deg2rad(a) * abs(B), np.deg2rad(ph) + np.angle(B)) @ M
        out.append(np.mean(M[0] + 1j * M[1]))
        mxy = (M[0] + 1j * M[1]) * np.exp(-1j * theta) * E2
        M = np.stack([mxy.real, mxy.imag, E1 * M[2] + 1 - E1])
    return np.array(out)


def _oracle(S, w, t2=T2):
    B = np.tensordot(w, S, axes=(0, 0))
    return np.stack([_isochromats(b, t2) for b in B.ravel()]).reshape(B.shape + (N_TR,))


MAPS = np.array([[0.7 + 0.2j, 0.5 - 0.3j, 0.1 + 0.6j, 0.45],
                 [0.3 - 0.4j, 0.6 + 0.1j, 0.55, -0.2 + 0.5j]])  # (channels, voxels)
SHIM = np.array([0.9 * np.exp(0.4j), 1.1 * np.exp(-1.2j)])


def _sim():
    return _SpoiledTrain(flip=FLIPS, phases=PHASES, TR=TR, states=N_TR + 2)


def test_static_shim_against_isochromats():
    s = _sim().simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIM)
    assert s.shape == (4, N_TR) and s.dtype == np.complex64
    ref = _oracle(MAPS, SHIM)
    assert np.max(np.abs(s - ref)) <= 2e-5
    # without shim weights every channel drives with weight 1
    assert np.max(np.abs(_sim().simulate(T1=T1, T2=T2, B1=MAPS) - _oracle(MAPS, np.ones(2)))) <= 2e-5
    # the shim in the constructor; a real map with one weight is one channel
    s2 = _SpoiledTrain(flip=FLIPS, phases=PHASES, TR=TR, states=N_TR + 2, shim=SHIM).simulate(T1=T1, T2=T2, B1=MAPS)
    np.testing.assert_array_equal(s2, s)
    b1 = np.array([0.8, 1.0, 1.2])
    w1 = np.array([0.95 * np.exp(0.3j)])
    s3 = _sim().simulate(T1=T1, T2=T2, B1=b1, shim=w1)
    assert np.max(np.abs(s3 - _oracle(b1[None].astype(complex), w1))) <= 2e-5


def test_shim_on_a_shipped_simulator_with_pools():
    """MRFSimulator's train with a semisolid pool: the phase of the field
    multiplies the samples of |B| exactly (a rotation about z)."""
    sim = MRFSimulator(flip=FLIPS, TR=TR, phases=PHASES)
    B = np.tensordot(SHIM, MAPS, axes=(0, 0))
    pools = dict(bound_fraction=0.12, bound_exchange=25.0)
    ref = np.exp(1j * np.angle(B))[:, None] * sim.simulate(T1=T1, T2=T2, B1=np.abs(B), **pools)
    s = sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIM, **pools)
    np.testing.assert_allclose(s, ref, rtol=1e-6, atol=1e-7)


def _central(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


def test_jacobian_with_respect_to_the_channel_maps():
    s, J = _sim().jacobian(("T2", "B1"), T1=T1, T2=T2, B1=MAPS, shim=SHIM)
    assert J.shape == (4, 1 + 2 * 2, N_TR)
    h = 1e-6
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            def f(t, c=c, unit=unit):
                S = MAPS.copy()
                S[c] += t * unit
                return _oracle(S, SHIM)
            fd = _central(f, 0.0, h)
            got = J[:, 1 + 2 * c + part]
            assert np.max(np.abs(got - fd)) <= 1e-4 * np.max(np.abs(fd)) + 2e-6, (c, part)
    # T2's column against the oracle's
    fd = _central(lambda t: _oracle(MAPS, SHIM, t), T2, 1e-4)
    assert np.max(np.abs(J[:, 0] - fd)) <= 1e-4 * np.max(np.abs(fd)) + 1e-7


def test_pullback_with_respect_to_maps_and_shim_weights():
    rng = np.random.default_rng(2)
    cot = rng.standard_normal((4, N_TR)) + 1j * rng.standard_normal((4, N_TR))
    s, pull = _sim().vjp(("shim", "B1", "T2"), T1=T1, T2=T2, B1=MAPS, shim=SHIM)
    np.testing.assert_allclose(s, _sim().simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIM), rtol=1e-6, atol=1e-7)
    g = pull(cot)
    assert g["shim"].shape == (2,) and np.iscomplexobj(g["shim"])
    assert g["B1"].shape == MAPS.shape and np.iscomplexobj(g["B1"])

    def loss(S, w):
        return np.sum((np.conj(cot) * _oracle(S, w)).real)

    h = 1e-6
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            dw = np.zeros(2, complex)
            dw[c] = unit
            fd = _central(lambda t: loss(MAPS, SHIM + t * dw), 0.0, h)
            got = g["shim"][c].real if part == 0 else g["shim"][c].imag
            assert abs(got - fd) <= 1e-4 * abs(fd) + 1e-5, ("shim", c, part)
            for v in range(4):
                dS = np.zeros_like(MAPS)
                dS[c, v] = unit
                fd = _central(lambda t: loss(MAPS + t * dS, SHIM), 0.0, h)
                got = g["B1"][c, v].real if part == 0 else g["B1"][c, v].imag
                assert abs(got - fd) <= 1e-4 * abs(fd) + 1e-5, ("B1", c, v, part)


def test_refusals():
    from pool_oracles import _FakeDeviceArray

    sim = _sim()
    with pytest.raises(ValueError, match=r"shim has 3 weights per pulse but B1 has 2 channel\(s\) on its first axis"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=np.ones(3))
    with pytest.raises(ValueError, match="a complex B1 holds the channels' sensitivities on its first axis"):
        sim.simulate(T1=T1, T2=T2, B1=0.5 + 0.5j)
    with pytest.raises(ValueError, match="shim weights need the channels' transmit sensitivities"):
        sim.simulate(T1=T1, T2=T2, shim=SHIM)
    with pytest.raises(ValueError, match="shim must be finite"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="must be finite"):
        sim.simulate(T1=T1, T2=T2, B1=np.array([[np.nan + 0j], [1.0]]))
    with pytest.raises(TypeError, match="shim must be complex numbers, one per channel"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=np.array(["a", "b"]))
    with pytest.raises(ValueError, match="jacobian_vjp does not take a multi-channel B1"):
        sim.jacobian_vjp("T2", "flip", T1=T1, T2=T2, B1=MAPS)
    with pytest.raises(ValueError, match="shim is a protocol parameter"):
        sim.jacobian(("T2", "shim"), T1=T1, T2=T2, B1=MAPS)
    # a device map is validated as one before anything runs
    with pytest.raises(ValueError, match="B1: device array with a null pointer"):
        sim.simulate(T1=T1, T2=T2, B1=_FakeDeviceArray(), shim=SHIM)
    with pytest.raises(ValueError, match=r"shim must have shape \(channels,\)"):
        _SpoiledTrain(flip=FLIPS, phases=PHASES, TR=TR, shim=np.ones((2, 2, 2))).simulate(T1=T1, T2=T2, B1=MAPS)


def _spgr(B, flips, TR=5.0, TE=2.0, T1=1000.0, T2star=30.0):
    """Ernst's spoiled gradient echo at the field B (complex), float64: the
    flip scaled by |B| and the transmit phase arg(B) on the sample."""
    a = np.deg2rad(flips)[None] * np.abs(B)[:, None]
    E1 = np.exp(-TR / T1)
    return np.exp(1j * np.angle(B))[:, None] * np.sin(a) * (1 - E1) / (1 - E1 * np.cos(a)) * np.exp(-TE / T2star)


def test_null_field_on_a_closed_form():
    """DESPOT1 where two channels cancel (B = 0): the signal is sin(a|B|)
    e^{i arg B} ~ a B, so the Jacobian along each map and the shim's
    pullback are those of a B, in both real and imaginary parts."""
    from blochsim.simulators import DESPOT1Simulator

    flips = np.array([3.0, 8.0, 15.0])
    S = np.array([[0.8 + 0.1j, 1.0], [0.6 - 0.2j, 1.0]])
    w = np.array([1.0, -1.0 + 0j])
    sim = DESPOT1Simulator(flip=flips, TR=5.0, TE=2.0)
    s, J = sim.jacobian("B1", T1=1000.0, T2star=30.0, B1=S, shim=w)
    assert s.shape == (2, 3) and J.shape == (2, 4, 3)
    h = 1e-7
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            dS = np.zeros_like(S)
            dS[c] = unit
            fd = _central(lambda t: _spgr(np.tensordot(w, S + t * dS, axes=(0, 0)), flips), 0.0, h)
            np.testing.assert_allclose(J[:, 2 * c + part], fd, rtol=1e-5, atol=1e-8)
    s, pull = sim.vjp(("shim", "B1"), T1=1000.0, T2star=30.0, B1=S, shim=w)
    g = pull(np.ones_like(s))
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            dw = np.zeros(2, complex)
            dw[c] = unit
            fd = _central(lambda t: np.sum(np.real(_spgr(np.tensordot(w + t * dw, S, axes=(0, 0)), flips))), 0.0, h)
            got = g["shim"][c].real if part == 0 else g["shim"][c].imag
            assert abs(got - fd) <= 1e-5 * abs(fd) + 1e-8, (c, part)


def test_static_shim_on_closed_forms():
    """DESPOT1 (closed form) against Ernst's formula at the combined field;
    its Jacobian along the maps and the shim pullback against central
    differences of the formula; MP2RAGE's uniform image does not see the
    transmit phase."""
    from blochsim.simulators import DESPOT1Simulator, MP2RAGESimulator

    flips = np.array([3.0, 8.0, 15.0, 25.0])
    sim = DESPOT1Simulator(flip=flips, TR=5.0, TE=2.0)
    s = sim.simulate(T1=1000.0, T2star=30.0, B1=MAPS, shim=SHIM)
    assert s.dtype == np.complex128
    np.testing.assert_allclose(s, _spgr(np.tensordot(SHIM, MAPS, axes=(0, 0)), flips), rtol=1e-12, atol=1e-15)
    _, J = sim.jacobian(("T1", "B1"), T1=1000.0, T2star=30.0, B1=MAPS, shim=SHIM)
    assert J.shape == (4, 5, 4)
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            dS = np.zeros_like(MAPS)
            dS[c] = unit
            fd = _central(lambda t: _spgr(np.tensordot(SHIM, MAPS + t * dS, axes=(0, 0)), flips), 0.0, 1e-6)
            np.testing.assert_allclose(J[:, 1 + 2 * c + part], fd, rtol=1e-6, atol=1e-10)
    cot = np.exp(1j * np.arange(16.0)).reshape(4, 4)
    _, pull = sim.vjp(("shim",), T1=1000.0, T2star=30.0, B1=MAPS, shim=SHIM)
    g = pull(cot)["shim"]
    for c in range(2):
        for part, unit in ((0, 1.0), (1, 1j)):
            dw = np.zeros(2, complex)
            dw[c] = unit
            fd = _central(lambda t: np.sum((np.conj(cot) * _spgr(np.tensordot(SHIM + t * dw, MAPS, axes=(0, 0)),
                                                                   flips)).real), 0.0, 1e-6)
            assert abs((g[c].real if part == 0 else g[c].imag) - fd) <= 1e-6 * abs(fd) + 1e-12
    mp2 = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)
    B = np.tensordot(SHIM, MAPS, axes=(0, 0))
    uni = mp2.uni(mp2.simulate(T1=1500.0, B1=MAPS, shim=SHIM))
    np.testing.assert_allclose(uni, mp2.uni(mp2.simulate(T1=1500.0, B1=np.abs(B))), rtol=1e-10, atol=1e-12)


def test_dask_arrays_with_channels():
    """A multi-channel B1 of Dask arrays (channels, *voxels), chunked along
    the voxels (and the channels): simulate, jacobian and vjp as the NumPy
    call gives them, static and per pulse; the maps' gradient chunked as
    the maps, the shim's summed over the chunks."""
    da = pytest.importorskip("dask.array")
    T2 = da.from_array(np.array([40.0, 60.0, 80.0, 100.0]), chunks=2)
    maps = da.from_array(MAPS, chunks=(1, 2))
    shims = np.exp(1j * np.linspace(0.0, 1.0, N_TR))[:, None] * SHIM
    sim = _sim()
    for shim in (SHIM, shims):
        ref = sim.simulate(T1=T1, T2=T2.compute(), B1=MAPS, shim=shim)
        got = sim.simulate(T1=T1, T2=T2, B1=maps, shim=shim)
        assert isinstance(got, da.Array) and got.chunks[0] == (2, 2)
        np.testing.assert_array_equal(got.compute(), ref)
        s0, J0 = sim.jacobian(("T2", "B1"), T1=T1, T2=T2.compute(), B1=MAPS, shim=shim)
        s1, J1 = sim.jacobian(("T2", "B1"), T1=T1, T2=T2, B1=maps, shim=shim)
        np.testing.assert_array_equal(J1.compute(), J0)
        w = np.exp(1j * np.arange(ref.size) / 7.0).reshape(ref.shape)
        g0 = sim.vjp(("B1", "shim", "T2"), T1=T1, T2=T2.compute(), B1=MAPS, shim=shim)[1](w)
        g1 = sim.vjp(("B1", "shim", "T2"), T1=T1, T2=T2, B1=maps, shim=shim)[1](w)
        assert g1["B1"].shape == MAPS.shape and g1["shim"].shape == np.shape(shim)
        np.testing.assert_allclose(g1["B1"].compute(), g0["B1"], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(g1["shim"].compute(), g0["shim"], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(g1["T2"].compute(), g0["T2"], rtol=1e-6, atol=1e-12)

