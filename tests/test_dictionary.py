"""Large dictionaries: the compressed (SVD subspace) dictionary that
rank="auto" keeps, the exact re-ranking of its candidates, and the
dictionary written to one file and read back, against brute-force matching
of the full atoms written here in float64."""
import numpy as np
import pytest

from blochsim.estimators import DictionaryMatcher
from blochsim.simulators import MRFSimulator

FLIPS = np.concatenate([np.linspace(5.0, 60.0, 60), np.linspace(60.0, 5.0, 60)])
MRF = MRFSimulator(flip=FLIPS, TR=10.0, TI=20.0, states=16)
T1G, T2G = np.geomspace(300.0, 3000.0, 50), np.geomspace(20.0, 300.0, 40)


def _brute_force(signals):
    """The best atom of each signal by |<a, s>| / |a| over the full grid in
    float64, with its M0 and score."""
    T1, T2 = np.meshgrid(T1G, T2G, indexing="ij")
    atoms = MRF.simulate(T1=T1.ravel(), T2=T2.ravel()).astype(np.complex128)
    norms = np.linalg.norm(atoms, axis=1)
    d = signals.astype(np.complex128) @ atoms.conj().T / norms
    i = np.argmax(np.abs(d), axis=1)
    dots = d[np.arange(len(i)), i]
    return dict(T1=T1.ravel()[i], T2=T2.ravel()[i], M0=dots / norms[i],
                score=np.abs(dots) / np.linalg.norm(signals, axis=1))


def _noisy_voxels(n, seed=0, sd=0.01):
    rng = np.random.default_rng(seed)
    T1 = rng.uniform(350.0, 2800.0, n)
    T2 = rng.uniform(25.0, 280.0, n)
    M0 = rng.uniform(0.5, 2.0, n) * np.exp(1j * rng.uniform(-np.pi, np.pi, n))
    s = MRF.simulate(T1=T1, T2=T2) * M0[:, None]
    return s + sd * (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape))


@pytest.fixture
def small_auto(monkeypatch):
    """Make rank="auto" compress this test's small dictionary."""
    monkeypatch.setattr(DictionaryMatcher, "auto_bytes", 1 << 10)
    monkeypatch.setattr(DictionaryMatcher, "auto_sample", 300)


def test_auto_keeps_a_small_dictionary_in_full():
    dm = DictionaryMatcher(MRF).fit(T1=T1G, T2=T2G)
    assert dm.compressed_rank is None
    assert dm._atoms.shape == (T1G.size * T2G.size, FLIPS.size)


def test_auto_compresses_a_large_dictionary_and_matches_exactly(small_auto):
    dm = DictionaryMatcher(MRF, chunk=500).fit(T1=T1G, T2=T2G)
    r = dm.compressed_rank
    assert r is not None and r < FLIPS.size // 4
    assert dm._atoms.shape == (T1G.size * T2G.size, r)
    s = _noisy_voxels(400)
    m = dm.map(s)
    ref = _brute_force(s)
    np.testing.assert_array_equal(m["T1"], ref["T1"])
    np.testing.assert_array_equal(m["T2"], ref["T2"])
    np.testing.assert_allclose(m["M0"], ref["M0"], rtol=1e-5)
    np.testing.assert_allclose(m["score"], ref["score"], rtol=1e-5)


def test_subspace_alone_is_close_and_refining_is_exact(small_auto):
    """refine=0 matches in the subspace only: the same atoms on all but a
    few voxels; the default re-ranking recovers every exact atom."""
    s = _noisy_voxels(400, seed=1)
    ref = _brute_force(s)
    rough = DictionaryMatcher(MRF, refine=0).fit(T1=T1G, T2=T2G).map(s)
    assert np.mean(rough["T1"] == ref["T1"]) > 0.95
    np.testing.assert_allclose(rough["score"], ref["score"], rtol=1e-3)


def test_the_auto_rank_keeps_the_energy(small_auto):
    dm = DictionaryMatcher(MRF).fit(T1=T1G, T2=T2G)
    T1, T2 = np.meshgrid(T1G, T2G, indexing="ij")
    atoms = MRF.simulate(T1=T1.ravel(), T2=T2.ravel()).astype(np.complex128)
    unit = atoms / np.linalg.norm(atoms, axis=1, keepdims=True)
    B = dm._basis.astype(np.complex128)
    lost = np.linalg.norm(unit - (unit @ B) @ B.conj().T) ** 2 / len(unit)
    assert lost < 1e-5


def test_save_and_load_round_trip(tmp_path, small_auto):
    dm = DictionaryMatcher(MRF, groups=20).fit(T1=T1G, T2=T2G, B1=0.9)
    path = tmp_path / "dict.npz"
    dm.save(path)
    back = DictionaryMatcher.load(path)
    assert type(back.simulator) is MRFSimulator
    np.testing.assert_array_equal(back.simulator._protocol_values({})["flip"], FLIPS)
    assert back.compressed_rank == dm.compressed_rank and back._fixed == {"B1": 0.9}
    np.testing.assert_array_equal(back._grids["T1"], T1G)
    s = _noisy_voxels(50, seed=2)
    a, b = dm.map(s), back.map(s)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_save_and_load_a_full_and_a_given_dictionary(tmp_path):
    dm = DictionaryMatcher(MRF).fit(T1=T1G[:10], T2=T2G[:5])
    dm.save(tmp_path / "full")
    back = DictionaryMatcher.load(tmp_path / "full.npz")
    s = _noisy_voxels(20, seed=3)
    np.testing.assert_array_equal(dm.map(s)["index"], back.map(s)["index"])
    atoms = MRF.simulate(T1=T1G[:5], T2=80.0)
    given = DictionaryMatcher(MRF).fit(dictionary=(atoms, {"T1": T1G[:5]}))
    given.save(tmp_path / "given.npz")
    np.testing.assert_array_equal(DictionaryMatcher.load(tmp_path / "given.npz").map(atoms)["T1"], T1G[:5])


def test_load_refusals(tmp_path):
    from blochsim import Delay, Inversion, Pulse, Readout, Simulator

    class Mine(Simulator):
        protocol = {"flip": 30.0}
        tissue_properties = ("T1", "T2", "M0")

        def repetition(self, p):
            return (Readout() @ Delay(10.0) @ Pulse(p["flip"])) ** 20 @ Inversion()

    dm = DictionaryMatcher(Mine()).fit(T1=T1G[:8], T2=80.0)
    dm.save(tmp_path / "mine.npz")
    with pytest.raises(ValueError, match="not shipped with blochsim; pass simulator="):
        DictionaryMatcher.load(tmp_path / "mine.npz")
    back = DictionaryMatcher.load(tmp_path / "mine.npz", simulator=Mine())
    assert back.map(Mine().simulate(T1=T1G[3], T2=80.0))["T1"] == T1G[3]
    np.savez(tmp_path / "other.npz", x=np.ones(3))
    with pytest.raises(ValueError, match="not a blochsim dictionary"):
        DictionaryMatcher.load(tmp_path / "other.npz")
    with pytest.raises(RuntimeError, match="call fit"):
        DictionaryMatcher(MRF).save(tmp_path / "x.npz")


@pytest.mark.parametrize("kw, err, match", [
    (dict(rank="big"), ValueError, "rank must be a positive integer, 'auto' or None, got 'big'"),
    (dict(rank=0), ValueError, "rank"),
    (dict(refine=-1), ValueError, "refine must be a non-negative integer, got -1"),
    (dict(refine=1.5), ValueError, "refine must be a non-negative integer"),
])
def test_matcher_option_refusals(kw, err, match):
    with pytest.raises(err, match=match):
        DictionaryMatcher(MRF, **kw)
