"""Parallel transmission with per-pulse transmit settings: a shim per pulse
and a kT-points pulse (one waveform per channel), against isochromat Bloch
integrations in float64 written here (hard pulses as right-handed
rotations about an axis in the transverse plane at the pulse's phase plus
arg of the voxel's field, SPEC §2's convention: a 90° pulse at phase 0
takes +z to -y; a sampled pulse one rotation per sample at the centre of
its dwell, with free precession between); the Jacobian along the channels'
maps and the pullbacks to the maps, the shim weights and the tissue
against central differences of those integrations; the device's team
templates on the host; every refusal."""
import numpy as np
import pytest

from blochsim import Delay, Pulse, Readout, SampledPulse, Sequence, Simulator
from blochsim.sequence.operators import GAMMA_RAD_PER_S_PER_T
from test_ptx import FLIPS, MAPS, N_TR, PHASES, SHIM, T1, T2, TR, _central, _rotation, _sim, _SpoiledTrain

RNG = np.random.default_rng(7)
SHIMS = (0.7 + 0.6 * RNG.random((N_TR, 2))) * np.exp(1j * RNG.uniform(-np.pi, np.pi, (N_TR, 2)))


def _train(B, t2=T2, n_iso=256, tr=TR):
    """The spoiled train's samples for a voxel whose field at pulse j is
    B[j] (complex): the mean of n_iso isochromats dephased evenly by each
    shift, float64."""
    theta = 2 * np.pi * np.arange(n_iso) / n_iso
    M = np.zeros((3, n_iso))
    M[2] = 1.0
    E1, E2 = np.exp(-tr / T1), np.exp(-tr / t2)
    out = []
    for a, ph, b in zip(FLIPS, PHASES, B):
        M = _rotation(np.deg2rad(a) * abs(b), np.deg2rad(ph) + np.angle(b)) @ M
        out.append(np.mean(M[0] + 1j * M[1]))
        mxy = (M[0] + 1j * M[1]) * np.exp(-1j * theta) * E2
        M = np.stack([mxy.real, mxy.imag, E1 * M[2] + 1 - E1])
    return np.array(out)


def _train_oracle(S, shims, t2=T2, tr=TR):
    B = shims @ S  # (pulses, voxels)
    return np.stack([_train(B[:, v], t2, tr=tr) for v in range(S.shape[1])])


def test_shim_per_pulse_against_isochromats():
    sim = _sim()
    s = sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIMS)
    assert s.shape == (4, N_TR) and s.dtype == np.complex64
    assert np.max(np.abs(s - _train_oracle(MAPS, SHIMS))) <= 2e-5
    # the same row for every pulse is the static shim
    tiled = sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=np.tile(SHIM, (N_TR, 1)))
    assert np.max(np.abs(tiled - sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIM))) <= 1e-6
    # pulses given their own drive (Pulse.channels) play as the shim's rows
    class Driven(_SpoiledTrain):
        def repetition(self, p):
            ops = []
            for a, ph, w in zip(p["flip"], p["phases"], SHIMS):
                ops += [Pulse(float(a), float(ph), channels=w), Readout(), *_shift_and_relax(p)]
            return Sequence(ops)

    driven = Driven(flip=FLIPS, phases=PHASES, TR=TR, states=N_TR + 2).simulate(T1=T1, T2=T2, B1=MAPS)
    assert np.max(np.abs(driven - s)) <= 1e-6


def test_null_fields_turn_about_the_axis_of_the_change():
    """Channels that cancel in a voxel (B = 0 for some pulses, or for all
    with a static shim): the Jacobian along the maps and the shim's
    pullback still follow the integration, whose pulses turn about the axis
    of the change."""
    S = np.array([[0.8 + 0.1j, 1.0, 0.5j], [0.6 - 0.2j, 1.0, 0.5j]])
    shims = SHIMS.copy()
    shims[::3] = [1.0, -1.0]  # every third pulse cancels in voxels 1 and 2
    sim = _sim()
    for shim in (shims, np.array([1.0, -1.0])):
        rows = shim if shim.ndim == 2 else np.tile(shim, (N_TR, 1))
        s, J = sim.jacobian(("T2", "B1"), T1=T1, T2=T2, B1=S, shim=shim)
        assert np.max(np.abs(s - _train_oracle(S, rows))) <= 2e-5
        _check_map_columns(J[:, 1:], lambda S_: _train_oracle(S_, rows), S)
        h = 1e-6
        s, pullback = sim.vjp(("B1", "shim"), T1=T1, T2=T2, B1=S, shim=shim)
        g = pullback(2 * s)
        for c in range(2):
            for part, unit in ((0, 1.0), (1, 1j)):
                dw = np.zeros(shim.shape, complex)
                if shim.ndim == 2:
                    dw[3, c] = unit
                else:
                    dw[c] = unit
                fd = _central(lambda t: np.sum(np.abs(_train_oracle(S, np.broadcast_to(shim + t * dw, rows.shape)))
                                               ** 2), 0.0, h)
                got = (g["shim"][c] if shim.ndim == 1 else g["shim"][3, c])
                got = got.real if part == 0 else got.imag
                assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-5, (shim.ndim, c, part)


def _check_map_columns(J, oracle, S, h=1e-6):
    """J (voxels, 2 channels, samples): d/dRe S_c then d/dIm S_c of each
    channel's map, against central differences of ``oracle(S)``."""
    for c in range(S.shape[0]):
        for part, unit in ((0, 1.0), (1, 1j)):
            dS = np.zeros_like(S)
            dS[c] = unit
            fd = _central(lambda t: oracle(S + t * dS), 0.0, h)
            assert np.max(np.abs(J[:, 2 * c + part] - fd)) <= 1e-4 * np.max(np.abs(fd)) + 2e-6, (c, part)


def _shift_and_relax(p):
    from blochsim import Dephase
    return [Dephase(1), Delay(p["TR"])]


def test_jacobian_and_pullback_with_a_shim_per_pulse():
    sim = _sim()
    s, J = sim.jacobian(("T2", "B1"), T1=T1, T2=T2, B1=MAPS, shim=SHIMS)
    assert J.shape == (4, 1 + 2 * 2, N_TR)
    np.testing.assert_allclose(s, sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIMS), atol=1e-6)
    _check_map_columns(J[:, 1:], lambda S: _train_oracle(S, SHIMS), MAPS)
    fd = _central(lambda t: _train_oracle(MAPS, SHIMS, t), T2, 1e-4)
    assert np.max(np.abs(J[:, 0] - fd)) <= 1e-4 * np.max(np.abs(fd)) + 1e-7

    target = _train_oracle(MAPS, SHIMS) * 0.9 + 0.01

    def loss(S, shims, t2=T2):
        return float(np.sum(np.abs(_train_oracle(S, shims, t2) - target) ** 2))

    t2 = np.array([55.0, 60.0, 65.0, 70.0])
    s, pullback = sim.vjp(("B1", "shim", "T2", "TR", "phases"), T1=T1, T2=t2, B1=MAPS, shim=SHIMS)
    g = pullback(2 * (s - target))
    assert g["shim"].shape == (N_TR, 2) and g["B1"].shape == MAPS.shape and g["T2"].shape == (4,)
    # the protocol's timing and phases, beside the transmit settings

    def voxel_tr(tr):
        B = SHIMS @ MAPS
        return float(sum(np.sum(np.abs(_train(B[:, v], t2[v], tr=tr) - target[v]) ** 2) for v in range(4)))

    fd = _central(voxel_tr, TR, 1e-4)
    assert np.shape(g["TR"]) == () and abs(g["TR"] - fd) <= 1e-3 * abs(fd) + 1e-6
    assert g["phases"].shape == (N_TR,)

    def voxelwise(S, shims, t2):
        B = shims @ S
        return float(sum(np.sum(np.abs(_train(B[:, v], t2[v]) - target[v]) ** 2) for v in range(4)))

    for v in range(4):
        dt = np.zeros(4)
        dt[v] = 1.0
        fd = _central(lambda t: voxelwise(MAPS, SHIMS, t2 + t * dt), 0.0, 1e-3)
        assert abs(g["T2"][v] - fd) <= 1e-3 * abs(fd) + 1e-6, ("T2", v)
    h = 1e-6
    for row in (0, 7, N_TR - 1):
        for c in range(2):
            for part, unit in ((0, 1.0), (1, 1j)):
                dw = np.zeros_like(SHIMS)
                dw[row, c] = unit
                fd = _central(lambda t: voxelwise(MAPS, SHIMS + t * dw, t2), 0.0, h)
                got = g["shim"][row, c].real if part == 0 else g["shim"][row, c].imag
                assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-5, ("shim", row, c, part)
    for c in range(2):
        for v in (0, 3):
            for part, unit in ((0, 1.0), (1, 1j)):
                dS = np.zeros_like(MAPS)
                dS[c, v] = unit
                fd = _central(lambda t: voxelwise(MAPS + t * dS, SHIMS, t2), 0.0, h)
                got = g["B1"][c, v].real if part == 0 else g["B1"][c, v].imag
                assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-5, ("B1", c, v, part)


# kT-points: four rectangular sub-pulses of 6 samples, each with its own
# channel weights, separated by 3 samples of no RF (where the gradient
# blips would be), dwell 10 µs; a balanced train of them (no spoiling), so
# that every sample of the train is a pathway the per-voxel B0 reaches.
DWELL_US = 10.0
SUB = np.array([[0.9 * np.exp(0.3j), 0.5 * np.exp(-1.1j)],
                [0.4 * np.exp(2.0j), 1.0 * np.exp(0.6j)],
                [0.7 * np.exp(-0.4j), 0.6 * np.exp(1.7j)],
                [0.3 * np.exp(-2.5j), 0.8 * np.exp(-0.2j)]])  # (sub-pulses, channels), µT


def _kt_waveform(sub=SUB):
    cols = []
    for w in sub:
        cols += [w] * 6 + [np.zeros(2)] * 3
    return np.array(cols).T  # (channels, samples)


KT = _kt_waveform()
KT_MAPS = np.array([[1.2 + 0.3j, 0.8 - 0.5j, 0.3 + 0.9j, 1.0, 0.6 + 0.6j],
                    [0.5 - 0.8j, 1.1 + 0.2j, 0.9, -0.4 + 0.7j, 0.2 - 1.0j]])
KT_B0 = np.array([0.0, 35.0, -60.0, 120.0, 15.0])
KT_TR, KT_N, KT_T1, KT_T2 = 6.0, 12, 900.0, 70.0


class _KTPoints(Simulator):
    """A balanced train of kT-points excitations (one waveform per channel)."""

    protocol = {"waveform": KT, "TR": KT_TR, "n": KT_N}
    tissue_properties = ("T1", "T2", "M0", "B1", "B0")

    def repetition(self, p):
        one = Readout() @ Delay(p["TR"]) @ SampledPulse(p["waveform"], DWELL_US)
        return one ** p["n"]


def _free(M, tau_ms, b0, t1=KT_T1, t2=KT_T2):
    E1, E2 = np.exp(-tau_ms / t1), np.exp(-tau_ms / t2)
    mxy = (M[0] + 1j * M[1]) * E2 * np.exp(-2j * np.pi * b0 * tau_ms * 1e-3)
    return np.array([mxy.real, mxy.imag, E1 * M[2] + 1 - E1])


def _kt_voxel(S, b0, wave=KT, t1=KT_T1, t2=KT_T2):
    """The train's samples in one voxel (sensitivities S (channels,)), float64:
    per sample, half a dwell of free precession, the rotation by gamma |B|
    dwell about the axis at arg B, half a dwell again; then TR."""
    per_uT = GAMMA_RAD_PER_S_PER_T * 1e-6 * DWELL_US * 1e-6
    half = 0.5 * DWELL_US * 1e-3
    M = np.array([0.0, 0.0, 1.0])
    out = []
    for _ in range(KT_N):
        for j in range(wave.shape[1]):
            B = S @ wave[:, j]
            M = _free(M, half, b0, t1, t2)
            M = _rotation(per_uT * abs(B), np.angle(B)) @ M
            M = _free(M, half, b0, t1, t2)
        M = _free(M, KT_TR, b0, t1, t2)
        out.append(M[0] + 1j * M[1])
    return np.array(out)


def _kt_oracle(S=KT_MAPS, b0=KT_B0, wave=KT, t2=KT_T2):
    return np.stack([_kt_voxel(S[:, v], b0[v], wave, t2=t2) for v in range(S.shape[1])])


def test_kt_points_against_isochromats():
    sim = _KTPoints(states=4)
    s = sim.simulate(T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    assert s.shape == (5, KT_N)
    ref = _kt_oracle()
    assert np.max(np.abs(ref)) > 0.1
    assert np.max(np.abs(s - ref)) <= 2e-5
    # each channel alone: the other's map at zero
    for c in range(2):
        S = KT_MAPS.copy()
        S[1 - c] = 0.0
        assert np.max(np.abs(sim.simulate(T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=S) - _kt_oracle(S))) <= 2e-5


def test_kt_points_jacobian_and_pullback():
    sim = _KTPoints(states=4)
    s, J = sim.jacobian(("B0", "B1", "T2"), T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    assert J.shape == (5, 1 + 4 + 1, KT_N)
    _check_map_columns(J[:, 1:5], _kt_oracle, KT_MAPS)
    h = 1e-6
    fd = _central(lambda t: _kt_oracle(b0=KT_B0 + t), 0.0, 1e-3)
    assert np.max(np.abs(J[:, 0] - fd)) <= 1e-4 * np.max(np.abs(fd)) + 1e-6
    fd = _central(lambda t: _kt_oracle(t2=t), KT_T2, 1e-3)
    assert np.max(np.abs(J[:, 5] - fd)) <= 1e-4 * np.max(np.abs(fd)) + 1e-7
    # the pullback to the maps: loss = sum |s|^2
    s, pullback = sim.vjp("B1", T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    g = pullback(2 * s)["B1"]
    assert g.shape == KT_MAPS.shape and g.dtype == np.complex128
    for c in range(2):
        for v in (1, 4):
            for part, unit in ((0, 1.0), (1, 1j)):
                dS = np.zeros_like(KT_MAPS)
                dS[c, v] = unit
                fd = _central(lambda t: np.sum(np.abs(_kt_oracle(KT_MAPS + t * dS)) ** 2), 0.0, h)
                got = g[c, v].real if part == 0 else g[c, v].imag
                assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-5, (c, v, part)


def test_kt_points_pullback_to_the_channel_waveforms():
    """vjp with respect to the waveform of each channel (a protocol
    parameter of the simulator): dL/dRe + i dL/dIm of every sample, against
    central differences of the isochromat integration; the gaps' samples
    (no RF) get theirs too."""
    sim = _KTPoints(states=4)
    s, pullback = sim.vjp(("waveform", "B1"), T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    target = 0.5 * _kt_oracle()
    g = pullback(2 * (s - target))
    assert g["waveform"].shape == KT.shape and g["waveform"].dtype == np.complex128

    def loss(wave):
        return float(np.sum(np.abs(_kt_oracle(wave=wave) - target) ** 2))

    h = 1e-6
    for c, j in ((0, 0), (1, 3), (0, 7), (1, 14), (0, 32)):
        for part, unit in ((0, 1.0), (1, 1j)):
            dw = np.zeros_like(KT)
            dw[c, j] = unit
            fd = _central(lambda t: loss(KT + t * dw), 0.0, h)
            got = g["waveform"][c, j].real if part == 0 else g["waveform"][c, j].imag
            assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-4, (c, j, part, got, fd)
    # the maps' pullback in the same call, as without the waveform
    g_maps = sim.vjp("B1", T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)[1](2 * (s - target))["B1"]
    np.testing.assert_allclose(g["B1"], g_maps, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", [4, 5])
def test_device_team_templates_play_the_settings(variant):
    """The device's register teams (emulated on the host) load each
    setting for their problem as the host lanes do."""
    sim = _KTPoints(states=4)
    want = sim.simulate(T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    s0, J0 = sim.jacobian(("T2", "B1"), T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
    sim._host_variant = variant
    try:
        np.testing.assert_allclose(sim.simulate(T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS), want, atol=2e-6)
        s, J = sim.jacobian(("T2", "B1"), T1=KT_T1, T2=KT_T2, B0=KT_B0, B1=KT_MAPS)
        np.testing.assert_allclose(J, J0, atol=2e-5 * np.abs(J0).max())
    finally:
        sim._host_variant = 0


def test_refusals():
    from pool_oracles import _FakeDeviceArray

    sim = _sim()
    with pytest.raises(ValueError, match=r"shim per pulse must have shape \(pulses, channels\) = \(40, 2\)"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=np.ones((N_TR - 1, 2)))
    with pytest.raises(ValueError, match="per-pulse transmit settings .* play on the single-pool kernels; pools"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIMS, bound_fraction=0.1, bound_exchange=20.0)
    import blochsim
    if not blochsim.backends()["cuda"]["available"]:
        with pytest.raises(RuntimeError, match="device='cuda' was asked for, but the CUDA backend cannot run"):
            _SpoiledTrain(flip=FLIPS, phases=PHASES, TR=TR, device="cuda").simulate(T1=T1, T2=T2, B1=MAPS,
                                                                                   shim=SHIMS)
    with pytest.raises(ValueError, match="B1: device array with a null pointer"):
        sim.simulate(T1=T1, T2=T2, B1=_FakeDeviceArray(), shim=SHIMS)
    with pytest.raises(ValueError, match="'flip' also reaches the pulses' nominal flips, which it does not"):
        from blochsim.simulators import MRFSimulator
        MRFSimulator(flip=FLIPS[:10], TR=TR).vjp(("flip", "shim"), T1=T1, T2=T2, B1=MAPS, shim=SHIMS[:10])
    with pytest.raises(ValueError, match="a shim per pulse needs a known number of pulses"):
        sim.simulate(T1=T1, T2=T2, B1=MAPS, shim=SHIMS, repetitions="auto")
    with pytest.raises(ValueError, match="jacobian_vjp does not take a multi-channel B1"):
        sim.jacobian_vjp("T2", "flip", T1=T1, T2=T2, B1=MAPS, shim=SHIMS)
    from blochsim.simulators import DESPOT1Simulator
    with pytest.raises(ValueError, match=r"DESPOT1Simulator is a closed form, whose pulses share one shim"):
        DESPOT1Simulator(flip=np.array([3.0, 15.0]), TR=5.0).simulate(T1=1000.0, B1=MAPS, shim=np.ones((2, 2)))
    kt = _KTPoints(states=4)
    with pytest.raises(ValueError, match=r"pulses drive 2 transmit channel\(s\) but B1 has 3 on its first axis"):
        kt.simulate(T1=KT_T1, T2=KT_T2, B1=np.ones((3, 5), complex))
    with pytest.raises(ValueError, match=r"the sequence's pulses drive transmit channels .*pass B1 as the channels'"):
        kt.simulate(T1=KT_T1, T2=KT_T2)
    with pytest.raises(ValueError, match="per-pulse transmit settings do not combine with slice_profile"):
        _KTPoints(states=4, slice_profile=([0.9, 1.0], [0.5, 0.5])).simulate(T1=KT_T1, T2=KT_T2, B1=KT_MAPS)
    with pytest.raises(ValueError, match="channels of a Pulse must be finite"):
        Pulse(10.0, channels=[1.0, np.nan])
    with pytest.raises(ValueError, match="channels of a Pulse must be a non-empty 1-D sequence"):
        Pulse(10.0, channels=np.ones((2, 2)))
    with pytest.raises(TypeError, match="channels of a Pulse must be numbers"):
        Pulse(10.0, channels=["a", "b"])
    with pytest.raises(ValueError, match=r"pulses drive different numbers of transmit channels: \[1, 2\]"):
        class Mixed(_KTPoints):
            def repetition(self, p):
                return Readout() @ Pulse(5.0, channels=[1.0]) @ Pulse(5.0, channels=[1.0, 1j])
        Mixed().simulate(T1=KT_T1, T2=KT_T2, B1=KT_MAPS)
    with pytest.raises(ValueError, match=r"waveform must be a non-empty array of shape \(channels, samples\)"):
        SampledPulse(np.ones((2, 0)), 10.0)
    with pytest.raises(TypeError, match="channels of a Pulse must be numbers, one per transmit channel, got obj"):
        Pulse(10.0, channels=np.array([object(), 1.0], dtype=object))


def test_jacobian_of_the_tissue_alone_with_settings():
    """Per-pulse settings and a Jacobian along the tissue only: one pass,
    as the Jacobian along the maps gives those columns."""
    sim = _sim()
    s, J = sim.jacobian("T2", T1=T1, T2=T2, B1=MAPS, shim=SHIMS)
    s2, J2 = sim.jacobian(("T2", "B1"), T1=T1, T2=T2, B1=MAPS, shim=SHIMS)
    assert J.shape == (4, N_TR)
    np.testing.assert_allclose(J, J2[:, 0], rtol=1e-6, atol=1e-9)
    fd = _central(lambda t: _train_oracle(MAPS, SHIMS, t), T2, 1e-4)
    assert np.max(np.abs(J - fd)) <= 1e-4 * np.max(np.abs(fd)) + 1e-7
