"""Parallel transmission on the reference MRF train (SPEC §9, 500 TRs, 32
states): one real B1 map (the base), two channels with a static shim, and
two channels with a shim per pulse (per-pulse transmit settings), the
forward on the host and, where a GPU is usable, on the card (NumPy in and
out, device='cuda'); and the Jacobian along the maps with a shim per pulse
over the first 20 TRs (one kernel pass a pulse).

Run: ``pytest bench/test_bench_ptx.py --benchmark-only``.
"""
import numpy as np
import pytest

import blochsim
from blochsim.cli import reference_flips
from blochsim.simulators import MRFSimulator

N = 20_000
RNG = np.random.default_rng(0)
MAPS = (0.6 + 0.4 * RNG.random((2, N))) * np.exp(1j * RNG.uniform(-1.0, 1.0, (2, N)))
T1 = np.geomspace(200.0, 3000.0, N)
T2 = np.geomspace(10.0, 300.0, N)
SHIM = np.array([1.0, np.exp(0.8j)])
SHIMS = np.exp(1j * np.linspace(0.0, 2.0, 500))[:, None] * SHIM
DEVICES = ["cpu"] + (["cuda"] if blochsim.backends()["cuda"]["available"] else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["one map", "static shim", "shim per pulse"])
def test_ptx_forward(benchmark, case, device):
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device=device)
    kw = {"one map": {"B1": np.abs(SHIM @ MAPS)}, "static shim": {"B1": MAPS, "shim": SHIM},
          "shim per pulse": {"B1": MAPS, "shim": SHIMS}}[case]
    sim.simulate(T1=T1[:16], T2=T2[:16], **{k: (v[..., :16] if k == "B1" else v) for k, v in kw.items()})
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **kw}, rounds=3, warmup_rounds=1)
    assert out.shape == (N, 500)
    benchmark.extra_info["atoms_per_s_median"] = N / benchmark.stats.stats.median


@pytest.mark.parametrize("device", DEVICES)
def test_ptx_jacobian_shim_per_pulse(benchmark, device):
    n = 2_000
    sim = MRFSimulator(flip=reference_flips(500)[:20], TR=10.0, states=32, device=device)
    kw = {"T1": T1[:n], "T2": T2[:n], "B1": MAPS[:, :n], "shim": SHIMS[:20]}
    s, J = benchmark.pedantic(sim.jacobian, args=(("T2", "B1"),), kwargs=kw, rounds=3, warmup_rounds=1)
    assert J.shape == (n, 5, 20)
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median
