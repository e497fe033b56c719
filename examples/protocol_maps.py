"""Parameter maps from the sequence library's protocols on a simulated
noisy phantom, each the way it is measured on a scanner:

- T1 from MP2RAGE's uniform image (Marques et al. 2010) by a lookup table;
- T1 from DESPOT1's variable flip angles, with and without the B1 map;
- T2* from a multi-echo gradient echo (T2 in the states, T2' on the
  samples) by a log-linear fit of the echoes;
- the diffusion tensor's mean diffusivity and fractional anisotropy.

Run: python examples/protocol_maps.py [size]
"""
import sys
import time

import numpy as np

from blochsim.estimators import LookupTable
from blochsim.simulators import (DESPOT1Simulator, DiffusionTensorSimulator, MP2RAGESimulator,
                                 MultiEchoGRESimulator)

SIGMA = 0.002  # noise per real and imaginary part (M0 = 1)


def phantom(size):
    """Discs of white matter, grey matter and CSF-like tissue: T1, T2, T2'
    (ms), M0, a B1 that falls off to the edges, and a diffusion tensor
    (µm²/ms) whose fibres run along x in the white matter."""
    y, x = np.mgrid[-1:1:size * 1j, -1:1:size * 1j]
    t = {"T1": np.full((size, size), 1300.0), "T2": np.full((size, size), 80.0),
         "T2prime": np.full((size, size), 60.0), "M0": 0.9 + 0.1 * x}
    D = np.zeros((size, size, 3))
    D[:] = 0.8
    for (cx, cy, r, t1, t2, t2p, lam) in [(-0.45, -0.3, 0.35, 800.0, 70.0, 40.0, (1.6, 0.3, 0.3)),
                                          (0.45, -0.3, 0.35, 1400.0, 90.0, 50.0, (0.8, 0.8, 0.8)),
                                          (0.0, 0.45, 0.3, 3500.0, 500.0, 200.0, (3.0, 3.0, 3.0))]:
        inside = (x - cx) ** 2 + (y - cy) ** 2 < r ** 2
        t["T1"][inside], t["T2"][inside], t["T2prime"][inside], D[inside] = t1, t2, t2p, lam
    t["B1"] = 1.05 - 0.25 * (x ** 2 + y ** 2)
    t["Dxx"], t["Dyy"], t["Dzz"] = D[..., 0], D[..., 1], D[..., 2]
    return t


def noisy(s, rng):
    return s + SIGMA * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))


def report(name, estimate, truth, seconds):
    err = np.abs(estimate - truth) / truth
    print(f"{name:34s} median error {100 * np.nanmedian(err):5.2f} %   {seconds:6.3f} s")


def main(size=48):
    rng = np.random.default_rng(1)
    t = phantom(size)

    # MP2RAGE: the uniform image is free of M0; a lookup table inverts it for T1
    mp2 = MP2RAGESimulator(TI=[700.0, 2500.0], flip=[4.0, 5.0], TR=5000.0, TR_gre=7.0, n_readouts=160)
    s = noisy(mp2.simulate(T1=t["T1"], M0=t["M0"]), rng)
    start = time.perf_counter()
    lut = LookupTable(mp2, feature=lambda s: MP2RAGESimulator.uni(s)).fit(T1=np.linspace(300.0, 4500.0, 2000))
    T1_mp2 = lut.map(s.reshape(-1, 2))["T1"].reshape(size, size)
    report("T1, MP2RAGE UNI lookup", T1_mp2, t["T1"], time.perf_counter() - start)

    # DESPOT1: the line S/sin a = E1 S/tan a + M0 (1 - E1); B1 errors scale T1 by about B1^2
    vfa = DESPOT1Simulator(flip=[3.0, 8.0, 15.0], TR=6.0)
    s = noisy(vfa.simulate(T1=t["T1"], M0=t["M0"], B1=t["B1"]), rng)
    start = time.perf_counter()
    T1_vfa = vfa.fit(s, B1=t["B1"])["T1"]
    report("T1, DESPOT1 with the B1 map", T1_vfa, t["T1"], time.perf_counter() - start)
    report("T1, DESPOT1 without it", vfa.fit(s)["T1"], t["T1"], 0.0)

    # multi-echo GRE, ideally spoiled: the echoes decay at 1/T2* = 1/T2 + 1/T2'
    TE = np.arange(3.0, 40.0, 4.0)
    megre = MultiEchoGRESimulator(flip=20.0, TR=50.0, TE=TE, rf_spoiling=None, repetitions="auto")
    start = time.perf_counter()
    s = noisy(megre.simulate(T1=t["T1"], T2=t["T2"], T2prime=t["T2prime"], M0=t["M0"]), rng)
    slope = np.polyfit(TE, np.log(np.abs(s).reshape(-1, TE.size).T), 1)[0]
    T2star = (-1.0 / slope).reshape(size, size)
    report("T2*, multi-echo GRE", T2star, 1 / (1 / t["T2"] + 1 / t["T2prime"]), time.perf_counter() - start)

    # DTI: 30 directions at b = 1000 plus two b = 0
    g = rng.standard_normal((30, 3))
    dirs = np.concatenate([[[0.0, 0.0, 1.0]] * 2, g / np.linalg.norm(g, axis=1, keepdims=True)])
    dti = DiffusionTensorSimulator(b=np.r_[0.0, 0.0, np.full(30, 1000.0)], directions=dirs, TE=70.0)
    start = time.perf_counter()
    s = noisy(dti.simulate(T2=t["T2"], M0=t["M0"], Dxx=t["Dxx"], Dyy=t["Dyy"], Dzz=t["Dzz"]), rng)
    fit = dti.fit_tensor(s)
    lam = np.stack([fit["Dxx"], fit["Dyy"], fit["Dzz"]], axis=-1)  # the phantom's tensors are diagonal
    md = lam.mean(axis=-1)
    fa = np.sqrt(1.5 * np.sum((lam - md[..., None]) ** 2, axis=-1) / np.sum(lam ** 2, axis=-1))
    report("MD, diffusion tensor", md, (t["Dxx"] + t["Dyy"] + t["Dzz"]) / 3, time.perf_counter() - start)
    wm = t["Dxx"] > 1.5
    true = np.array([1.6, 0.3, 0.3])
    fa_true = np.sqrt(1.5 * np.sum((true - true.mean()) ** 2) / np.sum(true ** 2))
    print(f"{'FA in the white matter':34s} {np.median(fa[wm]):.3f} (true {fa_true:.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 48)
