"""
A Cramér–Rao bound map from the Jacobian
========================================

The exact Jacobian of the signal with respect to the tissue (forward-mode
dual numbers through the EPG) gives the Fisher information of an
acquisition at every tissue, and so the smallest standard deviation any
unbiased estimator can reach (the Cramér–Rao bound). Here: the bound of T1
and of T2, relative to their values, for a fingerprinting train with M0,
T1 and T2 all unknown, over a (T1, T2) grid.
"""
import matplotlib.pyplot as plt
import numpy as np

from blochsim.optim import crlb
from blochsim.simulators import MRFSimulator

SIGMA = 0.01
flips = np.concatenate([np.linspace(5, 60, 150), np.linspace(60, 2, 150)])
sim = MRFSimulator(flip=flips, TR=10.0, TI=20.0, states=32)
T1, T2 = np.meshgrid(np.geomspace(300, 3000, 60), np.geomspace(20, 300, 50), indexing="ij")
_, J = sim.jacobian(("M0", "T1", "T2"), T1=T1, T2=T2, M0=1.0)  # (60, 50, 3, 300)
var = crlb(J.reshape(-1, 3, J.shape[-1]), SIGMA ** 2)  # (3000, 3): the bounds' variances
sd_T1 = np.sqrt(var[:, 1]).reshape(T1.shape) / T1
sd_T2 = np.sqrt(var[:, 2]).reshape(T2.shape) / T2

fig, axes = plt.subplots(1, 2, figsize=(10, 4))
extent = (20, 300, 300, 3000)
for ax, sd, name in ((axes[0], sd_T1, "T1"), (axes[1], sd_T2, "T2")):
    im = ax.imshow(100 * sd, origin="lower", aspect="auto", cmap="viridis",
                   extent=(np.log10(20), np.log10(300), np.log10(300), np.log10(3000)))
    ax.set_xlabel("log10 T2 (ms)")
    ax.set_ylabel("log10 T1 (ms)")
    ax.set_title(f"CRLB of {name}, % of {name} (noise {SIGMA})")
    fig.colorbar(im, ax=ax)
fig.tight_layout()
plt.show()
