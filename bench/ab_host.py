"""The host reference calls timed in one process, for A/B comparisons of two
builds run alternately on the same machine (bench/NOTES.md).

Run: ``python bench/ab_host.py [label [word]]``; prints one line per call
(those whose name holds ``word``, if given) with the median and the spread
of its repeats.  To compare with another commit,
install it beside this one (``pip install --target DIR``) and run the same
script with ``PYTHONPATH=DIR python -S``.
"""
import sys

import numpy as np

from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import FSESimulator, MRFSimulator
from timed import report  # bench/timed.py: run as a script, this folder is on the path

POOLS = {
    "mt": {"bound_fraction": 0.1, "bound_exchange": 20.0},
    "poolB": {"poolB_fraction": 0.2, "poolB_exchange": 10.0, "poolB_T2": 20.0, "poolB_shift": 50.0},
    "poolBC": {"poolB_fraction": 0.1, "poolB_exchange": 10.0, "poolB_shift": 50.0,
               "poolC_fraction": 0.05, "poolC_exchange": 20.0, "poolC_shift": -100.0},
    "poolBCDE+mt": {"bound_fraction": 0.1, "bound_exchange": 20.0,
                    **{f"pool{x}_{k}": v for x, sh in zip("BCDE", (50.0, -100.0, 200.0, -300.0))
                       for k, v in (("fraction", 0.02), ("exchange", 15.0), ("shift", sh))}},
}



def main(label, word=""):
    flips = reference_flips(500)
    real = MRFSimulator(flip=flips, TR=10.0, states=32)
    k = np.arange(500)
    cplx = MRFSimulator(flip=flips, TR=10.0, phases=0.5 * 117.0 * k * (k + 1), states=32)
    T1, T2 = reference_tissues(100_000)
    t1, t2 = T1[:10_000], T2[:10_000]
    s, pull = real.vjp("flip", T1=t1[:1000], T2=t2[:1000])
    cot = 2 * s
    # the one-problem player: Jacobians of two exchanging pools, and the
    # pooled adjoint (200 voxels, 200 TRs)
    short = MRFSimulator(flip=flips[:200], TR=10.0, states=32)
    t1s, t2s = t1[:200], t2[:200]
    sp, pull_mt = short.vjp(("flip", "T2"), T1=t1s, T2=t2s, **POOLS["mt"])
    cot_mt = 2 * sp
    fse = FSESimulator(ESP=10.0, flip=np.full(16, 180.0))
    calls = {
        "forward real 1e5": (lambda: real.simulate(T1=T1, T2=T2), 5),
        "forward real 1e4": (lambda: real.simulate(T1=t1, T2=t2), 10),
        "forward complex 1e4": (lambda: cplx.simulate(T1=t1, T2=t2), 10),
        "jacobian (T1, T2) 1e4": (lambda: real.jacobian(("T1", "T2"), T1=t1, T2=t2), 10),
        "vjp flip pullback 1e3": (lambda: pull(cot), 5),
        "MT forward 1e4": (lambda: real.simulate(T1=t1, T2=t2, **POOLS["mt"]), 5),
        "poolB forward 1e4": (lambda: real.simulate(T1=t1, T2=t2, **POOLS["poolB"]), 5),
        "poolB+C+MT forward 1e4": (lambda: real.simulate(T1=t1, T2=t2, **POOLS["poolBC"], **POOLS["mt"]), 5),
        "poolB+C+D+E+MT forward 1e3": (lambda: real.simulate(T1=t1[:1000], T2=t2[:1000], **POOLS["poolBCDE+mt"]), 5),
        "MT jacobian (T1, T2) 1e3": (lambda: real.jacobian(("T1", "T2"), T1=t1[:1000], T2=t2[:1000], **POOLS["mt"]), 5),
        "poolB+C jacobian (T1, T2) 200, 200 TRs": (
            lambda: short.jacobian(("T1", "T2"), T1=t1s, T2=t2s, **POOLS["poolBC"]), 5),
        "MT vjp (flip, T2) pullback 200, 200 TRs": (lambda: pull_mt(cot_mt), 5),
        "one voxel": (lambda: real.simulate(T1=1000.0, T2=80.0), 200),
        "one voxel, jacobian (T1, T2)": (lambda: real.jacobian(("T1", "T2"), T1=1000.0, T2=80.0), 200),
        "one voxel, FSE of 16 echoes": (lambda: fse.simulate(T1=1000.0, T2=80.0), 200),
    }
    report(label, calls, word)


if __name__ == "__main__":
    main(*sys.argv[1:3]) if len(sys.argv) > 1 else main("this")
