"""DictionaryMatcher on the GPU: atoms simulated, normalised and projected on
the device and kept there; signals projected and matched there by the fused
kernel (cuda/match.cuh).  Only the sample that learns a subspace, each
signal's few candidates (indices and inner products) and the maps cross to
the host."""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import dispatch as _dispatch
from blochsim._arrays import noise as _noise
from blochsim._arrays import validate as V


def wanted(dm, signals=None) -> bool:
    """Whether a call of ``dm`` (a DictionaryMatcher or PERK) runs on the
    device: its ``device`` option, else its simulator's, else whether
    ``signals`` are a device array."""
    asked = dm.device if dm.device is not None else getattr(dm.simulator, "device", None)
    on = "signals" if signals is not None and V.is_device_array(signals) else None
    if asked == "auto" and not _dispatch.cuda_status()[0] and not on:
        return False
    return _dispatch.resolve_device(asked, on) == "cuda"


def _columns(params, a, b):
    """Device float32 columns of rows [a, b) of the parameter table."""
    from blochsim._arrays.device import DeviceArray
    return {k: DeviceArray.from_numpy(np.ascontiguousarray(v[a:b], np.float32)) for k, v in params.items()}


def _simulate(sim, params, fixed, a, b, contrasts):
    """Atoms of rows [a, b) of ``params`` simulated on the device: a
    DeviceArray (b - a, contrasts), complex64."""
    from blochsim._arrays.device import DeviceArray
    out = DeviceArray((b - a, contrasts), np.complex64)
    sim.simulate(**_columns(params, a, b), **fixed, out=out)
    return out


def _check_memory(what, need):
    free, _ = _core.memory_info()
    if need > 0.9 * free:
        raise MemoryError(f"{what} needs {need / 2 ** 30:.2f} GiB of device memory and the device has "
                          f"{free / 2 ** 30:.2f} GiB free: compress the dictionary (a smaller rank), fit fewer "
                          f"atoms, or fit with dask=True on several workers")


def fit(dm, params, fixed, contrasts):
    """Simulate the dictionary of the parameter table ``params`` on the
    device, chunk by chunk, each chunk's atoms normalised and (with a
    subspace) projected there; ``dm`` then holds them as a DeviceArray."""
    from blochsim._arrays.device import DeviceArray
    if dm.groups is not None:
        raise ValueError("DictionaryMatcher: groups is not available on the device (device='cuda'); the fused "
                         "kernel matches every atom at the card's rate")
    sim = dm.simulator
    n = len(next(iter(params.values())))
    basis = None
    full = n * contrasts * 8
    if (isinstance(dm.rank, int) and dm.rank < contrasts) or (dm.rank == "auto" and full > dm.auto_bytes):
        def sample(pick):
            return _simulate(sim, {k: v[pick] for k, v in params.items()}, fixed, 0, len(pick), contrasts).get()
        basis = dm._sampled_basis(n, sample, rank=dm.rank if isinstance(dm.rank, int) else None)
    r = contrasts if basis is None else basis.shape[1]
    chunk = min(dm.chunk, n)
    _check_memory(f"DictionaryMatcher.fit: {n} atoms of {r} complex components on the device",
                  n * r * 8 + n * 8 + chunk * (contrasts * 8 + 16))
    atoms = DeviceArray((n, r), np.complex64)
    norms = _core.DeviceBuffer(8 * n)
    basis_dev = DeviceArray.from_numpy(basis.astype(np.complex64)) if basis is not None else None
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        block = _simulate(sim, params, fixed, a, b, contrasts)
        _core.project_device(block.ptr, b - a, contrasts, basis_dev.ptr if basis_dev is not None else 0, r, True,
                             atoms.ptr + 8 * r * a, norms.ptr + 8 * a, 0)
    host_norms = np.empty(n, np.float64)
    _core.copy_to_host(host_norms.view(np.uint8), norms.ptr, 0)
    keep = host_norms > 0  # a null atom matches nothing
    if not keep.all():  # rare: the kept rows gathered through the host
        atoms = DeviceArray.from_numpy(np.ascontiguousarray(atoms.get()[keep]))
    dm.contrasts = contrasts
    dm._original = np.flatnonzero(keep)
    dm.params = {k: v[keep] for k, v in params.items()}
    dm._norms = host_norms[keep]
    dm._basis = basis
    dm._basis_dev = basis_dev
    dm._atoms = atoms
    dm._device_copy = None
    dm._group_of = None
    return dm


def resident(dm):
    """The matcher's atoms and basis on the device, (DeviceArray, DeviceArray
    or None): as fitted there, or copied once from the host and kept."""
    from blochsim._arrays.device import DeviceArray
    if isinstance(dm._atoms, DeviceArray):
        return dm._atoms, dm._basis_dev
    if dm._device_copy is None:
        basis = None if dm._basis is None else DeviceArray.from_numpy(dm._basis.astype(np.complex64))
        dm._device_copy = (DeviceArray.from_numpy(np.ascontiguousarray(dm._atoms, np.complex64)), basis)
    return dm._device_copy


def _device_signals(signals, contrasts, what):
    """Signals as (pointer, voxel shape, library, holder): a complex64
    device array as it is (checked finite on the device), NumPy ones
    copied to the device once."""
    from blochsim._arrays.device import DeviceArray, Interface
    from blochsim.estimators._common import _signals
    if V.is_device_array(signals):
        it = Interface("signals", signals, allow_complex64=True)
        if it.dtype != np.complex64 or not it.shape or it.shape[-1] != contrasts:
            raise ValueError(f"{what}: device signals must be a C-contiguous complex64 array of shape "
                             f"(*voxels, {contrasts}), got {np.dtype(it.dtype)} {it.shape}")
        size = int(np.prod(it.shape, dtype=np.int64))
        if size:
            stream = int(it.stream or 0)
            [(idx, value)] = _core.first_bad_values([(it.ptr, 2 * size, False, 0.0, False)], stream)
            if idx >= 0:
                at = tuple(int(i) for i in np.unravel_index(idx // 2 // contrasts, it.shape[:-1]))
                raise ValueError(f"{what}: signals are not finite at voxel {at} ({value!r})")
            _core.stream_synchronize(stream)
        return it.ptr, it.shape[:-1], it.library, it
    s = _signals(signals, contrasts, what)
    flat = np.ascontiguousarray(s.reshape(-1, contrasts), np.complex64)
    d = DeviceArray.from_numpy(flat)
    return d.ptr, s.shape[:-1], None, d


def match(dm, signals, k, m, refine):
    """DictionaryMatcher.match on the device: maps as NumPy arrays for NumPy
    signals, as device arrays of the signals' library for device ones."""
    from blochsim._arrays.device import DeviceArray, to_library
    from blochsim.estimators.dictionary._atoms import EXACT_MARGIN, _exact_order
    c = dm.contrasts
    sig_ptr, shape, library, holder = _device_signals(signals, c, "DictionaryMatcher.match")
    n = int(np.prod(shape, dtype=np.int64))
    atoms, basis_dev = resident(dm)
    N = atoms.shape[0]
    wide = min(m + EXACT_MARGIN, N)
    if wide > _core.match_device_max_k():
        raise ValueError(f"DictionaryMatcher.match: the device keeps at most {_core.match_device_max_k()} "
                         f"candidates a signal, and k = {k} with refine = {dm.refine} asks for {wide}")
    r = atoms.shape[1]
    # the kernel's staged parts of the signals and of the atoms (at most
    # 2**30 bytes of atoms at once): up to 256 bytes a 16-component chunk
    parts = 256 * -(-r // 16)
    _check_memory("DictionaryMatcher.match", n * (r * 8 + 8 + wide * 28 + parts) + min(N * parts, 2 ** 30))
    qn = _core.DeviceBuffer(8 * max(n, 1))
    if basis_dev is not None:
        q = DeviceArray((n, r), np.complex64)
        _core.project_device(sig_ptr, n, c, basis_dev.ptr, r, False, q.ptr, qn.ptr, 0)
        q_ptr = q.ptr
    else:
        _core.project_device(sig_ptr, n, c, 0, c, False, 0, qn.ptr, 0)
        q_ptr = sig_ptr
    idx = np.empty((n, wide), np.int64)
    power = np.empty((n, wide), np.float32)
    dot = np.empty((n, wide), np.complex128)
    bufs = [_core.DeviceBuffer(max(a.nbytes, 8)) for a in (idx, power, dot)]
    _core.match_device(q_ptr, atoms.ptr, n, N, r, wide, bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, 0)
    for a, b in zip((idx, power, dot), bufs):
        _core.copy_to_host(a.reshape(-1).view(np.uint8), b.ptr, 0)
    qnorm = np.empty(n, np.float64)
    _core.copy_to_host(qnorm.view(np.uint8), qn.ptr, 0)
    idx, dots = _exact_order(idx, dot, m)
    if refine:
        idx, dots = _exact(dm, sig_ptr, idx, k)
    else:
        idx, dots = idx[:, :k], dots[:, :k]
    score = np.abs(dots) / np.where(qnorm > 0, qnorm, 1.0)[:, None]
    out = {name: v[idx] for name, v in dm.params.items()}
    out.update(index=dm._original[idx], score=score, M0=dots / dm._norms[idx])
    if k == 1:
        out = {name: v[:, 0].reshape(shape) for name, v in out.items()}
    else:
        out = {name: v.reshape(shape + (k,)) for name, v in out.items()}
    if library is None:
        return out
    return {name: to_library(v, library) for name, v in out.items()}


def _exact(dm, sig_ptr, idx, k):
    """Re-rank each signal's candidates idx (n, m) on the device: the
    candidates simulated again in full there, their inner products with the
    signals in double precision; the k best as (indices, <unit atom, s>)."""
    n, m = idx.shape
    c = dm.contrasts
    best_i = np.empty((n, k), np.int64)
    best_d = np.empty((n, k), np.complex128)
    rows = max(1, dm.chunk // m)
    dots = _core.DeviceBuffer(16 * rows * m)
    norms = _core.DeviceBuffer(8 * rows * m)
    for a in range(0, n, rows):
        ic = idx[a:a + rows]
        cand = {name: v[ic.reshape(-1)] for name, v in dm.params.items()}
        atoms = _simulate(dm.simulator, cand, dm._fixed, 0, ic.size, c)
        _core.candidate_dots_device(atoms.ptr, sig_ptr + 8 * c * a, len(ic), m, c, dots.ptr, norms.ptr, 0)
        d = np.empty((len(ic), m), np.complex128)
        _core.copy_to_host(d.reshape(-1).view(np.uint8), dots.ptr, 0)
        d /= dm._norms[ic]
        order = np.argsort(-np.abs(d), axis=1, kind="stable")[:, :k]
        best_i[a:a + rows] = np.take_along_axis(ic, order, 1)
        best_d[a:a + rows] = np.take_along_axis(d, order, 1)
    return best_i, best_d


def perk_map(perk, signals, known, uncertainty):
    """PERK.map on the device: the inputs formed from the signals there
    (perk_inputs_kernel) and the fused map (cuda/perk.cuh); maps as NumPy
    arrays for NumPy signals, device arrays of the signals' library for
    device ones."""
    from blochsim._arrays.device import DeviceArray, to_library
    if perk._model is None:
        raise RuntimeError("PERK.map needs a fitted PERK: call fit() first")
    c = perk.contrasts
    sig_ptr, shape, library, holder = _device_signals(signals, c, "PERK.map")
    n = int(np.prod(shape, dtype=np.int64))
    cols = perk._known_columns(known, shape, "PERK.map")
    for k, col in zip(perk.known, cols):
        if not np.all(np.isfinite(col)):
            raise ValueError(f"PERK.map: known {k} is not finite")
    model = _perk_model(perk)
    F, d = perk._model["omega"].shape
    p = len(perk._model["offset"])
    _check_memory("PERK.map", n * (4 * d + 4 * p + 4 * len(cols)))
    x = DeviceArray((n, d), np.float32)
    kn = DeviceArray.from_numpy(np.ascontiguousarray(np.stack(cols, axis=1), np.float32)) if cols else None
    basis = model.get("basis")
    r = basis.shape[1] if basis is not None else 0
    _core.perk_inputs_device(sig_ptr, n, c, 0 if perk.input_mode == "cartesian" else 1, perk.normalize,
                             basis.ptr if basis is not None else 0, r, kn.ptr if kn is not None else 0, len(cols),
                             x.ptr, d, 0)
    out = DeviceArray((n, p), np.float32)
    _core.perk_device(model["omega"].ptr, model["phase"].ptr, model["weight"].ptr, model["offset"].ptr, d, F, p,
                      x.ptr, n, out.ptr, 0, 0, 0)
    maps = perk._maps(out.get(), shape, uncertainty)
    if library is None:
        return maps
    return {k: to_library(v, library) for k, v in maps.items()}


def is_device(v) -> bool:
    """Whether v is a blochsim DeviceArray."""
    from blochsim._arrays.device import DeviceArray
    return isinstance(v, DeviceArray)


def add(a, b):
    """a += b for float64 DeviceArrays of one shape, on the device; a."""
    _core.add_device(a.ptr, b.ptr, int(np.prod(a.shape, dtype=np.int64)), 0)
    return a


def to_host(sums):
    """A tuple of training sums with its DeviceArrays copied to NumPy."""
    return tuple(v.get() if is_device(v) else v for v in sums)


def _training_arrays(perk, spec):
    """The features' frequencies and phases and the input basis on the
    device, copied there once per fit."""
    from blochsim._arrays.device import DeviceArray
    held = getattr(perk, "_training_device", None)
    if held is None or held[0] is not spec["omega"]:
        arrays = {k: DeviceArray.from_numpy(np.ascontiguousarray(spec[k], np.float32)) for k in ("omega", "phase")}
        if perk._basis is not None:
            arrays["basis"] = DeviceArray.from_numpy(np.ascontiguousarray(perk._basis, np.float32))
        perk._training_device = held = (spec["omega"], arrays)
    return held[1]


def perk_block(perk, spec, b, theta):
    """One PERK training block on the device: the signals of draws theta (m,
    p) simulated there, the block's noise added there (the host's numbers:
    :mod:`blochsim._arrays.noise`), their inputs and features formed and summed
    there.  Returns (Σ z, Σ z zᵀ, Σ t, Σ t zᵀ, m): the sums of z as float64
    DeviceArrays, those of t (the few targets) in NumPy."""
    from blochsim._arrays.device import DeviceArray
    names = list(spec["spans"])
    m, c, d = len(theta), spec["contrasts"], spec["inputs"]
    F = spec["omega"].shape[0]
    params = {k: theta[:, i] for i, k in enumerate(names)}
    if simulator_on_device(perk.simulator):
        s = _simulate(perk.simulator, params, spec["fixed"], 0, m, c)
    else:
        s = DeviceArray.from_numpy(np.ascontiguousarray(
            np.asarray(perk.simulator.simulate(**params, **spec["fixed"])).reshape(m, c), np.complex64))
    if spec["noise_std"] > 0:
        _noise.add(s, spec["noise_std"], _noise.key(spec["seed"]), b, _noise.PERK_TRAINING)
    arrays = _training_arrays(perk, spec)
    basis = arrays.get("basis")
    kcols = [theta[:, names.index(k)] for k in spec["known"]]
    kn = DeviceArray.from_numpy(np.ascontiguousarray(np.stack(kcols, axis=1), np.float32)) if kcols else None
    x = DeviceArray((m, d), np.float32)
    _core.perk_inputs_device(s.ptr, m, c, 0 if perk.input_mode == "cartesian" else 1, perk.normalize,
                             basis.ptr if basis is not None else 0, basis.shape[1] if basis is not None else 0,
                             kn.ptr if kn is not None else 0, len(kcols), x.ptr, d, 0)
    t = perk._targets(spec, theta)
    p = t.shape[1]
    td = DeviceArray.from_numpy(np.ascontiguousarray(t, np.float64))
    sz, szz, stz = DeviceArray((F,), np.float64), DeviceArray((F, F), np.float64), DeviceArray((p, F), np.float64)
    _core.perk_moments_device(arrays["omega"].ptr, arrays["phase"].ptr, d, F, x.ptr, td.ptr, m, p,
                              float(spec["scale"]), sz.ptr, szz.ptr, stz.ptr, 0)
    return sz, szz, t.sum(0), stz, m


def _perk_model(perk):
    """The fitted model's arrays (and input basis) on the device, copied
    there once per fit."""
    from blochsim._arrays.device import DeviceArray
    if perk._device_model is None:
        arrays = {k: DeviceArray.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in perk._model.items()}
        if perk._basis is not None:
            arrays["basis"] = DeviceArray.from_numpy(np.ascontiguousarray(perk._basis, np.float32))
        perk._device_model = arrays
    return perk._device_model


def perk_run(perk, x, g, p):
    """PERK's first p estimates of the inputs x (n, d) on the device and,
    with a cotangent g (n, p), its pullback to x: (out (n, p), xbar (n, d)
    or None), NumPy."""
    from blochsim._arrays.device import DeviceArray
    model = _perk_model(perk)
    n, d = x.shape
    F = perk._model["omega"].shape[0]
    _check_memory("PERK.vjp", n * (8 * d + 8 * p))
    xd = DeviceArray.from_numpy(np.ascontiguousarray(x, np.float32))
    out = DeviceArray((n, p), np.float32)
    gd = DeviceArray.from_numpy(np.ascontiguousarray(g, np.float32)) if g is not None else None
    xbar = DeviceArray((n, d), np.float32) if g is not None else None
    # the first p rows of the weights and offsets: the estimates without their uncertainties
    _core.perk_device(model["omega"].ptr, model["phase"].ptr, model["weight"].ptr, model["offset"].ptr, d, F, p,
                      xd.ptr, n, out.ptr, gd.ptr if gd is not None else 0, xbar.ptr if xbar is not None else 0, 0)
    return out.get(), (xbar.get() if xbar is not None else None)


def simulator_on_device(sim) -> bool:
    """Whether ``sim`` plays on this process's GPU: ``device="cuda"``, or
    ``"auto"`` with a usable GPU."""
    dev = getattr(sim, "device", None)
    return dev == "cuda" or (dev == "auto" and _dispatch.cuda_status()[0])


def projected_chunk(sim, params, fixed, basis):
    """Atoms of the parameter table ``params`` simulated on the device,
    normalised and projected on ``basis`` (contrasts, r) there: (unit
    projections (m, r) complex64, norms (m,) float64), NumPy."""
    from blochsim._arrays.device import DeviceArray
    m = len(next(iter(params.values())))
    c, r = basis.shape
    block = _simulate(sim, params, fixed, 0, m, c)
    basis_dev = DeviceArray.from_numpy(np.ascontiguousarray(basis, np.complex64))
    out = DeviceArray((m, r), np.complex64)
    norms = DeviceArray((m,), np.float64)
    _core.project_device(block.ptr, m, c, basis_dev.ptr, r, True, out.ptr, norms.ptr, 0)
    return out.get(), norms.get()
