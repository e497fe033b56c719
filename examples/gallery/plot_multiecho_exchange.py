"""
Myelin water imaging with exchange: a four-pool white-matter network
====================================================================

Multi-echo T2 relaxometry reads the myelin water fraction (MWF) from the
short-T2 part of a CPMG decay (MacKay et al. 1994, MRM 31:673). In white
matter that water is not alone: it exchanges with intra/extracellular
water and with the myelin's semisolid pool, which also exchanges, through
a second semisolid pool, with the rest (the four-pool network of Levesque
& Pike 2009, MRM 62:1487; :func:`blochsim.presets.white_matter_four_pool`).

Here :class:`blochsim.simulators.FSESimulator` plays a 48-echo CPMG train
(5 ms spacing, refocusing at 160° to show stimulated echoes) through the
network, and again with every exchange switched off. A regularised
non-negative T2 spectrum (Whittall & MacKay 1989, JMR 84:134) fitted to
each decay gives the apparent MWF. The network holds 0.07 / (1 - 0.18) =
0.085 of its water in myelin; the fit, which takes the refocusing as
perfect and smooths the spectrum, reads less even with every exchange off,
and exchange lowers it further: during the train myelin water's
magnetisation leaks into the intra/extracellular water and, through the
myelin semisolid, out of sight.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import nnls

from blochsim.presets import white_matter_four_pool
from blochsim.simulators import FSESimulator

ESP, ECHOES = 5.0, 48
wm = white_matter_four_pool(ihmt=False)
still = {**wm, **{k: 0.0 for k in wm if "exchange" in k}}
fse = FSESimulator(ESP=ESP, flip=np.full(ECHOES, 160.0), states=24)
echoes = ESP * np.arange(1, ECHOES + 1)
decays = {"exchanging": np.abs(fse.simulate(**wm)), "no exchange": np.abs(fse.simulate(**still))}

T2 = np.geomspace(5.0, 1000.0, 80)
A = np.exp(-echoes[:, None] / T2[None, :])
mu = 0.02  # Tikhonov weight on the spectrum (keeps it smooth)
A_reg = np.vstack([A, mu * np.eye(T2.size)])

fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
for name, d in decays.items():
    spectrum, _ = nnls(A_reg, np.concatenate([d / d[0], np.zeros(T2.size)]))
    mwf = spectrum[T2 < 40.0].sum() / spectrum.sum()
    ax[0].semilogy(echoes, d, "o-", ms=3, label=name)
    ax[1].semilogx(T2, spectrum, label=f"{name}: apparent MWF {mwf:.3f}")
    print(f"{name}: apparent MWF {mwf:.3f}")
ax[0].set_xlabel("echo time (ms)")
ax[0].set_ylabel("|echo| (fraction of M0)")
ax[0].legend()
ax[1].axvline(40.0, color="0.6", lw=0.8)
ax[1].set_xlabel("T2 (ms)")
ax[1].set_ylabel("amplitude")
ax[1].legend(fontsize=8)
fig.tight_layout()
plt.show()
water = 1 - wm["bound_fraction"] - wm["bound2_fraction"]
print("myelin water's share of the water:", round(wm["poolB_fraction"] / water, 3))
