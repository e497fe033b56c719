"""The device's register path (epg/registers.hpp), instantiated on the host.

The GPU runs RegisterStore with teams of threads exchanging boundary orders;
here the same template runs with a team of 1 (one member holds every order)
and of 4 (the members are the lanes of a vector, so shifts cross members as
on the GPU), the team of 4 with the orders past its registers in a tail
in memory (the tail kernel beyond 8192 orders), and teams of 4 with 8
orders each (the narrow warp kernel of calls with few problems); each must
give the host backend's results.
"""
import numpy as np
import pytest

from blochsim import Delay, Dephase, Excitation, Pulse, Readout, Refocusing, Sequence, Simulator, Spoil
from blochsim.simulators import FSESimulator, MRFSimulator, StimulatedEchoSimulator, TrueFISPSimulator

# K at most 32 (real) / 16 (complex) with one member, 4 * 16 / 4 * 8 with four.
FLIPS = np.concatenate([np.linspace(5, 60, 40), np.linspace(60, 2, 40)])


def run(sim, variant, **kw):
    sim._host_variant = variant
    try:
        return sim.simulate(**kw)
    finally:
        sim._host_variant = 0


class Mixed(Simulator):
    """Shifts both ways, a spoiler, pulses at several phases, flow."""

    tissue_properties = ("T1", "T2", "B0", "B1", "v", "D")

    def repetition(self, p):
        return Sequence([Excitation(90.0, 90.0), Dephase(), Delay(5.0), Refocusing(150.0), Dephase(-1),
                         Delay(3.0), Readout(), Dephase(2), Delay(4.0), Pulse(60.0, 33.0), Dephase(-1),
                         Readout(), Spoil(), Readout(), Delay(2.0), Pulse(40.0, -20.0), Dephase(3),
                         Readout(), Dephase(-3), Readout()])


CASES = [
    ("mrf real, K = 16", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=16), {}),
    ("mrf real, K = 13 (truncated team)", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=13), {}),
    ("mrf real, K = 64 over 4 members", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=64), {}),
    ("mrf real, B1", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=50),
     {"B1": np.array([0.8, 1.1, 1.0])}),
    ("fse complex, K = 8", lambda: FSESimulator(ESP=5.0, flip=np.full(20, 130.0), states=8), {}),
    ("fse complex, B0, K = 29", lambda: FSESimulator(ESP=5.0, flip=np.full(20, 130.0), states=29),
     {"B0": np.array([0.0, 17.0, -40.0])}),
    ("fse diffusion, K = 32",
     lambda: FSESimulator(ESP=5.0, flip=np.full(20, 130.0), states=32, crusher_dephasing_rad=8 * np.pi,
                          voxel_size_m=1e-3), {"D": np.array([1.0, 3.0, 0.2])}),
    ("mixed with flow", lambda: Mixed(states=12, crusher_dephasing_rad=2 * np.pi, voxel_size_m=2e-3),
     {"v": np.array([0.01, -0.05, 0.3]), "B1": 0.9}),
    ("mrf real, K = 75 (tail past 64)", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=75), {}),
    ("mrf real, B1, K = 200 (tail)", lambda: MRFSimulator(flip=FLIPS, TR=10.0, states=200),
     {"B1": np.array([0.8, 1.1, 1.0])}),
    ("fse complex, B0, K = 70 (tail past 32)",
     lambda: FSESimulator(ESP=5.0, flip=np.full(40, 130.0), states=70), {"B0": np.array([0.0, 17.0, -40.0])}),
    ("fse diffusion, K = 90 (tail)",
     lambda: FSESimulator(ESP=5.0, flip=np.full(40, 130.0), states=90, crusher_dephasing_rad=8 * np.pi,
                          voxel_size_m=1e-3), {"D": np.array([1.0, 3.0, 0.2])}),
    ("mixed with flow, K = 40 (tail)", lambda: Mixed(states=40, repetitions=4, crusher_dephasing_rad=2 * np.pi,
                                                     voxel_size_m=2e-3),
     {"v": np.array([0.01, -0.05, 0.3]), "B1": 0.9, "B0": 7.0}),
    ("truefisp", lambda: TrueFISPSimulator(flip=50.0, TR=5.0, nshots=100), {"B0": np.array([0.0, 23.0, 3.0])}),
    ("stimulated echo", lambda: StimulatedEchoSimulator(flip=[70.0, 110.0, 95.0], TE=20.0, TM=150.0), {}),
]


@pytest.mark.parametrize("variant", [1, 4, 5, 8], ids=["team of 1", "team of 4", "team of 4 with a tail",
                                                        "team of 4, 8 orders each (the narrow kernel)"])
@pytest.mark.parametrize("name,make,extra", CASES, ids=[c[0] for c in CASES])
def test_register_path_equals_host_backend(variant, name, make, extra):
    sim = make()
    kw = {"T1": np.array([300.0, 900.0, 2000.0]), "T2": np.array([30.0, 80.0, 150.0]), **extra}
    if "T1" not in sim.tissue_properties:
        kw.pop("T1")
    ref = sim.simulate(**kw)
    K = sim.stream()[1]["states"] or max(8, 1 + sim.stream()[0].total_shifts)
    real, _ = sim.stream()[0].real_subspace(any(k in kw for k in ("B0", "B1phase", "v")))
    capacity = {1: 32 if real else 16, 4: 4 * (16 if real else 8), 5: 1 << 30, 8: 32}[variant]
    if K > capacity:
        with pytest.raises(ValueError, match="states exceed what the register team holds"):
            run(sim, variant, **kw)
        return
    out = run(sim, variant, **kw)
    assert np.max(np.abs(out - ref)) <= 2e-6 * np.max(np.abs(ref))


def test_register_path_perfect_cpmg_oracle():
    n, esp = 30, 6.0
    sim = FSESimulator(ESP=esp, flip=np.full(n, 180.0), states=32)
    T2 = np.array([40.0, 90.0])
    out = run(sim, 4, T1=1000.0, T2=T2)
    expect = np.exp(-np.arange(1, n + 1)[None, :] * esp / T2[:, None])
    assert np.max(np.abs(np.abs(out) - expect)) < 1e-5
