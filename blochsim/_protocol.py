"""Protocol and packing: the protocol/tissue bookkeeping every simulator
shares, the checks of a call's request, and the event stream a played
simulator's protocol packs into (cached per protocol)."""
from __future__ import annotations

import copy
import functools
import hashlib
import pickle
import threading

import numpy as np

from blochsim import _core
from blochsim._engine import dispatch as _dispatch, pools as _pools
from blochsim._arrays import validate as V
from blochsim.sequence import Operator, pack, pack_with_provenance, trace
from blochsim.sequence.packing import EV_INVERSION, EV_SPOIL

# Protocol keywords every played simulator takes.
PLAYED_COMMON = {"states": None, "crusher_dephasing_rad": None, "voxel_size_m": None,
                 "repetitions": 1, "budget_bytes": None, "lineshape": "super-lorentzian", "slice_profile": None,
                 "shim": None}


def _lazy_entry(name, method):
    """``method`` (simulate, jacobian or vjp), which hands a call with Dask
    arrays among its values to :mod:`blochsim.distributed`."""

    @functools.wraps(method)
    def entry(self, *args, **values):
        if _dispatch.any_lazy(values):
            from blochsim import distributed
            return distributed.lazy_call(self, name, args, values)
        return method(self, *args, **values)

    return entry


#: per-process simulators rebuilt from pickles (a Dask worker's tasks share
#: one instance per protocol, so its packed streams are built once there)
_RESTORED: dict = {}
_RESTORED_MAX = 32
_RESTORED_LOCK = threading.Lock()
#: what a simulator caches and rebuilds, never pickled
_CACHES = ("_stream_cache", "_dephasing_cache", "_keyed_cache", "_checked_cache", "_packed_cache")


def _restore(cls, state, token):
    """The simulator of a pickle: this process's instance for ``token`` (the
    hash of the class and state), made once; a fresh one when the state
    could not be hashed or the class was redefined."""
    with _RESTORED_LOCK:
        obj = _RESTORED.get(token) if token is not None else None
        if obj is None or type(obj) is not cls:
            obj = cls.__new__(cls)
            obj.__dict__.update(state)
            if token is not None:
                _RESTORED.pop(token, None)
                if len(_RESTORED) >= _RESTORED_MAX:
                    _RESTORED.pop(next(iter(_RESTORED)))
                _RESTORED[token] = obj
        return obj


class Base:
    """Protocol/tissue bookkeeping shared by played and closed-form simulators.

    Simulators pickle to their protocol (class, options, protocol values),
    without their caches; unpickled in a process that already holds an
    equal one, they are that one, so a Dask worker rebuilds a simulator's
    caches once, not per task.  ``copy.copy`` and ``copy.deepcopy`` make
    independent copies.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Dask arrays among the tissue values: the call becomes a lazy graph
        for name in ("simulate", "jacobian", "vjp", "jacobian_vjp"):
            if name in cls.__dict__:
                setattr(cls, name, _lazy_entry(name, cls.__dict__[name]))

    def _state(self):
        """The pickled state (no caches) and its hash (None when it cannot
        be pickled here: a lambda among the options needs cloudpickle)."""
        state = {k: v for k, v in self.__dict__.items() if k not in _CACHES}
        try:
            blob = pickle.dumps((type(self), state), protocol=4)
        except (pickle.PicklingError, AttributeError, TypeError):
            try:
                import cloudpickle
                blob = cloudpickle.dumps((type(self), state), protocol=4)
            except Exception:
                return state, None
        return state, hashlib.sha256(blob).hexdigest()

    def __reduce__(self):
        state, token = self._state()
        return _restore, (type(self), state, token)

    def __dask_tokenize__(self):
        token = self._state()[1]
        return type(self).__qualname__, token if token is not None else id(self)

    def __copy__(self):
        obj = type(self).__new__(type(self))
        obj.__dict__.update(self.__dict__)
        return obj

    def __deepcopy__(self, memo):
        obj = type(self).__new__(type(self))
        memo[id(self)] = obj
        obj.__dict__.update(copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in _CACHES}, memo))
        return obj

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
        if device is not None and device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")
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
        """The checked protocol of a call: the given values with the call's
        overrides.  The checks run once per distinct value (the last one is
        kept): a repeated call with the same values skips them, and its
        stream caches key on the given values instead of the checked ones."""
        given = {**self._given, **overrides}
        key = protocol_key(given)
        cached = self.__dict__.get("_checked_cache")
        if cached is not None and cached[0] == key:
            return CheckedProtocol(cached[1], key)
        p = self._checked({**self._defaults, **given})
        self._checked_cache = (key, dict(p))
        return CheckedProtocol(p, key)

    def _checked(self, values):
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

    def _jacobian_request(self, diff, order, values):
        """The checked names, protocol overrides and tissue of a jacobian call."""
        check_order(order)
        names = diff_names(diff, self.tissue_properties, type(self).__name__, "jacobian")
        proto, tissue = self._split(values)
        check_diff_values(names, tissue)
        return names, proto, tissue

    def _tissue(self, tissue):
        arrays = {k: V.tissue_array(k, v) for k, v in tissue.items()}
        shape = V.broadcast_voxels(arrays) if arrays else ()
        return arrays, shape


class Played(Base):
    """The protocol side of a played simulator: its checks, the operators
    of a preparation and a repetition, and their packed event stream."""

    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency", "D", "v", "T2prime")
    _common = PLAYED_COMMON

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # every played simulator models the pools
        cls.tissue_properties = tuple(cls.tissue_properties) + tuple(
            k for k in _pools.POOL_PROPERTIES if k not in cls.tissue_properties)
    # 0: the host backend; 1 or 4: the device's register path emulated on the
    # host with that many team members (tests of the device templates); with
    # pools, any non-zero value: the device's pooled team of 4 members
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
        if isinstance(p["repetitions"], str):
            if p["repetitions"] != "auto":
                raise ValueError(f"repetitions must be a positive integer or 'auto', got {p['repetitions']!r}")
        else:
            p["repetitions"] = V.positive_int("repetitions", p["repetitions"])
        if p["budget_bytes"] is not None:
            p["budget_bytes"] = V.positive_int("budget_bytes", p["budget_bytes"])
        for g in ("crusher_dephasing_rad", "voxel_size_m"):
            if p[g] is not None:
                p[g] = float(V.protocol_array(g, p[g], low=0.0, strict=True, ndim_max=0))
        if p["lineshape"] not in _pools.LINESHAPES:
            raise ValueError(f"lineshape must be one of {list(_pools.LINESHAPES)}, got {p['lineshape']!r}")
        if p["slice_profile"] is not None and not isinstance(p["slice_profile"], SliceProfile):
            p["slice_profile"] = SliceProfile(p["slice_profile"], self)
        if p["shim"] is not None:  # combined with B1's channels before a stream is played (_modifiers._Transmit)
            V.shim_weights(p["shim"], -1)
        return p

    def _checked(self, values):
        return self.check_protocol(self._common_checks(values))

    def _packed(self, p):
        """The event stream for protocol p, reused while p does not change."""
        if p["repetitions"] == "auto":
            raise ValueError("blochsim internal error: repetitions='auto' reached the packer unresolved")
        key = checked_key(p)
        cached = getattr(self, "_stream_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        # the repetition first: it refuses a protocol that lacks what the call needs
        repetition = self.repetition(p)
        s = pack(self.preparation(p), repetition, p["repetitions"])
        self._stream_cache = (key, s)
        return s

    def _keyed_alternative(self, p):
        """The moment-keyed event stream of protocol p, for a protocol a
        subclass can also play keyed by moment (a Pulseq file read on one
        EPG order); None here."""
        return None

    def _host_stream(self, p, present, s, ps, states, arrays, shape):
        """The stream (and its packed form) a host simulate or jacobian
        plays: the one-order stream s, or the moment-keyed stream of the same
        protocol where a subclass has one and its program does under half
        the work (a train whose refocusing leaves most orders of its band
        empty); never with D or v, whose one-order geometry the keyed EPG
        does not share."""
        from blochsim.sequence import keyed

        if s.moments is not None or present & {"D", "v"} or not keyed.may_prefer(s, states):
            return s, ps
        alt = self._keyed_alternative(p)
        if alt is None or alt.moments is None:
            return s, ps
        from blochsim._engine import host as _backend_host

        program = keyed.program_for(type(self).__name__, alt, _backend_host.ranges(arrays, shape),
                                    list(_core.TISSUE_FIELDS))
        if not keyed.prefer(program, s, states):
            return s, ps
        return alt, self._stream_for(p, present, alt, keyed=True)[1]

    def _stream_for(self, p, present, stream=None, keyed=False):
        """The event stream of protocol p (or ``stream``, packed from it),
        its packed form for the kernels, the states and whether it plays on
        the real path, given the tissue properties present.  A stream of
        3-D moments (the moment-keyed EPG) is refused unless ``keyed`` (the
        caller plays it)."""
        s = self._packed(p) if stream is None else stream
        # the moment-keyed EPG's moments are absolute: D needs no crusher geometry there
        if (("D" in present and s.moments is None) or "v" in present) and (
                p["crusher_dephasing_rad"] is None or p["voxel_size_m"] is None):
            which = "D" if "D" in present else "v"
            raise ValueError(
                f"{which} needs the crusher geometry: pass crusher_dephasing_rad and voxel_size_m "
                f"to {type(self).__name__} (got crusher_dephasing_rad={p['crusher_dephasing_rad']!r}, "
                f"voxel_size_m={p['voxel_size_m']!r})")
        if s.channels is not None and s.transmit is None:
            raise ValueError(f"{type(self).__name__}: the sequence's pulses drive transmit channels (Pulse.channels, "
                             f"a waveform per channel): pass B1 as the channels' complex sensitivities, shape "
                             f"(channels, *voxels)")
        if s.moments is not None and not keyed:
            raise TypeError(f"{type(self).__name__}: this sequence's gradient moments need the moment-keyed EPG "
                            "(states keyed by 3-D moment), which plays simulate, jacobian and vjp with respect "
                            "to tissue properties: jacobian_vjp (second order in protocol parameters) is not "
                            "played on it yet (read the file with axis= and unit= to put its moments on one EPG "
                            "order)")
        if "inv_efficiency" in present and not np.any(s.flags & EV_INVERSION):
            self._refuse_idle_inversion()
        states = p["states"] if p["states"] is not None else max(8, 1 + s.total_shifts)
        off_axis = any(k in present for k in ("B0", "B1phase", "v"))
        dk = voxel = 0.0
        if p["crusher_dephasing_rad"] is not None and p["voxel_size_m"] is not None:
            dk = p["crusher_dephasing_rad"] / p["voxel_size_m"]
            voxel = p["voxel_size_m"]
        # the packed form of the last stream and settings, reused by the next call that plays them
        settings = (states, off_axis, dk, voxel)
        cached = self.__dict__.get("_packed_cache")
        if cached is not None and cached[0] is s and cached[1] == settings:
            return s, cached[2], cached[2].states, cached[3]
        if s.moments is None:
            states = min(states, reached_orders(s))
        real, phi0 = s.real_subspace(off_axis)
        ps = _core.PackedStream(s, states, dk, voxel, real, phi0)
        self._packed_cache = (s, settings, ps, bool(real))
        return s, ps, states, bool(real)

    def _pooled_call(self, p, tissue, names, stream=None, keyed=False):
        """The tissue of a call with its idle pools dropped and, for a call
        the pooled kernels play (pools, or exact rectangular pulses),
        ((exchanging pools, bound pool), the event stream, its packed form);
        else None.  A stream of 3-D moments is refused unless ``keyed``
        (the caller plays it on the moment-keyed EPG)."""
        owner = type(self).__name__
        if _pools.any_pool(tissue):
            tissue = _pools.drop_idle(tissue, names, owner)
        if not _pools.any_pool(tissue) and (self._packed(p) if stream is None else stream).driven is None:
            return tissue, None
        pools = _pools.configuration(tissue, owner)
        s, ps, _, _ = self._stream_for(p, set(tissue), stream, keyed=keyed)
        return tissue, (pools, s, ps)

    def _streams(self, p):
        """What the engine may ask of this simulator for protocol p."""
        return Streams(self, p)

    def _refuse_idle_inversion(self):
        raise TypeError(f"{type(self).__name__} plays no ideal inversion with this protocol, so "
                        f"inv_efficiency would be ignored: leave it out, or choose an ideal inversion")

    def _vjp_names(self, names, p):
        """The protocol and tissue names of a vjp request, checked."""
        if not names:
            raise ValueError("vjp needs at least one name in wrt")
        protocol_names, tissue_names = [], []
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"wrt names parameters by str, got {k!r}")
            if k in self.tissue_properties:
                tissue_names.append(k)
            elif k in self._defaults:
                v = p[k]
                if k in PLAYED_COMMON:
                    raise TypeError(f"{type(self).__name__} cannot differentiate with respect to {k!r}: it is "
                                    f"a setting of the engine, not a sequence value")
                if not (isinstance(v, (float, complex, np.floating, np.complexfloating)) or
                        (isinstance(v, np.ndarray) and v.dtype.kind in "fc")):
                    raise TypeError(f"{type(self).__name__} cannot differentiate with respect to {k!r}: "
                                    f"it is not a float protocol parameter (got {v!r})")
                protocol_names.append(k)
            else:
                raise TypeError(f"{type(self).__name__} cannot differentiate with respect to {k!r}: its "
                                f"protocol is {sorted(set(self._defaults) - set(PLAYED_COMMON))} and it "
                                f"models {list(self.tissue_properties)}")
        if len(set(names)) != len(names):
            raise ValueError(f"wrt names a parameter twice: {list(names)}")
        return protocol_names, tissue_names

    def _traced_stream(self, p, proto, protocol_names):
        """The stream packed from protocol p traced in ``protocol_names``,
        its provenance (which event values each protocol entry reaches) and
        each protocol gradient's shape (a scalar as given stays a scalar)."""
        raw = {**self._defaults, **self._given, **proto}
        traced = dict(p)
        for k in protocol_names:
            traced[k] = trace(k, p[k])
        if p["repetitions"] == "auto":
            raise ValueError("blochsim internal error: repetitions='auto' reached the packer unresolved")
        stream, prov = pack_with_provenance(self.preparation(traced), self.repetition(traced), p["repetitions"])
        pshapes = {k: (np.shape(p[k]) if np.ndim(raw[k]) > 0 else ()) for k in protocol_names}
        return stream, prov, pshapes

    def stream(self, **protocol):
        """The packed event stream of one call with these protocol overrides."""
        self._check_names(protocol)
        p = self._protocol_values(protocol)
        if p["repetitions"] == "auto":
            raise ValueError("stream() needs repetitions as a number: 'auto' depends on the tissue")
        return pack(self.preparation(p), self.repetition(p), p["repetitions"]), p


def reached_orders(s):
    """The orders a stream's states can reach: 1 + its shifts (a spoiled
    event's shift after it is not played).  Orders at or past it stay zero
    whatever K is, so the kernels play K = min(states, this) with the same
    result: a balanced train (no shifts) plays one order, not ``states``."""
    after = np.abs(s.shift_after.astype(np.int64))
    after[(s.flags & EV_SPOIL) != 0] = 0
    return 1 + int(np.abs(s.shift_before.astype(np.int64)).sum() + after.sum())


def diff_names(diff, modelled, owner, what):
    """The names of a ``diff`` argument (a name or a sequence of distinct names)."""
    names = (diff,) if isinstance(diff, str) else tuple(diff)
    if not names:
        raise ValueError(f"{what} needs at least one property in diff")
    for k in names:
        if not isinstance(k, str):
            raise TypeError(f"diff names properties by str, got {k!r}")
        if k not in modelled:
            raise TypeError(f"{owner} cannot differentiate with respect to {k!r}: it models "
                            f"{list(modelled)} (protocol parameters take vjp)")
    if len(set(names)) != len(names):
        raise ValueError(f"diff names a property twice: {list(names)}")
    return names


def check_order(order):
    """jacobian computes first derivatives only."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order != 1:
        raise ValueError(f"jacobian computes first derivatives (order=1), got order={order!r}; the "
                         f"derivative of a cost of the Jacobian is jacobian_vjp")


def check_diff_values(names, tissue, what="jacobian"):
    """Each property differentiated must be passed, as a float."""
    for name in names:
        if name not in tissue:
            raise ValueError(f"{what} with respect to {name!r} needs {name} passed as a tissue value")
        v = tissue[name]
        if isinstance(v, (int, float)) or V.is_device_array(v):
            continue
        if np.asarray(v).dtype.kind != "f":
            raise TypeError(f"{name} must be a float array to differentiate, got dtype {np.asarray(v).dtype}")


class CheckedProtocol(dict):
    """A checked protocol (a dict) that carries ``key``, the key of the given
    values it was checked from, while it is not changed: any change drops
    the key, so that the caches key on its own values again."""

    __slots__ = ("key",)

    def __init__(self, values, key):
        super().__init__(values)
        self.key = key


def _dropping_key(method):
    def changed(self, *args, **kwargs):
        self.key = None
        return method(self, *args, **kwargs)
    changed.__name__ = method.__name__
    return changed


for _name in ("__setitem__", "__delitem__", "__ior__", "update", "pop", "popitem", "setdefault", "clear"):
    setattr(CheckedProtocol, _name, _dropping_key(getattr(dict, _name)))
del _name


def checked_key(p):
    """The cache key of a protocol dict: the key of the values a
    :class:`CheckedProtocol` was checked from, else a snapshot of p."""
    key = getattr(p, "key", None)
    return ("given", key) if key is not None else ("checked", protocol_key(p))


def protocol_key(p):
    """A hashable snapshot of a protocol dict (arrays by value)."""
    def snap(v):
        if isinstance(v, np.ndarray):
            return (v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, (tuple, list)):
            return (type(v).__name__,) + tuple(snap(x) for x in v)
        if isinstance(v, Operator):  # a pulse given as protocol: its operators, not its short repr
            return v._key()
        return repr(v)

    return tuple((k, snap(p[k])) for k in sorted(p))


class SliceProfile:
    """A checked slice profile: flip scales and weights summing to 1."""

    def __init__(self, value, sim):
        try:
            scales, weights = value
        except (TypeError, ValueError):
            raise ValueError(f"slice_profile must be a pair (scales, weights), got {value!r}") from None
        self.scales = np.atleast_1d(V.protocol_array("slice_profile scales", scales, low=0.0))
        self.weights = np.atleast_1d(V.protocol_array("slice_profile weights", weights, low=0.0))
        if self.scales.shape != self.weights.shape or self.scales.ndim != 1:
            raise ValueError(f"slice_profile: {self.scales.size} scales and {self.weights.size} weights")
        total = float(np.sum(self.weights))
        if not total > 0:
            raise ValueError("slice_profile weights must have a positive sum")
        self.weights = self.weights / total
        if "B1" not in sim.tissue_properties:
            raise TypeError(f"slice_profile scales the flips through B1, which {type(sim).__name__} does not model")

    def __eq__(self, other):
        return (isinstance(other, SliceProfile) and np.array_equal(self.scales, other.scales)
                and np.array_equal(self.weights, other.weights))

    def __hash__(self):
        return hash((self.scales.tobytes(), self.weights.tobytes()))


class Streams:
    """The event streams of one call's protocol, as the engine
    (:mod:`blochsim._engine`) asks for them: all it sees of a simulator."""

    def __init__(self, sim, p):
        self._sim = sim
        #: the checked protocol values
        self.p = p
        #: the simulator's class name, naming the call in refusals
        self.name = type(sim).__name__
        #: 0: the host backend; else the device's register teams emulated on the host (tests)
        self.variant = sim._host_variant
        #: the semisolid pool's lineshape, as an index of blochsim._engine.pools.LINESHAPES
        self.lineshape = _pools.LINESHAPES.index(p["lineshape"])
        #: device memory a call of NumPy inputs may use on the card (None: most of the free memory)
        self.budget = p["budget_bytes"]

    def packed(self):
        """The protocol's event stream (blochsim.sequence.EventStream)."""
        return self._sim._packed(self.p)

    def stream(self, present, stream=None, keyed=False):
        """(stream, packed stream, states, real path) for the tissue
        properties ``present``: the protocol's stream or ``stream``."""
        return self._sim._stream_for(self.p, present, stream, keyed)

    def host_stream(self, present, s, ps, states, arrays, shape):
        """The stream a host simulate or jacobian plays: ``s`` or the
        moment-keyed stream of the same protocol where it is cheaper."""
        return self._sim._host_stream(self.p, present, s, ps, states, arrays, shape)

    def pooled(self, tissue, names, stream=None, keyed=False):
        """(tissue without idle pools, (pools, stream, packed) or None)."""
        return self._sim._pooled_call(self.p, tissue, names, stream, keyed)

    def tissue(self, tissue):
        """The host tissue arrays, checked, and their voxel shape."""
        return self._sim._tissue(tissue)
