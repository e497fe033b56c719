"""Where a resident device call spends its time beyond the kernel (device
tool): the whole ``simulate`` call against ``_core.forward_cuda`` alone on
the same device buffers, and a cProfile of the whole call.

    python3 bench/overhead_device.py [atoms]
"""
import cProfile
import pstats
import sys
import time

import cupy as cp

from blochsim import _core
from blochsim.cli import reference_flips, reference_tissues
from blochsim.simulators import MRFSimulator

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
T1, T2 = reference_tissues(n)
T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
out = cp.empty((n, 500), cp.complex64)


def median(f, reps=7):
    f()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


full = median(lambda: sim.simulate(T1=T1, T2=T2, out=out))
print(f"n={n}: simulate {full * 1e3:.3f} ms = {n / full / 1e6:.1f} M atoms/s")
# the launch alone, with the arguments simulate() gives it
seen = {}
real_forward = _core.forward_cuda


def spy(ps, dev, count, out_ptr, stream):
    # copies of the planes: simulate() frees its own when it returns
    own = []
    for d in dev:
        if d is None:
            own.append(None)
            continue
        size = count if d[1] else 1
        plane = cp.empty(size, cp.float32)
        cp.cuda.runtime.memcpyAsync(plane.data.ptr, d[0], 4 * size, cp.cuda.runtime.memcpyDeviceToDevice, stream)
        own.append(plane)
    seen["args"] = (ps, count, out_ptr, own, [None if d is None else d[1] for d in dev])
    return real_forward(ps, dev, count, out_ptr, stream)


_core.forward_cuda = spy
sim.simulate(T1=T1, T2=T2, out=out)
_core.forward_cuda = real_forward
ps, count, out_ptr, own, strides = seen["args"]
cp.cuda.Device().synchronize()
dev = tuple(None if a is None else (int(a.data.ptr), st) for a, st in zip(own, strides))
stream = cp.cuda.Stream(non_blocking=True)
kern = median(lambda: (real_forward(ps, dev, count, out_ptr, stream.ptr), stream.synchronize()))
print(f"forward_cuda alone {kern * 1e3:.3f} ms = {n / kern / 1e6:.1f} M atoms/s; "
      f"the rest of simulate {(full - kern) * 1e3:.3f} ms")
pr = cProfile.Profile()
pr.enable()
for _ in range(10):
    sim.simulate(T1=T1, T2=T2, out=out)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
