"""Simulator base classes: protocol in the constructor, tissue in ``simulate``.

A played simulator describes one repetition of its sequence (and an optional
preparation) as operators; blochsim packs it into the event stream once per
shape and plays it through the EPG kernels.  Writing a custom sequence::

    import numpy as np
    from blochsim import _memory, Simulator, Excitation, Refocusing, Delay, Dephase, Readout

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

import math

import numpy as np

from blochsim import _core, _dispatch, _memory, _pools, steady
from blochsim import _validate as V
from blochsim.sequence import (EV_INVERSION, Operator, Readout, Traced, _GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RF_DURATION, _GRAD_RF_OFFSET, pack,
                               pack_with_provenance, trace)

# Protocol keywords every played simulator takes.
PLAYED_COMMON = {"states": None, "crusher_dephasing_rad": None, "voxel_size_m": None,
                 "repetitions": 1, "budget_bytes": None, "lineshape": "super-lorentzian", "slice_profile": None}


# repetitions="auto": the most playings tried, and the agreement asked for
_MAX_AUTO_REPETITIONS = 65536
_AUTO_TOLERANCE = 1e-5


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

    def _jacobian_request(self, diff, order, values):
        """The checked names, protocol overrides and tissue of a jacobian call."""
        _check_order(order)
        names = _diff_names(diff, self.tissue_properties, type(self).__name__, "jacobian")
        proto, tissue = self._split(values)
        _check_diff_values(names, tissue)
        return names, proto, tissue

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
    slice_profile : (scales, weights), optional
        A slice profile integrated ahead of time: the effective flip across
        the slice as multiples ``scales`` of the nominal (times B1) with
        their ``weights`` (normalised to sum 1); the signal is the weighted
        average over them.  Needs a simulator modelling B1; host arrays.
    repetitions : int or "auto", optional
        Playings of the repetition; only the last is recorded.  "auto"
        gives the periodic steady state for the tissue of the call: exactly,
        as the fixed point of one playing's map (:mod:`blochsim.steady`),
        when the repetition never winds (no :class:`Dephase`) and the
        tissue has no pools, D or v; otherwise by playing 8, 16, 32, …
        times until the last playing's samples change by less than 1e-5 of
        their largest magnitude between doublings, at most 65536
        (``jacobian_vjp`` always plays).
    lineshape : {"super-lorentzian", "lorentzian", "gaussian", "super-lorentzian-cutoff"}, optional
        Absorption lineshape of the semisolid pool (tissue ``bound_*``),
        through which pulses with a duration saturate it
        (:func:`blochsim.lineshape`).
    budget_bytes : int, optional
        Device memory a call with NumPy inputs and ``device="cuda"`` may use
        (default: most of the free memory); larger problems stream through
        the device in chunks.
    device : {"cpu", "cuda"}, optional
        Force a backend; by default NumPy inputs run on the host.
    threads : int, optional
        Host threads (default: $BLOCHSIM_NUM_THREADS or all usable CPUs).
    **protocol
        The subclass's protocol parameters.

    Notes
    -----
    Every played simulator also models pools (SPEC §3), switched on by
    naming their fractions: a semisolid pool (``bound_fraction``,
    ``bound_exchange`` Hz, ``bound_T1`` ms, default 1000, ``bound_T2`` ms,
    default 0.012) and up to four exchanging pools with transverse states
    (``poolB_fraction``, ``poolB_exchange`` Hz, ``poolB_T1`` and
    ``poolB_T2`` ms, default free water's, ``poolB_shift`` Hz; then
    ``poolC_*``, ``poolD_*``, ``poolE_*``).  Fractions are of the total
    equilibrium magnetisation; free water holds the rest.  Each pool
    exchanges with free water at k·f_other (detailed balance; an absent rate
    is 0).  Pools run on the host and, with NumPy inputs and
    ``device="cuda"``, on the GPU; they do not combine with D or v.
    """

    tissue_properties = ("T1", "T2", "M0", "B1", "B0", "B1phase", "inv_efficiency", "D", "v", "T2prime")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # every played simulator models the pools
        cls.tissue_properties = tuple(cls.tissue_properties) + tuple(
            k for k in _pools.POOL_PROPERTIES if k not in cls.tissue_properties)
    _common = PLAYED_COMMON
    # 0: the host backend; 1 or 4: the device's register path emulated on the
    # host with that many team members (tests of the device templates); with
    # pools, any non-zero value: the device's pooled team of 4 members
    _host_variant = 0

    @classmethod
    def from_pulseq(cls, path, **options):
        """A simulator playing a Pulseq sequence file (versions 1.4 and 1.5).

        Parameters
        ----------
        path : str or os.PathLike
            The ``.seq`` file.
        **options
            ``rf`` ("auto", default: hard pulses where a rotation at the
            centre is exact for the slice-centre spin, the waveform
            otherwise; "hard"; or "shaped": every waveform sample by
            sample), ``dephasing`` ("moment", default: the gradient moments
            between RF and ADC centres as whole numbers of their common
            unit, never rounded; "spoil"; or a callable given each
            :class:`blochsim.pulseq.PulseqBlock` and returning the shifts at
            its end), ``axis``, ``unit``, ``field_strength``,
            ``voxel_size_m`` (the voxel the moments are measured against, 1
            mm unless given), and any :class:`Simulator` option
            (``states``, ``repetitions``, ...).

        Returns
        -------
        blochsim.pulseq.PulseqSimulator
            One sample per ADC event (at its centre).  What is read and the
            limits of the model: :mod:`blochsim.pulseq`.

        Examples
        --------
        >>> import blochsim
        >>> sim = blochsim.Simulator.from_pulseq("gre.seq")          # doctest: +SKIP
        >>> s = sim.simulate(T1=1000.0, T2=80.0)                      # doctest: +SKIP
        """
        from blochsim.pulseq import PulseqSimulator

        return PulseqSimulator(path=path, **options)

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
        if p["slice_profile"] is not None and not isinstance(p["slice_profile"], _SliceProfile):
            p["slice_profile"] = _SliceProfile(p["slice_profile"], self)
        return p

    def _protocol_values(self, overrides):
        values = {**self._defaults, **self._given, **overrides}
        return self.check_protocol(self._common_checks(values))

    def _packed(self, p):
        """The event stream for protocol p, reused while p does not change."""
        if p["repetitions"] == "auto":
            raise ValueError("blochsim internal error: repetitions='auto' reached the packer unresolved")
        key = _protocol_key(p)
        cached = getattr(self, "_stream_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        # the repetition first: it refuses a protocol that lacks what the call needs
        repetition = self.repetition(p)
        s = pack(self.preparation(p), repetition, p["repetitions"])
        self._stream_cache = (key, s)
        return s

    def _stream_for(self, p, present, stream=None):
        """The event stream of protocol p (or ``stream``, packed from it),
        its packed form for the kernels, the states and whether it plays on
        the real path, given the tissue properties present."""
        if ("D" in present or "v" in present) and (p["crusher_dephasing_rad"] is None or p["voxel_size_m"] is None):
            which = "D" if "D" in present else "v"
            raise ValueError(
                f"{which} needs the crusher geometry: pass crusher_dephasing_rad and voxel_size_m "
                f"to {type(self).__name__} (got crusher_dephasing_rad={p['crusher_dephasing_rad']!r}, "
                f"voxel_size_m={p['voxel_size_m']!r})")
        s = self._packed(p) if stream is None else stream
        if "inv_efficiency" in present and not np.any(s.flags & EV_INVERSION):
            self._refuse_idle_inversion()
        states = p["states"] if p["states"] is not None else max(8, 1 + s.total_shifts)
        real, phi0 = s.real_subspace(any(k in present for k in ("B0", "B1phase", "v")))
        dk = voxel = 0.0
        if p["crusher_dephasing_rad"] is not None and p["voxel_size_m"] is not None:
            dk = p["crusher_dephasing_rad"] / p["voxel_size_m"]
            voxel = p["voxel_size_m"]
        return s, _core.PackedStream(s, states, dk, voxel, real, phi0), states, bool(real)

    def _profiled(self, values):
        """The slice profile of a call (None without one) and ``values`` to
        play it: every tissue value given a trailing profile axis, B1 times
        the profile's scales, and no profile."""
        raw = values.get("slice_profile", self._given.get("slice_profile"))
        if raw is None:
            return None, values
        prof = raw if isinstance(raw, _SliceProfile) else _SliceProfile(raw, self)
        out = {"slice_profile": None}
        for k, v in values.items():
            if k == "slice_profile":
                continue
            if k in self.tissue_properties:
                if V.is_device_array(v):
                    raise ValueError(f"slice_profile needs host (NumPy) tissue values; {k} is a device array")
                out[k] = np.asarray(V.tissue_array(k, v))[..., None]
            else:
                out[k] = v
        out["B1"] = out["B1"] * prof.scales if "B1" in out else prof.scales
        return prof, out

    def _profiled_vjp(self, names, prof, values, played):
        """vjp() averaged over a slice profile: the played call's pullback
        of the weighted cotangent, summed back over the profile (B1's
        share times each scale)."""
        s_p, pull = self.vjp(names, **played)  # s_p: (*voxels, P, samples)
        signal = np.tensordot(s_p, prof.weights, axes=([-2], [0])).astype(np.complex64)

        def pullback(cotangent):
            g = _cotangent(cotangent, signal.shape, dtype=np.complex128)
            grads = pull(g[..., None, :] * prof.weights[:, None])
            out = {}
            for k in names:
                if k in self.tissue_properties:
                    gk = grads[k] * (prof.scales if k == "B1" else 1.0)
                    out[k] = _reduce_to(np.sum(gk, axis=-1), np.shape(V.tissue_array(k, values[k])))
                else:
                    out[k] = grads[k]
            return out

        return signal, pullback

    def _t2prime(self, values):
        """The call's T2prime (validated, ms) and ``values`` without it, or
        (None, values) when it has none."""
        if "T2prime" not in values or "T2prime" not in self.tissue_properties:
            return None, values
        on_device = [k for k, v in values.items() if V.is_device_array(v)]
        if on_device:
            raise ValueError(f"T2prime needs host (NumPy) values; {on_device[0]} is a device array")
        t2p = V.tissue_array("T2prime", values["T2prime"])
        V.broadcast_voxels({k: (t2p if k == "T2prime" else np.asarray(v)) for k, v in values.items()
                            if k in self.tissue_properties})
        return t2p, {k: v for k, v in values.items() if k != "T2prime"}

    def _t2prime_factor(self, t2p, values, traced=()):
        """exp(-dephasing / T2prime) per voxel and recorded sample, shape
        (*T2prime.shape, samples), and each sample's Readout.dephasing (ms;
        :class:`Traced` along the protocol names ``traced``)."""
        proto, _ = self._split(values)
        p = self._protocol_values(proto)
        key = (_protocol_key(p), tuple(traced))
        cached = getattr(self, "_dephasing_cache", None)
        if cached is not None and cached[0] == key:
            tau = cached[1]
        else:
            q = dict(p)
            for k in traced:
                q[k] = trace(k, p[k])
            # only the repetition's readouts are recorded (its last playing)
            tau = [op.dephasing for op in self.repetition(q).ops() if isinstance(op, Readout)]
            self._dephasing_cache = (key, tau)
        tau_ms = np.array([float(t) for t in tau], dtype=np.float64)
        return np.exp(-tau_ms / t2p[..., None]), tau

    @staticmethod
    def _t2prime_shape(signal_shape, t2p):
        return np.broadcast_shapes(signal_shape, t2p.shape + signal_shape[-1:])

    def _t2prime_jacobian(self, diff, order, t2p, values):
        """jacobian() with T2prime: the played Jacobian times the factor,
        and d/dT2prime = signal * factor * dephasing / T2prime^2."""
        names = (diff,) if isinstance(diff, str) else tuple(diff)
        _check_order(order)
        other = tuple(k for k in names if k != "T2prime")
        f, tau = self._t2prime_factor(t2p, values)
        tau_ms = np.array([float(t) for t in tau])
        s, J = self.jacobian(other, order, **values) if other else (self.simulate(**values), None)
        shape = self._t2prime_shape(s.shape, t2p)
        cols, i = [], 0
        for k in names:
            if k == "T2prime":
                cols.append(s * f * tau_ms / t2p[..., None] ** 2)
            else:
                cols.append(J[..., i, :] * f)
                i += 1
        J = np.stack([np.broadcast_to(c, shape) for c in cols], axis=-2).astype(np.complex64)
        s = np.broadcast_to(s * f, shape).astype(np.complex64)
        return s, (J[..., 0, :] if isinstance(diff, str) else J)

    def _t2prime_vjp(self, names, t2p, values):
        """vjp() with T2prime: the played pullback of the cotangent times
        the factor, plus the factor's own share through T2prime and through
        the protocol values the samples' dephasing times come from."""
        other = tuple(k for k in names if k != "T2prime")
        protocol = tuple(k for k in other if k not in self.tissue_properties)
        f, tau = self._t2prime_factor(t2p, values, protocol)
        tau_ms = np.array([float(t) for t in tau])
        s, pull = self.vjp(other, **values) if other else (self.simulate(**values), None)
        shape = self._t2prime_shape(s.shape, t2p)
        signal = np.broadcast_to(s * f, shape).astype(np.complex64)

        def pullback(cotangent):
            g = _cotangent(cotangent, signal.shape, dtype=np.complex128)
            out = dict(pull(_reduce_to(g * f, s.shape))) if pull is not None else {}
            w = np.real(np.conj(g) * s * f)  # dL/d(log factor), per voxel and sample
            if "T2prime" in names:
                out["T2prime"] = _reduce_to(np.sum(w * tau_ms / t2p[..., None] ** 2, axis=-1), t2p.shape)
            dtau = -np.sum(w / t2p[..., None], axis=tuple(range(w.ndim - 1)))  # dL/d dephasing_j
            for j, t in enumerate(tau):
                if not isinstance(t, Traced):
                    continue
                for (name, idx, part), c in t.terms.items():
                    a = np.array(out[name])
                    a[idx] += c * dtau[j] * (1.0 if part == 0 else 1j)
                    out[name] = a
            return out

        return signal, pullback

    def _exact(self, values, wrt=()):
        """With repetitions='auto' on a repetition that never winds (no
        Dephase) and a tissue without pools, D or v: the repetition's
        program (protocol names of ``wrt`` traced), the tissue arrays, the
        voxel shape, the protocol and the protocol names; else None."""
        if values.get("repetitions", self._given.get("repetitions", self._defaults.get("repetitions"))) != "auto":
            return None
        if values.get("slice_profile", self._given.get("slice_profile")) is not None:
            return None
        if any(V.is_device_array(v) for v in values.values()):
            return None
        proto, tissue = self._split(values)
        if _pools.any_pool(tissue) or "D" in tissue or "v" in tissue:
            return None
        p = self._protocol_values({**proto, "repetitions": 1})
        ops = self.repetition(p).ops()
        if not steady.never_winds(ops):
            return None
        protocol_names = self._vjp_names(tuple(wrt), p)[0] if wrt else []
        if protocol_names:
            q = dict(p)
            for k in protocol_names:
                q[k] = trace(k, p[k])
            ops = self.repetition(q).ops()
        arrays, shape = self._tissue(tissue)
        prog = steady.program(ops)
        if "inv_efficiency" in arrays and ("inversion",) not in prog:
            self._refuse_idle_inversion()
        return prog, arrays, shape, p, protocol_names

    def _refuse_idle_inversion(self):
        raise TypeError(f"{type(self).__name__} plays no ideal inversion with this protocol, so "
                        f"inv_efficiency would be ignored: leave it out, or choose an ideal inversion")

    def _exact_vjp(self, names, values, exact):
        """vjp() at the exact steady state: the protocol's gradients by the
        periodic adjoint of the order-0 maps, the tissue's by the complex
        step (a pass per name)."""
        prog, arrays, shape, p, protocol_names = exact
        proto, tissue = self._split(values)
        _check_diff_values([k for k in names if k in self.tissue_properties], tissue, "vjp")
        raw = {**self._defaults, **self._given, **proto}
        signal = steady.signal(prog, arrays, shape).astype(np.complex64)

        def pullback(cotangent):
            g = _cotangent(cotangent, signal.shape, dtype=np.complex128)
            entries = steady.protocol_gradients(prog, arrays, shape, g) if protocol_names else {}
            out = {}
            for k in names:
                if k in self.tissue_properties:
                    d = steady.tissue_derivative(prog, arrays, shape, k)
                    out[k] = _reduce_to(np.sum(np.real(np.conj(g) * d), axis=-1), np.shape(arrays[k]))
                    continue
                value = np.asarray(p[k])
                grad = np.zeros(value.shape, dtype=np.complex128 if value.dtype.kind == "c" else np.float64)
                for (name, idx, part), v in entries.items():
                    if name == k:
                        grad[idx] += v if part == 0 else 1j * v
                out[k] = grad if np.ndim(raw[k]) > 0 else grad.sum()
            return out

        return signal, pullback

    def _steady_repetitions(self, values):
        """``values`` with repetitions='auto' (given or the default) replaced
        by the playings that reach the periodic steady state for this call's
        tissue: doubling from 8 until the last playing's samples agree to
        1e-5 of their largest magnitude."""
        if values.get("repetitions", self._given.get("repetitions", self._defaults.get("repetitions"))) != "auto":
            return values
        rest = {k: v for k, v in values.items() if k != "repetitions"}
        if any(V.is_device_array(v) for v in rest.values()):
            raise ValueError("repetitions='auto' needs host (NumPy) tissue values")
        R = 8
        prev = np.asarray(self.simulate(**rest, repetitions=R))
        while R < _MAX_AUTO_REPETITIONS:
            R *= 2
            cur = np.asarray(self.simulate(**rest, repetitions=R))
            scale = float(np.max(np.abs(cur))) if cur.size else 0.0
            if cur.size == 0 or float(np.max(np.abs(cur - prev))) <= _AUTO_TOLERANCE * max(scale, 1e-30):
                return {**values, "repetitions": R}
            prev = cur
        raise ValueError(f"repetitions='auto': {type(self).__name__} did not reach a periodic steady state within "
                         f"{_MAX_AUTO_REPETITIONS} playings (the last doubling changed the samples by "
                         f"{float(np.max(np.abs(cur - prev))):.3g}); give repetitions as a number")

    def jacobian(self, diff, order=1, out=None, **values):
        """Signal and its derivatives with respect to tissue properties, in one
        pass (forward-mode dual numbers in the kernel, SPEC §4).

        Parameters
        ----------
        diff : str or sequence of str
            Tissue properties to differentiate with respect to; each must be
            one this simulator models and be passed in ``values``.
        order : int
            Derivative order; 1 (first derivatives) is what is supported.
        out : tuple of two arrays, complex64, optional
            ``(signal, J)``: C-contiguous arrays shaped as the results, to
            write into and return (NumPy on the host, device arrays on the
            device).  Reusing them across calls (a fit's iterations) saves
            mapping fresh memory at every call.
        **values
            Tissue properties and protocol overrides, as for :meth:`simulate`.

        Returns
        -------
        signal : numpy.ndarray, complex64, shape (*voxels, samples)
        J : numpy.ndarray, complex64
            ``(*voxels, samples)`` for one name, ``(*voxels, len(diff),
            samples)`` for a sequence of names: d signal / d property, per
            the property's public unit (per ms of T1 and T2, per Hz of B0,
            per degree of B1phase, per µm²/ms of D, per m/s of v).
        """
        t2p, values = self._t2prime(values)
        if t2p is not None:
            if out is not None:
                raise ValueError("jacobian with T2prime returns new arrays: out must be None")
            return self._t2prime_jacobian(diff, order, t2p, values)
        exact = self._exact(values)
        if exact is not None:
            if out is not None:
                raise ValueError("jacobian at the exact steady state returns new arrays: out must be None")
            names, _, _ = self._jacobian_request(diff, order, values)
            prog, arrays, shape, _, _ = exact
            sig = steady.signal(prog, arrays, shape).astype(np.complex64)
            J = np.stack([steady.tissue_derivative(prog, arrays, shape, k) for k in names], axis=-2)
            return sig, (J[..., 0, :] if isinstance(diff, str) else J).astype(np.complex64)
        values = self._steady_repetitions(values)
        prof, played = self._profiled(values)
        if prof is not None:
            if out is not None:
                raise ValueError("jacobian with a slice_profile returns new arrays: out must be None")
            names = (diff,) if isinstance(diff, str) else tuple(diff)
            s, J = self.jacobian(tuple(names), order, **played)  # J: (*voxels, P, names, samples)
            # d/dB1 of s(B1 · scale) is scale times the played derivative
            chain = np.stack([prof.scales if k == "B1" else np.ones_like(prof.scales) for k in names], axis=1)
            s = np.tensordot(s, prof.weights, axes=([-2], [0]))
            J = np.einsum("...pns,p,pn->...ns", J, prof.weights, chain)
            J = J.astype(np.complex64)
            return s.astype(np.complex64), (J[..., 0, :] if isinstance(diff, str) else J)
        names, proto, tissue = self._jacobian_request(diff, order, values)
        p = self._protocol_values(proto)
        on_device = [k for k, v in tissue.items() if V.is_device_array(v)]
        one = isinstance(diff, str)
        if out is not None and (not isinstance(out, tuple) or len(out) != 2):
            raise TypeError(f"out must be a tuple (signal, J) of two arrays, got {type(out).__name__}")
        if _pools.any_pool(tissue):
            tissue = _pools.drop_idle(tissue, names, type(self).__name__)
        if _pools.any_pool(tissue) or self._packed(p).driven is not None:
            signal, J = self._pooled(p, tissue, on_device, names, out)
            # (device results come back shaped)
            return out if out is not None else (signal, J[..., 0, :] if one and isinstance(J, np.ndarray) else J)
        device = _dispatch.resolve_device(self.device, on_device[0] if on_device else None)
        if device == "cpu" and on_device:
            raise ValueError(f"device='cpu' was asked for, but {on_device[0]} is a device array")
        fields, scale = _fields_and_scale(names)
        if device == "cuda":
            return self._jacobian_device(p, tissue, on_device, names, fields, scale, one, out)
        arrays, shape = self._tissue(tissue)
        s, ps, _, _ = self._stream_for(p, set(arrays))
        n = int(np.prod(shape, dtype=np.int64))
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        if out is not None:
            for name, a, want in _jacobian_out_shapes(out, shape, len(fields), ps.n_samples, one):
                _check_host_out(name, a, want)
        self._check_memory("jacobian", ps, shape, arrays, "jacobian", fields,
                           outputs=0 if out is not None else 1 + len(fields))
        si = _host_si(arrays, shape)
        signal, J = self._host_jacobian(ps, si, n, shape, fields, scale, threads, out)
        return out if out is not None else (signal, J[..., 0, :] if one else J)

    def _check_memory(self, what, ps, shape, arrays, entry, fields=(), outputs=1, pools=None, host_kernels=True):
        """Refuse (MemoryError, before anything is allocated) a call whose
        host memory does not fit: ``outputs`` complex64 rows of samples per
        voxel, the tissue planes and, with ``host_kernels``, the workspaces
        of the host entry ``entry`` (_core.ENTRIES) with ``fields`` and the
        pool counts ``pools``."""
        n = math.prod(shape)
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        # each property not a scalar: a float64 broadcast copy, its SI values, and the float32 plane
        planes = sum(1 for a in arrays.values() if getattr(a, "size", 1) != 1)
        per = 8.0 * ps.n_samples * outputs + 20.0 * planes
        fixed = 0.0
        if host_kernels and n:
            n_exchanging, bound = pools if pools is not None else (0, False)
            fixed = _core.workspace_bytes(entry, ps, n, threads, list(fields), n_exchanging, bound)
        _memory.check_host(f"{type(self).__name__}.{what}", n, per, fixed,
                           f"the workspace of states={ps.states} on {threads} thread(s)",
                           "lower states (or threads)")

    def _host_jacobian(self, ps, si, n, shape, fields, scale, threads, out=None):
        """Signal (*shape, samples) and Jacobian (*shape, len(fields),
        samples) per public unit on the host, into ``out`` (checked) if
        given."""
        if out is None:
            signal = np.empty(shape + (ps.n_samples,), dtype=np.complex64)
            jac = np.empty((n, len(fields), ps.n_samples), dtype=np.complex64)
        else:
            signal, jac = out
        # seeded with the SI value of one public unit: derivatives per public unit
        _core.jacobian_host(ps, si, n, fields, scale, signal.reshape(n, ps.n_samples),
                            jac.reshape(n, len(fields), ps.n_samples), threads, self._host_variant)
        return signal, jac.reshape(shape + (len(fields), ps.n_samples))

    def _jacobian_device(self, p, tissue, on_device, names, fields, scale, one, out=None):
        """jacobian() on the GPU: device arrays in and out, or NumPy in and out
        (moved through the device whole) with device='cuda'."""
        host_only, ifaces, arrays, shape = _device_inputs(tissue, on_device)
        s, ps, states, real = self._stream_for(p, set(arrays) | set(ifaces))
        limit = _core.cuda_jacobian_max_states(real)
        if states > limit:
            raise ValueError(
                f"states={states} is more than a device Jacobian holds on the {'real' if real else 'complex'} "
                f"path ({limit}); run this Jacobian on the host (NumPy inputs, device='cpu') or lower states")
        want = shape + (s.n_samples,)
        checked = None
        if out is not None:
            checked = _jacobian_out_shapes(out, shape, len(fields), s.n_samples, one)
            for name, a, w in checked:
                if host_only:
                    _check_host_out(name, a, w)
                elif not V.is_device_array(a):
                    raise TypeError(f"{name} must be a device array when tissue properties are device arrays")
        result, J = self._simulate_resident(ps, arrays, ifaces, shape, want,
                                             None if out is None or host_only else out[0],
                                             jacobian=(fields, scale, len(names)),
                                             jac_out=None if out is None or host_only else checked[1])
        if host_only:
            result, J = result.get(), J.get()
            if out is not None:
                np.copyto(out[0], result)
                np.copyto(out[1], J[..., 0, :] if one else J)
                return out
        if out is not None:
            return out
        return result, (J[..., 0, :] if one else J)

    def vjp(self, wrt, **values):
        """Signal and its pullback: reverse-mode gradients of a real loss of
        the signal with respect to protocol parameters and tissue properties
        (an adjoint sweep through the events with checkpointing, SPEC §4).

        Parameters
        ----------
        wrt : str or sequence of str
            Float protocol parameters (e.g. ``flip``, ``phases``, ``TR``,
            ``ESP``, ``TE``, ``TI``) and tissue properties (passed in
            ``values``) to differentiate with respect to.
        **values
            Tissue properties and protocol overrides, as for :meth:`simulate`
            (NumPy arrays: the host backend).

        Returns
        -------
        signal : numpy.ndarray, complex64, shape (*voxels, samples)
        pullback : callable
            ``pullback(cotangent)`` with ``cotangent`` shaped like the signal,
            ``dL/dRe s + i dL/dIm s`` of a real loss L (so L = sum |s|^2 has
            cotangent ``2 * s``), returns a dict mapping each name of ``wrt``
            to dL/d name, float64, shaped like the parameter (a protocol
            parameter as given; a tissue property as passed, summed over the
            voxels it broadcasts to), per public unit (per degree of flip and
            phase, per ms of TR, ESP, TE, TI, T1, T2, per µT of a waveform);
            complex128 dL/dRe + i dL/dIm for a complex protocol parameter
            (a complex RF waveform).  A protocol parameter
            is shared by every voxel, so its gradient sums over them.

        Notes
        -----
        With pools or exact rectangular pulses (:class:`RectPulse`) the
        adjoint runs in double precision one voxel at a time
        (pools_adjoint.hpp), on the host or, with ``device="cuda"`` or
        device-array inputs, on the GPU; the gradient then also reaches the
        duration and offset of every pulse (and every pool property).

        Examples
        --------
        >>> import numpy as np
        >>> from blochsim.simulators import FSESimulator
        >>> fse = FSESimulator(ESP=5.0, flip=np.full(16, 150.0))
        >>> s, pullback = fse.vjp(("flip", "ESP", "T2"), T1=1000.0, T2=np.array([60.0, 90.0]))
        >>> g = pullback(2 * s)          # gradient of sum |s|^2
        >>> g["flip"].shape, g["ESP"].shape, g["T2"].shape
        ((16,), (), (2,))
        """
        names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        t2p, values = self._t2prime(values)
        if t2p is not None:
            return self._t2prime_vjp(names, t2p, values)
        exact = self._exact(values, names)
        if exact is not None:
            return self._exact_vjp(names, values, exact)
        values = self._steady_repetitions(values)
        prof, played = self._profiled(values)
        if prof is not None:
            return self._profiled_vjp(names, prof, values, played)
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        protocol_names, tissue_names = self._vjp_names(names, p)
        _check_diff_values(tissue_names, tissue, "vjp")
        if _pools.any_pool(tissue):
            tissue = _pools.drop_idle(tissue, tissue_names, type(self).__name__)
        device, on_device, stream, prov, pshapes = self._traced_call(p, proto, protocol_names, tissue)
        if _pools.any_pool(tissue) or stream.driven is not None:
            return self._pooled_vjp(p, tissue, on_device, stream, names, tissue_names, prov, pshapes)
        fields, scale = _fields_and_scale(tissue_names)
        if device == "cuda":
            return self._vjp_device(p, tissue, on_device, stream, names, tissue_names, fields, scale, prov, pshapes)
        arrays, shape = self._tissue(tissue)
        s, ps, _, _ = self._stream_for(p, set(arrays), stream)
        n = int(np.prod(shape, dtype=np.int64))
        self._check_memory("vjp", ps, shape, arrays, "adjoint", fields, outputs=2)
        si = _host_si(arrays, shape)
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        signal = np.empty(shape + (s.n_samples,), dtype=np.complex64)
        _core.forward_host(ps, si, n, signal.reshape(n, s.n_samples), threads, self._host_variant)
        tshapes = {k: np.shape(arrays[k]) for k in tissue_names}

        def pullback(cotangent):
            cot = _cotangent(cotangent, signal.shape)
            ev = np.zeros((s.n_events, 4), dtype=np.float64)
            tg = np.zeros((n, len(fields)), dtype=np.float32)
            _core.adjoint_host(ps, si, n, fields, cot.reshape(n, s.n_samples), ev, tg, threads)
            return _assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

        return signal, pullback

    def jacobian_vjp(self, diff, wrt, **values):
        """Signal, tissue Jacobian, and the pullback of a cost of the Jacobian
        to protocol parameters: second order, forward over reverse (the
        adjoint sweep run on dual numbers along each tissue direction), for
        design costs such as Cramér–Rao bounds.

        Parameters
        ----------
        diff : str or sequence of str
            Tissue properties of the Jacobian, as for :meth:`jacobian`.
        wrt : str or sequence of str
            Float protocol parameters to differentiate the cost with respect
            to, as for :meth:`vjp`.
        **values
            Tissue properties and protocol overrides: NumPy arrays run on
            the host; device arrays (or ``device="cuda"``) on the GPU, whose
            Jacobian holds up to 256 states (128 on the complex path).

        Returns
        -------
        signal : numpy.ndarray, complex64, shape (*voxels, samples)
        J : numpy.ndarray, complex64
            As :meth:`jacobian` returns it.
        pullback : callable
            ``pullback(J_cotangent, signal_cotangent=None)``: with the
            cotangent dC/dRe J + i dC/dIm J of a real cost C (shaped like J)
            and optionally a cotangent of the signal for a part of the cost
            that depends on the signal itself, returns a dict of dC/d name
            for the names of ``wrt`` (float64, shaped like the parameter, per
            public unit, summed over the voxels).

        Examples
        --------
        >>> import numpy as np
        >>> from blochsim.optim import CRLBCost
        >>> from blochsim.simulators import FSESimulator
        >>> fse = FSESimulator(ESP=10.0, flip=np.full(8, 150.0))
        >>> s, J, pullback = fse.jacobian_vjp(("M0", "T2"), "flip", T2=80.0, M0=1.0)
        >>> value, WJ = CRLBCost(("M0", "T2"), noise_variance=1e-4, weights={"T2": 1.0})(J)
        >>> pullback(WJ)["flip"].shape
        (8,)
        """
        if "T2prime" in values:
            raise ValueError("jacobian_vjp does not take T2prime: its factor exp(-dephasing/T2prime) is "
                             "per sample, so apply it to J and to the cotangents outside")
        values = self._steady_repetitions(values)
        if self._profiled(values)[0] is not None:
            raise ValueError("jacobian_vjp does not take a slice_profile; average jacobian_vjp over the "
                             "profile's B1 scales instead")
        names, proto, tissue = self._jacobian_request(diff, 1, values)
        wrt_names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        p = self._protocol_values(proto)
        self._refuse_pools(tissue, "jacobian_vjp", p)
        protocol_names, tissue_wrt = self._vjp_names(wrt_names, p)
        if tissue_wrt:
            raise TypeError(f"jacobian_vjp differentiates with respect to protocol parameters; "
                            f"{tissue_wrt[0]!r} is a tissue property")
        device, on_device, stream, prov, pshapes = self._traced_call(p, proto, protocol_names, tissue)
        if device == "cuda":
            return self._jacobian_vjp_device(p, tissue, on_device, stream, names, isinstance(diff, str), wrt_names,
                                             prov, pshapes)
        arrays, shape = self._tissue(tissue)
        s, ps, _, _ = self._stream_for(p, set(arrays), stream)
        n = int(np.prod(shape, dtype=np.int64))
        fields, scale = _fields_and_scale(names)
        self._check_memory("jacobian_vjp", ps, shape, arrays, "adjoint2", fields, outputs=2 + 2 * len(fields))
        si = _host_si(arrays, shape)
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        signal, J = self._host_jacobian(ps, si, n, shape, fields, scale, threads)
        one = isinstance(diff, str)
        J_out = J[..., 0, :] if one else J

        def pullback(J_cotangent, signal_cotangent=None):
            W = _cotangent(J_cotangent, J_out.shape, "the Jacobian's").reshape(n, len(names), s.n_samples)
            ev = np.zeros((s.n_events, 4), dtype=np.float64)
            for j, field in enumerate(fields):
                part = np.zeros_like(ev)
                _core.adjoint2_host(ps, si, n, field, W, j, part, threads)
                ev += scale[j] * part  # J is per public unit of property j
            if signal_cotangent is not None:
                cot = _cotangent(signal_cotangent, signal.shape).reshape(n, s.n_samples)
                part = np.zeros_like(ev)
                _core.adjoint_host(ps, si, n, [], cot, part, np.zeros((n, 0), np.float32), threads)
                ev += part
            return _assemble(wrt_names, p, prov, pshapes, ev, None, None, (), shape, {})

        return signal, J_out, pullback

    def _jacobian_vjp_device(self, p, tissue, on_device, stream, names, one, wrt_names, prov, pshapes):
        """jacobian_vjp() on the GPU: the Jacobian in the inputs' library
        (NumPy for NumPy inputs), the pullback taking a device or NumPy
        Jacobian cotangent and returning NumPy gradients."""
        from blochsim._device import new_output

        host_only, ifaces, arrays, shape = _device_inputs(tissue, on_device)
        s, ps, states, real = self._stream_for(p, set(arrays) | set(ifaces), stream)
        limit = _core.cuda_jacobian_max_states(real)
        if states > limit:
            raise ValueError(
                f"states={states} is more than a device Jacobian holds on the {'real' if real else 'complex'} "
                f"path ({limit}); run jacobian_vjp on the host (NumPy inputs, device='cpu') or lower states")
        n = int(np.prod(shape, dtype=np.int64))
        nd = len(names)
        fields, scale = _fields_and_scale(names)
        # the signal and its Jacobian, their cotangents, the tissue planes
        _check_device_memory(n * (16 * s.n_samples * (1 + nd) + 4 * (len(arrays) + len(ifaces))), n)
        own, cuda_stream = _work_stream([i.stream for i in ifaces.values() if i.stream is not None])
        dev, keep = _resident_tissue(arrays, ifaces, shape, n, own, cuda_stream)
        library = next(iter(ifaces.values())).library if ifaces else "blochsim"
        signal, out_ptr = new_output(shape + (s.n_samples,), library)
        J, jac_ptr = new_output(shape + (nd, s.n_samples), library)
        _core.jacobian_cuda(ps, dev, n, fields, scale, out_ptr, jac_ptr, cuda_stream)
        _core.stream_synchronize(cuda_stream)
        J_shape = shape + ((s.n_samples,) if one else (nd, s.n_samples))

        def upload(c, want, what):
            return _device_cotangent(c, want, what, own if own is not None else cuda_stream, cuda_stream)

        def pullback(J_cotangent, signal_cotangent=None):
            ptr, held = upload(J_cotangent, J_shape, "the Jacobian's")
            ev = np.zeros((s.n_events, 4), dtype=np.float64)
            for j, field in enumerate(fields):
                part = np.zeros_like(ev)
                # direction j's cotangent: row stride nd samples, offset j rows
                _core.adjoint2_cuda(ps, dev, n, field, ptr + 8 * j * s.n_samples, nd * s.n_samples, part,
                                    cuda_stream)
                ev += scale[j] * part
            if signal_cotangent is not None:
                sptr, sheld = upload(signal_cotangent, shape + (s.n_samples,), "the signal's")
                part = np.zeros_like(ev)
                tbuf = _core.DeviceBuffer(8, own if own is not None else cuda_stream)
                _core.adjoint_cuda(ps, dev, n, [], sptr, part, tbuf.ptr, cuda_stream)
                ev += part
                del sheld, tbuf
            del held
            return _assemble(wrt_names, p, prov, pshapes, ev, None, None, (), shape, {})

        pullback._keep = (keep, own, dev)
        J_out = J[..., 0, :] if one else J
        if host_only:
            return signal.get(), (J.get()[..., 0, :] if one else J.get()), pullback
        return signal, J_out, pullback

    def _vjp_device(self, p, tissue, on_device, stream, names, tissue_names, fields, scale, prov, pshapes):
        """vjp() on the GPU: device tissue arrays (or NumPy ones with
        device='cuda', moved to the device).  The signal comes back in the
        inputs' library (NumPy for NumPy inputs); the pullback takes a
        device or NumPy cotangent and returns NumPy gradients."""
        from blochsim._device import new_output

        host_only, ifaces, arrays, shape = _device_inputs(tissue, on_device)
        tshapes = {k: (ifaces[k].shape if k in ifaces else np.shape(arrays[k])) for k in tissue_names}
        s, ps, _, _ = self._stream_for(p, set(arrays) | set(ifaces), stream)
        n = int(np.prod(shape, dtype=np.int64))
        want = shape + (s.n_samples,)
        # the signal and its cotangent, the tissue planes and the tissue gradient
        _check_device_memory(n * (16 * s.n_samples + 4 * (len(arrays) + len(ifaces)) + 4 * len(fields)), n)
        own, cuda_stream = _work_stream([i.stream for i in ifaces.values() if i.stream is not None])
        dev, keep = _resident_tissue(arrays, ifaces, shape, n, own, cuda_stream)
        library = next(iter(ifaces.values())).library if ifaces else "blochsim"
        signal, out_ptr = new_output(want, library)
        _core.forward_cuda(ps, dev, n, out_ptr, cuda_stream)
        _core.stream_synchronize(cuda_stream)

        def pullback(cotangent):
            order = own if own is not None else cuda_stream
            cot_ptr, cot_keep = _device_cotangent(cotangent, want, "the signal's", order, cuda_stream)
            ev = np.zeros((s.n_events, 4), dtype=np.float64)
            tg = np.zeros((n, len(fields)), dtype=np.float32)
            tbuf = _core.DeviceBuffer(max(tg.nbytes, 8), order)
            _core.adjoint_cuda(ps, dev, n, fields, cot_ptr, ev, tbuf.ptr, cuda_stream)
            if tg.size:
                _core.copy_to_host(tg.reshape(-1).view(np.uint8), tbuf.ptr, cuda_stream)
            _core.stream_synchronize(cuda_stream)
            del cot_keep, tbuf
            return _assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

        pullback._keep = (keep, own, dev)
        return (signal.get() if host_only else signal), pullback

    def _traced_call(self, p, proto, protocol_names, tissue):
        """What vjp and jacobian_vjp share: the backend, the device arrays
        among the tissue, the stream packed from a protocol traced in
        protocol_names with its provenance, and each protocol gradient's
        shape (a scalar as given stays a scalar)."""
        on_device = [k for k, v in tissue.items() if V.is_device_array(v)]
        device = _dispatch.resolve_device(self.device, on_device[0] if on_device else None)
        if device == "cpu" and on_device:
            raise ValueError(f"device='cpu' was asked for, but {on_device[0]} is a device array")
        raw = {**self._defaults, **self._given, **proto}
        traced = dict(p)
        for k in protocol_names:
            traced[k] = trace(k, p[k])
        if p["repetitions"] == "auto":
            raise ValueError("blochsim internal error: repetitions='auto' reached the packer unresolved")
        stream, prov = pack_with_provenance(self.preparation(traced), self.repetition(traced), p["repetitions"])
        pshapes = {k: (np.shape(p[k]) if np.ndim(raw[k]) > 0 else ()) for k in protocol_names}
        return device, on_device, stream, prov, pshapes

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

    def stream(self, **protocol):
        """The packed event stream of one call with these protocol overrides."""
        self._check_names(protocol)
        p = self._protocol_values(protocol)
        if p["repetitions"] == "auto":
            raise ValueError("stream() needs repetitions as a number: 'auto' depends on the tissue")
        return pack(self.preparation(p), self.repetition(p), p["repetitions"]), p

    def simulate(self, out=None, **values):
        """Simulate the signal.

        NumPy inputs run on the host (or, with ``device="cuda"``, stream
        through the GPU in chunks of at most ``budget_bytes`` and come back as
        NumPy).  Inputs exposing ``__cuda_array_interface__`` (CuPy, PyTorch,
        Numba, ...) run on the GPU and the result is a device array of the
        same library (a :class:`blochsim.DeviceArray` when it cannot be
        told); host inputs mixed with them are moved to the device.  A
        ``stream`` in the interface orders the work on that stream; without
        one the result is synchronised.

        Parameters
        ----------
        out : array, complex64, shape (*voxels, samples), optional
            C-contiguous array to write into and return (NumPy on the host,
            a device array on the device).
        **values
            Tissue properties (public units; each a float or an array, all
            broadcast to one voxel shape) and protocol overrides for this
            call.

        Returns
        -------
        array, complex64, shape (*voxels, samples)
        """
        t2p, values = self._t2prime(values)
        if t2p is not None:
            f, _ = self._t2prime_factor(t2p, values)
            return _into(out, self.simulate(**values) * f)
        exact = self._exact(values)
        if exact is not None:
            prog, arrays, shape, _, _ = exact
            return _into(out, steady.signal(prog, arrays, shape))
        values = self._steady_repetitions(values)
        prof, played = self._profiled(values)
        if prof is not None:
            return _into(out, np.tensordot(self.simulate(**played), prof.weights, axes=([-2], [0])))
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        on_device = [k for k, v in tissue.items() if V.is_device_array(v)]
        out_on_device = out is not None and V.is_device_array(out)
        if _pools.any_pool(tissue):
            tissue = _pools.drop_idle(tissue, (), type(self).__name__)
        if _pools.any_pool(tissue) or self._packed(p).driven is not None:
            return self._pooled(p, tissue, on_device + (["out"] if out_on_device else []), (), out)[0]
        device = _dispatch.resolve_device(self.device, on_device[0] if on_device else
                                          ("out" if out_on_device else None))
        if device == "cpu" and (on_device or out_on_device):
            which = on_device[0] if on_device else "out"
            raise ValueError(f"device='cpu' was asked for, but {which} is a device array")
        if device == "cpu":
            arrays, shape = self._tissue(tissue)
            ifaces = {}
        else:
            from blochsim._device import Interface

            arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in on_device}
            ifaces = {k: Interface(k, tissue[k]) for k in on_device}
            shapes = {**{k: a for k, a in arrays.items()}, **{k: _Shaped(i.shape) for k, i in ifaces.items()}}
            shape = V.broadcast_voxels(shapes) if shapes else ()
        s, ps, _, _ = self._stream_for(p, set(arrays) | set(ifaces))
        n = int(np.prod(shape, dtype=np.int64))
        want = shape + (s.n_samples,)
        if device == "cuda" and (ifaces or out_on_device):
            return self._simulate_resident(ps, arrays, ifaces, shape, want, out)
        if out is not None:
            _check_host_out("out", out, want)
        self._check_memory("simulate", ps, shape, arrays, "forward", outputs=0 if out is not None else 1,
                           host_kernels=device == "cpu")
        si = _host_si(arrays, shape)
        if out is None:
            out = np.empty(want, dtype=np.complex64)
        flat = out.reshape(n, s.n_samples)
        if device == "cuda":
            _core.forward_cuda_streamed(ps, si, n, flat, p["budget_bytes"] or 0)
        else:
            threads = self.threads if self.threads is not None else _dispatch.default_threads()
            _core.forward_host(ps, si, n, flat, threads, self._host_variant)
        return out

    def _pooled_vjp(self, p, tissue, on_device, stream, names, tissue_names, prov, pshapes):
        """vjp() with pools or exact rectangular pulses: the signal as
        simulate() computes it, the adjoint in double precision
        (pools_adjoint.hpp), on the GPU with device='cuda' or device-array
        inputs (moved through the host; the cotangent may be a device array,
        the gradients are NumPy)."""
        tissue, gpu, library, _ = self._pooled_backend(tissue, on_device)
        owner = type(self).__name__
        n_exchanging, bound = _pools.configuration(tissue, owner)
        arrays, shape = self._tissue(tissue)
        s, ps, _, _ = self._stream_for(p, set(arrays), stream)
        n = int(np.prod(shape, dtype=np.int64))
        fields = [_pools.field_index(k) for k in tissue_names]
        self._check_memory("vjp", ps, shape, arrays, "pooled_adjoint", fields, outputs=2,
                           pools=(n_exchanging, bound), host_kernels=not gpu)
        signal = self._pooled(p, tissue, (), (), None, gpu)[0]
        scale = np.array([V.TISSUE_UNITS[k][0] for k in tissue_names])
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        tshapes = {k: np.shape(arrays[k]) for k in tissue_names}
        si, planes = _host_si(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS)
        lineshape = _pools.LINESHAPES.index(p["lineshape"])
        # the event parameters the protocol names reach, as bits of the
        # adjoint's directions (pools_adjoint.hpp EventSeeds order; the
        # receiver phase costs nothing)
        columns = set()
        for k in names:
            if k in prov:
                columns.update(int(c) for c in prov[k][1])
        directions = (_GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RF_DURATION, _GRAD_RF_OFFSET)
        mask = sum(1 << d for d, c in enumerate(directions) if c in columns)

        def pullback(cotangent):
            if V.is_device_array(cotangent):
                from blochsim._device import to_host

                cotangent = to_host("cotangent", cotangent, allow_complex64=True)
            cot = _cotangent(cotangent, signal.shape)
            ev = np.zeros((s.n_events, 6), dtype=np.float64)
            tg = np.zeros((n, len(fields)), dtype=np.float32)
            _core.pooled_adjoint(ps, si, planes, n_exchanging, bound, lineshape, n, fields,
                                 cot.reshape(n, s.n_samples), ev, tg, threads, mask, gpu)
            return _assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

        if library is not None:
            from blochsim._device import from_host

            return from_host(signal, library), pullback
        return signal, pullback

    def _refuse_pools(self, tissue, what, p=None):
        if _pools.any_pool(tissue) or (p is not None and self._packed(p).driven is not None):
            raise ValueError(f"{type(self).__name__}.{what}: second order is not available with pools or exact "
                             f"rectangular pulses (RectPulse); the tissue Jacobian (jacobian) and reverse mode "
                             f"(vjp) are")

    def _pooled_backend(self, tissue, on_device, out=None):
        """Where a pooled call runs: (tissue with device arrays copied to the
        host, gpu, library of the device inputs or None, device outputs).
        The pooled Jacobian and adjoint take host arrays: their device-array
        inputs (and outputs) are moved through the host and run on the GPU."""
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
        device_out = any(V.is_device_array(o) for o in outs)
        on_device = [k for k in on_device if k != "out"]
        if not on_device and not device_out:
            return tissue, _dispatch.resolve_device(self.device) == "cuda", None, False
        device = _dispatch.resolve_device(self.device, on_device[0] if on_device else "out")
        if device == "cpu":
            raise ValueError(f"device='cpu' was asked for, but {on_device[0] if on_device else 'out'} is a "
                             f"device array")
        from blochsim._device import Interface, to_host

        library = Interface(on_device[0], tissue[on_device[0]]).library if on_device else None
        staged = {k: (to_host(k, v) if k in on_device else v) for k, v in tissue.items()}
        return staged, True, library, device_out

    def _pooled(self, p, tissue, on_device, names, out, gpu=None):
        """simulate() or jacobian() with pools or exact rectangular pulses:
        (signal, J), J (*voxels, len(names), samples) or None without names.
        NumPy in and out (on the GPU with device='cuda'); the signal of device
        arrays is computed on the device (_pooled_resident), their Jacobian
        is moved through the host and comes back as device arrays."""
        owner = type(self).__name__
        if not names and gpu is None and (on_device or V.is_device_array(out)):
            return self._pooled_resident(p, tissue, on_device, out), None
        tissue, use_gpu, library, device_out = self._pooled_backend(tissue, on_device, out)
        if library is not None and out is not None and not device_out:
            raise TypeError("out must be a device array when tissue properties are device arrays")
        gpu = use_gpu if gpu is None else gpu
        host_out = None if device_out else out
        if device_out or library is not None:
            signal, J = self._pooled(p, tissue, (), names, host_out, gpu)
            return _device_results(signal, J, out if device_out else None, library, names)
        out = host_out
        n_exchanging, bound = _pools.configuration(tissue, owner)
        # the fractions were checked by drop_idle()
        arrays, shape = self._tissue(tissue)
        s, ps, _, _ = self._stream_for(p, set(arrays))
        n = int(np.prod(shape, dtype=np.int64))
        ns = s.n_samples
        want = shape + (ns,)
        signal = jac = None
        if out is not None:
            if names:
                for name, a, w in _jacobian_out_shapes(out, shape, len(names), ns, len(names) == 1):
                    _check_host_out(name, a, w)
                signal, jac = out[0], out[1].reshape(n, len(names), ns)
            else:
                _check_host_out("out", out, want)
                signal = out
        fields = [_pools.field_index(k) for k in names]
        self._check_memory("jacobian" if names else "simulate", ps, shape, arrays, "pooled", fields,
                           outputs=0 if out is not None else 1 + len(names), pools=(n_exchanging, bound),
                           host_kernels=not gpu)
        if signal is None:
            signal = np.empty(want, dtype=np.complex64)
        if names and jac is None:
            jac = np.empty((n, len(names), ns), dtype=np.complex64)
        # seeded with the SI value of one public unit: derivatives per public unit
        seeds = [float(V.TISSUE_UNITS[k][0]) for k in names]
        threads = self.threads if self.threads is not None else _dispatch.default_threads()
        _core.pooled(ps, _host_si(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS), n_exchanging,
                     bound, _pools.LINESHAPES.index(p["lineshape"]), n, fields, seeds, signal.reshape(n, ns), jac,
                     threads, gpu, bool(self._host_variant) and not names and not gpu)
        return signal, (jac.reshape(shape + (len(names), ns)) if names else None)

    def _pooled_resident(self, p, tissue, on_device, out):
        """simulate() with pools for device-array inputs or output: the
        pooled kernels read the device arrays and write a device result.  The
        pool properties were copied to the host and checked there by
        drop_idle() (fractions and their sum); the tissue properties are
        checked on the device."""
        on_device = [k for k in on_device if k != "out"]
        device = _dispatch.resolve_device(self.device, on_device[0] if on_device else "out")
        if device == "cpu":
            raise ValueError(f"device='cpu' was asked for, but {on_device[0] if on_device else 'out'} is a "
                             f"device array")
        from blochsim._device import Interface

        n_exchanging, bound = _pools.configuration(tissue, type(self).__name__)
        arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in on_device}
        ifaces = {k: Interface(k, tissue[k]) for k in on_device}
        shapes = {**arrays, **{k: _Shaped(i.shape) for k, i in ifaces.items()}}
        shape = V.broadcast_voxels(shapes) if shapes else ()
        s, ps, _, _ = self._stream_for(p, set(arrays) | set(ifaces))
        return self._simulate_resident(ps, arrays, ifaces, shape, shape + (s.n_samples,), out,
                                       pools=(n_exchanging, bound, _pools.LINESHAPES.index(p["lineshape"])))

    def _simulate_resident(self, ps, arrays, ifaces, shape, want, out, jacobian=None, jac_out=None, pools=None):
        """The device path for device-array inputs (results stay on the device).
        With ``jacobian`` = (fields, scale, count) it returns (signal, J), J
        into ``jac_out`` = (name, device array, shape) if given.  With
        ``pools`` = (n_exchanging, bound, lineshape index) the pooled
        kernels play it."""
        from blochsim._device import Interface, new_output

        n = int(np.prod(shape, dtype=np.int64))
        streams = [i.stream for i in ifaces.values() if i.stream is not None]
        out_iface = None
        if out is not None:
            if not V.is_device_array(out):
                raise TypeError("out must be a device array when tissue properties are device arrays")
            out_iface = Interface("out", out, allow_complex64=True)
            if out_iface.dtype != np.complex64 or out_iface.shape != want:
                raise ValueError(f"out must be a C-contiguous complex64 device array of shape {want}, "
                                 f"got shape {out_iface.shape}")
            if out_iface.stream is not None:
                streams.append(out_iface.stream)
        jac_iface = None
        if jac_out is not None:
            name, a, w = jac_out
            jac_iface = Interface(name, a, allow_complex64=True)
            if jac_iface.dtype != np.complex64 or jac_iface.shape != w:
                raise ValueError(f"{name} must be a C-contiguous complex64 device array of shape {w}, "
                                 f"got shape {jac_iface.shape}")
            if jac_iface.stream is not None:
                streams.append(jac_iface.stream)
        # memory: the outputs plus one float32 plane per property
        need = (0 if out is not None else n * ps.n_samples * 8) + 4 * n * (len(arrays) + len(ifaces))
        if jacobian is not None and jac_out is None:
            need += n * ps.n_samples * 8 * jacobian[2]
        _check_device_memory(need, n)
        own, stream = _work_stream(streams)
        dev, keep = _resident_tissue(arrays, ifaces, shape, n, own, stream)
        library = next(iter(ifaces.values())).library if ifaces else "blochsim"
        if out_iface is not None:
            result, out_ptr = out, out_iface.ptr
        else:
            result, out_ptr = new_output(want, library)
        if jacobian is not None:
            fields, scale, count = jacobian
            # seeded with the SI value of one public unit: derivatives per
            # public unit
            if jac_iface is not None:
                jac, jac_ptr = jac_out[1], jac_iface.ptr
            else:
                jac, jac_ptr = new_output(shape + (count, want[-1]), library)
            _core.jacobian_cuda(ps, tuple(dev), n, fields, scale, out_ptr, jac_ptr, stream)
            _core.stream_synchronize(stream)
            return result, jac
        if pools is not None:
            planes, keep_pools = _resident_tissue(arrays, ifaces, shape, n, own, stream, _core.POOL_FIELDS)
            _core.pooled_cuda(ps, tuple(dev), tuple(planes), *pools, n, out_ptr, stream)
            return result
        _core.forward_cuda(ps, tuple(dev), n, out_ptr, stream)
        # The work is ordered after the producer's on its stream (if it gave
        # one); waiting for it hands back a result any stream may read.
        _core.stream_synchronize(stream)
        return result


def _check_device_memory(need, n):
    """Refuse (MemoryError) a device call needing ``need`` bytes for ``n``
    voxels when the device has less free, with a chunk size that fits."""
    free, total = _core.memory_info()
    if need > free:
        per = max(1, need // max(n, 1))
        raise MemoryError(
            f"this call needs {need / 2**30:.2f} GiB of device memory and {free / 2**30:.2f} GiB of "
            f"{total / 2**30:.2f} GiB are free; simulate at most about {max(free // per, 1):,} voxels "
            f"per call (chunk the first axis), or pass NumPy arrays with device='cuda', which stream "
            f"through the device in chunks of budget_bytes")


def _device_results(signal, J, out, library, names):
    """A pooled call's host results as device arrays: copied into the
    device ``out`` (an array, or a (signal, J) pair) when given, else new
    arrays of ``library``."""
    from blochsim._device import Interface, from_host

    one = len(names) == 1
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


def _jacobian_out_shapes(out, shape, count, samples, one):
    """(name, array, wanted shape) of a Jacobian's ``out`` pair."""
    return [("out[0]", out[0], shape + (samples,)),
            ("out[1]", out[1], shape + ((samples,) if one else (count, samples)))]


def _into(out, s):
    """s as complex64, written into ``out`` when one is given (and checked)."""
    s = np.asarray(s).astype(np.complex64)
    if out is None:
        return s
    _check_host_out("out", out, s.shape)
    out[...] = s
    return out


def _check_host_out(name, a, want):
    """Refuses a host output that is not a writeable C-contiguous complex64
    NumPy array of shape ``want``."""
    if not isinstance(a, np.ndarray) or a.dtype != np.complex64 or a.shape != want \
            or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError(
            f"{name} must be a writeable C-contiguous complex64 array of shape {want}, got "
            f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")


def _device_inputs(tissue, on_device):
    """Tissue for a device call: (host_only, device-array interfaces, host
    arrays, voxel shape); with no device array (device='cuda' on NumPy
    inputs) every property is copied to the device first."""
    from blochsim._device import DeviceArray, Interface

    host_only = not on_device
    if host_only:
        tissue = {k: DeviceArray.from_numpy(np.ascontiguousarray(V.tissue_array(k, v), np.float32))
                  for k, v in tissue.items()}
    ifaces = {k: Interface(k, v) for k, v in tissue.items() if V.is_device_array(v)}
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in ifaces}
    shapes = {**arrays, **{k: _Shaped(i.shape) for k, i in ifaces.items()}}
    return host_only, ifaces, arrays, (V.broadcast_voxels(shapes) if shapes else ())


def _work_stream(streams):
    """The stream a device call runs on: the first producer's, else a new
    blochsim stream (returned as its owner, to be kept alive)."""
    if streams:
        return None, int(streams[0])
    own = _core.CudaStream()
    return own, own.handle


def _resident_tissue(arrays, ifaces, shape, n, own, stream, fields=None):
    """Device float32 SI planes of the tissue in the order of the SI names
    ``fields`` (default TISSUE_FIELDS), as (pointer, stride) or None, and
    the buffers that hold them."""
    # temporaries are allocated and freed in the stream's order; each holds
    # the stream blochsim made, so it outlives them
    order = own if own is not None else stream
    keep = []
    dev = []
    for field in (_core.TISSUE_FIELDS if fields is None else fields):
        name = _SI_TO_PUBLIC.get(field)
        factor = V.TISSUE_UNITS[name][0] if name else 1.0
        if name in ifaces:
            it = ifaces[name]
            size = int(np.prod(it.shape, dtype=np.int64))
            count = 1 if size == 1 else n
            buf = _core.DeviceBuffer(4 * count, order)
            if count == 1:
                _core.expand_to_float(it.ptr, it.is_f64, (1,), (0,), factor, buf.ptr, 1, stream)
            else:
                _core.expand_to_float(it.ptr, it.is_f64, tuple(shape), _broadcast_strides(it.shape, shape),
                                      factor, buf.ptr, n, stream)
            _check_device_values(name, buf.ptr, count, shape if count > 1 else (), factor, stream)
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
    return tuple(dev), keep


def _diff_names(diff, modelled, owner, what):
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


def _device_cotangent(c, want, what, order, stream):
    """A pullback's cotangent on the device: a complex64 device array of
    shape ``want`` as it is, or a NumPy one copied to a new buffer (ordered
    on ``order``); returns (pointer, the object that holds the memory)."""
    from blochsim._device import Interface

    if V.is_device_array(c):
        it = Interface("cotangent", c, allow_complex64=True)
        if it.dtype != np.complex64 or it.shape != want:
            raise ValueError(f"cotangent must be a C-contiguous complex64 device array of {what} shape {want}, "
                             f"got {it.dtype} {it.shape}")
        return it.ptr, it
    host = _cotangent(c, want, what)
    buf = _core.DeviceBuffer(max(host.nbytes, 8), order)
    _core.copy_to_device(buf.ptr, host.reshape(-1).view(np.uint8), stream)
    return buf.ptr, buf


def _fields_and_scale(names):
    """The kernels' tissue field of each name and the SI value of one of its
    public units (a derivative per SI unit times it is per public unit)."""
    return ([_core.TISSUE_FIELDS.index(V.TISSUE_UNITS[k][1]) for k in names],
            np.array([V.TISSUE_UNITS[k][0] for k in names]))


def _cotangent(cotangent, shape, of="the signal's", dtype=np.complex64):
    """A pullback's cotangent as a C-contiguous complex array (complex64 by
    default) of the signal's shape (or the Jacobian's: ``of``)."""
    c = np.asarray(cotangent)
    if c.dtype.kind not in "fc":
        raise TypeError(f"cotangent must be a float or complex array, got dtype {c.dtype}")
    if c.shape != tuple(shape):
        raise ValueError(f"cotangent must have {of} shape {tuple(shape)}, got {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError("cotangent must be finite")
    return np.ascontiguousarray(c, dtype=dtype)


def _reduce_to(g, shape):
    """Sum g over the axes it was broadcast along from ``shape``."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a == 1 and b != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes):
    """The pullback's dict from the adjoint's per-event and per-voxel
    gradients: protocol entries through their provenance, tissue per public
    unit reduced to each property's shape."""
    out = {}
    if ev.shape[1] < 6:  # the single-pool adjoint has no pulse duration or offset columns
        ev = np.concatenate([ev, np.zeros((ev.shape[0], 6 - ev.shape[1]))], axis=1)
    for k in names:
        if k in tshapes:
            j = tissue_names.index(k)
            g = (tg[:, j].astype(np.float64) * scale[j]).reshape(shape)
            out[k] = _reduce_to(g, tshapes[k])
            continue
        full = np.shape(p[k])
        cplx = np.iscomplexobj(p[k])
        g = np.zeros(full, dtype=np.complex128 if cplx else np.float64)
        if k in prov:
            event, column, index, part, coef = prov[k]
            contrib = coef * ev[event, column]
            flat = np.zeros(len(contrib), np.int64) if full == () else \
                np.ravel_multi_index(tuple(np.array(index).T), full)
            size = max(int(np.prod(full)), 1)
            # a complex entry's gradient is dL/dRe + i dL/dIm (SPEC §4)
            g = np.bincount(flat, weights=np.where(part == 0, contrib, 0.0), minlength=size)
            if cplx:
                g = g + 1j * np.bincount(flat, weights=np.where(part == 1, contrib, 0.0), minlength=size)
            g = g.reshape(full)
        out[k] = g.sum().reshape(()) if pshapes[k] == () and g.shape != () else g
    return out


def _check_order(order):
    """jacobian computes first derivatives only."""
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order != 1:
        raise ValueError(f"jacobian computes first derivatives (order=1), got order={order!r}; the "
                         f"derivative of a cost of the Jacobian is jacobian_vjp")


def _check_diff_values(names, tissue, what="jacobian"):
    """Each property differentiated must be passed, as a float."""
    for name in names:
        if name not in tissue:
            raise ValueError(f"{what} with respect to {name!r} needs {name} passed as a tissue value")
        v = tissue[name]
        if isinstance(v, (int, float)) or V.is_device_array(v):
            continue
        if np.asarray(v).dtype.kind != "f":
            raise TypeError(f"{name} must be a float array to differentiate, got dtype {np.asarray(v).dtype}")


class _Shaped:
    """Stands in for an array in shape broadcasting."""

    def __init__(self, shape):
        self.shape = tuple(shape)


def _host_si(arrays, shape):
    """Tissue arrays as float32 SI values (length n or 1) in TISSUE_FIELDS order."""
    return V.si_planes(arrays, shape, _core.TISSUE_FIELDS)


def _broadcast_strides(src_shape, shape):
    """Element strides of a C-contiguous array of src_shape broadcast to shape."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(1, len(src_shape) + 1):
        size = src_shape[-i]
        strides[-i] = 0 if size == 1 else acc
        acc *= size
    return tuple(strides)


def _check_device_values(name, ptr, count, shape, factor, stream):
    """The device-side version of the host checks: finite and within bounds."""
    _, _, low, strict = V.TISSUE_UNITS[name]
    idx, value = _core.first_bad_value(ptr, count, low is not None, float(low or 0.0), bool(strict), stream)
    if idx < 0:
        return
    where = tuple(int(i) for i in np.unravel_index(idx, shape)) if shape else ()
    v = float(f"{value / factor:.7g}")  # the float32 value, back in public units
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v!r} at index {where}")
    op = ">" if strict else ">="
    unit = V.UNIT_NAMES[name]
    raise ValueError(f"{name} must be {op} {low:g}{' ' + unit if unit else ''}, got {v!r} at index {where}")


_SI_TO_PUBLIC = {v[1]: k for k, v in V.TISSUE_UNITS.items()}


def _protocol_key(p):
    """A hashable snapshot of a protocol dict (arrays by value)."""
    def snap(v):
        if isinstance(v, np.ndarray):
            return (v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, (tuple, list)):
            return (type(v).__name__,) + tuple(snap(x) for x in v)
        if isinstance(v, Operator):  # a pulse given as protocol: its operators, not its short repr
            return tuple(repr(o) for o in v.ops())
        return repr(v)

    return tuple((k, snap(p[k])) for k in sorted(p))


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
        p, t, shape, ctype = self._evaluation(proto, tissue)
        out = self.signal(p, t)
        out = np.broadcast_to(out, shape + (np.shape(out)[-1],))
        return np.ascontiguousarray(out, dtype=ctype)

    def _evaluation(self, proto, tissue):
        """Protocol, tissue as float64 with a trailing sample axis, voxel
        shape and output dtype of a call."""
        p = self._protocol_values(proto)
        arrays, shape = self._tissue(tissue)
        dtype = np.result_type(*arrays.values(), np.float32) if arrays else np.float64
        ctype = np.complex128 if dtype == np.float64 else np.complex64
        t = {k: np.asarray(a, dtype=np.float64)[..., None] for k, a in arrays.items()}
        return p, t, shape, ctype

    def protocol_derivatives(self, p: dict, t: dict, names: tuple, s) -> dict:
        """Analytic derivatives of :meth:`signal` at M0 = 1 with respect to
        the protocol parameters ``names`` (per public unit), each broadcast
        like the signal: sample c's derivative with respect to contrast c's
        value of the parameter."""
        raise NotImplementedError(f"{type(self).__name__} defines no protocol derivatives")

    def vjp(self, wrt, **values):
        """Signal and its pullback, from the analytic derivatives (see
        :meth:`blochsim.Simulator.vjp` for the conventions).

        Parameters
        ----------
        wrt : str or sequence of str
            Protocol parameters and tissue properties (passed in
            ``values``) to differentiate with respect to.
        **values
            Tissue properties and protocol overrides, as for :meth:`simulate`.

        Returns
        -------
        signal : numpy.ndarray, complex, shape (*voxels, samples)
        pullback : callable
            ``pullback(cotangent)`` -> dict of dL/d name, float64, shaped
            like each parameter (a protocol parameter as given, summed over
            the voxels and, for a scalar, over the contrasts; a tissue
            property as passed), per public unit.
        """
        names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        if not names:
            raise ValueError("vjp needs at least one name in wrt")
        proto, tissue = self._split(values)
        p, t, shape, ctype = self._evaluation(proto, tissue)
        tissue_names, proto_names = [], []
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"wrt names parameters by str, got {k!r}")
            if k in self.tissue_properties:
                tissue_names.append(k)
            elif k in self._defaults and isinstance(p.get(k), (float, np.floating, np.ndarray)) \
                    and np.asarray(p[k]).dtype.kind == "f":
                proto_names.append(k)
            else:
                raise TypeError(f"{type(self).__name__} cannot differentiate with respect to {k!r}: its float "
                                f"protocol is {sorted(self._defaults)} and it models {list(self.tissue_properties)}")
        if len(set(names)) != len(names):
            raise ValueError(f"wrt names a parameter twice: {list(names)}")
        _check_diff_values(tissue_names, tissue, "vjp")
        tshapes = {k: np.shape(V.tissue_array(k, tissue[k])) for k in tissue_names}
        m0 = t.pop("M0", 1.0)
        unit = self.signal(p, t)
        samples = np.shape(unit)[-1]
        dt = self.derivatives(p, t, tuple(k for k in tissue_names if k != "M0"), unit)
        dt["M0"] = unit
        dp = self.protocol_derivatives(p, t, tuple(proto_names), unit) if proto_names else {}
        signal = np.ascontiguousarray(np.broadcast_to(m0 * unit, shape + (samples,)), dtype=ctype)

        def pullback(cotangent):
            g = _cotangent(cotangent, signal.shape, dtype=np.complex128)
            out = {}
            for k in names:
                d = dt[k] if k == "M0" else m0 * (dt[k] if k in dt else dp[k])
                prod = np.real(np.conj(g) * np.broadcast_to(d, signal.shape))
                if k in tshapes:
                    out[k] = _reduce_to(prod.sum(axis=-1), tshapes[k])
                else:
                    per_contrast = prod.reshape(-1, samples).sum(axis=0)
                    out[k] = _reduce_to(per_contrast, np.shape(p[k]))
            return out

        return signal, pullback

    def derivatives(self, p: dict, t: dict, names: tuple, s) -> dict:
        """Analytic derivatives of :meth:`signal` with respect to the tissue
        properties ``names`` (public units, broadcast like the signal), given
        the signal ``s`` at (p, t).  M0 is never among them and never in t:
        it scales every closed form, and :meth:`jacobian` applies it."""
        raise NotImplementedError(f"{type(self).__name__} defines no analytic derivatives")

    def jacobian(self, diff, order=1, **values):
        """Signal and its analytic derivatives with respect to tissue
        properties.

        Parameters
        ----------
        diff : str or sequence of str
            Tissue properties to differentiate with respect to; each must be
            one this simulator models and be passed in ``values``.
        order : int
            Derivative order; 1 (first derivatives) is what is supported.
        **values
            Tissue properties and protocol overrides, as for :meth:`simulate`.

        Returns
        -------
        signal : numpy.ndarray, complex, shape (*voxels, samples)
        J : numpy.ndarray, complex
            ``(*voxels, samples)`` for one name, ``(*voxels, len(diff),
            samples)`` for a sequence of names, per the property's public
            unit; complex128 for float64 inputs, else complex64.
        """
        names, proto, tissue = self._jacobian_request(diff, order, values)
        p, t, shape, ctype = self._evaluation(proto, tissue)
        # the signal is M0 times that at M0 = 1: d/dM0 is the latter (also
        # where M0 = 0), and the other derivatives scale by M0
        m0 = t.pop("M0", 1.0)
        unit = self.signal(p, t)
        d = self.derivatives(p, t, tuple(k for k in names if k != "M0"), unit)
        d["M0"] = unit
        samples = np.shape(unit)[-1]
        out = np.ascontiguousarray(np.broadcast_to(m0 * unit, shape + (samples,)), dtype=ctype)
        J = np.stack([np.broadcast_to(d[k] if k == "M0" else m0 * d[k], shape + (samples,)) for k in names],
                     -2).astype(ctype)
        return out, (J[..., 0, :] if isinstance(diff, str) else J)


class _SliceProfile:
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
        return (isinstance(other, _SliceProfile) and np.array_equal(self.scales, other.scales)
                and np.array_equal(self.weights, other.weights))

    def __hash__(self):
        return hash((self.scales.tobytes(), self.weights.tobytes()))
