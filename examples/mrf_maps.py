"""T1, T2 and M0 maps of a simulated noisy MR fingerprinting phantom with
the four estimators of blochsim.estimators, with their errors and times.

- PERK: kernel ridge regression trained on simulated fingerprints;
- DictionaryMatcher: a T1 × T2 dictionary, M0 from the complex scale;
- NonlinearLeastSquares: Levenberg–Marquardt with exact Jacobians, started
  from the dictionary's maps;
- LookupTable: T1 alone, from a separate two-TI inversion-recovery
  acquisition of the same phantom (the ratio of its two images cancels M0).

Run: python examples/mrf_maps.py [size]
"""
import sys
import time

import numpy as np

from blochsim.estimators import PERK, DictionaryMatcher, LookupTable, NonlinearLeastSquares
from blochsim.simulators import InversionRecoverySimulator, MRFSimulator

SIGMA = 0.005  # noise per real and imaginary part (M0 = 1: unit magnetisation)


def phantom(size, rng):
    """Discs of white matter, grey matter and fluid-like tissue on a muscle
    background, with a smooth M0 shading: (T1, T2, M0) in ms, ms, a.u."""
    y, x = np.mgrid[-1:1:size * 1j, -1:1:size * 1j]
    T1 = np.full((size, size), 1400.0)
    T2 = np.full((size, size), 45.0)
    for (cx, cy, r, t1, t2) in [(-0.45, -0.4, 0.3, 800.0, 70.0), (0.45, -0.35, 0.3, 1300.0, 90.0),
                                (0.0, 0.45, 0.28, 2600.0, 220.0)]:
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        T1[inside], T2[inside] = t1, t2
    T1 *= 1 + 0.05 * rng.standard_normal(T1.shape)
    T2 *= 1 + 0.05 * rng.standard_normal(T2.shape)
    M0 = 0.8 + 0.3 * np.exp(-(x ** 2 + y ** 2))
    return T1, T2, M0


def noisy(s, rng):
    return s + SIGMA * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))


def report(name, maps, truth, seconds):
    errs = "  ".join(f"{k} {100 * np.sqrt(np.mean(((maps[k] - v) / v) ** 2)):5.2f} %" for k, v in truth.items()
                     if k in maps)
    print(f"{name:24s} {seconds:7.2f} s   rms relative error: {errs}")


def main(size=48):
    """Simulate the phantom at size × size voxels, map it four ways, print
    each estimator's time and rms relative errors."""
    rng = np.random.default_rng(0)
    T1, T2, M0 = phantom(size, rng)
    flips = np.concatenate([np.linspace(5, 60, 150), np.linspace(60, 2, 150)])
    mrf = MRFSimulator(flip=flips, TR=10.0, TI=20.0, states=24)
    s = noisy(mrf.simulate(T1=T1, T2=T2, M0=M0), rng)
    truth = {"T1": T1, "T2": T2, "M0": M0}
    print(f"phantom {size}x{size}, {len(flips)} MRF contrasts, noise sd {SIGMA}")

    t0 = time.perf_counter()
    perk = PERK(mrf, n_features=2000, complex_mode="magnitude").fit(
        noise_std=SIGMA, samples=50000, T1=(500.0, 3200.0), T2=(30.0, 300.0), M0=(0.6, 1.3))
    t1 = time.perf_counter()
    maps = perk.map(s)
    report(f"PERK (fit {t1 - t0:.1f} s)", maps, truth, time.perf_counter() - t1)

    t0 = time.perf_counter()
    dm = DictionaryMatcher(mrf, rank=30).fit(T1=np.geomspace(500.0, 3200.0, 120), T2=np.geomspace(30.0, 300.0, 100))
    t1 = time.perf_counter()
    dmap = dm.map(s)
    dmap["M0"] = np.abs(dmap["M0"])
    report(f"dictionary (fit {t1 - t0:.1f} s)", dmap, truth, time.perf_counter() - t1)

    t0 = time.perf_counter()
    nls = NonlinearLeastSquares(mrf, max_iterations=30).fit(
        noise_std=SIGMA, init={"T1": dmap["T1"], "T2": dmap["T2"], "M0": dmap["M0"]},
        T1=(300.0, 4000.0), T2=(10.0, 500.0), M0=(0.1, 3.0))
    nmap = nls.map(s)
    report("least squares", nmap, truth, time.perf_counter() - t0)
    print(f"{'':24s} median standard error: T1 {np.median(nmap['T1_se']):.1f} ms, "
          f"T2 {np.median(nmap['T2_se']):.2f} ms")

    ir = InversionRecoverySimulator(TI=[300.0, 2500.0])
    ir_images = noisy(ir.simulate(T1=T1, M0=M0), rng)
    t0 = time.perf_counter()
    lut = LookupTable(ir, feature=lambda x: np.real(x[:, 0] / x[:, 1])).fit(T1=np.linspace(300.0, 3500.0, 3201))
    report("lookup (IR, T1 only)", lut.map(ir_images), {"T1": T1}, time.perf_counter() - t0)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 48)
