"""A float64 oracle for exchange networks and dipolar order (SPEC §3):
Cartesian Bloch–McConnell(–Provotorov) by ``scipy.linalg.expm`` of the
whole generator, written from the SPEC conventions (F+ = Mx + i My; a
phase-phi pulse rotates about (cos phi, sin phi, 0); B0 turns F+ by
exp(-2 pi i B0 t)), with any pair of pools exchanging, several semisolid
pools, and each semisolid pool's dipolar order Zd (scaled to Z's units)
coupled to its Z by W [[-1, x], [x, -x^2]], x = 2 pi df sqrt(15) T2
(Provotorov; Varma et al. 2015, JMR 260:67)."""
import numpy as np
from scipy.linalg import expm

from pool_oracles import oracle_lineshape, rotation

LIQUID_NAMES = "ABCDE"


class NetworkOracle:
    """liquid: (fraction, T1 ms, T2 ms, shift Hz) per liquid pool after free
    water (B, C, ...); semisolid: (fraction, T1 ms, T2 ms, T1D ms or None)
    per semisolid pool (bound, bound2); rates: {(name, name): k Hz} for
    every exchanging pair, names "A" (free water), "B".., "bound", "bound2"."""

    def __init__(self, T1, T2, B0=0.0, liquid=(), semisolid=(), rates=None, B1=1.0, lineshape="super-lorentzian"):
        self.liquid = [(None, T1, T2, 0.0)] + list(liquid)
        self.semisolid = list(semisolid)
        self.n, self.nb = len(self.liquid), len(self.semisolid)
        fa = 1.0 - sum(p[0] for p in liquid) - sum(p[0] for p in semisolid)
        self.f = [fa] + [p[0] for p in liquid] + [p[0] for p in semisolid]
        self.dipolar = {}
        for b, p in enumerate(self.semisolid):
            if p[3] is not None:
                self.dipolar[b] = 3 * self.n + self.nb + len(self.dipolar)
        self.size = 3 * self.n + self.nb + len(self.dipolar) + 1
        self.B0, self.B1, self.shape = B0, B1, lineshape
        self.rates = dict(rates or {})

    def _z(self, name):
        """The Z component of pool ``name``."""
        if name in ("bound", "bound2"):
            return 3 * self.n + (0 if name == "bound" else 1)
        return 3 * LIQUID_NAMES.index(name) + 2

    def _f(self, name):
        if name in ("bound", "bound2"):
            return self.f[self.n + (0 if name == "bound" else 1)]
        return self.f[LIQUID_NAMES.index(name)]

    def equilibrium(self):
        x = np.zeros(self.size)
        for j in range(self.n):
            x[3 * j + 2] = self.f[j]
        for b in range(self.nb):
            x[3 * self.n + b] = self.f[self.n + b]
        x[-1] = 1.0
        return x

    def _W(self, b, w1, df):
        """Saturation rate (1/s) of semisolid pool b by a field w1 (rad/s)
        at df (Hz) from its resonance, and its dipolar x."""
        T2b = self.semisolid[b][2]
        W = np.pi * w1 * w1 * oracle_lineshape(self.shape, df, T2b)
        return W, 2 * np.pi * df * np.sqrt(15.0) * T2b * 1e-3

    def _saturate(self, G, b, W, x):
        zb = 3 * self.n + b
        G[zb, zb] -= W
        if b in self.dipolar:
            zd = self.dipolar[b]
            G[zb, zd] += W * x
            G[zd, zb] += W * x
            G[zd, zd] -= W * x * x

    def generator(self, w1=0.0, phase=0.0, df=0.0):
        """d/dt per second, in the frame of an RF field of amplitude w1
        (rad/s, B1 included), phase (rad) and frequency df (Hz)."""
        G = np.zeros((self.size, self.size))
        one = self.size - 1
        for j, (_, T1, T2, shift) in enumerate(self.liquid):
            x, y, z = 3 * j, 3 * j + 1, 3 * j + 2
            R1, R2 = 1e3 / T1, 1e3 / T2
            wz = -2 * np.pi * (self.B0 + shift - df)
            wx, wy = w1 * np.cos(phase), w1 * np.sin(phase)
            K = np.array([[0, -wz, wy], [wz, 0, -wx], [-wy, wx, 0]])
            G[x:z + 1, x:z + 1] += K - np.diag([R2, R2, R1])
            G[z, one] += R1 * self.f[j]
        for b, (fb, T1b, _, T1D) in enumerate(self.semisolid):
            zb = 3 * self.n + b
            G[zb, zb] -= 1e3 / T1b
            G[zb, one] += 1e3 / T1b * fb
            if b in self.dipolar:
                G[self.dipolar[b], self.dipolar[b]] -= 1e3 / T1D
            if w1:
                self._saturate(G, b, *self._W(b, w1, df - self.B0))
        for (a, c), k in self.rates.items():
            fa, fc = self._f(a), self._f(c)
            comps = [(self._z(a), self._z(c))]
            if a not in ("bound", "bound2") and c not in ("bound", "bound2"):
                ia, ic = LIQUID_NAMES.index(a), LIQUID_NAMES.index(c)
                comps += [(3 * ia, 3 * ic), (3 * ia + 1, 3 * ic + 1)]
            for p, q in comps:
                G[p, p] -= k * fc
                G[q, p] += k * fc
                G[q, q] -= k * fa
                G[p, q] += k * fa
        return G

    def evolve(self, x, t_ms):
        return expm(self.generator() * t_ms * 1e-3) @ x

    def rect(self, x, flip_deg, t_ms, phase_deg=0.0, offset=0.0):
        """An exact rectangular pulse (RectPulse), back in the water frame."""
        w1 = self.B1 * np.radians(flip_deg) / (t_ms * 1e-3)
        y = expm(self.generator(w1, np.radians(phase_deg), offset) * t_ms * 1e-3) @ x
        th = -2 * np.pi * offset * t_ms * 1e-3
        for j in range(self.n):
            mx, my = y[3 * j], y[3 * j + 1]
            y[3 * j], y[3 * j + 1] = mx * np.cos(th) - my * np.sin(th), mx * np.sin(th) + my * np.cos(th)
        return y

    def saturate(self, x, flip_deg, t_ms, offset=0.0, dual=False, power=1.0):
        """The semisolid pools' saturation by a pulse of flip (deg), duration
        (ms), power factor and offset (Hz); dual: half the power at each of
        +-offset."""
        G = np.zeros((self.size, self.size))
        w1sq = (self.B1 * np.radians(flip_deg) / (t_ms * 1e-3)) ** 2 * power
        for b in range(self.nb):
            for side in ((1.0, -1.0) if dual else (1.0,)):
                W, xd = self._W(b, np.sqrt(w1sq * (0.5 if dual else 1.0)), side * offset - self.B0)
                self._saturate(G, b, W, xd)
        return expm(G * t_ms * 1e-3) @ x

    def rotate(self, x, flip_deg, phase_deg=0.0):
        """A hard pulse (B1 included) on every liquid pool."""
        R = rotation(self.B1 * np.radians(flip_deg), np.radians(phase_deg))
        y = x.copy()
        for j in range(self.n):
            y[3 * j:3 * j + 3] = R @ x[3 * j:3 * j + 3]
        return y

    def spoil(self, x):
        y = x.copy()
        for j in range(self.n):
            y[3 * j] = y[3 * j + 1] = 0.0
        return y

    def transverse(self, x):
        return sum(x[3 * j] + 1j * x[3 * j + 1] for j in range(self.n))
