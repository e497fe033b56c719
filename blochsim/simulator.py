"""Simulator base classes: protocol in the constructor, tissue in ``simulate``.

A played simulator describes one repetition of its sequence (and an optional
preparation) as operators; blochsim packs it into the event stream once per
shape and plays it through the EPG kernels.  Writing a custom sequence::

    import numpy as np
    from blochsim import Simulator, Excitation, Refocusing, Delay, Dephase, Readout

    class CPMG(Simulator):
        protocol = {"ESP": 10.0, "n_echoes": 16}
        tissue_properties = ("T1", "T2", "M0", "B1")

        def preparation(self, p):
            return Excitation(90.0, phase=90.0)

        def repetition(self, p):
            half = Delay(p["ESP"] / 2)
            echo = Readout() @ half @ Dephase() @ Refocusing(180.0) @ Dephase() @ half
            return echo ** p["n_echoes"]

    CPMG().simulate(T1=1000.0, T2=np.array([50.0, 100.0]))   # shape (2, 16)
"""
from __future__ import annotations

import numpy as np

from blochsim import _core, _dispatch
from blochsim import _validate as V
from blochsim.sequence import pack

# Protocol keywords every played simulator takes.
PLAYED_COMMON = {"states": None, "crusher_dephasing_rad": None, "voxel_size_m": None,
                 "repetitions": 1}


class _Base:
    """Protocol/tissue bookkeeping shared by played and closed-form simulators."""

    #: protocol parameters and their defaults (None: required or automatic)
    protocol: dict = {}
    #: tissue properties this simulator models
    tissue_properties: tuple = ()
    #: tissue properties that must be given
    required: tuple = ()
    _common: dict = {}

    def __init__(self, *, device=None, threads=None, **protocol):
        self._defaults = {**self._common, **type(self).protocol}
        self._check_names(protocol)
        self._given = dict(protocol)
        if device is not None and device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.device = device
        if threads is not None:
            threads = V.positive_int("threads", threads)
        self.threads = threads
        # validate now, so a bad protocol fails at construction
        self._protocol_values({})

    def _check_names(self, protocol):
        for k in protocol:
            if k not in self._defaults:
                if k in self.tissue_properties:
                    raise TypeError(f"{k} is a tissue property of {type(self).__name__}: "
                                    f"pass it to simulate(), not the constructor")
                raise TypeError(f"{type(self).__name__} has no protocol parameter {k!r}; "
                                f"it takes {sorted(self._defaults)}")

    def _protocol_values(self, overrides):
        values = {**self._defaults, **self._given, **overrides}
        return self.check_protocol(values)

    def check_protocol(self, p: dict) -> dict:
        """Validate and normalise the protocol; subclasses extend this."""
        return p

    def _split(self, kwargs):
        proto, tissue = {}, {}
        for k, v in kwargs.items():
            if k in self._defaults:
                proto[k] = v
            elif k in self.tissue_properties:
                tissue[k] = v
            elif k in V.TISSUE_UNITS:
                raise TypeError(f"{type(self).__name__} does not model tissue property {k!r}; "
                                f"it models {list(self.tissue_properties)}")
            else:
                raise TypeError(f"{type(self).__name__}.simulate() got an unknown keyword {k!r}; "
                                f"protocol: {sorted(self._defaults)}, tissue: {list(self.tissue_properties)}")
        for r in self.required:
            if r not in tissue:
                raise TypeError(f"{type(self).__name__}.simulate() needs tissue property {r!r}")
        return proto, tissue

    def _tissue(self, tissue):
        arrays = {k: V.tissue_array(k, v) for k, v in tissue.items()}
        shape = V.broadcast_voxels(arrays) if arrays else ()
        return arrays, shape


class Simulator(_Base):
    """Base class of sequences played through the EPG engine.

    Subclasses set :attr:`protocol` (defaults of their protocol parameters)
    and :attr:`tissue_properties`, and define :meth:`repetition` (one
    repetition of the sequence, as operators) and optionally
    :meth:`preparation` (played once first) and :meth:`check_protocol`.

    Parameters
    ----------
    states : int, optional
        Number of EPG orders K.  Default: 1 + the shifts of one playing, at
        least 8.  Any size runs; memory grows as K.
    crusher_dephasing_rad : float, optional
        Dephasing one shift puts across the voxel, rad; needed for D and v.
    voxel_size_m : float, optional
        Voxel size along the crusher, m; needed for D and v.
    repetitions : int, optional
        Playings of the repetition; only the last is recorded.
    device : {"cpu", "cuda"}, optional
        Force a backend; by default NumPy inputs run on the host.
    threads : int, optional
        Host threads (default: $BLOCHSIM_NUM_THREADS or all usable CPUs).
    **protocol
        The subclass's protocol parameters.
    """

    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency", "D", "v")
    _common = PLAYED_COMMON
    # 0: the host backend; 1 or 4: the device's register path emulated on the
    # host with that many team members (tests of the device templates)
    _host_variant = 0

    def preparation(self, p: dict):
        """Operators played once before the repetitions (default: none)."""
        return None

    def repetition(self, p: dict):
        """Operators of one repetition (the layout); subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must define repetition()")

    def _common_checks(self, p):
        if p["states"] is not None:
            p["states"] = V.positive_int("states", p["states"])
        p["repetitions"] = V.positive_int("repetitions", p["repetitions"])
        for g in ("crusher_dephasing_rad", "voxel_size_m"):
            if p[g] is not None:
                p[g] = float(V.protocol_array(g, p[g], low=0.0, strict=True, ndim_max=0))
        return p

    def _protocol_values(self, overrides):
        values = {**self._defaults, **self._given, **overrides}
        return self.check_protocol(self._common_checks(values))

    def _packed(self, p):
        """The event stream for protocol p, reused while p does not change."""
        key = _protocol_key(p)
        cached = getattr(self, "_stream_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        s = pack(self.preparation(p), self.repetition(p), p["repetitions"])
        self._stream_cache = (key, s)
        return s

    def stream(self, **protocol):
        """The packed event stream of one call with these protocol overrides."""
        self._check_names(protocol)
        p = self._protocol_values(protocol)
        return pack(self.preparation(p), self.repetition(p), p["repetitions"]), p

    def simulate(self, out=None, **values):
        """Simulate the signal.

        Parameters
        ----------
        out : numpy.ndarray, complex64, shape (*voxels, samples), optional
            C-contiguous array to write the signal into (returned).
        **values
            Tissue properties (public units; each a float or an array, all
            broadcast to one voxel shape) and protocol overrides for this
            call.

        Returns
        -------
        numpy.ndarray, complex64, shape (*voxels, samples)
        """
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        arrays, shape = self._tissue(tissue)
        if ("D" in arrays or "v" in arrays) and (p["crusher_dephasing_rad"] is None or p["voxel_size_m"] is None):
            which = "D" if "D" in arrays else "v"
            raise ValueError(
                f"{which} needs the crusher geometry: pass crusher_dephasing_rad and voxel_size_m "
                f"to {type(self).__name__} (got crusher_dephasing_rad={p['crusher_dephasing_rad']!r}, "
                f"voxel_size_m={p['voxel_size_m']!r})")
        device = _dispatch.resolve_device(self.device, False)
        s = self._packed(p)
        states = p["states"] if p["states"] is not None else max(8, 1 + s.total_shifts)
        off_axis = any(k in arrays for k in ("B0", "B1phase", "v"))
        real, phi0 = s.real_subspace(off_axis)
        n = int(np.prod(shape, dtype=np.int64))
        si = []
        for name in _core.TISSUE_FIELDS:
            pub = _SI_TO_PUBLIC.get(name)
            if pub in arrays:
                a = arrays[pub]
                factor = V.TISSUE_UNITS[pub][0]
                flat = np.ascontiguousarray(a, dtype=np.float64).ravel() if a.size == 1 else \
                    np.broadcast_to(a, shape).ravel()
                si.append(np.ascontiguousarray(flat * factor, dtype=np.float32))
            else:
                si.append(None)
        want = shape + (s.n_samples,)
        if out is None:
            out = np.empty(want, dtype=np.complex64)
        elif not isinstance(out, np.ndarray) or out.dtype != np.complex64 or out.shape != want \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(
                f"out must be a writeable C-contiguous complex64 array of shape {want}, got "
                f"{type(out).__name__} {getattr(out, 'dtype', '')} {getattr(out, 'shape', '')}")
        result = out
        out = out.reshape(n, s.n_samples)
        dk = 0.0
        voxel = 0.0
        if p["crusher_dephasing_rad"] is not None and p["voxel_size_m"] is not None:
            dk = p["crusher_dephasing_rad"] / p["voxel_size_m"]
            voxel = p["voxel_size_m"]
        if device == "cuda":  # pragma: no cover - resolve_device refuses without CUDA
            raise RuntimeError("the CUDA backend is not available in this build")
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        _core.forward_host(s.interval, s.flags, s.shift_before, s.shift_after, s.flip_rad,
                           s.phase_rad, s.rx_phase_rad, s.slot, s.duration_s, s.n_samples,
                           states, dk, voxel, real, phi0, tuple(si), n, out, threads, s.rf_table,
                           self._host_variant)
        return result


_SI_TO_PUBLIC = {v[1]: k for k, v in V.TISSUE_UNITS.items()}


def _protocol_key(p):
    """A hashable snapshot of a protocol dict (arrays by value)."""
    items = []
    for k in sorted(p):
        v = p[k]
        if isinstance(v, np.ndarray):
            items.append((k, v.dtype.str, v.shape, v.tobytes()))
        else:
            items.append((k, repr(v)))
    return tuple(items)


class ClosedFormSimulator(_Base):
    """Base class of simulators with an analytic signal.

    Computed in NumPy in the precision of the inputs: float64 inputs (and
    Python floats) give complex128, float32 inputs complex64.  Subclasses
    define :meth:`signal`.
    """

    def signal(self, p: dict, t: dict):
        """Signal from the protocol and tissue (public units, broadcast)."""
        raise NotImplementedError

    def simulate(self, **values):
        """Simulate the signal.

        Parameters
        ----------
        **values
            Tissue properties (public units, broadcast to one voxel shape)
            and protocol overrides.

        Returns
        -------
        numpy.ndarray, complex, shape (*voxels, samples)
        """
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        arrays, shape = self._tissue(tissue)
        dtype = np.result_type(*arrays.values(), np.float32) if arrays else np.float64
        ctype = np.complex128 if dtype == np.float64 else np.complex64
        t = {k: np.asarray(a, dtype=np.float64)[..., None] for k, a in arrays.items()}
        out = self.signal(p, t)
        out = np.broadcast_to(out, shape + (np.shape(out)[-1],))
        return np.ascontiguousarray(out, dtype=ctype)
