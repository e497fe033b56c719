"""blochsim's Pulseq reader and simulators against MRzero (``mrzerocore``
on PyPI, a phase-distribution-graph simulator) on the same files in the
same run, 1e3 and 1e4 voxels of a T1 x T2 range.

The files are written with pypulseq by the writers of
``tests/test_pulseq_reference.py``: a turbo spin echo (8 echoes), pypulseq's
TSE example's form (3 shots of 16 echoes whose spoilers leave the train's
proportion), a HASTE-like train (64 echoes), an EPI (64 lobes), a TSE
whose crushers change area every echo (16 echoes; the moment-keyed EPG) and
pypulseq's spin-echo EPI form (64 lines).
blochsim's call is timed by pytest-benchmark (its moment-keyed program
built outside the timing, as it is cached per sequence and tissue range);
MRzero's ``compute_graph`` and ``execute_graph`` at their default pruning
(at most 200 states, 1e-4 state magnitude, 1e-2 emitted and latent signal)
are timed in the same test, its graph alone too, and the ratio is recorded
in ``extra_info``.  MRzero returns every ADC sample of the voxels summed,
blochsim each ADC's echo per voxel.

Run: ``pip install ".[bench,mrzero]"`` and then
``pytest bench/test_bench_mrzero.py --benchmark-only``.
"""
import importlib.util
import pathlib
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("pypulseq")
torch = pytest.importorskip("torch")
mr0 = pytest.importorskip("MRzeroCore")

from blochsim import Simulator  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "_pulseq_writers", pathlib.Path(__file__).parents[1] / "tests" / "test_pulseq_reference.py")
writers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writers)

FILES = {
    "tse": lambda p: writers.tse(p, echoes=8),
    "tse_shots": lambda p: writers.tse(p, shots=3, echoes=16, phase_encode=False),
    "haste": lambda p: writers.haste(p, echoes=64),
    "epi": lambda p: writers.epi(p, n=64),
    "tse16_unequal": lambda p: writers.tse_unequal(p, echoes=16),
    "epi_se": lambda p: writers.epi_se(p, n=64, TE=60e-3),
}
VOXELS = [1000, 10000]
THREADS = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("mrzero")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: write(root / f"{name}.seq") for name, write in FILES.items()}


@pytest.mark.parametrize("voxels", VOXELS)
@pytest.mark.parametrize("name", list(FILES))
def test_against_mrzero(benchmark, files, name, voxels):
    """One file: blochsim's simulate (benchmarked) and MRzero's graph and
    execution on the same threads (the best of 3 after a warm-up)."""
    T1 = np.geomspace(300.0, 3000.0, voxels)
    T2 = np.geomspace(20.0, 300.0, voxels)
    sim = Simulator.from_pulseq(files[name], threads=THREADS)
    sim.simulate(T1=T1, T2=T2)
    out = benchmark.pedantic(sim.simulate, kwargs={"T1": T1, "T2": T2}, rounds=3, warmup_rounds=0)
    assert out.shape[0] == voxels

    torch.set_num_threads(THREADS)
    seq = mr0.Sequence.import_file(str(files[name]))
    data = mr0.CustomVoxelPhantom(pos=torch.zeros(voxels, 3), PD=1.0,
                                  T1=torch.tensor(T1 * 1e-3, dtype=torch.float32),
                                  T2=torch.tensor(T2 * 1e-3, dtype=torch.float32), T2dash=1e9, D=0.0,
                                  voxel_size=1e-6, voxel_shape="box").build()

    def run():
        t = time.perf_counter()
        graph = mr0.compute_graph(seq, data, 200, 1e-4)
        g = time.perf_counter() - t
        signal = mr0.execute_graph(graph, seq, data, print_progress=False)
        return time.perf_counter() - t, g, signal

    run()
    seconds, graph_s, signal = min((run() for _ in range(3)), key=lambda r: r[0])
    assert np.all(np.isfinite(signal.detach().numpy()))
    ours = benchmark.stats.stats.median
    benchmark.extra_info.update(voxels=voxels, samples=out.shape[1], mrzero_s=seconds, mrzero_graph_s=graph_s,
                                mrzero_samples=int(signal.numel()), times_faster=seconds / ours)
