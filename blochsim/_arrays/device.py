"""Device arrays: reading the CUDA array interface, blochsim's own device
array, and outputs in the caller's array library.

Nothing here imports CuPy or PyTorch unless the caller handed us one of
their arrays.
"""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import reverse as _reverse
from blochsim._arrays import validate as V

_TYPESTRS = {"<f4": (np.float32, False), "<f8": (np.float64, True)}
#: DLPack type codes by NumPy dtype kind
_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class DeviceArray:
    """A C-contiguous array in CUDA device memory owned by blochsim.

    Exposes ``__cuda_array_interface__`` (version 3) and ``__dlpack__``, so
    CuPy (``cupy.asarray``), PyTorch (``torch.from_dlpack``), Numba and
    others can use it without a copy.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype (a numeric dtype: complex64 and float32 for signals
        and tissue, integers and double precision for estimator maps)
    ptr : int, device pointer
    """

    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self._buf = _core.DeviceBuffer(self.nbytes)
        self.ptr = self._buf.ptr
        self.device_id = _core.current_device()

    @classmethod
    def from_numpy(cls, a) -> "DeviceArray":
        """Copy a numeric NumPy array to a new DeviceArray."""
        a = np.ascontiguousarray(a)
        if a.dtype.kind not in _DLPACK_CODES:
            raise TypeError(f"DeviceArray holds numbers, got dtype {a.dtype}")
        d = cls(a.shape, a.dtype)
        _core.copy_to_device(d.ptr, a.reshape(-1).view(np.uint8), 0)
        _core.stream_synchronize(0)
        return d

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": None}

    def __dlpack_device__(self):
        return (2, self.device_id)  # kDLCUDA

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # our work is synchronised before we return arrays, so any stream may read
        code = _DLPACK_CODES[self.dtype.kind]
        return _core.dlpack_capsule(self, self.ptr, self.shape, code, self.dtype.itemsize * 8,
                                    self.device_id)

    def get(self) -> np.ndarray:
        """Copy to a NumPy array."""
        out = np.empty(self.shape, self.dtype)
        _core.copy_to_host(out.reshape(-1).view(np.uint8), self.ptr, 0)
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.get()
        return a if dtype is None else a.astype(dtype)

    def __repr__(self):
        return f"blochsim.DeviceArray(shape={self.shape}, dtype={self.dtype})"


class Interface:
    """A validated view of an object's ``__cuda_array_interface__``."""

    __slots__ = ("obj", "ptr", "shape", "dtype", "is_f64", "stream", "library")

    def __init__(self, name: str, obj, *, allow_complex64: bool = False):
        try:
            cai = obj.__cuda_array_interface__
        except Exception as exc:  # pragma: no cover - a broken exporter
            raise TypeError(f"{name}: reading __cuda_array_interface__ failed: {exc}") from None
        version = cai.get("version", 0)
        if version < 2:
            raise TypeError(f"{name}: __cuda_array_interface__ version {version} is not supported (need >= 2)")
        if cai.get("mask") is not None:
            raise TypeError(f"{name}: masked device arrays are not supported")
        typestr = cai.get("typestr")
        shape = tuple(int(s) for s in cai["shape"])
        if typestr in _TYPESTRS:
            self.dtype, self.is_f64 = _TYPESTRS[typestr]
        elif allow_complex64 and typestr == "<c8":
            self.dtype, self.is_f64 = np.complex64, False
        else:
            want = "complex64" if allow_complex64 else "float32 or float64"
            raise TypeError(f"{name} must be a {want} device array, got typestr {typestr!r}")
        itemsize = np.dtype(self.dtype).itemsize
        strides = cai.get("strides")
        if strides is not None:
            expect, acc = [], itemsize
            for s in reversed(shape):
                expect.append(acc)
                acc *= s
            expect = tuple(reversed(expect))
            if any(st != ex for st, ex, sz in zip(strides, expect, shape) if sz > 1):
                raise ValueError(f"{name} must be a C-contiguous device array, got strides {tuple(strides)} "
                                 f"for shape {shape}")
        ptr, _readonly = cai["data"]
        size = int(np.prod(shape, dtype=np.int64))
        if ptr == 0 and size > 0:
            raise ValueError(f"{name}: device array with a null pointer and {size} elements")
        if size > 0:
            dev = _core.pointer_device(ptr)
            cur = _core.current_device()
            if dev != cur:
                where = "host memory" if dev < 0 else f"device {dev}"
                raise ValueError(f"{name} is in {where}, but blochsim runs on the current device {cur}; "
                                 f"move it or make that device current")
        self.obj = obj  # keeps the exporter alive for the call
        self.ptr = int(ptr)
        self.shape = shape
        self.stream = cai.get("stream") if version >= 3 else None
        self.library = library_of(obj)


def to_host(name: str, obj, allow_complex64: bool = False) -> np.ndarray:
    """A copy on the host of the device array ``obj`` (validated as
    :class:`Interface`), after the work its stream holds."""
    it = Interface(name, obj, allow_complex64=allow_complex64)
    host = np.empty(it.shape, dtype=it.dtype)
    _core.copy_to_host(host.reshape(-1).view(np.uint8), it.ptr, int(it.stream or 0))
    return host


def from_host(a: np.ndarray, like_library: str):
    """A complex64 device array of the caller's library holding ``a``."""
    d, ptr = new_output(a.shape, like_library)
    _core.copy_to_device(ptr, np.ascontiguousarray(a, np.complex64).reshape(-1).view(np.uint8), 0)
    _core.stream_synchronize(0)
    return d


def to_library(a: np.ndarray, library: str):
    """A device array of the caller's library (CuPy, PyTorch; else a
    blochsim DeviceArray) holding a copy of the NumPy array ``a``."""
    a = np.ascontiguousarray(a)
    if library == "cupy":
        import cupy

        return cupy.asarray(a)
    if library == "torch":
        import torch

        return torch.as_tensor(a, device=f"cuda:{_core.current_device()}")
    return DeviceArray.from_numpy(a)


def library_of(a) -> str:
    """The name of the package ``a``'s type comes from: "numpy", "cupy",
    "torch", "blochsim" (a DeviceArray), ..."""
    return type(a).__module__.split(".")[0]


def host_copy(a) -> np.ndarray:
    """A NumPy copy of a NumPy value or a device array of CuPy, PyTorch or
    blochsim (any dtype)."""
    if library_of(a) == "torch":
        return a.detach().cpu().numpy()
    if hasattr(a, "get") and library_of(a) in ("cupy", "blochsim"):
        return np.asarray(a.get())
    return np.asarray(a)


def array_module(a):
    """The array module of ``a``: numpy (NumPy arrays and anything else),
    cupy or torch, imported only when ``a`` is one of theirs."""
    module = library_of(a)
    if module in ("cupy", "torch"):
        import importlib
        return importlib.import_module(module)
    return np


def host_as(a: np.ndarray, like):
    """The NumPy array ``a`` as an array of ``like``'s library, on its device
    (``a`` itself for NumPy)."""
    xp = array_module(like)
    if xp is np:
        return a
    if xp.__name__ == "torch":
        return xp.as_tensor(a, device=like.device)
    return xp.asarray(a)


def astype(a, dtype):
    """``a`` as ``dtype`` (a NumPy dtype or its name) in its own library."""
    name = np.dtype(dtype).name
    xp = array_module(a)
    if xp.__name__ == "torch":
        return a.to(getattr(xp, name))
    return a.astype(getattr(xp, name))


def gradients_in_libraries(grads: dict, libraries: dict) -> dict:
    """A pullback's gradients with each tissue property's that was passed
    as a device array (``libraries``: name -> its array library) moved to
    that library, float64 as on the host; protocol parameters' stay NumPy."""
    for k, library in libraries.items():
        if k in grads:
            grads[k] = to_library(np.asarray(grads[k], np.float64), library)
    return grads


def new_output(shape, like_library: str):
    """A complex64 device array in the caller's library (CuPy, PyTorch) or a
    blochsim DeviceArray; returns (array, pointer)."""
    if like_library == "cupy":
        import cupy

        a = cupy.empty(shape, dtype=cupy.complex64)
        return a, int(a.data.ptr)
    if like_library == "torch":
        import torch

        a = torch.empty(shape, dtype=torch.complex64, device=f"cuda:{_core.current_device()}")
        return a, int(a.data_ptr())
    a = DeviceArray(shape, np.complex64)
    return a, a.ptr


# The plumbing of device calls: tissue intake, streams, resident planes,
# cotangents and outputs.

def device_results(signal, J, out, library, one=False):
    """Host results as device arrays: copied into the device ``out`` (an
    array, or a (signal, J) pair) when given, else new arrays of
    ``library``; J (*voxels, directions, samples) without its direction
    axis for ``one`` direction named by a str."""
    hosts = [signal] if J is None else [signal, J[..., 0, :] if one else J]
    if out is None:
        made = [from_host(h, library) for h in hosts]
        return made[0], (made[1] if J is not None else None)
    targets = list(out) if isinstance(out, tuple) else [out]
    for j, (o, h) in enumerate(zip(targets, hosts)):
        name = "out" if len(targets) == 1 else f"out[{j}]"
        it = Interface(name, o, allow_complex64=True)
        if it.dtype != np.complex64 or it.shape != h.shape:
            raise ValueError(f"{name} must be a C-contiguous complex64 array of shape {h.shape}, got "
                             f"{np.dtype(it.dtype)} {it.shape}")
        _core.copy_to_device(it.ptr, np.ascontiguousarray(h).reshape(-1).view(np.uint8), int(it.stream or 0))
        _core.stream_synchronize(int(it.stream or 0))
    return targets[0], (targets[1] if len(targets) > 1 else None)


def device_inputs(tissue, on_device):
    """Tissue for a device call: (host_only, device-array interfaces, host
    arrays, voxel shape); with no device array (device='cuda' on NumPy
    inputs) every property is copied to the device first."""
    host_only = not on_device
    if host_only:
        tissue = {k: DeviceArray.from_numpy(np.ascontiguousarray(V.tissue_array(k, v), np.float32))
                  for k, v in tissue.items()}
    ifaces = {k: Interface(k, v) for k, v in tissue.items() if V.is_device_array(v)}
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in ifaces}
    shapes = {**arrays, **{k: Shaped(i.shape) for k, i in ifaces.items()}}
    return host_only, ifaces, arrays, (V.broadcast_voxels(shapes) if shapes else ())


def work_stream(streams):
    """The stream a device call runs on: the first producer's, else a new
    blochsim stream (returned as its owner, to be kept alive)."""
    if streams:
        return None, int(streams[0])
    own = _core.CudaStream()
    return own, own.handle


def resident_tissue(arrays, ifaces, shape, n, own, stream, fields=None):
    """Device float32 SI planes of the tissue in the order of the SI names
    ``fields`` (default TISSUE_FIELDS), as (pointer, stride) or None, and
    the buffers that hold them."""
    # temporaries are allocated and freed in the stream's order; each holds
    # the stream blochsim made, so it outlives them
    order = own if own is not None else stream
    keep = []
    dev = []
    checks = []
    for field in (_core.TISSUE_FIELDS if fields is None else fields):
        name = V.SI_TO_PUBLIC.get(field)
        factor = V.TISSUE_UNITS[name][0] if name else 1.0
        if name in ifaces:
            it = ifaces[name]
            size = int(np.prod(it.shape, dtype=np.int64))
            count = 1 if size == 1 else n
            buf = _core.DeviceBuffer(4 * count, order)
            if count == 1:
                _core.expand_to_float(it.ptr, it.is_f64, (1,), (0,), factor, buf.ptr, 1, stream)
            else:
                _core.expand_to_float(it.ptr, it.is_f64, tuple(shape), broadcast_strides(it.shape, shape),
                                      factor, buf.ptr, n, stream)
            checks.append((name, buf.ptr, count, shape if count > 1 else (), factor))
            keep.append(buf)
            dev.append((buf.ptr, 0 if count == 1 else 1))
        elif name in arrays:
            a = arrays[name]
            host = (np.asarray(a, np.float64).reshape(1) if a.size == 1 else
                    np.broadcast_to(a, shape).reshape(-1)) * factor
            host = np.ascontiguousarray(host, dtype=np.float32)
            buf = _core.DeviceBuffer(host.nbytes, order)
            _core.copy_to_device(buf.ptr, host.view(np.uint8), stream)
            keep.append((buf, host))
            dev.append((buf.ptr, 0 if host.size == 1 else 1))
        else:
            dev.append(None)
    check_device_values(checks, stream)
    return tuple(dev), keep


def device_cotangent(c, want, what, order, stream):
    """A pullback's cotangent on the device: a complex64 device array of
    shape ``want`` as it is, or a NumPy one copied to a new buffer (ordered
    on ``order``); returns (pointer, the object that holds the memory)."""
    if V.is_device_array(c):
        it = Interface("cotangent", c, allow_complex64=True)
        if it.dtype != np.complex64 or it.shape != want:
            raise ValueError(f"cotangent must be a C-contiguous complex64 device array of {what} shape {want}, "
                             f"got {it.dtype} {it.shape}")
        return it.ptr, it
    host = _reverse.cotangent(c, want, what)
    buf = _core.DeviceBuffer(max(host.nbytes, 8), order)
    _core.copy_to_device(buf.ptr, host.reshape(-1).view(np.uint8), stream)
    return buf.ptr, buf


class Shaped:
    """Stands in for an array in shape broadcasting."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def broadcast_strides(src_shape, shape):
    """Element strides of a C-contiguous array of src_shape broadcast to shape."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(1, len(src_shape) + 1):
        size = src_shape[-i]
        strides[-i] = 0 if size == 1 else acc
        acc *= size
    return tuple(strides)


def check_device_values(checks, stream):
    """The device-side version of the host checks, finite and within bounds,
    of the SI planes ``checks`` = [(name, pointer, count, voxel shape (()
    for one value), factor to SI)]: one synchronisation for all; the first
    failing property is refused."""
    bounds = [V.TISSUE_UNITS[name][2:] for name, *_ in checks]
    found = _core.first_bad_values([(ptr, count, low is not None, float(low or 0.0), bool(strict))
                                    for (_, ptr, count, _, _), (low, strict) in zip(checks, bounds)], stream)
    for (name, _, _, shape, factor), (low, strict), (idx, value) in zip(checks, bounds, found):
        if idx < 0:
            continue
        where = tuple(int(i) for i in np.unravel_index(idx, shape)) if shape else ()
        v = float(f"{value / factor:.7g}")  # the float32 value, back in public units
        if not np.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v!r} at index {where}")
        op = ">" if strict else ">="
        unit = V.UNIT_NAMES[name]
        raise ValueError(f"{name} must be {op} {low:g}{' ' + unit if unit else ''}, got {v!r} at index {where}")

