"""The star networks' results (MT, exchanging pools B-D, both), for the
check that a change leaves them bit for bit: simulate, (T1, T2) Jacobians
and (flip, TR, T1) pullbacks of an MRF train on its real and complex
planes, an FSE train, MTSimulator, CESTSimulator, and a train of
saturations and hard pulses of finite duration (simulate, Jacobian,
pullback: the semisolid pool's saturation on the lanes and the player),
saved to an .npz.

Run it with two builds and compare every array with ``np.array_equal``;
an earlier commit's wheel runs beside an editable install with
``python -S`` (no site hooks) and its wheel's folder first on ``sys.path``::

    git worktree add /tmp/old <commit>
    pip wheel --no-deps --no-build-isolation /tmp/old -w /tmp/oldwheel
    pip install --no-deps --target /tmp/oldsite /tmp/oldwheel/blochsim-*.whl
    python -S -c "import sys; sys.path[:0] = ['/tmp/oldsite', '<site-packages>']; \\
        sys.argv = ['x', 'old.npz']; exec(open('bench/star_identity.py').read())"
    python bench/star_identity.py new.npz
"""
import sys
import numpy as np
out = sys.argv[1]
from blochsim.simulators import MRFSimulator, FSESimulator, MTSimulator, CESTSimulator
from blochsim import Delay, Pulse, Readout, Saturation, Simulator, Spoil
from blochsim.sequence import Sequence
from blochsim.cli import reference_flips, reference_tissues
T1, T2 = reference_tissues(300)
res = {}
configs = {
    "mt": dict(bound_fraction=0.1, bound_exchange=20.0, bound_T2=0.011),
    "B": dict(poolB_fraction=0.2, poolB_exchange=10.0, poolB_T2=20.0, poolB_shift=50.0),
    "Bmt": dict(poolB_fraction=0.15, poolB_exchange=10.0, poolB_T2=20.0, bound_fraction=0.1, bound_exchange=25.0),
    "BCD": dict(poolB_fraction=0.1, poolB_exchange=10.0, poolC_fraction=0.05, poolC_exchange=30.0, poolC_shift=-80.0,
                poolD_fraction=0.03, poolD_exchange=100.0, bound_fraction=0.1, bound_exchange=20.0),
    "Bnoshift": dict(poolB_fraction=0.2, poolB_exchange=10.0, poolB_T2=20.0),
}
k = np.arange(100)
for name, c in configs.items():
    for ph_name, ph in (("real", 0.0), ("cplx", 0.5 * 117.0 * k * (k + 1))):
        sim = MRFSimulator(flip=reference_flips(100), TR=10.0, phases=ph, states=16)
        res[f"{name}-{ph_name}-sim"] = sim.simulate(T1=T1, T2=T2, B0=np.linspace(-20, 20, 300), **c)
        s, J = sim.jacobian(("T1", "T2"), T1=T1[:40], T2=T2[:40], **c)
        res[f"{name}-{ph_name}-jac"] = J
        s, pb = sim.vjp(("flip", "TR", "T1"), T1=T1[:20], T2=T2[:20], **c)
        g = pb(np.ones_like(s))
        for kk, v in g.items():
            res[f"{name}-{ph_name}-vjp-{kk}"] = np.asarray(v)
    res[f"{name}-fse"] = FSESimulator(ESP=8.0, flip=np.full(20, 150.0)).simulate(T1=T1, T2=T2, **c)
res["mt-sim"] = MTSimulator(flip=10.0, TR=30.0, n_tr=40, exc_duration=1.0).simulate(T1=T1, T2=T2, **configs["Bmt"])
res["cest"] = CESTSimulator(offsets=np.linspace(-5, 5, 21)).simulate(T1=T1[:30], T2=T2[:30], **configs["B"], bound_fraction=0.1, bound_exchange=25.0)


class SatTrain(Simulator):
    """Saturation events and hard pulses of finite duration: the semisolid
    pool's saturation on the lanes and (Jacobian, pullback) the player."""
    protocol = {"sat_flip": 400.0, "flip": 20.0}

    def repetition(self, p):
        return Sequence([Saturation(p["sat_flip"], 6.0, offset=1500.0), Delay(2.0),
                         Pulse(p["flip"], duration=1.0, offset=100.0), Readout(), Delay(6.0), Spoil()])


for name in ("mt", "Bmt"):
    sat = SatTrain()
    res[f"{name}-sat-sim"] = sat.simulate(T1=T1, T2=T2, B0=np.linspace(-20, 20, 300), **configs[name])
    res[f"{name}-sat-jac"] = sat.jacobian(("T1", "bound_fraction"), T1=T1[:40], T2=T2[:40], **configs[name])[1]
    s, pb = sat.vjp(("sat_flip", "flip", "T1"), T1=T1[:20], T2=T2[:20], **configs[name])
    for kk, v in pb((1.0 - 1.0j) * np.ones_like(s)).items():
        res[f"{name}-sat-vjp-{kk}"] = np.asarray(v)
np.savez(out, **res)
print(len(res), "arrays")
