"""Reading Pulseq files and playing them: blochsim's reader against
pypulseq's own (``Sequence.read``) on the same files in the same run, and
1e4 voxels simulated through each.

The files are written once per session with pypulseq by the writers of
``tests/test_pulseq_reference.py``: a turbo spin echo (8 echoes), a
single-shot HASTE-like train (64 echoes), a single-shot EPI (64 lobes),
and an RF-spoiled gradient echo of 20,000 TRs (100,000 blocks).

Run: ``pytest bench/test_bench_pulseq.py --benchmark-only``.
"""
import importlib.util
import pathlib
import warnings

import numpy as np
import pytest

pp = pytest.importorskip("pypulseq")

from blochsim import Simulator  # noqa: E402
from blochsim.pulseq import read_pulseq  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "_pulseq_writers", pathlib.Path(__file__).parents[1] / "tests" / "test_pulseq_reference.py")
writers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writers)

FILES = {
    "tse": lambda p: writers.tse(p, echoes=8),
    "haste": lambda p: writers.haste(p, echoes=64),
    "epi": lambda p: writers.epi(p, n=64),
    "gre_100k_blocks": lambda p: writers.long_gre(p, 20000),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, write in FILES.items():
            out[name] = write(root / f"{name}.seq")
    return out


def _blocks(path):
    text = pathlib.Path(path).read_text()
    body = text[text.index("[BLOCKS]"):].split("\n[", 1)[0]
    return sum(1 for line in body.splitlines()[1:] if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("reader", ["blochsim", "pypulseq"])
def test_read(benchmark, files, name, reader):
    """One read of the file: blochsim's operators (parse, moments, RF,
    shifts) or pypulseq's Sequence.read."""
    path = str(files[name])

    def read():
        if reader == "blochsim":
            return read_pulseq(path)
        seq = pp.Sequence()
        seq.read(path)
        return seq

    rounds = 3 if name == "gre_100k_blocks" else 10
    benchmark.pedantic(read, rounds=rounds, warmup_rounds=1)
    benchmark.extra_info["blocks"] = _blocks(path)


@pytest.mark.parametrize("name", ["tse", "haste", "epi"])
def test_simulate_1e4_voxels(benchmark, files, name):
    """1e4 voxels (a T1 x T2 grid) through the file, read outside the timing."""
    sim = Simulator.from_pulseq(files[name])
    T1, T2 = np.meshgrid(np.geomspace(300.0, 3000.0, 100), np.geomspace(20.0, 300.0, 100))
    T1, T2 = T1.ravel(), T2.ravel()
    sim.simulate(T1=T1[:16], T2=T2[:16])
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2}, rounds=3, warmup_rounds=1)
    assert out.shape[0] == 10_000
    benchmark.extra_info["voxels"] = 10_000
    benchmark.extra_info["samples"] = out.shape[1]
    benchmark.extra_info["voxels_per_s_median"] = 10_000 / benchmark.stats.stats.median


KEYED_FILES = {
    # pypulseq's TSE example's form: shots whose spoilers leave the train's proportion of x to z
    "tse_shots": (lambda p: writers.tse(p, shots=3, echoes=16, phase_encode=False), ("moment", "keyed")),
    # crushers on z and x changing area from echo to echo with no common unit: keyed only
    "tse16_unequal": (lambda p: writers.tse_unequal(p, echoes=16), ("moment",)),
    "tse24_unequal": (lambda p: writers.tse_unequal(p, echoes=24), ("moment",)),
    # 64 echoes, crushers of unequal areas on z and x, the same every echo: one order holds them too
    "tse64_unequal_fixed": (lambda p: writers.tse_unequal(p, echoes=64, vary=False), ("moment", "keyed")),
}


@pytest.fixture(scope="module")
def keyed_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("keyed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: write(root / f"{name}.seq") for name, (write, _) in KEYED_FILES.items()}


@pytest.mark.parametrize("name, dephasing", [(n, d) for n, (_, ds) in KEYED_FILES.items() for d in ds])
def test_keyed_1e4_voxels(benchmark, keyed_files, name, dephasing):
    """1e4 voxels (a T1 x T2 grid) through a file on one EPG order
    (``moment`` where one order holds it) or the moment-keyed EPG (``keyed``,
    and ``moment`` where one order cannot hold it), the keyed program built
    outside the timing (it is cached per stream and tissue range)."""
    from blochsim.sequence import keyed

    sim = Simulator.from_pulseq(keyed_files[name], dephasing=dephasing)
    T1, T2 = np.meshgrid(np.geomspace(300.0, 3000.0, 100), np.geomspace(20.0, 300.0, 100))
    T1, T2 = T1.ravel(), T2.ravel()
    sim.simulate(T1=T1, T2=T2)
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2}, rounds=3, warmup_rounds=0)
    assert out.shape[0] == 10_000
    played = [p for s, p in keyed._PROGRAMS.values()]
    benchmark.extra_info["voxels"] = 10_000
    benchmark.extra_info["samples"] = out.shape[1]
    if any(type(op).__name__ == "_Moment" for op in read_pulseq(keyed_files[name], dephasing=dephasing)):
        benchmark.extra_info["keyed_states"] = played[-1].max_slots
        benchmark.extra_info["keyed_state_events"] = played[-1].cost
        benchmark.extra_info["error_bound"] = played[-1].error_bound


def test_keyed_pools_1e3_voxels(benchmark, keyed_files):
    """1e3 voxels with an exchanging pool through the 16-echo train of
    unequal crushers (the moment-keyed EPG with pools: one voxel at a time
    in double precision), against the same call without pools."""
    sim = Simulator.from_pulseq(keyed_files["tse16_unequal"])
    T2 = np.geomspace(20.0, 300.0, 1000)
    pools = dict(poolB_fraction=0.15, poolB_exchange=30.0, poolB_T1=800.0, poolB_T2=20.0, poolB_shift=40.0)
    sim.simulate(T1=1000.0, T2=T2)
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": 1000.0, "T2": T2, **pools}, rounds=3, warmup_rounds=0)
    assert out.shape[0] == 1000
    import time

    t = time.perf_counter()
    sim.simulate(T1=1000.0, T2=T2)
    benchmark.extra_info["without_pools_s"] = time.perf_counter() - t
