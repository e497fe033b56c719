"""One resident call of one of issue 40's device paths on the reference MRF
train (500 TRs, TR 10 ms, states 32), played twice (the second is the one
to profile), for Nsight Compute:

    ncu --clock-control none --launch-skip 1 --launch-count 1 \\
        -k regex:"warp_kernel|block_kernel|tail_kernel|jacobian_kernel|jacobian_block_kernel|pooled_team_kernel" \\
        python3 bench/profile_paths.py PATH [atoms]

PATH: real, complex (RF-spoiled phases), bssfp (kind="bssfp" with B0),
jacobian (T1, T2 on the real path), mt (a semisolid pool), poolB (an
exchanging pool 50 Hz off water), states128, jacobian512 (T1, T2 at 512
states on a 512-TR train: block teams).  ``bench/profile_paths.sh``
profiles them all and prints instructions per atom and TR.
"""
import sys

import cupy as cp
import numpy as np

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

PATHS = ("real", "complex", "bssfp", "jacobian", "mt", "poolB", "states128", "jacobian512")


def call(path, n):
    """(simulator, keyword arguments) of one resident call of ``path``."""
    k = np.arange(500)
    T1, T2 = reference_tissues(n)
    tissue = {"T1": cp.asarray(T1, cp.float32), "T2": cp.asarray(T2, cp.float32)}
    opts = {}
    if path == "complex":
        opts["phases"] = 0.5 * 117.0 * k * (k + 1)
    if path == "bssfp":
        opts["kind"] = "bssfp"
        tissue["B0"] = cp.asarray(np.linspace(-50.0, 50.0, n), cp.float32)
    if path == "states128":
        opts["states"] = 128
    flips = reference_flips(500)
    if path == "jacobian512":
        opts["states"] = 512
        flips = np.resize(flips, 512)
    if path == "mt":
        tissue.update(bound_fraction=0.1, bound_exchange=20.0)
    if path == "poolB":
        tissue.update(poolB_fraction=0.2, poolB_exchange=10.0, poolB_T2=20.0, poolB_shift=50.0)
    sim = MRFSimulator(flip=flips, TR=10.0, **{"states": 32, **opts})
    return sim, tissue


def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    sim, tissue = call(path, n)
    for _ in range(2):
        r = sim.jacobian(("T1", "T2"), **tissue) if path.startswith("jacobian") else sim.simulate(**tissue)
    cp.cuda.Device().synchronize()
    signal = r[0] if isinstance(r, tuple) else r
    print("ok", path, n, float(cp.abs(cp.asarray(signal)).max()))


if __name__ == "__main__":
    main()
