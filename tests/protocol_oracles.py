"""Oracles and helpers the simulator-family tests share (imported by them:
pytest puts tests/ on the path): isochromats, stepped recursions, played
versions of closed-form protocols, a finite-difference check."""
import numpy as np

from blochsim import Delay, Inversion, Pulse, Readout, Simulator, Spoil
from blochsim.sequence import Sequence


MP2 = dict(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)


def _pulse(a_rad, phase_rad):
    """The rotation of a hard pulse of flip a about (cos phase, sin phase,
    0), by Rodrigues' formula (SPEC §2's convention: phase 0 tips Z onto -y)."""
    u = np.array([np.cos(phase_rad), np.sin(phase_rad), 0.0])
    K = np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    return np.eye(3) + np.sin(a_rad) * K + (1 - np.cos(a_rad)) * K @ K


def _geometric_oracle(T1, TI, flip, TR, TR_gre, n, eta=1.0, B1=1.0, M0=1.0):
    """The MPnRAGE steady state in closed form (the MP2RAGE equation of
    Marques et al. 2010 generalised to any number of blocks): per block the
    n pulses act as Z -> Z r^n + (1 - E1)(1 - r^n)/(1 - r), r = cos(a) E1;
    the inversion, the gaps and the blocks compose to Z -> A Z + B over one
    TR, whose fixed point is the steady state."""
    TI, flip = np.atleast_1d(TI), np.broadcast_to(np.radians(flip), np.shape(np.atleast_1d(TI)))
    c = n // 2
    E1 = np.exp(-TR_gre / T1)
    starts, ends = TI - c * TR_gre, TI - c * TR_gre + n * TR_gre
    gaps = np.diff(np.concatenate([[0.0], np.ravel(np.stack([starts, ends], 1)), [TR]]))[0::2]
    A, B = -eta, 0.0
    for i in range(len(TI)):
        E = np.exp(-gaps[i] / T1)
        A, B = A * E, B * E + 1 - E
        r = np.cos(B1 * flip[i]) * E1
        A, B = A * r ** n, B * r ** n + (1 - E1) * (1 - r ** n) / (1 - r)
    E = np.exp(-gaps[-1] / T1)
    A, B = A * E, B * E + 1 - E
    z = B / (1 - A)
    out, zc = [], -eta * z  # Z after the inversion
    for i in range(len(TI)):
        E = np.exp(-gaps[i] / T1)
        zc = zc * E + 1 - E
        r = np.cos(B1 * flip[i]) * E1
        out.append(M0 * np.sin(B1 * flip[i]) * (zc * r ** c + (1 - E1) * (1 - r ** c) / (1 - r)))
        zc = zc * r ** n + (1 - E1) * (1 - r ** n) / (1 - r)
    return np.array(out)


def _stepped_oracle(T1, TI, flip, TR, TR_gre, n, eta=1.0, repetitions=40):
    """The same protocol stepped pulse by pulse on the longitudinal
    magnetisation (ideal spoiling), repeated until periodic."""
    TI, flip = np.atleast_1d(TI), np.broadcast_to(np.radians(flip), np.shape(np.atleast_1d(TI)))
    c = n // 2
    z = 1.0
    for _ in range(repetitions):
        z, t, out = -eta * z, 0.0, []
        for i in range(len(TI)):
            t_pulse = TI[i] - c * TR_gre
            for k in range(n):
                z = 1 + (z - 1) * np.exp(-(t_pulse - t) / T1)
                if k == c:
                    out.append(np.sin(flip[i]) * z)
                z, t = z * np.cos(flip[i]), t_pulse
                t_pulse += TR_gre
            z, t = 1 + (z - 1) * np.exp(-(t_pulse - t) / T1), t_pulse
        z = 1 + (z - 1) * np.exp(-(TR - t) / T1)
    return np.array(out)


def _jacobian_matches_differences(sim, t, names, J, step=1e-6, rtol=1e-6, atol=1e-12):
    """J (voxels, names, samples) against central differences of
    sim.simulate in each name, steps relative to the largest value."""
    for i, k in enumerate(names):
        h = step * np.max(np.abs(t[k]))
        fd = (sim.simulate(**{**t, k: t[k] + h}).astype(complex) - sim.simulate(**{**t, k: t[k] - h})) / (2 * h)
        np.testing.assert_allclose(J[:, i], fd, rtol=rtol, atol=atol, err_msg=k)


class PlayedMP2RAGE(Simulator):
    """MP2RAGE through the EPG engine: inversion, two blocks of pulse,
    readout, spoil, relaxation; the samples at the k-space centres."""
    protocol = dict(MP2)
    tissue_properties = ("T1", "T2", "M0", "B1", "inv_efficiency")

    def repetition(self, p):
        n, c, tr = p["n_readouts"], p["n_readouts"] // 2, p["TR_gre"]
        ops, now = [Inversion()], 0.0
        for i, TI in enumerate(p["TI"]):
            start = TI - c * tr
            ops.append(Delay(start - now))
            for k in range(n):
                ops += [Pulse(p["flip"][i]), Readout(), Spoil(), Delay(tr)]
            now = start + n * tr
        ops.append(Delay(p["TR"] - now))
        return Sequence(ops)


def _flash_isochromats(flip, TR, TE, n, inc, T1, T2, B1=1.0, B0=0.0, M0=1.0, inversion=False, TI=0.0, N=512):
    """FLASH by an ensemble of N isochromats whose dephasing per TR is
    2 pi j / N (Bloch rotations about (cos phi, sin phi, 0), relaxation,
    B0 precession), averaged at each echo."""
    theta = 2 * np.pi * np.arange(N) / N
    fp = np.zeros(N, complex)  # Mx + i My per isochromat
    mz = np.ones(N)

    def relax(fp, mz, t):
        return fp * np.exp(-t / T2) * np.exp(-2j * np.pi * B0 * t * 1e-3), 1 + (mz - 1) * np.exp(-t / T1)

    if inversion:
        fp, mz = relax(fp, -mz, TI)
    out = []
    for k in range(n):
        phi = np.radians(inc * k * (k + 1) / 2)
        a = np.radians(np.broadcast_to(flip, (n,))[k]) * B1
        m = _pulse(a, phi) @ np.stack([fp.real, fp.imag, mz])
        fp, mz = m[0] + 1j * m[1], m[2]
        fp, mz = relax(fp, mz, TE)
        out.append(M0 * np.mean(fp) * np.exp(-1j * (phi - np.pi / 2)))
        fp = fp * np.exp(1j * theta)
        fp, mz = relax(fp, mz, TR - TE)
    return np.array(out)


def _bloch_dwell(m, b1_rad_per_ms, dwell_ms, T1, T2, B0):
    """Isochromats m (3, N) through one dwell of constant RF (b1: complex
    rad/ms, its angle the RF phase) by the exact exponential of the Bloch
    equation with relaxation and off-resonance (4x4 affine generator)."""
    from scipy.linalg import expm
    w1, phi, w0 = abs(b1_rad_per_ms), np.angle(b1_rad_per_ms), 2 * np.pi * B0 * 1e-3
    u = (np.cos(phi), np.sin(phi), 0.0)
    G = np.zeros((4, 4))
    G[:3, :3] = w1 * np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    G[:3, :3] += np.array([[-1 / T2, w0, 0], [-w0, -1 / T2, 0], [0, 0, -1 / T1]])
    G[2, 3] = 1 / T1
    E = expm(G * dwell_ms)
    return E[:3, :3] @ m + E[:3, 3:4]


TES = np.array([3.0, 8.0, 14.0, 25.0])


def _irbssfp_isochromat(flip, TR, TE, n, TI, T1, T2, B0=0.0, B1=1.0, eta=1.0, M0=1.0):
    """One isochromat (the train is balanced): inversion, TI, -a/2 at phase
    180, TR/2, then pulses of alternating phase sampled TE after each with
    the receiver following; times i."""
    m = np.array([0.0, 0.0, -eta])

    def rot(m, a_deg, phi_deg):
        return _pulse(np.radians(a_deg) * B1, np.radians(phi_deg)) @ m

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2) * np.exp(-2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    m = free(m, TI)
    m = free(rot(m, flip / 2, 180.0), TR / 2)
    out = []
    for k in range(n):
        ph = 180.0 * (k % 2)
        m = free(rot(m, flip, ph), TE)
        out.append(1j * M0 * (m[0] + 1j * m[1]) * np.exp(-1j * np.radians(ph)))
        m = free(m, TR - TE)
    return np.array(out)


def _dess_isochromats(flip, TR, TE, n, T1, T2, B0=0.0, B1=1.0, M0=1.0, N=1024):
    """DESS by an ensemble of N isochromats dephased 2 pi j / N by each TR's
    gradient: the two echoes of the n-th TR, times i."""
    theta = 2 * np.pi * np.arange(N) / N
    fp, mz = np.zeros(N, complex), np.ones(N)
    a = np.radians(flip) * B1

    def free(fp, mz, t):
        return fp * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3), 1 + (mz - 1) * np.exp(-t / T1)

    for _ in range(n):
        # a phase-0 pulse about x: F+ = Mx + i My
        mx, my = fp.real, fp.imag
        my, mz = my * np.cos(a) - mz * np.sin(a), my * np.sin(a) + mz * np.cos(a)
        fp = mx + 1j * my
        fp, mz = free(fp, mz, TE)
        s1 = 1j * M0 * np.mean(fp)
        fp = fp * np.exp(1j * theta)
        fp, mz = free(fp, mz, TR - 2 * TE)
        s2 = 1j * M0 * np.mean(fp)
        fp, mz = free(fp, mz, TE)
    return np.array([s1, s2])


def _fmssfp_isochromat(flip, TR, TE, n, inc, sweep, T1, T2, B0=0.0, B1=1.0):
    """One isochromat under the swept-phase balanced train, times i."""
    m = np.array([0.0, 0.0, 1.0])
    out, phi = [], 0.0
    for k in range(n):
        if k:
            phi += inc + sweep * k
        ph = np.radians(phi)
        m = _pulse(np.radians(flip) * B1, ph) @ m
        for t, record in ((TE, True), (TR - TE, False)):
            f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
            m = np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])
            if record:
                out.append(1j * f * np.exp(-1j * ph))
    return np.array(out)


def _balanced_isochromat(flips, TR, TE, inc, T1, T2, B0=0.0, B1=1.0, eta=None, TI=0.0):
    """One isochromat under a balanced train of flips at phases k·inc
    (after an inversion of efficiency eta when given), times i."""
    m = np.array([0.0, 0.0, 1.0 if eta is None else -eta])

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    if eta is not None:
        m = free(m, TI)
    out = []
    for k, fl in enumerate(flips):
        ph = np.radians(k * inc)
        m = free(_pulse(np.radians(fl) * B1, ph) @ m, TE)
        out.append(1j * (m[0] + 1j * m[1]) * np.exp(-1j * ph))
        m = free(m, TR - TE)
    return np.array(out)


def _molli_isochromat(TI, RR, flip, TR, n, scheme, T1, T2, B0=0.0, B1=1.0, eta=1.0):
    """MOLLI on one isochromat: each image an alpha/2-prepared balanced
    block sampled at its centre pulse, spoiled after; times i."""
    m = np.array([0.0, 0.0, 1.0])

    def free(m, t):
        f = (m[0] + 1j * m[1]) * np.exp(-t / T2 - 2j * np.pi * B0 * t * 1e-3)
        return np.array([f.real, f.imag, 1 + (m[2] - 1) * np.exp(-t / T1)])

    def rot(m, a_deg, ph_deg):
        return _pulse(np.radians(a_deg) * B1, np.radians(ph_deg)) @ m

    out, c = [], n // 2
    for ti, (images, pause) in zip(TI, scheme):
        m = np.array([m[0], m[1], -eta * m[2]])
        now = 0.0
        for i in range(images):
            start = ti + i * RR - (c + 0.5) * TR
            m = free(rot(free(m, start - now), flip / 2, 180.0), TR / 2)
            for k in range(n):
                ph = 180.0 * (k % 2)
                m = free(rot(m, flip, ph), TR / 2)
                if k == c:
                    out.append(1j * (m[0] + 1j * m[1]) * np.exp(-1j * np.radians(ph)))
                m = free(m, TR / 2)
            m = np.array([0.0, 0.0, m[2]])
            now = start + (n + 0.5) * TR
        m = free(m, (images + pause) * RR - now)
    return np.array(out)


HSFP_FLIPS = 5 + 60 * np.sin(np.linspace(0, np.pi, 80)) ** 2


class NoB1(Simulator):
    """A played simulator without B1."""
    tissue_properties = ("T1", "T2", "M0")

    def repetition(self, p):
        return Readout() @ Pulse(30.0)
