"""One pooled reference-workload call (NumPy in and out through the device),
for Nsight Compute's kernel times, e.g.

    ncu --clock-control none --metrics gpu__time_duration.sum \\
        -k regex:"pooled_team_kernel|warp_kernel" python3 bench/profile_pools.py 100000 mt

The pools: none (the single-pool warp kernel), mt, poolB (50 Hz shift) or
poolB_noshift.
"""
import sys

import numpy as np

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

POOLS = {
    "none": {},
    "mt": {"bound_fraction": 0.1, "bound_exchange": 20.0},
    "poolB": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0, "poolB_shift": 50.0},
    "poolB_noshift": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0},
}

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
pool = sys.argv[2] if len(sys.argv) > 2 else "mt"
T1, T2 = reference_tissues(n)
sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
out = sim.simulate(T1=T1, T2=T2, **POOLS[pool])
print("ok", pool, n, float(np.abs(out).max()))
