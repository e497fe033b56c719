"""The estimators on a GPU: the fused matching kernel against float64 brute
force and the host kernel, dictionaries that live on the card, PERK's map
there.  Skipped without a usable device (marker ``gpu``)."""
import pickle

import numpy as np
import pytest

from blochsim import _core
from blochsim._arrays.device import DeviceArray
from blochsim.estimators import PERK, DictionaryMatcher
from blochsim.estimators.dictionary._atoms import _best
from blochsim.simulators import MRFSimulator, SpinEchoSimulator
from test_matching import _random

pytestmark = pytest.mark.gpu

FLIPS = np.concatenate([np.linspace(5, 60, 60), np.linspace(60, 2, 60)])
GRIDS = dict(T1=np.geomspace(300, 3000, 37), T2=np.geomspace(20, 300, 29), B1=np.linspace(0.8, 1.2, 3))


def _device_best(q, atoms, k):
    n, r = q.shape
    dq, da = DeviceArray.from_numpy(q), DeviceArray.from_numpy(atoms)
    idx, power, dot = (DeviceArray((n, k), t) for t in (np.int64, np.float32, np.complex128))
    _core.match_device(dq.ptr, da.ptr, n, len(atoms), r, k, idx.ptr, power.ptr, dot.ptr, 0)
    _core.stream_synchronize(0)
    return idx.get(), dot.get(), power.get()


@pytest.mark.parametrize("n, N, r, k", [(1, 1, 1, 1), (3, 7, 5, 2), (130, 131, 12, 1), (300, 5037, 12, 7),
                                        (97, 301, 500, 3), (257, 70000, 3, 1), (17, 5, 7, 5), (40, 900, 20, 40)])
def test_device_kernel_against_float64_and_the_host(n, N, r, k):
    rng = np.random.default_rng(n * 7919 + N)
    q, atoms = _random(rng, n, r), _random(rng, N, r, unit=True)
    idx, dot, power = _device_best(q, atoms, k)
    d = q.astype(np.complex128) @ atoms.astype(np.complex128).conj().T
    p = np.abs(d) ** 2
    want = np.lexsort((np.broadcast_to(np.arange(N), p.shape), -p), axis=1)[:, :k]
    m = min(k, N)
    np.testing.assert_array_equal(idx[:, :m], want)
    assert (idx[:, m:] == -1).all()
    np.testing.assert_allclose(dot[:, :m], np.take_along_axis(d, want, 1), rtol=1e-12,
                               atol=1e-12 * np.abs(d).max())
    host = _best(q, atoms, k, threads=2)
    np.testing.assert_array_equal(idx, host[0])
    # the card's keys come from tensor-core products (a 3-way split of each
    # value) accumulated in float32 rounded towards zero: within a few 1e-5
    # of the host's at 500 samples; the winners' inner products above are
    # exact
    np.testing.assert_allclose(power, host[2], rtol=1e-4)


@pytest.mark.parametrize("scale", [1e-15, 1.0, 1e15])
def test_device_kernel_keeps_single_precision_at_any_scale(scale):
    # the FP16 parts of the tensor-core kernel are kept in range by a power
    # of two a signal and an atom: signals of any size, atoms of norms over
    # six decades rank and score as in float64
    rng = np.random.default_rng(5)
    n, N, r, k = 200, 3000, 40, 3
    q = _random(rng, n, r) * np.float32(scale)
    atoms = _random(rng, N, r, unit=True) * rng.permutation(np.geomspace(1e-3, 1e3, N)).astype(np.float32)[:, None]
    idx, dot, power = _device_best(q, atoms, k)
    p = np.abs(q.astype(np.complex128) @ atoms.astype(np.complex128).conj().T) ** 2
    order = np.argsort(-p, axis=1, kind="stable")
    top = np.take_along_axis(p, order[:, :k + 1], 1)
    clear = ((top[:, :-1] - top[:, 1:]) > 1e-4 * top[:, :-1]).all(1)  # no near-tie among the k best
    assert clear.sum() > n // 2
    np.testing.assert_array_equal(idx[clear], order[clear, :k])
    np.testing.assert_allclose(power, np.take_along_axis(p, idx, 1), rtol=1e-4)


def test_device_ties_go_to_the_lower_atom_index():
    rng = np.random.default_rng(1)
    base = _random(rng, 40, 12, unit=True)
    atoms = np.concatenate([base] * 60)
    atoms[40:80] *= -1
    idx = _device_best(base[[3, 17, 39]] * 2.0, atoms, 5)[0]
    for row, a in zip(idx, [3, 17, 39]):
        np.testing.assert_array_equal(row, a + 40 * np.arange(5))


@pytest.mark.parametrize("rank", [None, 10, "auto"])
def test_dictionary_on_the_card_equals_the_host(rank):
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    host = DictionaryMatcher(sim, rank=rank, refine=16)
    card = DictionaryMatcher(sim, rank=rank, refine=16, device="cuda")
    host.auto_bytes = card.auto_bytes = 1 << 16
    host.fit(**GRIDS)
    card.fit(**GRIDS)
    assert isinstance(card._atoms, DeviceArray) and card.compressed_rank == host.compressed_rank
    mesh = np.meshgrid(*GRIDS.values(), indexing="ij")
    params = {name: m.reshape(-1) for name, m in zip(GRIDS, mesh)}
    rng = np.random.default_rng(5)
    pick = rng.choice(len(params["T1"]), 200, replace=False)
    sig = 0.7 * np.asarray(sim.simulate(**{k: v[pick] for k, v in params.items()}))
    sig = sig + 0.001 * (rng.standard_normal(sig.shape) + 1j * rng.standard_normal(sig.shape))
    a, b = host.match(sig, k=2), card.match(sig, k=2)
    np.testing.assert_array_equal(b["index"][:, 0], pick)
    np.testing.assert_array_equal(a["index"], b["index"])
    np.testing.assert_allclose(b["score"], a["score"], rtol=1e-5)
    np.testing.assert_allclose(b["M0"], a["M0"], rtol=1e-4)
    cupy = pytest.importorskip("cupy")
    maps = card.map(cupy.asarray(sig.astype(np.complex64)))
    assert isinstance(maps["T1"], cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(maps["index"]), a["index"][:, 0])
    # a host dictionary matches device signals on the card (copied there once)
    np.testing.assert_array_equal(cupy.asnumpy(host.map(cupy.asarray(sig.astype(np.complex64)))["index"]),
                                  a["index"][:, 0])


def test_device_dictionary_refusals():
    cupy = pytest.importorskip("cupy")
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    card = DictionaryMatcher(sim, rank=8, device="cuda").fit(**GRIDS)
    bad = cupy.zeros((3, len(FLIPS)), cupy.complex64)
    bad[1, 5] = np.nan
    with pytest.raises(ValueError, match=r"not finite at voxel \(1,\)"):
        card.map(bad)
    with pytest.raises(ValueError, match="complex64"):
        card.map(cupy.zeros((3, len(FLIPS)), cupy.float32))
    with pytest.raises(ValueError, match="groups"):
        DictionaryMatcher(sim, groups=4, device="cuda").fit(**GRIDS)
    # full atoms of 500 samples past the card's free memory, kept full: refused before any simulation
    free, _ = _core.memory_info()
    side = int(np.sqrt(1.2 * free / (500 * 8))) + 1
    long = MRFSimulator(flip=np.linspace(5, 60, 500), TR=10.0, states=8)
    huge = dict(T1=np.geomspace(300, 3000, side), T2=np.geomspace(20, 300, side))
    with pytest.raises(MemoryError, match="GiB of device memory"):
        DictionaryMatcher(long, rank=None, device="cuda").fit(**huge)


def test_dictionary_larger_than_the_card_is_streamed():
    """Full atoms that would take 1.2 times the card's free memory are
    simulated chunk by chunk and kept only as their rank-12 projections;
    noise-free signals find their own atoms or, on this grid of about 5,000
    steps an axis (0.05 % apart, neighbours alike to a few 1e-7), a
    neighbour within three steps: the kernel's single-precision keys (TF32
    tensor-core products) resolve no finer, and the exact re-ranking sees
    only their few best."""
    free, _ = _core.memory_info()
    side = int(np.sqrt(1.2 * free / (500 * 8))) + 1
    sim = MRFSimulator(flip=np.concatenate([np.linspace(5, 60, 250), np.linspace(60, 2, 250)]), TR=10.0,
                       states=8)
    grids = dict(T1=np.geomspace(300, 3000, side), T2=np.geomspace(20, 300, side))
    assert side * side * 500 * 8 > free
    dm = DictionaryMatcher(sim, rank=12, chunk=1 << 20, device="cuda").fit(**grids)
    assert dm._atoms.shape == (side * side, 12)
    pick = np.random.default_rng(4).choice(side * side, 64, replace=False)
    i1, i2 = np.unravel_index(pick, (side, side))
    maps = dm.map(0.9 * sim.simulate(T1=grids["T1"][i1], T2=grids["T2"][i2]))
    step = grids["T1"][1] / grids["T1"][0] - 1
    np.testing.assert_allclose(maps["T1"], grids["T1"][i1], rtol=3.01 * step)
    np.testing.assert_allclose(maps["T2"], grids["T2"][i2], rtol=3.01 * (grids["T2"][1] / grids["T2"][0] - 1))
    np.testing.assert_allclose(np.abs(maps["M0"]), 0.9, rtol=1e-3)


def test_perk_map_on_the_card_equals_the_host():
    te = np.arange(10.0, 170.0, 10.0)
    sim = SpinEchoSimulator(TE=te, TR=5000.0)
    perk = PERK(sim, n_features=400).fit(noise_std=0.005, samples=8000, T1=1000.0, T2=(20.0, 200.0),
                                         M0=(0.5, 1.5))
    rng = np.random.default_rng(2)
    s = sim.simulate(T1=1000.0, T2=rng.uniform(30, 180, 500), M0=rng.uniform(0.6, 1.4, 500))
    host = perk.map(s)
    perk.device = "cuda"
    card = perk.map(s)
    for k in host:
        np.testing.assert_allclose(card[k], host[k], rtol=2e-4, atol=1e-3 * np.abs(host[k]).max())
    cupy = pytest.importorskip("cupy")
    dev = perk.map(cupy.asarray(s.astype(np.complex64)))
    assert isinstance(dev["T2"], cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(dev["T2"]), host["T2"], rtol=2e-4)


def test_perk_map_on_the_card_with_known_maps_and_cartesian_inputs():
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    perk = PERK(sim, n_features=300, complex_mode="cartesian", normalize=True)
    perk.fit(noise_std=0.001, samples=4096, known=("B1",), T1=(300.0, 2500.0), T2=(20.0, 250.0), B1=(0.8, 1.2))
    rng = np.random.default_rng(3)
    B1 = rng.uniform(0.85, 1.15, 300)
    s = sim.simulate(T1=rng.uniform(400, 2000, 300), T2=rng.uniform(30, 200, 300), B1=B1)
    host = perk.map(s, known={"B1": B1})
    perk.device = "cuda"
    card = perk.map(s, known={"B1": B1})
    for k in host:
        np.testing.assert_allclose(card[k], host[k], rtol=1e-3, atol=1e-3 * np.abs(host[k]).max())


def test_perk_training_on_the_card_equals_the_host_and_repeats_bitwise():
    te = np.arange(10.0, 170.0, 10.0)
    sim = SpinEchoSimulator(TE=te, TR=5000.0)
    kw = dict(noise_std=0.005, samples=5000, seed=3, T1=1000.0, T2=(20.0, 200.0), M0=(0.5, 1.5))
    host = PERK(sim, n_features=500).fit(**kw)
    card = PERK(sim, n_features=500, device="cuda").fit(**kw)
    again = PERK(sim, n_features=500, device="cuda").fit(**kw)
    for k in card._model:
        np.testing.assert_array_equal(card._model[k], again._model[k])  # the same sums, bitwise
    rng = np.random.default_rng(4)
    s = sim.simulate(T1=1000.0, T2=rng.uniform(30, 180, 400), M0=rng.uniform(0.6, 1.4, 400))
    a, b = host.map(s), card.map(s)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=2e-3, atol=2e-3 * np.abs(a[k]).max())


def test_perk_training_on_the_card_with_known_log_and_cartesian_inputs():
    """The main job's kind of training (B1 known, T1 and T2 over log ranges,
    Cartesian inputs in a subspace) on the card: the host's model to single
    precision (the same draws and noise), and the same bits whatever the
    grouping of the blocks."""
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    kw = dict(noise_std=0.003, samples=6000, seed=5, known=("B1",), T1=(300.0, 3000.0), T2=(20.0, 1000.0),
              M0=(0.5, 1.5), B1=(0.8, 1.2), log=("T1", "T2"))
    host = PERK(sim, n_features=600, complex_mode="cartesian").fit(**kw)
    card = PERK(sim, n_features=600, complex_mode="cartesian", device="cuda").fit(**kw)
    other = PERK(sim, n_features=600, complex_mode="cartesian", device="cuda").fit(chunk=2048, **kw)
    for k in card._model:
        np.testing.assert_array_equal(card._model[k], other._model[k])
    rng = np.random.default_rng(8)
    B1 = rng.uniform(0.85, 1.15, 300)
    s = sim.simulate(T1=rng.uniform(400, 2500, 300), T2=rng.uniform(30, 800, 300), M0=rng.uniform(0.6, 1.4, 300),
                     B1=B1)
    a, b = host.map(s, known={"B1": B1}), card.map(s, known={"B1": B1})
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=2e-3, atol=2e-3 * np.abs(a[k]).max())
    kept = pickle.loads(pickle.dumps(card))  # without its device arrays
    c = kept.map(s, known={"B1": B1})
    for k in b:
        np.testing.assert_array_equal(c[k], b[k])


def test_device_noise_is_the_hosts():
    from blochsim._arrays import noise as _noise
    rng = np.random.default_rng(9)
    base = (rng.standard_normal(200_001) + 1j * rng.standard_normal(200_001)).astype(np.complex64)
    key = _noise.key(11)
    host = _noise.add(base.copy(), 0.3, key, 5, _noise.PERK_TRAINING, threads=2, first=77)
    card = _noise.add(DeviceArray.from_numpy(base), 0.3, key, 5, _noise.PERK_TRAINING, first=77).get()
    # double-precision Box–Muller on both: a float32 sum differs, rarely, by its last bit
    np.testing.assert_allclose(card, host, rtol=2e-7, atol=1e-7)
    assert np.mean(card == host) > 0.999


def test_perk_pullback_on_the_card_equals_the_host():
    te = np.arange(10.0, 170.0, 10.0)
    sim = SpinEchoSimulator(TE=te, TR=5000.0)
    perk = PERK(sim, n_features=400).fit(noise_std=0.005, samples=4096, uncertainty=True, T1=1000.0,
                                         T2=(20.0, 200.0), M0=(0.5, 1.5))
    rng = np.random.default_rng(6)
    s = sim.simulate(T1=1000.0, T2=rng.uniform(30, 180, 300), M0=rng.uniform(0.6, 1.4, 300))
    cot = {"T2": rng.standard_normal(300), "M0": rng.standard_normal(300)}
    a, pa = perk.vjp(s)
    perk.device = "cuda"
    b, pb = perk.vjp(s)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=2e-4, atol=1e-3 * np.abs(a[k]).max())
    ga, gb = pa(cot), pb(cot)
    np.testing.assert_allclose(gb, ga, rtol=1e-3, atol=1e-3 * np.abs(ga).max())


def test_main_job_on_the_card_matches_the_cpu(capsys):
    """The main job on the card (signals, their noise, matching and PERK
    there) against the same job on the CPU: the same noise, so the same
    error table but for near-ties and single-precision training sums."""
    from blochsim._engine import dispatch as _dispatch
    from blochsim.cli import build_parser, maps_job
    args = build_parser().parse_args(["--size", "40", "--trs", "200", "--quiet", "--maps", ""])
    status, cpu = maps_job(args, "cpu", _dispatch.backends())
    assert status == 0
    status, card = maps_job(args, "cuda", _dispatch.backends())
    assert status == 0
    for method in ("dictionary", "PERK"):
        for k in ("T1", "T2", "M0"):
            assert card[method][k] == pytest.approx(cpu[method][k], rel=0.03, abs=2e-4), (method, k)
