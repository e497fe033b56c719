"""Oracles and sequences the pool tests share (SPEC §3): Cartesian
Bloch–McConnell by ``scipy.linalg.expm`` of its generator, written from the
SPEC conventions, the lineshape integrals by ``scipy.integrate.quad``, and
the sequences the tests play."""
import numpy as np
from scipy.integrate import quad
from scipy.linalg import expm

from blochsim import (Delay, Dephase, Excitation, Inversion, Pulse, Readout, RectPulse, Refocusing, Saturation,
                      Simulator, Spoil)
from blochsim.simulators import MRFSimulator

GAMMA_HZ_PER_T = 42.57747892e6


# --------------------------------------------------------------------------
# The oracle: Cartesian Bloch–McConnell, written from the SPEC conventions
# (F+ = Mx + i My; a phase-0 pulse rotates about +x and takes z to -y; B0
# turns F+ by exp(-2 pi i B0 t)).  Liquid pools carry (Mx, My, Mz), the
# semisolid pool Mz only; a last component holds the constant 1 for the
# recovery terms.

def rotation(a, phi):
    """The 3 × 3 rotation of (Mx, My, Mz) by a (rad) about (cos phi, sin phi, 0)."""
    u = np.array([np.cos(phi), np.sin(phi), 0.0])
    K = np.array([[0, -u[2], u[1]], [u[2], 0, -u[0]], [-u[1], u[0], 0]])
    return np.eye(3) + np.sin(a) * K + (1 - np.cos(a)) * K @ K


class Oracle:
    def __init__(self, T1, T2, B0=0.0, pools=(), bound=None):
        """pools: (f, k, T1, T2, shift) per exchanging pool (ms, Hz);
        bound: (f, k, T1) or None."""
        self.liquid = [(None, 0.0, T1, T2, 0.0)] + list(pools)
        self.bound = bound
        fa = 1.0 - sum(p[0] for p in pools) - (bound[0] if bound else 0.0)
        self.f = [fa] + [p[0] for p in pools]
        self.n = len(self.liquid)
        self.size = 3 * self.n + (1 if bound else 0) + 1
        self.B0 = B0

    def equilibrium(self):
        x = np.zeros(self.size)
        for j in range(self.n):
            x[3 * j + 2] = self.f[j]
        if self.bound:
            x[3 * self.n] = self.bound[0]
        x[-1] = 1.0
        return x

    def generator(self, w1=0.0, W=0.0):
        """d/dt per second; w1: RF amplitude (rad/s, phase 0); W: the
        semisolid pool's saturation rate (1/s)."""
        G = np.zeros((self.size, self.size))
        one = self.size - 1
        fa = self.f[0]
        for j, (_, k, T1, T2, shift) in enumerate(self.liquid):
            x, y, z = 3 * j, 3 * j + 1, 3 * j + 2
            R1, R2 = 1e3 / T1, 1e3 / T2
            w = 2 * np.pi * (self.B0 + shift)
            G[x, x] -= R2
            G[y, y] -= R2
            G[z, z] -= R1
            G[z, one] += R1 * self.f[j]
            G[x, y] += w
            G[y, x] -= w
            G[y, z] -= w1
            G[z, y] += w1
            if j > 0:
                for c in range(3):
                    a, b = c, 3 * j + c
                    G[a, a] -= k * self.f[j]
                    G[b, a] += k * self.f[j]
                    G[b, b] -= k * fa
                    G[a, b] += k * fa
        if self.bound:
            fb, kb, T1b = self.bound
            zb = 3 * self.n
            R1 = 1e3 / T1b
            G[zb, zb] -= R1 + W
            G[zb, one] += R1 * fb
            G[2, 2] -= kb * fb
            G[zb, 2] += kb * fb
            G[zb, zb] -= kb * fa
            G[2, zb] += kb * fa
        return G

    def evolve(self, x, t_ms, **kw):
        return expm(self.generator(**kw) * t_ms * 1e-3) @ x

    def transverse(self, x):
        return sum(x[3 * j] + 1j * x[3 * j + 1] for j in range(self.n))

    def longitudinal(self, x):
        return sum(x[3 * j + 2] for j in range(self.n))

    def rotate(self, x, flip_deg, phase_deg=0.0):
        """Hard pulse at phase phi: rotation about (cos phi, sin phi, 0)."""
        R = rotation(np.radians(flip_deg), np.radians(phase_deg))
        y = x.copy()
        for j in range(self.n):
            y[3 * j:3 * j + 3] = R @ x[3 * j:3 * j + 3]
        return y

    def invert(self, x):
        y = x.copy()
        for j in range(self.n):
            y[3 * j + 2] = -x[3 * j + 2]
        return y


def sl_integral(x):
    """The super-Lorentzian's g(x) by quad, split at the magic angle."""
    u0 = 1 / np.sqrt(3)

    def f(u):
        w = 3 * u * u - 1
        return np.sqrt(2 / np.pi) * np.exp(-2 * x * x / (w * w)) / abs(w)

    return (quad(f, 0, u0, epsabs=0, epsrel=1e-12, limit=500)[0]
            + quad(f, u0, 1, epsabs=0, epsrel=1e-12, limit=500)[0])


def oracle_lineshape(kind, df, T2_ms):
    T2 = T2_ms * 1e-3
    x = 2 * np.pi * df * T2
    if kind == "lorentzian":
        return T2 / np.pi / (1 + x * x)
    if kind == "gaussian":
        return T2 / np.sqrt(2 * np.pi) * np.exp(-x * x / 2)
    # the integral down to x = 1e-3; the classic form of Gloor 2008 from x_c = 2 pi 1.5 kHz 12 us
    xc = 2 * np.pi * 1.5e3 * 12e-6 if kind == "super-lorentzian-cutoff" else 1e-3
    if abs(x) < xc:
        # the even quadratic matched in value and slope at x_c
        g_c = sl_integral(xc)
        slope = (sl_integral(xc * (1 + 1e-5)) - sl_integral(xc * (1 - 1e-5))) / (2e-5 * xc)
        b = slope / (2 * xc)
        return T2 * (g_c + b * (x * x - xc * xc))
    return T2 * sl_integral(x)


# --------------------------------------------------------------------------
# Sequences played for the tests

class InversionProbe(Simulator):
    """Inversion, TI, then a 90° pulse read at once: -i times the liquid Z."""
    protocol = {"TI": 100.0}

    def repetition(self, p):
        return Readout() @ Pulse(90.0) @ Delay(p["TI"]) @ Inversion()


class FID(Simulator):
    """An excitation, then a sample every `dt` ms."""
    protocol = {"flip": 90.0, "phase": 0.0, "dt": 1.0, "n": 10}

    def preparation(self, p):
        return Excitation(p["flip"], phase=p["phase"])

    def repetition(self, p):
        return Readout() @ Delay(p["dt"])

    def check_protocol(self, p):
        p["repetitions"] = p["n"]
        return p


class FIDAll(Simulator):
    """FID recording every sample (the train unrolled)."""
    protocol = {"flip": 90.0, "phase": 0.0, "dt": 1.0, "n": 10}

    def preparation(self, p):
        return Excitation(p["flip"], phase=p["phase"])

    def repetition(self, p):
        return (Readout() @ Delay(p["dt"])) ** p["n"]


class SaturationTrain(Simulator):
    """n sub-pulses of a rectangular off-resonance saturation, each followed
    by its share of the pulse's time, then a 90° read of the liquid Z."""
    protocol = {"flip": 600.0, "duration": 10.0, "offset": 2000.0, "n": 40}

    def repetition(self, p):
        n = p["n"]
        sub = Delay(p["duration"] / n) @ Saturation(p["flip"] / n, p["duration"] / n, offset=p["offset"])
        return Readout() @ Pulse(90.0) @ Spoil() @ sub ** n


def _fid_oracle(o, flip, phase, dt, n):
    x = o.rotate(o.equilibrium(), flip, phase)
    out = []
    for _ in range(n):
        x = o.evolve(x, dt)
        out.append(o.transverse(x))
    return np.array(out)


T2_S = 12e-6


# --------------------------------------------------------------------------
# Derivatives

POOLED = dict(T1=900.0, T2=60.0, M0=1.3, B1=0.95, B0=8.0, bound_fraction=0.12, bound_exchange=30.0,
              bound_T1=800.0, bound_T2=0.011, poolB_fraction=0.15, poolB_exchange=25.0, poolB_T1=500.0,
              poolB_T2=12.0, poolB_shift=60.0)


class MTTrain(Simulator):
    """A short RF-spoiled-like train with saturating pulses, off-resonance
    preparation and a crusher, recording every TR."""
    protocol = {"n": 12}

    def preparation(self, p):
        return Delay(3.0) @ Saturation(500.0, 8.0, offset=1800.0) @ Inversion()

    def repetition(self, p):
        ops = []
        for i in range(p["n"]):
            ops += [Pulse(35.0 + 5 * i, phase=(17.0 * i * i) % 360, duration=1.2), Readout(), Dephase(),
                    Delay(6.0)]
        from blochsim.sequence import Sequence
        return Sequence(ops)


# --------------------------------------------------------------------------
# CEST and MT simulators

CEST_TISSUE = dict(T1=1300.0, T2=70.0, B0=12.0, B1=0.9, poolB_fraction=0.01, poolB_exchange=800.0, poolB_T1=1000.0,
                   poolB_T2=15.0, poolB_shift=3.5 * 127.7, bound_fraction=0.1, bound_exchange=25.0, bound_T2=0.012)


def _cest_oracle(offsets_ppm, field, b1, n, tp, td, t):
    """The Z-spectrum of a train of rectangular pulses by expm in the frame
    of the RF at each offset (spoiled after each pulse), in the test: the
    shaped oracle below with one segment."""
    return _shaped_cest_oracle(offsets_ppm, field, b1, [1.0], n, tp, td, t)


# --------------------------------------------------------------------------
# Reverse mode

def _central(f, v, h):
    """Central differences of the scalar function f at every entry of v."""
    v = np.asarray(v, dtype=float)
    g = np.zeros(v.shape)
    for i in np.ndindex(v.shape):
        up, dn = v.copy(), v.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


class EveryEvent(Simulator):
    """An exact off-resonance pulse, then hard pulses that also saturate the
    semisolid pool, with readout phases: every event value the pooled
    adjoint differentiates."""
    protocol = {"flips": np.array([40.0, 70.0, 25.0]), "phases": np.array([0.0, 30.0, 75.0]), "TR": 7.0,
                "sat_duration": 2.0, "sat_offset": 900.0, "rect_flip": 200.0, "rect_duration": 3.0,
                "rect_phase": 20.0, "rect_offset": 150.0, "rx": 10.0}

    def repetition(self, p):
        from blochsim.sequence import Sequence
        ops = [RectPulse(p["rect_flip"], p["rect_duration"], phase=p["rect_phase"], offset=p["rect_offset"]),
               Readout(p["rx"])]
        for i in range(3):
            ops += [Delay(p["TR"]), Pulse(p["flips"][i], p["phases"][i], duration=p["sat_duration"],
                                          offset=p["sat_offset"]), Readout(p["rx"])]
        return Sequence(ops)


EVERY_TISSUE = dict(T1=900.0, T2=60.0, M0=1.3, B1=0.95, B0=8.0, bound_fraction=0.12, bound_exchange=30.0,
                    bound_T1=800.0, bound_T2=0.011, poolB_fraction=0.15, poolB_exchange=25.0, poolB_T1=500.0,
                    poolB_T2=12.0, poolB_shift=60.0)


def _rect_oracle(x, p, t, pools, bound):
    """An exact rectangular pulse (p["rect_*"], Lorentzian semisolid line)
    on the Cartesian state x: in its frame (RF phase by conjugation with
    Rz), then back to the water frame (F+ turned by -2 pi offset duration)."""
    B1, B0 = t["B1"], t["B0"]
    rect = Oracle(t["T1"], t["T2"], B0=B0 - p["rect_offset"], pools=pools, bound=bound)
    tau = p["rect_duration"] * 1e-3
    w1 = np.radians(p["rect_flip"]) * B1 / tau
    G = rect.generator(w1=w1, W=np.pi * w1 ** 2 * oracle_lineshape("lorentzian", p["rect_offset"] - B0,
                                                                     t["bound_T2"]))
    c, sn = np.cos(np.radians(p["rect_phase"])), np.sin(np.radians(p["rect_phase"]))
    Rz = np.eye(rect.size)
    for j in range(rect.n):
        Rz[3 * j:3 * j + 2, 3 * j:3 * j + 2] = [[c, -sn], [sn, c]]
    x = expm(Rz @ G @ Rz.T * tau) @ x
    th = -2 * np.pi * p["rect_offset"] * tau
    for j in range(rect.n):
        mx, my = x[3 * j], x[3 * j + 1]
        x[3 * j], x[3 * j + 1] = mx * np.cos(th) - my * np.sin(th), mx * np.sin(th) + my * np.cos(th)
    return x


def _every_event_oracle(p, t):
    """EveryEvent's samples in float64 by the Cartesian oracle, in the test."""
    pools = [(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])]
    bound = (t["bound_fraction"], t["bound_exchange"], t["bound_T1"])
    o = Oracle(t["T1"], t["T2"], B0=t["B0"], pools=pools, bound=bound)
    B1, B0, zb = t["B1"], t["B0"], 3 * o.n
    x = _rect_oracle(o.equilibrium(), p, t, pools, bound)
    rx = np.exp(-1j * np.radians(p["rx"]))
    out = [t["M0"] * o.transverse(x) * rx]
    g_sat = oracle_lineshape("lorentzian", p["sat_offset"] - B0, t["bound_T2"])
    for i in range(3):
        x = o.evolve(x, p["TR"])
        alpha = np.radians(p["flips"][i]) * B1
        x[zb] *= np.exp(-np.pi * g_sat * alpha ** 2 / (p["sat_duration"] * 1e-3))
        x = o.rotate(x, p["flips"][i] * B1, p["phases"][i])
        out.append(t["M0"] * o.transverse(x) * rx)
    return np.array(out)


def _mt_oracle(flip, TR, mt_flip, mt_dur, mt_off, n, t):
    """The MTSimulator's last sample by the TR recursion, in the test."""
    o = Oracle(t["T1"], t["T2"], B0=t["B0"] - mt_off, bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
    w1 = np.radians(mt_flip) * t["B1"] / (mt_dur * 1e-3)
    W = np.pi * w1 ** 2 * oracle_lineshape("super-lorentzian", mt_off - t["B0"], t["bound_T2"])
    mt = expm(o.generator(w1=w1, W=W) * mt_dur * 1e-3)
    free = Oracle(t["T1"], t["T2"], B0=t["B0"], bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
    x = free.equilibrium()
    for i in range(n):
        x = free.rotate(x, flip * t["B1"])
        sample = 1j * free.transverse(x)
        x[:2] = 0.0
        x = free.evolve(x, TR - mt_dur)
        x = mt @ x  # Z only after the spoiler: the frame does not matter
        x[:2] = 0.0
    return sample


# --------------------------------------------------------------------------
# Shaped CEST pulses

def _shaped_cest_oracle(offsets_ppm, field, b1rms, shape, n, tp, td, t):
    """The Z-spectrum of a train of piecewise-constant pulses by expm per
    segment, in the frame of the RF at each offset (a negative sample is the
    RF along -x), spoiled after each pulse, in the test."""
    shape = np.asarray(shape, dtype=float)
    amps = b1rms * shape / np.sqrt(np.mean(shape ** 2))
    out = []
    for ppm in offsets_ppm:
        df = ppm * field * GAMMA_HZ_PER_T * 1e-6
        o = Oracle(t["T1"], t["T2"], B0=t["B0"] - df,
                   pools=[(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])],
                   bound=(t["bound_fraction"], t["bound_exchange"], 1000.0))
        g = oracle_lineshape("super-lorentzian", df - t["B0"], t["bound_T2"])
        dt = tp / len(shape) * 1e-3
        pulse = np.eye(o.size)
        for a in amps:
            w1 = 2 * np.pi * GAMMA_HZ_PER_T * a * 1e-6 * t["B1"]
            pulse = expm(o.generator(w1=w1, W=np.pi * w1 ** 2 * g) * dt) @ pulse
        delay = expm(o.generator() * td * 1e-3)
        x = o.equilibrium()
        for i in range(n):
            if i > 0:
                x = delay @ x
            x = pulse @ x
            for j in range(o.n):
                x[3 * j:3 * j + 2] = 0.0
        out.append(np.sin(np.radians(90 * t["B1"])) * o.longitudinal(x))
    return np.array(out)


class _FakeDeviceArray:
    """Claims the CUDA array interface; CESTSimulator refuses it before any
    device call."""
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False), "version": 3}


class PhaseTrain(Simulator):
    """Pulses at changing phases, each after a delay, read at once; then an
    exact rectangular pulse, a pulse straight after it and two more pulses
    after delays: every way the host's complex planes change their frame."""
    protocol = {"flips": np.array([30.0, 55.0, 80.0, 20.0, 45.0, 60.0, 35.0]),
                "phases": np.array([0.0, 117.0, 351.0, 225.0, 40.0, 300.0, 75.0]), "TR": 6.0,
                "rect_flip": 150.0, "rect_duration": 2.0, "rect_phase": 50.0, "rect_offset": 120.0, "rx": 25.0}

    def repetition(self, p):
        from blochsim.sequence import Sequence
        f, ph = p["flips"], p["phases"]
        ops = []
        for i in range(4):
            ops += [Delay(p["TR"]), Pulse(f[i], ph[i]), Readout(p["rx"])]
        ops += [RectPulse(p["rect_flip"], p["rect_duration"], phase=p["rect_phase"], offset=p["rect_offset"]),
                Readout(p["rx"]), Pulse(f[4], ph[4]), Readout(p["rx"])]
        for i in (5, 6):
            ops += [Delay(p["TR"]), Pulse(f[i], ph[i]), Readout(p["rx"])]
        return Sequence(ops)


def _phase_train_oracle(p, t):
    """PhaseTrain's samples in float64 by the Cartesian oracle; the
    semisolid pool when t names bound_fraction."""
    pools = [(t["poolB_fraction"], t["poolB_exchange"], t["poolB_T1"], t["poolB_T2"], t["poolB_shift"])]
    b = (t["bound_fraction"], t["bound_exchange"], t["bound_T1"]) if "bound_fraction" in t else None
    o = Oracle(t["T1"], t["T2"], B0=t["B0"], pools=pools, bound=b)
    rx = t["M0"] * np.exp(-1j * np.radians(p["rx"]))
    x, ref = o.equilibrium(), []
    for i in range(7):
        if i == 4:
            x = _rect_oracle(x, p, {"bound_T2": 0.012, **t}, pools, b)
            ref.append(rx * o.transverse(x))
        else:
            x = o.evolve(x, p["TR"])
        x = o.rotate(x, p["flips"][i] * t["B1"], p["phases"][i])
        ref.append(rx * o.transverse(x))
    return np.array(ref)


def _without_bound(t):
    return {k: v for k, v in t.items() if not k.startswith("bound_")}


# --------------------------------------------------------------------------
# The device's pooled register team (pools/registers.hpp), run on the host
# with four members (the lanes of a vector), so that the shifts cross
# members as on the GPU: 16 orders a member on the real planes, 8 on the
# complex ones with the semisolid pool alone, 4 with an exchanging pool.

def _team(sim, **kw):
    sim._host_variant = 4
    try:
        return sim.simulate(**kw)
    finally:
        sim._host_variant = 0


class BothWays(Simulator):
    """Shifts both ways, several of them at once, a spoiler, inversion, and
    pulses at several phases with saturating durations."""

    def repetition(self, p):
        from blochsim.sequence import Sequence
        return Sequence([Inversion(), Delay(20.0), Excitation(90.0, 90.0), Dephase(), Delay(5.0),
                         Refocusing(150.0), Dephase(-1), Delay(3.0), Readout(), Dephase(2), Delay(4.0),
                         Pulse(60.0, 33.0, duration=1.5, offset=700.0), Dephase(-1), Readout(), Spoil(), Readout(),
                         Delay(2.0), Pulse(40.0, -20.0), Dephase(3), Readout(), Dephase(-3), Readout(60.0)])


MT_POOL = dict(bound_fraction=0.12, bound_exchange=25.0, bound_T1=700.0, bound_T2=0.011)
B_POOL = dict(poolB_fraction=0.2, poolB_exchange=15.0, poolB_T1=450.0, poolB_T2=20.0)
MRF_FLIPS = np.concatenate([np.linspace(5, 60, 40), np.linspace(60, 2, 40)])
MRF_PHASES = (37.0 * np.arange(80)) % 360.0
TEAM_CASES = [
    ("mrf real, MT, K = 32", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, TI=20.0, states=32), MT_POOL),
    ("mrf real, MT, K = 13 (truncated team)", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=13), MT_POOL),
    ("mrf real, MT, K = 60 (four members)", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=60), MT_POOL),
    ("mrf real, poolB, B1, K = 27", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, TI=20.0, states=27),
     {**B_POOL, "B1": np.array([0.8, 1.1, 1.0])}),
    ("mrf complex (phases), MT, K = 30",
     lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, phases=MRF_PHASES, states=30), MT_POOL),
    ("mrf complex, poolB shift, K = 11", lambda: MRFSimulator(flip=MRF_FLIPS, TR=10.0, states=11),
     {**B_POOL, "poolB_shift": 50.0}),
    ("saturating train, both pools, K = 16", lambda: MTTrain(states=16), POOLED),
    ("saturating train, MT, K = 9", lambda: MTTrain(states=9), {**MT_POOL, "B0": np.array([0.0, 30.0, -5.0])}),
    ("shifts both ways, both pools, K = 14", lambda: BothWays(states=14), POOLED),
    ("shifts both ways, poolB, K = 15", lambda: BothWays(states=15), {**B_POOL, "poolB_shift": -80.0}),
    ("exact pulses, both pools, K = 12", lambda: EveryEvent(states=12), EVERY_TISSUE),
    ("exact pulses, MT, K = 16", lambda: EveryEvent(states=16), {**MT_POOL, "B0": 8.0}),
]
