"""Temporal subspaces: the low-rank bases of a signal evolution, handed to
low-rank reconstruction.

Simulated evolutions of a sequence (a dictionary's atoms) span few
dimensions: the leading singular vectors of the atoms keep all but a small
fraction of their energy (McGivney et al. 2014, IEEE TMI 33:2311; Tamir et
al. 2017, MRM 77:180).  A :class:`TemporalBasis` holds such a basis as a
``(samples, rank)`` array ``B`` of orthonormal columns, with the energy
each column keeps, and the two maps of a subspace reconstruction:

- ``project(signals) = signals @ conj(B)``: the coefficients ``B^H s`` of
  each signal (last axis: samples -> rank);
- ``expand(coefficients) = coefficients @ B.T``: the signal ``B c`` they
  stand for (last axis: rank -> samples),

so that ``expand(project(s))`` is the orthogonal projection of ``s`` onto
the subspace.  BART's subspace tools (``pics -B``, ``nlinv -B``) read the
same ``B`` from a ``.cfl``/``.hdr`` pair with the samples on its TE
dimension (5) and the rank on its COEFF dimension (6):
:meth:`TemporalBasis.write_bart` and :meth:`TemporalBasis.read_bart`,
and :func:`write_cfl` / :func:`read_cfl` for any array in that format.
"""
from __future__ import annotations

import os

import numpy as np

from blochsim._arrays.device import host_as, library_of

__all__ = ["TemporalBasis", "read_cfl", "write_cfl"]

#: BART's array dimensions (``enum mri_dims`` in its src/misc/mri.h): the
#: basis' samples lie on TE_DIM and its rank on COEFF_DIM
BART_DIMS, BART_TE_DIM, BART_COEFF_DIM = 16, 5, 6


class TemporalBasis:
    """An orthonormal basis of signal evolutions and the energy it keeps.

    Parameters
    ----------
    basis : array_like, complex, shape (samples, rank)
        Orthonormal columns (``B^H B = I`` to single precision).
    energy : array_like, float, shape (rank,), optional
        The fraction of the learning signals' energy each column keeps
        (squared singular values over their sum), in decreasing order.

    Attributes
    ----------
    basis : numpy.ndarray, complex64, shape (samples, rank)
    energy : numpy.ndarray, float64, shape (rank,) or None
    samples, rank : int

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import MRFSimulator
    >>> from blochsim.subspace import TemporalBasis
    >>> sim = MRFSimulator(flip=np.linspace(10, 60, 200), TR=10.0, states=16)
    >>> T1, T2 = np.meshgrid(np.geomspace(300, 3000, 30), np.geomspace(20, 300, 20))
    >>> atoms = sim.simulate(T1=T1.ravel(), T2=T2.ravel())
    >>> b = TemporalBasis.learn(atoms, rank=5)
    >>> b.basis.shape, bool(b.energy.sum() > 0.999)
    ((200, 5), True)
    >>> err = np.linalg.norm(b.expand(b.project(atoms)) - atoms) / np.linalg.norm(atoms)
    >>> bool(err < 0.03)
    True
    """

    def __init__(self, basis, energy=None):
        B = np.asarray(basis)
        if B.ndim != 2 or B.shape[0] < 1 or B.shape[1] < 1 or B.shape[1] > B.shape[0]:
            raise ValueError(f"basis must be a (samples, rank) array with 1 <= rank <= samples, got shape "
                             f"{B.shape}")
        if not np.all(np.isfinite(B)):
            raise ValueError("basis must be finite")
        B = np.ascontiguousarray(B, np.complex64)
        gram = B.conj().T.astype(np.complex128) @ B
        off = float(np.max(np.abs(gram - np.eye(B.shape[1]))))
        if off > 1e-4:
            raise ValueError(f"basis must have orthonormal columns (B^H B = I), got |B^H B - I| up to {off:.3g}")
        if energy is not None:
            e = np.asarray(energy, np.float64)
            if e.shape != (B.shape[1],) or not np.all(np.isfinite(e)) or np.any(e < 0):
                raise ValueError(f"energy must be {B.shape[1]} non-negative numbers (one per column), got "
                                 f"{np.shape(energy)}")
            energy = e
        self.basis = B
        self.energy = energy

    @property
    def samples(self) -> int:
        return self.basis.shape[0]

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def __repr__(self):
        kept = "" if self.energy is None else f", energy kept {self.energy.sum():.6g}"
        return f"TemporalBasis(samples={self.samples}, rank={self.rank}{kept})"

    @classmethod
    def learn(cls, signals, rank=None, tolerance=None, normalize=True):
        """The leading left singular vectors of a set of evolutions.

        Parameters
        ----------
        signals : array_like, complex, shape (..., samples)
            Evolutions (a dictionary's atoms, simulated signals); NumPy or a
            device array (copied to the host).
        rank : int, optional
            Columns to keep.
        tolerance : float, optional
            Keep the fewest columns that leave out at most this fraction of
            the energy (default 1e-6 when ``rank`` is not given).
        normalize : bool
            Scale every evolution to unit norm first (the energy of a
            dictionary's shapes, not of its proton densities).

        Returns
        -------
        TemporalBasis
        """
        from blochsim._arrays import validate as V

        if V.is_device_array(signals):
            from blochsim._arrays.device import to_host

            signals = to_host("signals", signals, allow_complex64=True)
        S = np.asarray(signals)
        if S.ndim < 1 or S.shape[-1] < 1:
            raise ValueError(f"signals must have a samples axis (last), got shape {S.shape}")
        S = S.reshape(-1, S.shape[-1])
        if not np.all(np.isfinite(S)):
            raise ValueError("signals must be finite")
        if rank is not None and tolerance is not None:
            raise ValueError("give rank or tolerance, not both")
        if rank is not None:
            rank = V.positive_int("rank", rank)
            if rank > S.shape[1]:
                raise ValueError(f"rank must be at most the {S.shape[1]} samples, got {rank}")
        if tolerance is not None and not (0.0 <= float(tolerance) < 1.0):
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        G = np.zeros((S.shape[1], S.shape[1]), np.complex128)
        for a in range(0, len(S), _CHUNK):  # the Gram matrix a block of rows at a time, in double precision
            block = S[a:a + _CHUNK].astype(np.complex128)
            if normalize:
                norms = np.linalg.norm(block, axis=1)
                block = block[norms > 0] / norms[norms > 0, None]
            G += gram(block)
        if not np.trace(G).real > 0:
            raise ValueError("signals must hold at least one non-zero evolution")
        vectors, fraction = leading(G, rank, tolerance)
        # G = S^H S: its eigenvectors V are the rows' right singular vectors,
        # and a row s = sum_k (s V)_k conj(V[:, k]): the basis is conj(V)
        return cls(vectors.conj(), fraction)

    def project(self, signals):
        """Coefficients ``B^H s`` of signals along their last axis.

        Parameters
        ----------
        signals : array_like, shape (..., samples)
            NumPy (or array_like), CuPy or PyTorch (computed in that
            library, in complex128 for 64-bit input).

        Returns
        -------
        array, shape (..., rank), of the signals' library
        """
        signals = _operand("signals", signals, self.samples, "samples")
        return signals @ _like(self.basis.conj(), signals)

    def expand(self, coefficients):
        """The signals ``B c`` of coefficients along their last axis.

        Parameters
        ----------
        coefficients : array_like, shape (..., rank)
            NumPy (or array_like), CuPy or PyTorch (computed in that
            library, in complex128 for 64-bit input).

        Returns
        -------
        array, shape (..., samples), of the coefficients' library
        """
        coefficients = _operand("coefficients", coefficients, self.rank, "rank")
        return coefficients @ _like(np.ascontiguousarray(self.basis.T), coefficients)

    def write_bart(self, path):
        """Write the basis as BART reads a subspace basis: ``path.cfl`` and
        ``path.hdr``, dimensions ``1 1 1 1 1 samples rank`` (TE and COEFF),
        complex64.

        Parameters
        ----------
        path : str or os.PathLike
            The file name without the ``.cfl``/``.hdr`` extension.
        """
        dims = [1] * (BART_COEFF_DIM + 1)
        dims[BART_TE_DIM], dims[BART_COEFF_DIM] = self.samples, self.rank
        write_cfl(path, self.basis.reshape(dims, order="F"))

    @classmethod
    def read_bart(cls, path):
        """A basis from a BART ``.cfl``/``.hdr`` pair whose only dimensions
        past 1 are TE (samples) and COEFF (rank).

        Parameters
        ----------
        path : str or os.PathLike
            The file name without the extension.

        Returns
        -------
        TemporalBasis (without energy)
        """
        a = read_cfl(path)
        dims = list(a.shape) + [1] * (BART_COEFF_DIM + 1 - a.ndim)
        other = [d for i, d in enumerate(dims) if i not in (BART_TE_DIM, BART_COEFF_DIM) and d != 1]
        if other:
            raise ValueError(f"{os.fspath(path)}: a BART basis has only its TE ({BART_TE_DIM}) and COEFF "
                             f"({BART_COEFF_DIM}) dimensions past 1, got dimensions {dims}")
        return cls(a.reshape(dims[BART_TE_DIM], dims[BART_COEFF_DIM], order="F"))

    def save(self, path):
        """Write ``basis`` (samples, rank) and ``energy`` to a NumPy ``.npz``
        file (plain arrays for any tool)."""
        arrays = {"basis": self.basis}
        if self.energy is not None:
            arrays["energy"] = self.energy
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path):
        """A basis from an ``.npz`` file written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as f:
            if "basis" not in f.files:
                raise ValueError(f"TemporalBasis.load: {os.fspath(path)} holds no 'basis' array")
            return cls(f["basis"], f["energy"] if "energy" in f.files else None)


#: rows of evolutions a Gram matrix is accumulated from at a time
_CHUNK = 4096


def gram(rows):
    """S^H S of evolutions in rows, (samples, samples) complex128."""
    u = np.asarray(rows).astype(np.complex128, copy=False)
    return u.conj().T @ u


def leading(G, rank=None, tolerance=None):
    """The leading eigenvectors of a Gram matrix G, in decreasing order of
    their eigenvalues, and each one's share of the trace: ``rank`` of them,
    or the fewest that leave out at most ``tolerance`` (default 1e-6) of
    it.  Returns (vectors (samples, rank), fractions (rank,))."""
    w, U = np.linalg.eigh(G)
    w, U = np.clip(w[::-1], 0.0, None), U[:, ::-1]
    fraction = w / max(w.sum(), 1e-300)
    if rank is None:
        tol = 1e-6 if tolerance is None else float(tolerance)
        rank = min(int(np.searchsorted(np.cumsum(fraction), 1.0 - tol) + 1), len(w))
    return U[:, :rank], fraction[:rank]


def _operand(name, a, want, what):
    """``a`` as an array of its library (array_like -> NumPy), checked to be
    numeric with ``want`` entries on its last axis."""
    if library_of(a) not in ("cupy", "torch"):
        a = np.asarray(a)
        if a.dtype.kind not in "biufc":
            raise TypeError(f"{name} must be numeric, got dtype {a.dtype}")
    shape = tuple(a.shape)
    if len(shape) < 1 or shape[-1] != want:
        raise ValueError(f"{name} must have {want} {what} on its last axis, got shape {shape}")
    return a


def _like(B, a):
    """B (NumPy) in a's library, in complex128 unless a is single precision."""
    single = str(a.dtype).split(".")[-1] in ("float32", "complex64")
    return host_as(B if single else B.astype(np.complex128), a)


def write_cfl(path, array):
    """Write an array in BART's format: ``path.hdr`` (its dimensions) and
    ``path.cfl`` (complex64, column-major).

    Parameters
    ----------
    path : str or os.PathLike
        The file name without the extension.
    array : array_like, complex, up to 16 dimensions
    """
    a = np.asarray(array)
    if a.ndim > BART_DIMS:
        raise ValueError(f"a BART array has at most {BART_DIMS} dimensions, got {a.ndim}")
    base = os.fspath(path)
    dims = list(a.shape) or [1]
    with open(base + ".hdr", "w") as f:
        f.write("# Dimensions\n" + " ".join(str(d) for d in dims) + " \n")
    np.asarray(a, np.complex64).ravel(order="F").astype("<c8").tofile(base + ".cfl")


def read_cfl(path):
    """An array written in BART's format (``path.hdr`` and ``path.cfl``).

    Returns
    -------
    numpy.ndarray, complex64, the header's dimensions (trailing ones kept)
    """
    base = os.fspath(path)
    with open(base + ".hdr") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    try:
        at = lines.index("# Dimensions")
        dims = [int(x) for x in lines[at + 1].split()]
    except (ValueError, IndexError):
        raise ValueError(f"{base}.hdr: no '# Dimensions' line followed by the dimensions") from None
    if not dims or any(d < 0 for d in dims):
        raise ValueError(f"{base}.hdr: bad dimensions {dims}")
    data = np.fromfile(base + ".cfl", dtype="<c8")
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{base}.cfl: {data.size} complex values for dimensions {dims}")
    return data.astype(np.complex64).reshape(dims, order="F")
