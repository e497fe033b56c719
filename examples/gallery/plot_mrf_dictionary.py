"""
An MR fingerprinting dictionary and its matching
================================================

An FISP fingerprinting train (Jiang et al. 2015): an inversion, then TRs of
varying flip angle, each read right after its pulse, with one unbalanced
gradient (one EPG shift) per TR. The dictionary holds the signal of every
(T1, T2) on a grid; a measured fingerprint is matched to the atom of
largest normalised inner product (Ma et al. 2013), which gives T1, T2 and
M0 at once.
"""
import matplotlib.pyplot as plt
import numpy as np

from blochsim.estimators import DictionaryMatcher
from blochsim.simulators import MRFSimulator

flips = np.concatenate([np.linspace(5, 60, 100), np.linspace(60, 2, 100)])
sim = MRFSimulator(flip=flips, TR=10.0, TI=20.0, states=32)
dm = DictionaryMatcher(sim).fit(T1=np.geomspace(200, 3000, 120), T2=np.geomspace(10, 300, 100))

rng = np.random.default_rng(0)
T1 = rng.uniform(300, 2500, 400)
T2 = rng.uniform(20, 250, 400)
signals = 0.9 * sim.simulate(T1=T1, T2=T2)
signals = signals + 0.01 * (rng.standard_normal(signals.shape) + 1j * rng.standard_normal(signals.shape))
maps = dm.map(signals)

fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
for t1, t2 in ((800.0, 50.0), (1400.0, 100.0), (2500.0, 250.0)):
    axes[0].plot(np.real(sim.simulate(T1=t1, T2=t2)), lw=1, label=f"T1 {t1:.0f}, T2 {t2:.0f} ms")
axes[0].set_xlabel("TR")
axes[0].set_ylabel("signal")
axes[0].set_title("fingerprints")
axes[0].legend(fontsize=7)
axes[1].plot(T1, maps["T1"], ".", ms=3)
axes[1].plot([200, 3000], [200, 3000], "k--", lw=1)
axes[1].set_xlabel("true T1 (ms)")
axes[1].set_ylabel("matched T1 (ms)")
axes[2].plot(T2, maps["T2"], ".", ms=3)
axes[2].plot([10, 300], [10, 300], "k--", lw=1)
axes[2].set_xlabel("true T2 (ms)")
axes[2].set_ylabel("matched T2 (ms)")
fig.suptitle(f"{len(dm.params['T1']):,} atoms, noise 0.01, median |M0| {np.median(np.abs(maps['M0'])):.3f} (true 0.9)")
fig.tight_layout()
plt.show()
