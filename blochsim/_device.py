"""Device arrays: reading the CUDA array interface, blochsim's own device
array, and outputs in the caller's array library.

Nothing here imports CuPy or PyTorch unless the caller handed us one of
their arrays.
"""
from __future__ import annotations

import numpy as np

from blochsim import _core

_TYPESTRS = {"<f4": (np.float32, False), "<f8": (np.float64, True)}


class DeviceArray:
    """A C-contiguous array in CUDA device memory owned by blochsim.

    Exposes ``__cuda_array_interface__`` (version 3) and ``__dlpack__``, so
    CuPy (``cupy.asarray``), PyTorch (``torch.from_dlpack``), Numba and
    others can use it without a copy.

    Attributes
    ----------
    shape : tuple of int
    dtype : numpy.dtype (complex64 or float32)
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
        """Copy a float32 or complex64 NumPy array to a new DeviceArray."""
        a = np.ascontiguousarray(a)
        if a.dtype not in (np.float32, np.complex64):
            raise TypeError(f"DeviceArray holds float32 or complex64, got dtype {a.dtype}")
        d = cls(a.shape, a.dtype)
        _core.copy_to_device(d.ptr, a.reshape(-1).view(np.uint8), 0)
        _core.stream_synchronize(0)
        return d

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": None}

    def __dlpack_device__(self):
        return (2, self.device_id)  # kDLCUDA

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # our work is synchronised before we return arrays, so any stream may read
        code = 5 if self.dtype.kind == "c" else 2
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
        self.library = type(obj).__module__.split(".")[0]


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
