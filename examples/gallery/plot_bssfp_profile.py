"""
bSSFP off-resonance profiles
============================

Balanced SSFP in the steady state: the signal depends on the phase the
magnetisation precesses in one TR, 2π·B0·TR, and repeats every 1/TR in B0.
With RF phase cycling of 180° (the usual), the passband is centred on
resonance and the dark bands fall at ±1/(2 TR) (Scheffler & Lehnhardt 2003).
The closed form (Freeman & Hill 1971) and the played EPG sequence agree.
"""
import matplotlib.pyplot as plt
import numpy as np

from blochsim.simulators import TrueFISPSimulator, bSSFPSimulator

TR = 5.0  # ms
B0 = np.linspace(-1.0 / TR * 1e3, 1.0 / TR * 1e3, 401)  # Hz, two periods
T1, T2 = 1000.0, 100.0

fig, (ax_m, ax_p) = plt.subplots(1, 2, figsize=(10, 3.8))
for flip in (10.0, 30.0, 60.0):
    s = bSSFPSimulator(flip=flip, TR=TR).simulate(T1=T1, T2=T2, B0=B0)[:, 0]
    ax_m.plot(B0, np.abs(s), label=f"{flip:.0f}°")
    ax_p.plot(B0, np.angle(s, deg=True), label=f"{flip:.0f}°")
# the played sequence (2000 TRs from equilibrium, 10 s: the steady state) at 30°, every tenth offset
played = TrueFISPSimulator(flip=30.0, TR=TR, nshots=2000).simulate(T1=T1, T2=T2, B0=B0[::10])[:, -1]
ax_m.plot(B0[::10], np.abs(played), "k.", label="30°, played (EPG)")
ax_m.set_xlabel("off-resonance (Hz)")
ax_m.set_ylabel("|signal|")
ax_m.legend(fontsize=8)
ax_p.set_xlabel("off-resonance (Hz)")
ax_p.set_ylabel("phase (°)")
fig.suptitle(f"bSSFP, TR {TR:g} ms, T1 {T1:.0f} ms, T2 {T2:.0f} ms")
fig.tight_layout()
plt.show()
