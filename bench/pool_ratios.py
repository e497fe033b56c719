"""Interleaved medians of the pooled host kernels against the single pool
on the reference workload (SPEC §9), in one run, so that the VM's load
moves every case alike.

Run: ``python bench/pool_ratios.py [atoms] [forward|jacobian]``.  Prints
atoms/s and each case's time over the single pool's real-path and
complex-path times (the complex single pool: an RF-spoiled phase train).
"""
import sys
import time

import numpy as np

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator


def main(n, mode):
    T1, T2 = reference_tissues(n)
    k = np.arange(500)
    real = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    cplx = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, phases=(0.5 * 117.0 * k * (k + 1)) % 360)
    mt = {"bound_fraction": 0.1, "bound_exchange": 20.0}
    pool_b = {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0}
    cases = {
        "single, real path": (real, {}),
        "single, complex path": (cplx, {}),
        "MT": (real, mt),
        "poolB on resonance": (real, pool_b),
        "poolB, 50 Hz shift": (real, {**pool_b, "poolB_shift": 50.0}),
        "MT, complex stream": (cplx, mt),
        "poolB, complex stream": (cplx, pool_b),
    }

    def call(sim, kw, T1, T2):
        if mode == "jacobian":
            return sim.jacobian(("T1", "T2"), T1=T1, T2=T2, **kw)
        return sim.simulate(T1=T1, T2=T2, **kw)

    for sim, kw in cases.values():
        call(sim, kw, T1[:16], T2[:16])
    times = {c: [] for c in cases}
    for _ in range(5):
        for c, (sim, kw) in cases.items():
            t0 = time.perf_counter()
            call(sim, kw, T1, T2)
            times[c].append(time.perf_counter() - t0)
    med = {c: np.median(v) for c, v in times.items()}
    real_t, cplx_t = med["single, real path"], med["single, complex path"]
    print(f"{mode}, {n} atoms (median of 5, interleaved)")
    for c in cases:
        print(f"  {c:24s} {n / med[c]:11,.0f} atoms/s   / single real {med[c] / real_t:5.2f}"
              f"   / single complex {med[c] / cplx_t:5.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000, sys.argv[2] if len(sys.argv) > 2 else "forward")
