"""The call modifiers of a played simulator, composed once for every public
method: the receiver frame of a Pulseq file (the samples conjugated), T2′
(a per-sample factor on the played signal), the exact periodic
steady state (repetitions="auto" on a repetition that never winds),
repetitions="auto" by playing (rewrites the call's repetitions), and slice
profiles (a weighted average over flip scales).

:func:`apply` tries them in that order; the first that applies answers the
call, by calling the simulator's public methods on a plainer call or by the
exact steady state's own solver.
"""
from __future__ import annotations

import numpy as np

from blochsim import steady
from blochsim._engine import dispatch, pools as _pools, reverse as _reverse, transmit as _transmit
from blochsim._arrays import validate as V
from blochsim._arrays.device import Interface, array_module, astype, host_as, host_copy, library_of
from blochsim._protocol import SliceProfile, check_diff_values, check_order, checked_key
from blochsim.sequence import Readout, Traced, trace

# repetitions="auto": the most playings tried, and the agreement asked for
_MAX_AUTO_REPETITIONS = 65536
_AUTO_TOLERANCE = 1e-5


def _given(sim, values, name):
    """The call's value of protocol parameter ``name``: this call's, the
    constructor's, or the default."""
    return values.get(name, sim._given.get(name, sim._defaults.get(name)))


def _names(diff):
    return (diff,) if isinstance(diff, str) else tuple(diff)


def _conj(a):
    """The complex conjugate of a NumPy array or a device array of CuPy,
    PyTorch or blochsim (a new array of the same library)."""
    if not V.is_device_array(a):
        return np.conj(a)
    from blochsim._arrays.device import DeviceArray
    if isinstance(a, DeviceArray):
        return DeviceArray.from_numpy(np.conj(a.get()))
    c = a.conj()
    return c.resolve_conj() if hasattr(c, "resolve_conj") else c


class _Frame:
    """frame="pulseq": the samples in the Pulseq format's receiver frame,
    the complex conjugate of SPEC's; the Jacobian conjugated with them, and
    a cotangent of the conjugated samples pulled back as the conjugate
    cotangent of SPEC's (for real parameters, Re(conj(g)·conj(ds)) =
    Re(conj(conj(g))·ds))."""

    what = 'with frame="pulseq"'
    second_order = ('jacobian_vjp does not take frame="pulseq": call it with frame="spec" and conjugate J and the '
                    "cotangents outside")

    def given(self, sim, values):
        return _given(sim, values, "frame") == "pulseq"

    def state(self, sim, values, wrt=()):
        if "frame" not in sim._defaults or not self.given(sim, values):
            return None
        return {**values, "frame": "spec"}

    def simulate(self, sim, state):
        return _conj(sim.simulate(**state))

    def jacobian(self, sim, state, diff, order):
        s, J = sim.jacobian(diff, order, **state)
        return _conj(s), _conj(J)

    def vjp(self, sim, state, names):
        s, pull = sim.vjp(names, **state)
        return _conj(s), lambda cotangent: pull(_conj(cotangent))


class _Transmit:
    """Static parallel transmission: B1 complex with a leading channel axis
    (each channel's relative transmit sensitivity S_c) and the protocol's
    complex ``shim`` weights w_c (default 1 on every channel).  The voxel's
    field is B = sum_c S_c w_c, the same for every pulse, so each pulse
    plays with flip |B| * nominal and phase + arg(B).  A phase common to
    every pulse is a rotation of the frame about z, which every operator
    commutes with (relaxation, precession, shifts, exchange, saturation),
    so the signal is exactly u * s(B1 = |B|) with u = B / |B|: the played
    call runs with the real map |B| and the phase multiplies its samples.

    Derivatives: with dB a change of the field, d|B| = Re(conj(u) dB) and
    d arg(B) = Im(conj(u) dB) / |B|, so ds = u (ds/dB1 d|B| + i s d arg(B));
    dB = w_c for Re S_c, i w_c for Im S_c, S_c for Re w_c and i S_c for
    Im w_c."""

    what = "with a multi-channel B1"
    second_order = ("jacobian_vjp does not take a multi-channel B1 or shim weights; call it with the combined "
                    "map B1 = abs(sum_c S_c w_c) and multiply by its phase outside")

    def given(self, sim, values):
        return "shim" in sim._defaults and (_given(sim, values, "shim") is not None or _complex(values.get("B1")))

    def state(self, sim, values, wrt=()):
        """(S, w, |B|, u, values to play, whether B1 was complex) or None
        without pTx; arrays of B1's library (NumPy, CuPy, PyTorch)."""
        if "shim" not in sim._defaults:
            return None
        raw_shim = _given(sim, values, "shim")
        b1 = values.get("B1")
        if raw_shim is None and not _complex(b1):
            return None  # (a stream whose pulses drive channels is refused when it is played: _protocol)
        if "B1" not in sim.tissue_properties:
            raise TypeError(f"shim weights act through B1, which {type(sim).__name__} does not model")
        if b1 is None:
            raise ValueError("shim weights need the channels' transmit sensitivities: pass B1 as a complex array "
                             "of shape (channels, *voxels)")
        given_complex = _complex(b1)
        if V.is_device_array(b1):
            if not given_complex:
                Interface("B1", b1)  # a valid real map (dtype, strides, pointer) before any work
            S = b1
        else:
            S = np.asarray(b1) if given_complex else np.asarray(V.tissue_array("B1", b1))
        xp = array_module(S)
        if given_complex and S.ndim < 1:
            raise ValueError(f"a complex B1 holds the channels' sensitivities on its first axis, shape "
                             f"(channels, *voxels); got a scalar {complex(S)!r}")
        if not given_complex:  # a real map with shim weights: one channel
            S = S[None]
        S = astype(S, np.complex128)
        if not bool(xp.isfinite(S).all()):
            raise ValueError("B1 (the channels' sensitivities) must be finite")
        channels = S.shape[0]
        w_host = np.ones(channels, np.complex128) if raw_shim is None else V.shim_weights(raw_shim, channels)
        w = host_as(w_host, S).reshape((channels,) + (1,) * (S.ndim - 1)) if w_host.ndim == 1 else None
        B = (w * S).sum(0) if w is not None else None
        # where the field is null a change of it turns the pulses about its
        # own axis, which |B| alone does not carry: the kernels' settings do
        null = B is not None and bool((B == 0).any())
        dynamic = self._dynamic(sim, values, S, raw_shim, w_host, given_complex, wrt, null)
        if dynamic is not None:
            return dynamic
        mag = abs(B)
        u = xp.where(mag > 0, B / xp.where(mag > 0, mag, 1.0), 1.0 + 0j)
        played = {k: v for k, v in values.items() if k != "shim"}
        played["B1"] = mag
        played["shim"] = None
        return S, w, mag, u, played, given_complex

    @staticmethod
    def _checked(sim, values):
        """(the checked protocol of the call, played with no shim, its tissue)."""
        played = {k: v for k, v in values.items() if k not in ("shim", "B1")}
        proto, tissue = sim._split({**played, "shim": None})
        return sim._protocol_values(proto), tissue, proto

    def _dynamic(self, sim, values, S, raw_shim, w, given_complex, wrt=(), null=False):
        """The state of a call with per-pulse transmit settings (a shim
        per pulse, or pulses with their own channel drive), or None."""
        if not hasattr(sim, "_packed"):
            if w.ndim == 2:
                raise ValueError(f"{type(sim).__name__} is a closed form, whose pulses share one shim: shim must "
                                 f"have shape (channels,), got {w.shape}")
            return None
        p, tissue, proto = self._checked(sim, values)
        if p["repetitions"] == "auto" and w.ndim == 2:
            raise ValueError("a shim per pulse needs a known number of pulses: repetitions='auto' is not taken "
                             "with it")
        one = {**p, "repetitions": 1} if p["repetitions"] == "auto" else p
        if null and not (w.ndim == 2 or sim._packed(one).channels is not None):
            # a static shim with a null field plays on the settings where they take the call
            plain = [k for k in wrt if k not in sim.tissue_properties and k != "shim"]
            if (plain or _pools.any_pool(tissue) or p["repetitions"] == "auto" or p["slice_profile"] is not None
                    or sim._packed(p).driven is not None):
                return None
        if p["repetitions"] == "auto" or p["slice_profile"] is not None:
            if _transmit.needed(sim._packed(one), raw_shim):
                which = "repetitions='auto'" if p["repetitions"] == "auto" else "slice_profile"
                raise ValueError(f"per-pulse transmit settings do not combine with {which}")
            return None
        s = sim._packed(p)
        if not (_transmit.needed(s, raw_shim) or null):
            return None
        route = dispatch.route(sim.device, sim.threads, {**tissue, "B1": S})
        device = route.device == "cuda"
        libraries = {k: library_of(v) for k, v in {"B1": S, **tissue}.items() if V.is_device_array(v)}
        traced = None
        protocol_names = [k for k in wrt if k not in sim.tissue_properties and k != "shim"]
        if protocol_names:
            protocol_names, _ = sim._vjp_names(protocol_names, p)
            s, prov, pshapes = sim._traced_stream(p, proto, protocol_names)
            flips = [k for k in protocol_names if k in prov and np.any(np.asarray(prov[k][1]) == 1)]
            if flips:
                raise ValueError(f"{type(sim).__name__}.vjp with per-pulse transmit settings reaches the tissue, the "
                                 f"channels' maps (B1), the shim weights, the pulses' channel drives (a waveform "
                                 f"per channel), durations and phases; {flips[0]!r} also reaches the pulses' "
                                 f"nominal flips, which it does not")
        st = _transmit.settings(s, w if raw_shim is not None else None, S.shape[0], by_pulse=bool(protocol_names))
        if protocol_names:
            traced = (s.drive_sources or [], st.pulse, protocol_names, p, pshapes, prov)
        play = _transmit.Play(sim._streams(p), tissue, host_copy(S), st, sim.threads, device=device)
        return _transmit.Call(play, w, given_complex, sim._host_variant, libraries, traced)

    def simulate(self, sim, state):
        if isinstance(state, _transmit.Call):
            return state.simulate()
        S, w, mag, u, played, _ = state
        s0 = sim.simulate(**played)
        return astype(u, s0.dtype)[..., None] * s0  # the phase in the signal's precision

    def _field_columns(self, state, J0, s0):
        """d s / d Re S_c and d s / d Im S_c per channel c, from the played
        d s / d B1 (J0) and signal (s0)."""
        S, w, mag, u, played, _ = state
        xp = array_module(mag)
        cols = []
        for c in range(S.shape[0]):
            for dB in (w[c], 1j * w[c]):  # Re S_c, Im S_c
                q = u.conj() * dB
                d_arg = _transmit.over(q.imag, mag)
                # where the field is null the pulses turn about the axis of dB: ds = J0 dB (u = 1 there)
                null = xp.where(mag == 0, xp.imag(dB * xp.ones_like(mag)), 0.0)
                cols.append(u[..., None] * (J0 * (q.real + 1j * null)[..., None] + 1j * s0 * d_arg[..., None]))
        return cols

    def jacobian(self, sim, state, diff, order):
        """The played Jacobian times u; "B1" becomes 2 * channels columns,
        d/dRe S_c and d/dIm S_c channel by channel."""
        names = _names(diff)
        check_order(order)
        if "shim" in names:
            raise ValueError("jacobian differentiates tissue properties; shim is a protocol parameter (use vjp)")
        if isinstance(state, _transmit.Call):
            return state.jacobian(names, isinstance(diff, str))
        S, w, mag, u, played, _ = state
        s0, J0 = sim.jacobian(names, order, **played)  # names: a tuple, so J0 has its direction axis
        cols = []
        for j, k in enumerate(names):
            cols += self._field_columns(state, J0[..., j, :], s0) if k == "B1" else [u[..., None] * J0[..., j, :]]
        xp = array_module(s0)
        shape = np.broadcast_shapes(*(tuple(c.shape) for c in cols))
        J = astype(xp.stack([xp.broadcast_to(c, shape) for c in cols], -2), J0.dtype)
        s = astype(xp.broadcast_to(u[..., None] * s0, shape), s0.dtype)
        return s, (J[..., 0, :] if isinstance(diff, str) and J.shape[-2] == 1 else J)

    def vjp(self, sim, state, names):
        """The played pullback of conj(u) * cotangent; the field's share
        through |B| (the played B1 gradient) and arg(B) (the signal's own),
        then through the channels' maps and the shim weights."""
        if isinstance(state, _transmit.Call):
            return state.vjp(sim, names)
        S, w, mag, u, played, given_complex = state
        field = any(k in ("B1", "shim") for k in names)
        inner = tuple(k for k in names if k not in ("B1", "shim")) + (("B1",) if field else ())
        s0, pull = sim.vjp(inner, **played)
        xp = array_module(s0)
        signal = astype(u[..., None] * s0, s0.dtype)
        if xp is not np and tuple(signal.shape[:-1]) != tuple(mag.shape):
            raise ValueError(f"a multi-channel B1 of device arrays needs maps of the signal's voxel shape "
                             f"{tuple(signal.shape[:-1])}, got {tuple(mag.shape)}")

        def pullback(cotangent):
            if xp is np:
                cot = _reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
            else:
                given = cotangent if V.is_device_array(cotangent) else host_as(np.asarray(cotangent), signal)
                cot = astype(given, np.complex128)
                if tuple(cot.shape) != tuple(signal.shape):
                    raise ValueError(f"cotangent must have the signal's shape {tuple(signal.shape)}, got "
                                     f"{tuple(cot.shape)}")
            grads = pull(astype(u.conj()[..., None] * cot, np.complex64))
            out = {k: grads[k] for k in names if k not in ("B1", "shim")}
            if not field:
                return out
            g_mag = xp.broadcast_to(grads["B1"], mag.shape)
            # d L / d arg(B) per voxel of B1 (summed over the samples and the voxels B1 broadcasts to)
            g_arg = -(cot.conj() * signal).imag.sum(-1)
            if xp is np:
                g_arg = _reverse.reduce_to(g_arg, mag.shape)
            g_arg = _transmit.over(g_arg, mag)  # per unit of Im(conj(u) dB)
            # where the field is null the pulses turn about the axis of dB: dL along i J0 there
            g_null = 0.0
            if bool((mag == 0).any()):
                turned = pull(astype(-1j * u.conj()[..., None] * cot, np.complex64))["B1"]
                g_null = xp.where(mag == 0, xp.broadcast_to(turned, mag.shape), 0.0)

            def through(dB):  # d L for a change dB of the field, per voxel
                q = u.conj() * dB
                return g_mag * q.real + g_arg * q.imag + g_null * xp.imag(dB * xp.ones_like(mag))

            if "B1" in names:
                gS = xp.stack([through(w[c]) + 1j * through(1j * w[c]) for c in range(S.shape[0])])
                # a real map given with shim weights is one channel's real sensitivity
                out["B1"] = gS if given_complex else gS[0].real
            if "shim" in names:
                out["shim"] = np.array([complex(float(through(S[c]).sum()), float(through(1j * S[c]).sum()))
                                        for c in range(S.shape[0])])
            return out

        return signal, pullback


_TRANSMIT = _Transmit()


def transmit(sim, method, values, *args):
    """A closed-form simulator's ``method`` ("simulate", "jacobian" or
    "vjp") through static parallel transmission when the call has a
    multi-channel B1 or shim weights; None otherwise."""
    if not _TRANSMIT.given(sim, values):
        return None
    state = _TRANSMIT.state(sim, values, args[0] if method == "vjp" else ())
    return getattr(_TRANSMIT, method)(sim, state, *args)


def _complex(b1):
    """Whether B1 is complex (a channels' sensitivities): NumPy or device."""
    if b1 is None:
        return False
    if V.is_device_array(b1):
        typestr = getattr(b1, "__cuda_array_interface__", {}).get("typestr", "<f4")
        return np.dtype(typestr).kind == "c"
    return np.iscomplexobj(b1)


class _T2Prime:
    """T2′: the played signal times exp(-dephasing / T2′) per sample, the
    dephasing time of each :class:`Readout` (ms)."""

    what = "with T2prime"
    second_order = ("jacobian_vjp does not take T2prime: its factor exp(-dephasing/T2prime) is per sample, so "
                    "apply it to J and to the cotangents outside")

    def given(self, sim, values):
        return "T2prime" in values

    def state(self, sim, values, wrt=()):
        """The call's T2prime (validated, ms) and ``values`` without it."""
        if "T2prime" not in values or "T2prime" not in sim.tissue_properties:
            return None
        on_device = [k for k, v in values.items() if V.is_device_array(v)]
        if on_device:
            raise ValueError(f"T2prime needs host (NumPy) values; {on_device[0]} is a device array")
        t2p = V.tissue_array("T2prime", values["T2prime"])
        V.broadcast_voxels({k: (t2p if k == "T2prime" else np.asarray(v)) for k, v in values.items()
                            if k in sim.tissue_properties})
        return t2p, {k: v for k, v in values.items() if k != "T2prime"}

    @staticmethod
    def factor(sim, t2p, values, traced=()):
        """exp(-dephasing / T2prime) per voxel and recorded sample, shape
        (*T2prime.shape, samples), each sample's Readout.dephasing (ms;
        :class:`Traced` along the protocol names ``traced``) and the
        dephasing as floats."""
        proto, _ = sim._split(values)
        p = sim._protocol_values(proto)
        key = (checked_key(p), tuple(traced))
        cached = getattr(sim, "_dephasing_cache", None)
        if cached is not None and cached[0] == key:
            tau = cached[1]
        else:
            q = dict(p)
            for k in traced:
                q[k] = trace(k, p[k])
            # only the repetition's readouts are recorded (its last playing)
            tau = [op.dephasing for op in sim.repetition(q).ops() if isinstance(op, Readout)]
            sim._dephasing_cache = (key, tau)
        tau_ms = np.array([float(t) for t in tau], dtype=np.float64)
        return np.exp(-tau_ms / t2p[..., None]), tau, tau_ms

    def simulate(self, sim, state):
        t2p, values = state
        f, _, _ = self.factor(sim, t2p, values)
        return sim.simulate(**values) * f

    def jacobian(self, sim, state, diff, order):
        """The played Jacobian times the factor, and d/dT2prime = signal *
        factor * dephasing / T2prime^2."""
        t2p, values = state
        names = _names(diff)
        check_order(order)
        other = tuple(k for k in names if k != "T2prime")
        f, _, tau_ms = self.factor(sim, t2p, values)
        s, J = sim.jacobian(other, order, **values) if other else (sim.simulate(**values), None)
        shape = np.broadcast_shapes(s.shape, t2p.shape + s.shape[-1:])
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

    def vjp(self, sim, state, names):
        """The played pullback of the cotangent times the factor, plus the
        factor's own share through T2prime and through the protocol values
        the samples' dephasing times come from."""
        t2p, values = state
        other = tuple(k for k in names if k != "T2prime")
        protocol = tuple(k for k in other if k not in sim.tissue_properties)
        f, tau, tau_ms = self.factor(sim, t2p, values, protocol)
        s, pull = sim.vjp(other, **values) if other else (sim.simulate(**values), None)
        shape = np.broadcast_shapes(s.shape, t2p.shape + s.shape[-1:])
        signal = np.broadcast_to(s * f, shape).astype(np.complex64)

        def pullback(cotangent):
            g = _reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
            out = dict(pull(_reverse.reduce_to(g * f, s.shape))) if pull is not None else {}
            w = np.real(np.conj(g) * s * f)  # dL/d(log factor), per voxel and sample
            if "T2prime" in names:
                out["T2prime"] = _reverse.reduce_to(np.sum(w * tau_ms / t2p[..., None] ** 2, axis=-1), t2p.shape)
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


class _Exact:
    """repetitions="auto" on a repetition that never winds (no Dephase) and
    a tissue without pools, D or v: the periodic steady state as the fixed
    point of one playing's map (:mod:`blochsim.steady`)."""

    what = "at the exact steady state"
    second_order = None  # jacobian_vjp plays

    def state(self, sim, values, wrt=()):
        """The repetition's program (protocol names of ``wrt`` traced), the
        tissue arrays, the voxel shape, the protocol and the protocol
        names; None when the call is not one for the exact solver."""
        if _given(sim, values, "repetitions") != "auto":
            return None
        if _given(sim, values, "slice_profile") is not None:
            return None
        if any(V.is_device_array(v) for v in values.values()):
            return None
        proto, tissue = sim._split(values)
        if _pools.any_pool(tissue) or "D" in tissue or "v" in tissue:
            return None
        p = sim._protocol_values({**proto, "repetitions": 1})
        ops = sim.repetition(p).ops()
        if not steady.never_winds(ops):
            return None
        protocol_names = sim._vjp_names(tuple(wrt), p)[0] if wrt else []
        if protocol_names:
            q = dict(p)
            for k in protocol_names:
                q[k] = trace(k, p[k])
            ops = sim.repetition(q).ops()
        arrays, shape = sim._tissue(tissue)
        prog = steady.program(ops)
        if "inv_efficiency" in arrays and ("inversion",) not in prog:
            sim._refuse_idle_inversion()
        return prog, arrays, shape, p, protocol_names, values

    def simulate(self, sim, state):
        prog, arrays, shape = state[:3]
        return steady.signal(prog, arrays, shape)

    def jacobian(self, sim, state, diff, order):
        prog, arrays, shape, _, _, values = state
        names, _, _ = sim._jacobian_request(diff, order, values)
        sig = steady.signal(prog, arrays, shape).astype(np.complex64)
        J = np.stack([steady.tissue_derivative(prog, arrays, shape, k) for k in names], axis=-2)
        return sig, (J[..., 0, :] if isinstance(diff, str) else J).astype(np.complex64)

    def vjp(self, sim, state, names):
        """The protocol's gradients by the periodic adjoint of the order-0
        maps, the tissue's by the complex step (a pass per name)."""
        prog, arrays, shape, p, protocol_names, values = state
        proto, tissue = sim._split(values)
        check_diff_values([k for k in names if k in sim.tissue_properties], tissue, "vjp")
        raw = {**sim._defaults, **sim._given, **proto}
        signal = steady.signal(prog, arrays, shape).astype(np.complex64)

        def pullback(cotangent):
            g = _reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
            entries = steady.protocol_gradients(prog, arrays, shape, g) if protocol_names else {}
            out = {}
            for k in names:
                if k in sim.tissue_properties:
                    d = steady.tissue_derivative(prog, arrays, shape, k)
                    out[k] = _reverse.reduce_to(np.sum(np.real(np.conj(g) * d), axis=-1), np.shape(arrays[k]))
                    continue
                value = np.asarray(p[k])
                grad = np.zeros(value.shape, dtype=np.complex128 if value.dtype.kind == "c" else np.float64)
                for (name, idx, part), v in entries.items():
                    if name == k:
                        grad[idx] += v if part == 0 else 1j * v
                out[k] = grad if np.ndim(raw[k]) > 0 else grad.sum()
            return out

        return signal, pullback


class _AutoRepetitions:
    """repetitions="auto" otherwise: the playings that reach the periodic
    steady state for this call's tissue, doubling from 8 until the last
    playing's samples agree to 1e-5 of their largest magnitude."""

    def rewrite(self, sim, values):
        if _given(sim, values, "repetitions") != "auto":
            return values
        rest = {k: v for k, v in values.items() if k != "repetitions"}
        if any(V.is_device_array(v) for v in rest.values()):
            raise ValueError("repetitions='auto' needs host (NumPy) tissue values")
        R = 8
        prev = np.asarray(sim.simulate(**rest, repetitions=R))
        while R < _MAX_AUTO_REPETITIONS:
            R *= 2
            cur = np.asarray(sim.simulate(**rest, repetitions=R))
            scale = float(np.max(np.abs(cur))) if cur.size else 0.0
            if cur.size == 0 or float(np.max(np.abs(cur - prev))) <= _AUTO_TOLERANCE * max(scale, 1e-30):
                return {**values, "repetitions": R}
            prev = cur
        raise ValueError(f"repetitions='auto': {type(sim).__name__} did not reach a periodic steady state within "
                         f"{_MAX_AUTO_REPETITIONS} playings (the last doubling changed the samples by "
                         f"{float(np.max(np.abs(cur - prev))):.3g}); give repetitions as a number")


class _Profile:
    """A slice profile: every tissue value given a trailing profile axis,
    B1 times the profile's scales, and the played signal averaged over that
    axis with the profile's weights."""

    what = "with a slice_profile"
    second_order = ("jacobian_vjp does not take a slice_profile; average jacobian_vjp over the profile's B1 "
                    "scales instead")

    def given(self, sim, values):
        return _given(sim, values, "slice_profile") is not None

    def state(self, sim, values, wrt=()):
        """The profile and ``values`` to play it, or None without one."""
        raw = _given(sim, values, "slice_profile")
        if raw is None:
            return None
        prof = raw if isinstance(raw, SliceProfile) else SliceProfile(raw, sim)
        out = {"slice_profile": None}
        for k, v in values.items():
            if k == "slice_profile":
                continue
            if k in sim.tissue_properties:
                if V.is_device_array(v):
                    raise ValueError(f"slice_profile needs host (NumPy) tissue values; {k} is a device array")
                out[k] = np.asarray(V.tissue_array(k, v))[..., None]
            else:
                out[k] = v
        out["B1"] = out["B1"] * prof.scales if "B1" in out else prof.scales
        return prof, out, values

    def simulate(self, sim, state):
        prof, played, _ = state
        return np.tensordot(sim.simulate(**played), prof.weights, axes=([-2], [0]))

    def jacobian(self, sim, state, diff, order):
        prof, played, _ = state
        names = _names(diff)
        s, J = sim.jacobian(tuple(names), order, **played)  # J: (*voxels, P, names, samples)
        # d/dB1 of s(B1 · scale) is scale times the played derivative
        chain = np.stack([prof.scales if k == "B1" else np.ones_like(prof.scales) for k in names], axis=1)
        s = np.tensordot(s, prof.weights, axes=([-2], [0]))
        J = np.einsum("...pns,p,pn->...ns", J, prof.weights, chain).astype(np.complex64)
        return s.astype(np.complex64), (J[..., 0, :] if isinstance(diff, str) else J)

    def vjp(self, sim, state, names):
        """The played call's pullback of the weighted cotangent, summed back
        over the profile (B1's share times each scale)."""
        prof, played, values = state
        s_p, pull = sim.vjp(names, **played)  # s_p: (*voxels, P, samples)
        signal = np.tensordot(s_p, prof.weights, axes=([-2], [0])).astype(np.complex64)

        def pullback(cotangent):
            g = _reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
            grads = pull(g[..., None, :] * prof.weights[:, None])
            out = {}
            for k in names:
                if k in sim.tissue_properties:
                    gk = grads[k] * (prof.scales if k == "B1" else 1.0)
                    out[k] = _reverse.reduce_to(np.sum(gk, axis=-1), np.shape(V.tissue_array(k, values[k])))
                else:
                    out[k] = grads[k]
            return out

        return signal, pullback


_MODIFIERS = (_Frame(), _TRANSMIT, _T2Prime(), _Exact(), _AutoRepetitions(), _Profile())


def apply(sim, method, values, *args, out=None):
    """Public method ``method`` ("simulate", "jacobian", "vjp" or
    "jacobian_vjp", with its positional ``args``) of ``sim`` through the
    first modifier that applies to the call.

    Returns
    -------
    (result, values)
        ``result`` the modifier's answer (written into ``out`` for
        simulate), or None when the call plays as it is, with ``values``
        (repetitions="auto" resolved).
    """
    for m in _MODIFIERS:
        if hasattr(m, "rewrite"):
            values = m.rewrite(sim, values)
            continue
        if method == "jacobian_vjp":
            if m.second_order is not None and m.given(sim, values):
                raise ValueError(m.second_order)
            continue
        state = m.state(sim, values, wrt=args[0] if method == "vjp" else ())
        if state is None:
            continue
        if method == "simulate":
            return V.into(out, getattr(m, method)(sim, state)), values
        if out is not None:
            raise ValueError(f"{method} {m.what} returns new arrays: out must be None")
        return getattr(m, method)(sim, state, *args), values
    return None, values
