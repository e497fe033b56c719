"""Temporal subspaces (blochsim.subspace): the basis against NumPy's SVD of
the evolutions, the projection and expansion against the orthogonal
projector, BART's .cfl/.hdr layout byte by byte as its format defines it
(a text header "# Dimensions" with the sizes, complex64 values in
column-major order; TE is dimension 5 and COEFF dimension 6 of its
``enum mri_dims``), the dictionary's basis, and every refusal."""
import numpy as np
import pytest

from blochsim.estimators import DictionaryMatcher
from blochsim.simulators import MRFSimulator
from blochsim.subspace import TemporalBasis, read_cfl, write_cfl


def _atoms(n_tr=120):
    sim = MRFSimulator(flip=10.0 + 50.0 * np.sin(np.linspace(0.0, np.pi, n_tr)) ** 2, TR=10.0, states=16)
    T1, T2 = np.meshgrid(np.geomspace(300, 3000, 25), np.geomspace(20, 300, 16))
    return sim, T1.ravel(), T2.ravel(), sim.simulate(T1=T1.ravel(), T2=T2.ravel())


def _projector(B):
    B = np.asarray(B, np.complex128)
    return B @ B.conj().T


def test_learned_basis_is_the_svd_of_the_evolutions():
    _, _, _, atoms = _atoms()
    unit = atoms.astype(np.complex128) / np.linalg.norm(atoms, axis=1, keepdims=True)
    _, sv, Vh = np.linalg.svd(unit, full_matrices=False)
    b = TemporalBasis.learn(atoms, rank=6)
    # signals are rows s = sum_k c_k Vh[k]: the columns of B span Vh's rows
    assert b.basis.shape == (atoms.shape[1], 6) and b.basis.dtype == np.complex64
    np.testing.assert_allclose(_projector(b.basis), _projector(Vh[:6].T), atol=2e-5)
    np.testing.assert_allclose(b.energy, sv[:6] ** 2 / np.sum(sv ** 2), rtol=1e-6, atol=1e-12)
    # the fewest columns within a tolerance
    t = TemporalBasis.learn(atoms, tolerance=1e-4)
    kept = np.cumsum(sv ** 2) / np.sum(sv ** 2)
    assert t.rank == int(np.searchsorted(kept, 1 - 1e-4) + 1)
    assert 1 - t.energy.sum() <= 1e-4


def test_project_and_expand_are_the_orthogonal_projection():
    _, _, _, atoms = _atoms()
    b = TemporalBasis.learn(atoms, rank=5)
    c = b.project(atoms)
    assert c.shape == (len(atoms), 5) and c.dtype == np.complex64
    np.testing.assert_allclose(c, atoms @ b.basis.conj(), rtol=1e-5, atol=1e-7)
    back = b.expand(c)
    ref = (_projector(b.basis) @ atoms.astype(np.complex128).T).T
    np.testing.assert_allclose(back, ref, atol=2e-6)
    # leading axes pass through; float64 input computes in complex128
    s = atoms.reshape(4, -1, atoms.shape[1]).astype(np.complex128)
    assert b.project(s).shape == (4, s.shape[1], 5) and b.project(s).dtype == np.complex128
    assert b.expand(b.project(s)).shape == s.shape
    # a signal in the subspace comes back whole
    x = b.expand(np.array([1.0, 2j, 0.5, 0.0, -1.0], np.complex64))
    np.testing.assert_allclose(b.expand(b.project(x)), x, atol=1e-6)


def test_bart_files_are_the_format_bart_reads(tmp_path):
    B = np.linalg.qr(np.array([[1, 2j], [3, -1], [0.5j, 2]], np.complex128))[0]
    b = TemporalBasis(B, energy=[0.9, 0.1])
    b.write_bart(tmp_path / "basis")
    assert (tmp_path / "basis.hdr").read_text() == "# Dimensions\n1 1 1 1 1 3 2 \n"
    raw = np.frombuffer((tmp_path / "basis.cfl").read_bytes(), "<c8")
    # column-major: sample fastest, then the coefficient
    np.testing.assert_array_equal(raw, np.concatenate([B[:, 0], B[:, 1]]).astype(np.complex64))
    back = TemporalBasis.read_bart(tmp_path / "basis")
    np.testing.assert_array_equal(back.basis, b.basis)
    # any array round-trips, its trailing ones kept
    a = (np.arange(24) + 1j * np.arange(24)[::-1]).reshape(2, 3, 4, 1)
    write_cfl(tmp_path / "a", a)
    assert (tmp_path / "a.hdr").read_text().splitlines()[1].split() == ["2", "3", "4", "1"]
    r = read_cfl(tmp_path / "a")
    assert r.shape == (2, 3, 4, 1) and r.dtype == np.complex64
    np.testing.assert_array_equal(r, a.astype(np.complex64))
    np.testing.assert_array_equal(np.frombuffer((tmp_path / "a.cfl").read_bytes(), "<c8"),
                                  a.ravel(order="F").astype(np.complex64))
    # the npz layout: plain arrays
    b.save(tmp_path / "b.npz")
    with np.load(tmp_path / "b.npz") as f:
        assert sorted(f.files) == ["basis", "energy"] and f["basis"].shape == (3, 2)
    c = TemporalBasis.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(c.basis, b.basis)
    np.testing.assert_array_equal(c.energy, b.energy)


def test_dictionary_basis_is_the_one_it_matches_in():
    sim, T1, T2, atoms = _atoms()
    grids = dict(T1=np.geomspace(300, 3000, 25), T2=np.geomspace(20, 300, 16))
    full = DictionaryMatcher(sim, rank=None).fit(**grids)
    tb = full.temporal_basis(rank=6)
    ref = TemporalBasis.learn(atoms, rank=6)
    np.testing.assert_allclose(_projector(tb.basis), _projector(ref.basis), atol=5e-5)
    np.testing.assert_allclose(tb.energy, ref.energy, rtol=1e-4, atol=1e-9)
    compressed = DictionaryMatcher(sim, rank=6).fit(**grids)
    cb = compressed.temporal_basis()
    assert cb.rank == 6
    np.testing.assert_allclose(_projector(cb.basis), _projector(ref.basis), atol=5e-5)
    np.testing.assert_allclose(cb.energy, ref.energy, rtol=1e-3, atol=1e-8)
    # the coefficients it returns are those the matcher compares: the same
    # match from the projected signals' best inner product
    signals = sim.simulate(T1=np.array([800.0, 1500.0]), T2=np.array([60.0, 150.0]))
    q = cb.project(signals)
    unit_atoms = cb.project(atoms / np.linalg.norm(atoms, axis=1, keepdims=True))
    best = np.argmax(np.abs(q @ unit_atoms.conj().T), axis=1)
    found = compressed.match(signals)
    np.testing.assert_allclose(found["T1"], T1[best], rtol=1e-6)
    np.testing.assert_allclose(found["T2"], T2[best], rtol=1e-6)
    assert compressed.temporal_basis(rank=3).rank == 3


def test_refusals():
    _, _, _, atoms = _atoms(40)
    with pytest.raises(ValueError, match=r"basis must be a \(samples, rank\) array"):
        TemporalBasis(np.ones(5))
    with pytest.raises(ValueError, match=r"basis must be a \(samples, rank\) array"):
        TemporalBasis(np.ones((2, 3)))
    with pytest.raises(ValueError, match="orthonormal columns"):
        TemporalBasis(np.ones((4, 2)))
    with pytest.raises(ValueError, match="basis must be finite"):
        TemporalBasis(np.full((3, 1), np.nan))
    with pytest.raises(ValueError, match="energy must be 1 non-negative numbers"):
        TemporalBasis(np.eye(3)[:, :1], energy=[0.5, 0.5])
    with pytest.raises(ValueError, match="rank must be at most the 40 samples, got 41"):
        TemporalBasis.learn(atoms, rank=41)
    with pytest.raises(ValueError, match="give rank or tolerance, not both"):
        TemporalBasis.learn(atoms, rank=2, tolerance=1e-3)
    with pytest.raises(ValueError, match=r"tolerance must be in \[0, 1\), got 1.5"):
        TemporalBasis.learn(atoms, tolerance=1.5)
    with pytest.raises(ValueError, match="signals must hold at least one non-zero evolution"):
        TemporalBasis.learn(np.zeros((3, 40)))
    with pytest.raises(ValueError, match="signals must be finite"):
        TemporalBasis.learn(np.full((3, 40), np.inf))
    b = TemporalBasis.learn(atoms, rank=3)
    with pytest.raises(ValueError, match=r"signals must have 40 samples on its last axis, got shape \(2, 39\)"):
        b.project(np.ones((2, 39), np.complex64))
    with pytest.raises(ValueError, match=r"coefficients must have 3 rank on its last axis, got shape \(4,\)"):
        b.expand(np.ones(4, np.complex64))
    with pytest.raises(TypeError, match="signals must be numeric, got dtype <U1"):
        b.project(["a"] * 40)
    # array_like is taken as NumPy
    np.testing.assert_allclose(b.project([1.0] * 40), b.project(np.ones(40)), rtol=1e-12)


def test_file_refusals(tmp_path):
    write_cfl(tmp_path / "cube", np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"a BART basis has only its TE \(5\) and COEFF \(6\) dimensions past 1"):
        TemporalBasis.read_bart(tmp_path / "cube")
    (tmp_path / "bad.hdr").write_text("# Dims\n2 2\n")
    (tmp_path / "bad.cfl").write_bytes(b"")
    with pytest.raises(ValueError, match="no '# Dimensions' line"):
        read_cfl(tmp_path / "bad")
    (tmp_path / "short.hdr").write_text("# Dimensions\n2 2\n")
    (tmp_path / "short.cfl").write_bytes(np.ones(3, "<c8").tobytes())
    with pytest.raises(ValueError, match=r"3 complex values for dimensions \[2, 2\]"):
        read_cfl(tmp_path / "short")
    np.savez(tmp_path / "other.npz", x=np.ones(2))
    with pytest.raises(ValueError, match="holds no 'basis' array"):
        TemporalBasis.load(tmp_path / "other.npz")
    sim = MRFSimulator(flip=np.full(20, 30.0), TR=10.0, states=8)
    with pytest.raises(RuntimeError, match="call fit"):
        DictionaryMatcher(sim).temporal_basis()
    dm = DictionaryMatcher(sim, rank=3).fit(T1=np.geomspace(300, 3000, 10), T2=np.geomspace(20, 300, 8))
    with pytest.raises(ValueError, match="rank must be at most the stored rank 3, got 4"):
        dm.temporal_basis(rank=4)
    with pytest.raises(ValueError, match="tolerance applies to a full dictionary"):
        dm.temporal_basis(tolerance=1e-3)
