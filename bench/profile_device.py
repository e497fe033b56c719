"""One resident reference-workload launch, for Nsight Compute:

    ncu --clock-control none -k regex:warp_kernel --launch-skip 1 --launch-count 1 \
        python3 bench/profile_device.py [atoms] [complex]
"""
import sys

import cupy as cp
import numpy as np

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
cplx = len(sys.argv) > 2 and sys.argv[2] == "complex"
k = np.arange(500)
sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32,
                   phases=0.5 * 117.0 * k * (k + 1) if cplx else 0.0)
T1, T2 = reference_tissues(n)
T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
out = cp.empty((n, 500), cp.complex64)
for _ in range(2):
    sim.simulate(T1=T1, T2=T2, out=out)
cp.cuda.Device().synchronize()
print("ok", float(cp.abs(out).max()))
