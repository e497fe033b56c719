"""The fused matching kernel (match.hpp) and DictionaryMatcher on it, against
float64 brute force written here: indices, scores and M0, full and
compressed atoms, k > 1, ties, partial tiles.  CI runs this file on every
host level."""
import numpy as np
import pytest

from blochsim import _core
from blochsim.estimators import DictionaryMatcher
from blochsim.estimators.dictionary._atoms import _best
from blochsim.simulators import MRFSimulator, SpinEchoSimulator


def _random(rng, n, r, unit=False):
    x = (rng.standard_normal((n, r)) + 1j * rng.standard_normal((n, r))).astype(np.complex64)
    if unit:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def _brute(q, atoms, m):
    """float64: <atom, s> of every pair, the m largest powers per signal,
    ties to the lower index."""
    d = q.astype(np.complex128) @ atoms.astype(np.complex128).conj().T  # (n, N)
    p = np.abs(d) ** 2
    order = np.lexsort((np.broadcast_to(np.arange(p.shape[1]), p.shape), -p), axis=1)[:, :m]
    return order, np.take_along_axis(d, order, 1)


# sizes that leave partial rows of signals (lanes) and partial tiles and
# panels of atoms, at the dimensions of a compressed (12) and full (500)
# dictionary and odd ones
@pytest.mark.parametrize("n, N, r, k", [(1, 1, 1, 1), (3, 7, 5, 2), (65, 131, 12, 1), (200, 1037, 12, 4),
                                        (97, 301, 500, 3), (33, 8200, 3, 1), (17, 5, 7, 5)])
def test_kernel_against_float64_brute_force(n, N, r, k):
    rng = np.random.default_rng(n * 7919 + N)
    q, atoms = _random(rng, n, r), _random(rng, N, r, unit=True)
    idx, dot, power = _best(q, atoms, k, threads=2)
    want_i, want_d = _brute(q, atoms, k)
    # the single-precision ranking agrees wherever the float64 powers are
    # apart by more than its rounding; these random cases have no near-ties
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_allclose(dot, want_d, rtol=1e-12, atol=1e-12 * np.abs(want_d).max())
    np.testing.assert_allclose(power, np.abs(want_d) ** 2, rtol=2e-6 * r ** 0.5)


def test_fewer_atoms_than_k_fill_empty_slots():
    rng = np.random.default_rng(0)
    idx, dot, power = _best(_random(rng, 4, 6), _random(rng, 2, 6), 4, threads=1)
    assert (idx[:, 2:] == -1).all() and (power[:, 2:] == -1).all() and (dot[:, 2:] == 0).all()
    assert sorted(idx[0, :2]) == [0, 1]
    idx, _, _ = _best(_random(rng, 3, 6), np.zeros((0, 6), np.complex64), 2, threads=1)
    assert (idx == -1).all()


def test_ties_go_to_the_lower_atom_index():
    """Equal atoms (and atoms equal up to a phase) score equally: the lower
    index wins, in every position of the list, across tiles and panels."""
    rng = np.random.default_rng(1)
    base = _random(rng, 40, 12, unit=True)
    atoms = np.concatenate([base] * 60)  # atom i equals atoms i + 40, i + 80, ... (2400 atoms)
    atoms[40:80] *= -1  # a sign changes no score (and, being exact, not its rounding)
    sig = base[[3, 17, 39]] * 2.0
    idx, _, power = _best(sig, atoms, 5, threads=2)
    for row, a in zip(idx, [3, 17, 39]):
        np.testing.assert_array_equal(row, a + 40 * np.arange(5))
    # orthogonal signals: every power is (about) zero, the first atoms win
    idx, _, _ = _best(np.zeros((2, 12), np.complex64), atoms, 3, threads=1)
    np.testing.assert_array_equal(idx, [[0, 1, 2], [0, 1, 2]])


def test_results_do_not_depend_on_threads_or_atom_chunks():
    rng = np.random.default_rng(2)
    q, atoms = _random(rng, 300, 12), _random(rng, 3000, 12, unit=True)
    one = _best(q, atoms, 4, threads=1)
    two = _best(q, atoms, 4, threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)
    # chunks of atoms give the same single-precision powers (the ranking key)
    for a0 in (0, 1000, 2999):
        i, _, p = _best(q, atoms[a0:a0 + 700], 4, threads=1)
        np.testing.assert_array_equal(p, _best(q, atoms[a0:a0 + 700], 4, threads=2)[2])
        full = np.abs(q.astype(np.complex128) @ atoms[a0:a0 + 700].astype(np.complex128).conj().T) ** 2
        filled = i >= 0
        np.testing.assert_allclose(p[filled], np.take_along_axis(full, np.maximum(i, 0), 1)[filled], rtol=1e-5)


def test_kernel_refuses_bad_shapes():
    q = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="shapes"):
        _core.match(q, np.zeros((3, 6), np.float32), np.empty((2, 1), np.int64), np.empty((2, 1), np.float32),
                    np.empty((2, 2)))
    with pytest.raises(ValueError):  # k past the kernel's limit
        k = _core.MATCH_MAX_K + 1
        _core.match(q, np.zeros((3, 8), np.float32), np.empty((2, k), np.int64), np.empty((2, k), np.float32),
                    np.empty((2, 2 * k)))


FLIPS = np.concatenate([np.linspace(5, 60, 60), np.linspace(60, 2, 60)])
GRIDS = dict(T1=np.geomspace(300, 3000, 37), T2=np.geomspace(20, 300, 29), B1=np.linspace(0.8, 1.2, 3))


@pytest.mark.parametrize("rank", [None, 10, "auto"])
@pytest.mark.parametrize("k", [1, 3])
def test_matcher_equals_brute_force_on_the_full_dictionary(rank, k):
    """Noisy MRF signals matched by the fused kernel (in the subspace, then
    re-ranked on full atoms) against float64 brute force over the full
    atoms: index, score, M0."""
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    dm = DictionaryMatcher(sim, rank=rank, refine=16)
    dm.auto_bytes = 1 << 16  # "auto" compresses this 3219-atom dictionary
    dm.fit(**GRIDS)
    assert (dm.compressed_rank is None) == (rank is None)
    mesh = np.meshgrid(*GRIDS.values(), indexing="ij")
    params = {name: m.reshape(-1) for name, m in zip(GRIDS, mesh)}
    full = np.asarray(sim.simulate(**params)).astype(np.complex128)
    rng = np.random.default_rng(5)
    truth = rng.choice(len(full), 123, replace=False)
    sig = full[truth] * (0.5 + rng.random(123))[:, None] * np.exp(1j * rng.uniform(0, 6, 123))[:, None]
    sig = sig + 0.002 * (rng.standard_normal(sig.shape) + 1j * rng.standard_normal(sig.shape))
    got = dm.match(sig, k=k)
    norms = np.linalg.norm(full, axis=1)
    d = sig.conj() @ full.T  # conj(<atom, s>)
    d = d.conj()
    score = np.abs(d) / norms / np.linalg.norm(sig, axis=1)[:, None]
    want = np.lexsort((np.broadcast_to(np.arange(len(full)), score.shape), -score), axis=1)[:, :k]
    gi = got["index"].reshape(123, k)
    np.testing.assert_array_equal(gi, want)
    np.testing.assert_allclose(got["score"].reshape(123, k), np.take_along_axis(score, want, 1), rtol=1e-5)
    m0 = np.take_along_axis(d, want, 1) / norms[want] ** 2
    np.testing.assert_allclose(got["M0"].reshape(123, k), m0, rtol=1e-4)
    np.testing.assert_array_equal(got["T1"].reshape(123, k), params["T1"][want])


def test_group_matching_finds_the_atoms():
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    dm = DictionaryMatcher(sim, rank=None, groups=16, search=3).fit(**GRIDS)
    mesh = np.meshgrid(*GRIDS.values(), indexing="ij")
    params = {name: m.reshape(-1) for name, m in zip(GRIDS, mesh)}
    pick = np.random.default_rng(7).choice(len(params["T1"]), 50, replace=False)
    sig = 1.3 * np.asarray(sim.simulate(**{k: v[pick] for k, v in params.items()}))
    got = dm.match(sig, k=2)
    np.testing.assert_array_equal(got["index"][:, 0], pick)
    np.testing.assert_allclose(got["M0"][:, 0], 1.3, rtol=1e-5)
    assert (got["score"][:, 0] >= got["score"][:, 1]).all()


def test_subspace_match_without_refinement_is_the_projected_brute_force():
    """refine=0: the match in the rank-6 subspace is the float64 best over
    the projected unit atoms; its score is against the whole signal."""
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    dm = DictionaryMatcher(sim, rank=6, refine=0).fit(**GRIDS)
    rng = np.random.default_rng(9)
    sig = _random(rng, 77, len(FLIPS)).astype(np.complex128) * 0.05
    sig += np.asarray(sim.simulate(T1=800.0, T2=np.geomspace(30, 200, 77)))
    q = sig @ dm._basis.astype(np.complex128)
    want, d = _brute(q, dm._atoms, 1)
    got = dm.match(sig)
    np.testing.assert_array_equal(got["index"], dm._original[want[:, 0]])
    np.testing.assert_allclose(got["score"], np.abs(d[:, 0]) / np.linalg.norm(sig, axis=1), rtol=1e-5)
    np.testing.assert_allclose(got["M0"], d[:, 0] / dm._norms[want[:, 0]], rtol=1e-4)


def test_device_options_refused_without_a_usable_gpu():
    """device="cuda" on a machine whose CUDA backend cannot run (CI's) is
    refused by name before anything runs; a bad device name too."""
    from blochsim._engine import dispatch as _dispatch
    from blochsim.estimators import PERK
    if _dispatch.cuda_status()[0]:
        pytest.skip("a GPU is usable here: tests/test_gpu_estimators.py covers the device")
    sim = MRFSimulator(flip=FLIPS, TR=10.0, states=16)
    with pytest.raises(RuntimeError, match="device='cuda' was asked for, but the CUDA backend cannot run"):
        DictionaryMatcher(sim, device="cuda").fit(**GRIDS)
    host = DictionaryMatcher(sim, rank=None).fit(T1=GRIDS["T1"], T2=GRIDS["T2"])
    host.device = "cuda"
    with pytest.raises(RuntimeError, match="CUDA backend cannot run"):
        host.map(np.ones((2, len(FLIPS)), np.complex64))
    host.device = "auto"  # auto: the host when no GPU is usable
    assert host.map(np.asarray(sim.simulate(T1=800.0, T2=60.0)))["T2"] == pytest.approx(60.0, rel=0.1)
    with pytest.raises(ValueError, match="device must be"):
        DictionaryMatcher(sim, device="gpu")
    with pytest.raises(ValueError, match="device must be"):
        PERK(sim, device="gpu")
    perk = PERK(SpinEchoSimulator(TE=np.arange(10.0, 90.0, 10.0), TR=5000.0), n_features=50, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA backend cannot run"):
        perk.fit(samples=1024, T1=1000.0, T2=(20.0, 200.0))
    # the device entry itself, called without a usable GPU: an exception (the build's or the
    # validation's), never a crash
    with pytest.raises((ValueError, RuntimeError)):
        _core.match_device(0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
