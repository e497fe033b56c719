"""Exchange networks on the reference MRF train (SPEC §9: 500 TRs, 32
states): the four-pool white-matter network
(:func:`blochsim.presets.white_matter_four_pool`, with and without dipolar
order) against the two-pool rate (free water and one semisolid pool, the
star) measured in the same run, on the host and, where CUDA is usable, on
the device (NumPy through the card, and CuPy-resident); and a spoiled
train of dual-offset saturations (the lanes' saturation, formed once per
distinct pulse) on the two-pool star and the four-pool network.

Run: ``pytest bench/test_bench_networks.py --benchmark-only``.
"""
import numpy as np
import pytest

import blochsim
from blochsim import Delay, Pulse, Readout, Saturation, Simulator, Spoil
from blochsim.cli import reference_flips, reference_tissues
from blochsim.presets import white_matter_four_pool
from blochsim.sequence import Sequence
from blochsim.simulators import MRFSimulator

NETWORKS = {
    "two-pool": {"bound_fraction": 0.1, "bound_exchange": 20.0},
    "four-pool": {k: v for k, v in white_matter_four_pool(ihmt=False).items() if k not in ("T1", "T2")},
    "four-pool-ihmt": {k: v for k, v in white_matter_four_pool().items() if k not in ("T1", "T2")},
}


class SaturationTrain(Simulator):
    """300 repetitions of an 8 ms dual-offset saturation at 2 kHz (500°),
    then a 1 ms 20° pulse, a read and a spoiler."""
    protocol = {"repetitions": 300}

    def repetition(self, p):
        return Sequence([Saturation(500.0, 8.0, offset=2000.0, dual=True), Delay(2.0),
                         Pulse(20.0, duration=1.0), Readout(), Delay(5.0), Spoil()])


cuda = pytest.mark.skipif(not blochsim.backends()["cuda"]["available"], reason="no usable CUDA device")


def _record(benchmark, n):
    benchmark.extra_info["atoms"] = n
    benchmark.extra_info["atoms_per_s_median"] = n / benchmark.stats.stats.median


@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("n", [1_000, 10_000])
def test_host_mrf_forward_network(benchmark, n, network):
    """Forward on the host's lanes (single precision)."""
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cpu")
    sim.simulate(T1=T1[:16], T2=T2[:16], **NETWORKS[network])
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **NETWORKS[network]}, rounds=3,
                             warmup_rounds=1)
    assert out.shape == (n, 500)
    _record(benchmark, n)


@pytest.mark.parametrize("network", ["two-pool", "four-pool-ihmt"])
def test_host_saturation_train_network(benchmark, network):
    """SaturationTrain's forward on the host's lanes, 4 000 voxels."""
    T1, T2 = reference_tissues(4_000)
    sim = SaturationTrain()
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **NETWORKS[network]}, rounds=3,
                             warmup_rounds=1)
    assert out.shape == (4_000, 1)
    _record(benchmark, 4_000)


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_host_mrf_jacobian_network_1k(benchmark, network):
    """(T1, T2) Jacobian on the host (double precision per problem)."""
    T1, T2 = reference_tissues(1_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cpu")
    s, J = benchmark.pedantic(sim.jacobian, args=(("T1", "T2"),), kwargs={"T1": T1, "T2": T2, **NETWORKS[network]},
                              rounds=2, warmup_rounds=0)
    assert J.shape == (1_000, 2, 500)
    _record(benchmark, 1_000)


@cuda
@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("n", [100_000])
def test_device_mrf_forward_network_from_numpy(benchmark, n, network):
    """Forward through the card from NumPy (device='cuda')."""
    T1, T2 = reference_tissues(n)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    sim.simulate(T1=T1[:1024], T2=T2[:1024], **NETWORKS[network])
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, **NETWORKS[network]}, rounds=3,
                             warmup_rounds=1)
    assert out.shape == (n, 500)
    _record(benchmark, n)


@cuda
@pytest.mark.parametrize("network", sorted(NETWORKS))
@pytest.mark.parametrize("n", [100_000, 1_000_000])
def test_device_mrf_forward_network_resident(benchmark, n, network):
    """Forward on CuPy-resident arrays (the pooled kernels on the card)."""
    cp = pytest.importorskip("cupy")
    T1, T2 = reference_tissues(n)
    T1, T2 = cp.asarray(T1, cp.float32), cp.asarray(T2, cp.float32)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32)
    out = cp.empty((n, 500), cp.complex64)
    sim.simulate(T1=T1, T2=T2, out=out, **NETWORKS[network])
    benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2, "out": out, **NETWORKS[network]}, rounds=3,
                       warmup_rounds=1)
    _record(benchmark, n)


@cuda
@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_device_mrf_vjp_network_1e4(benchmark, network):
    """Pullback to (flip, TR, T1, T2) on the card (the pooled adjoint)."""
    T1, T2 = reference_tissues(10_000)
    sim = MRFSimulator(flip=reference_flips(500), TR=10.0, states=32, device="cuda")
    s, pullback = sim.vjp(("flip", "TR", "T1", "T2"), T1=T1, T2=T2, **NETWORKS[network])
    w = np.ones_like(s)
    benchmark.pedantic(pullback, args=(w,), rounds=2, warmup_rounds=0)
    _record(benchmark, 10_000)
