"""Quick timings of bench/test_bench_networks.py's cases, printed as each
finishes (for a device call with a hard time limit): the reference MRF
train on the two-pool star, the four-pool network and the four-pool
network with dipolar order; host forward and (T1, T2) Jacobian, a
spoiled train of dual-offset saturations (host and device forward), device
forward (NumPy through the card, CuPy-resident) and pullback.  Medians of
``$ROUNDS`` (default 3) after one warm-up; on the device the 1e5-voxel
forward, the Jacobian and the pullback before the 1e6-voxel forward.

Run: ``python bench/networks_timing.py [host] [device]``.
"""
import os
import sys
import time

import numpy as np

import blochsim
from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_bench_networks import NETWORKS, SaturationTrain  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 3))


def timed(label, n, f):
    f()
    times = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    med = float(np.median(times))
    print(f"{label:48s} {med * 1e3:10.1f} ms {n / med / 1e3:10.1f} k atoms/s", flush=True)


def host():
    for n in (1_000, 10_000):
        T1, T2 = reference_tissues(n)
        sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cpu")
        for name, c in NETWORKS.items():
            timed(f"host forward {name} {n}", n, lambda: sim.simulate(T1=T1, T2=T2, **c))
    T1, T2 = reference_tissues(4_000)
    for name in ("two-pool", "four-pool-ihmt"):
        c = NETWORKS[name]
        timed(f"host saturation train {name} 4000", 4_000, lambda: SaturationTrain().simulate(T1=T1, T2=T2, **c))
    T1, T2 = reference_tissues(1_000)
    for name, c in NETWORKS.items():
        timed(f"host jacobian(T1,T2) {name} 1000", 1_000, lambda: sim.jacobian(("T1", "T2"), T1=T1, T2=T2, **c))


def resident(n):
    import cupy as cp
    T1, T2 = reference_tissues(n)
    dT1, dT2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    out = cp.empty((n, 500), cp.complex64)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    for name, c in NETWORKS.items():
        def run():
            sim.simulate(T1=dT1, T2=dT2, out=out, **c)
            cp.cuda.Device().synchronize()
        timed(f"device resident forward {name} {n}", n, run)


def device():
    resident(100_000)
    T1, T2 = reference_tissues(100_000)
    for name in ("two-pool", "four-pool-ihmt"):
        c = NETWORKS[name]
        timed(f"device saturation train {name} 100000", 100_000,
              lambda: SaturationTrain(device="cuda").simulate(T1=T1, T2=T2, **c))
    T1, T2 = reference_tissues(10_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    for name, c in NETWORKS.items():
        timed(f"device jacobian(T1,T2) {name} 10000", 10_000, lambda: sim.jacobian(("T1", "T2"), T1=T1, T2=T2, **c))
    for name, c in NETWORKS.items():
        def pull():
            s, pb = sim.vjp(("flip", "TR", "T1", "T2"), T1=T1, T2=T2, **c)
            pb(np.ones_like(s))
        timed(f"device vjp(flip,TR,T1,T2) {name} 10000", 10_000, pull)
    resident(1_000_000)


if __name__ == "__main__":
    what = sys.argv[1:] or ["host", "device"]
    print(blochsim.backends()["cuda"], flush=True)
    for w in what:
        globals()[w]()
