"""
Inhomogeneous MT: ihMTR against the MT pulse's B1 rms and the dipolar T1D
=========================================================================

A semisolid pool with dipolar order (its relaxation time T1D) is saturated
less by a pulse at one offset than by the same energy split between +Δ and
−Δ: a single offset builds dipolar order, which holds part of the
Zeeman magnetisation back, while alternating offsets destroy it (Varma et
al. 2015, MRM 73:614; the two-pool model with dipolar order, Varma et al.
2015, JMR 260:67). The difference is the ihMT ratio,
ihMTR = (S_single − S_dual) / S_0.

Here :class:`blochsim.simulators.MTSimulator` plays a spoiled gradient echo
with an 8 ms MT pulse at 7 kHz every 30 ms, once at +7 kHz and once
frequency-alternating (``mt_mode="dual"``: 8 exact parts of 1 ms, 7
whole cycles each, alternating between ±7 kHz), with the white-matter network of
:func:`blochsim.presets.white_matter_four_pool` and a range of T1D. The
ratio grows with power, more slowly as the semisolid pool nears full
saturation, and vanishes as T1D shortens (the dipolar reservoir relaxes
before it can hold anything back). It stays at a few per cent here because
in this network the myelin semisolid, the pool with dipolar order, touches
only myelin water, which passes its saturation on to the
intra/extracellular water slowly.
"""
import matplotlib.pyplot as plt
import numpy as np

from blochsim.presets import white_matter_four_pool
from blochsim.sequence.operators import GAMMA_RAD_PER_S_PER_T
from blochsim.simulators import MTSimulator

DURATION, OFFSET, TR, FLIP = 8.0, 7000.0, 30.0, 8.0  # ms, Hz, ms, degrees
b1_rms = np.linspace(1.0, 12.0, 12)  # µT over the MT pulse
t1d = np.array([0.3, 1.0, 3.0, 6.0, 15.0])  # ms
tissue = {**white_matter_four_pool(), "bound_T1D": t1d}

# flip of a rectangular pulse of amplitude B1 over DURATION: gamma B1 tau
mt_flips = np.degrees(GAMMA_RAD_PER_S_PER_T * b1_rms * 1e-6 * DURATION * 1e-3)
common = dict(flip=FLIP, TR=TR, mt_duration=DURATION, mt_offset=OFFSET, n_tr=150)
s0 = MTSimulator(**common, mt_flip=0.0).simulate(**tissue)[..., 0].real
ihmtr = np.empty((len(b1_rms), len(t1d)))
mtr = np.empty(len(b1_rms))
for i, f in enumerate(mt_flips):
    single = MTSimulator(**common, mt_flip=f).simulate(**tissue)[..., 0].real
    dual = MTSimulator(**common, mt_flip=f, mt_mode="dual").simulate(**tissue)[..., 0].real
    ihmtr[i] = (single - dual) / s0
    mtr[i] = 1 - single[-1] / s0[-1]

fig, ax = plt.subplots(1, 2, figsize=(9.5, 3.8))
for j, t in enumerate(t1d):
    ax[0].plot(b1_rms, 100 * ihmtr[:, j], "o-", ms=3, label=f"T1D = {t:g} ms")
ax[0].set_xlabel("B1 rms of the MT pulse (µT)")
ax[0].set_ylabel("ihMTR (%)")
ax[0].legend(fontsize=8)
ax[0].set_title("ihMTR against power")
ax[1].semilogx(t1d, 100 * ihmtr[np.searchsorted(b1_rms, 6.0)], "o-")
ax[1].set_xlabel("T1D (ms)")
ax[1].set_ylabel("ihMTR at 6 µT (%)")
ax[1].set_title(f"MTR at 6 µT: {100 * mtr[np.searchsorted(b1_rms, 6.0)]:.0f} %")
fig.tight_layout()
plt.show()
print("ihMTR (%) at 6 µT:", dict(zip(t1d.tolist(), np.round(100 * ihmtr[np.searchsorted(b1_rms, 6.0)], 2))))
