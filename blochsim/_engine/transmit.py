"""Per-pulse transmit settings (parallel transmission with a shim per pulse,
or a waveform per channel): the settings of a call, the stream that names
them, and its plays of ``simulate``, ``jacobian`` and ``vjp`` on the host
or the GPU with the chain rule to the channels' maps, the shim weights and
the traced channel drives.

Pulse e of the stream drives the channels with w_e (its own
``Pulse.channels``, the shim's row for that pulse, or the static shim), so
that its field in a voxel with sensitivities S_c is B_e = sum_c S_c w_ec.
The pulses are grouped into settings g, each a drive U_g with B_e = a_e B_g
for a complex scale a_e that the stream's flip (|a_e|) and phase (arg a_e)
take; the kernels then play pulse e at flip * |B_g| and phase + arg B_g,
forming B_g from the voxel's sensitivities and the setting's drive
(Tissue::transmit in events.hpp).  Drives that are multiples of one another
share a setting; the rows of a per-pulse shim, the static shim and (for a
pullback to them) each traced pulse's drive are settings of their own, so
that the derivatives along a setting's field are those of its weights.

Derivatives (SPEC §4).  With u_g = B_g / |B_g|, a change dB_g of a setting's
field moves |B_g| by Re(conj(u_g) dB_g) and arg B_g by Im(conj(u_g) dB_g) /
|B_g|; at a null field the pulses turn about the axis of dB_g itself (the
derivative along Re dB at arg B = 0, along Im dB a quarter turn on).  The
kernels give ds/d|B_g| and ds/d arg B_g one setting a pass (the Jacobian's
B1 and B1phase directions moving setting Transmit::seeded), or dL/d|B_g|
and dL/d arg B_g of every setting in one adjoint sweep; the chain rule takes
them to the channels' maps (dB_g = U_gc for Re S_c, i U_gc for Im S_c) and
to the weights (dB_g = S_c, i S_c).
"""
from __future__ import annotations

import copy

import numpy as np

from blochsim import _core
from blochsim._arrays import validate as V
from blochsim._arrays.device import array_module, host_copy
from blochsim._engine import dispatch, memory, reverse
from blochsim.sequence.packing import EV_DRIVEN, EV_RF, _unitary_rotation_terms

_B1, _B1PHASE = _core.TISSUE_FIELDS.index("B1"), _core.TISSUE_FIELDS.index("B1phase_rad")


class Settings:
    """The transmit settings of one call: ``drive`` (G, channels) complex128,
    the stream that plays them (``stream``: flips and phases scaled per
    pulse, ``transmit`` naming each pulse's setting), and for the shim's
    gradient ``shim_rows``: the setting of each row of a per-pulse shim
    (P,) or of the static shim (1,); ``pulse``: with settings by pulse, the
    setting of each of the stream's driven pulses (``drive_sources``), else
    None."""

    def __init__(self, stream, drive, shim_rows, pulse=None):
        self.stream = stream
        self.drive = drive
        self.shim_rows = shim_rows
        self.pulse = pulse

    @property
    def count(self):
        return self.drive.shape[0]


def needed(s, shim) -> bool:
    """Whether a call plays per-pulse settings: a pulse with its own channel
    drive, or a shim per pulse."""
    return s.channels is not None or (shim is not None and np.ndim(shim) == 2)


def settings(s, shim, channels, by_pulse=False) -> Settings:
    """The settings of stream ``s`` for ``channels`` transmit channels and
    the shim (None: 1 on every channel; (channels,): static; (pulses,
    channels): one row per RF pulse of the stream, in played order).  With
    ``by_pulse`` each pulse with its own drive is a setting of its own (its
    playings share it), so that the derivatives along a setting are those
    along that pulse's drive (``Settings.pulse``: the setting of each of
    ``s.drive_sources``)."""
    rf = np.flatnonzero((s.flags & EV_RF) != 0)
    if np.any((s.flags & EV_DRIVEN) != 0):
        raise ValueError("per-pulse transmit settings do not combine with exact rectangular pulses (RectPulse), "
                         "which the pooled kernels play with one B1 per voxel")
    own = np.zeros(s.n_events, dtype=bool)
    drives = np.zeros((s.n_events, channels), dtype=np.complex128)
    if s.channels is not None:
        if s.channels.shape[1] != channels:
            raise ValueError(f"the sequence's pulses drive {s.channels.shape[1]} transmit channel(s) but B1 has "
                             f"{channels} on its first axis")
        own = ~np.isnan(s.channels[:, 0])
        drives[own] = s.channels[own]
    rest = rf[~own[rf]]
    setting = np.full(s.n_events, -1, dtype=np.int64)
    scale = np.ones(s.n_events, dtype=np.complex128)
    rows = []
    if shim is not None and np.ndim(shim) == 2:
        w = np.asarray(shim, dtype=np.complex128)
        if w.shape != (rf.size, channels):
            raise ValueError(f"shim per pulse must have shape (pulses, channels) = ({rf.size}, {channels}): one row "
                             f"per RF pulse the sequence plays, got {w.shape}")
        per_pulse = w[np.searchsorted(rf, rest)]
        rows = list(per_pulse)
        setting[rest] = np.arange(rest.size)
        shim_rows = np.arange(rest.size)
        if own[rf].any():
            shim_rows = np.full(rf.size, -1)
            shim_rows[~own[rf]] = np.arange(rest.size)  # a pulse with its own drive takes no shim row
    else:
        static = np.ones(channels, np.complex128) if shim is None else np.asarray(shim, np.complex128)
        shim_rows = np.zeros(1, dtype=np.int64) if rest.size else np.full(1, -1)
        if rest.size:
            rows = [static]
            setting[rest] = 0
    # pulses with their own drive: multiples of one drive share its setting
    mine = np.flatnonzero(own)
    pulse = None
    if mine.size and by_pulse:
        numbers = s.drive_op[mine]
        distinct = np.unique(numbers)
        pulse = np.full(len(s.drive_sources), -1, dtype=np.int64)
        pulse[distinct] = len(rows) + np.arange(distinct.size)
        setting[mine] = pulse[numbers]
        rows += [drives[mine][np.flatnonzero(numbers == k)[0]] for k in distinct]
    elif mine.size:
        w = drives[mine]
        mag = np.abs(w)
        k = np.argmax(mag, axis=1)
        peak = w[np.arange(mine.size), k]
        norm = np.linalg.norm(w, axis=1)
        a = np.where(norm > 0, norm * np.exp(1j * np.angle(peak)), 0.0)
        u = np.where(norm[:, None] > 0, w / np.where(a == 0, 1.0, a)[:, None], 0.0)
        u[norm == 0, 0] = 1.0
        key = np.round(np.concatenate([u.real, u.imag], axis=1) * 1e12)
        _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
        setting[mine] = len(rows) + inverse.reshape(-1)
        scale[mine] = a
        rows += list(u[first])
    out = _with_pulses(s, s.flip_rad.astype(np.float64) * np.abs(scale),
                       s.phase_rad.astype(np.float64) + np.angle(scale))
    out.transmit = np.ascontiguousarray(setting, dtype=np.int32)
    drive = np.array(rows, dtype=np.complex128).reshape(-1, channels)
    if drive.shape[0] > _core.MAX_TRANSMIT_SETTINGS:
        raise ValueError(f"the sequence's pulses need {drive.shape[0]} transmit settings (distinct channel "
                         f"drives); at most {_core.MAX_TRANSMIT_SETTINGS} are played")
    return Settings(out, drive, np.asarray(shim_rows), pulse)


def _with_pulses(s, flip, phase):
    """A copy of stream s with these flips and phases (rad, float64)."""
    out = copy.copy(s)
    out.flip_rad = flip.astype(np.float32)
    out.phase_rad = phase.astype(np.float32)
    rx = s.rx_phase_rad.astype(np.float64)
    out.rf_table = np.ascontiguousarray(np.stack([*_unitary_rotation_terms(flip), np.cos(phase), np.sin(phase),
                                                  np.cos(rx), np.sin(rx)], axis=1), dtype=np.float32)
    return out


def interleaved(a):
    """A complex array (..., channels) as the kernels' float32 (..., channels, 2)."""
    return np.ascontiguousarray(np.stack([a.real, a.imag], axis=-1), dtype=np.float32)


class Play:
    """The plays of one call with transmit settings, on the host or the GPU.

    ``streams`` the protocol's (blochsim._protocol.Streams), ``tissue`` the
    call's tissue without B1 (public names; host values, or device arrays
    with ``device``), ``S`` the channels' sensitivities (channels, *maps)
    complex128 NumPy and ``st`` the Settings.  With ``device`` the kernels
    run on the GPU (the tissue resident there, the sensitivities and drives
    copied to it) and the signal, Jacobian and gradients come back to the
    host for the chain rule."""

    def __init__(self, streams, tissue, S, st, threads, device=False):
        from blochsim._engine import pools as _pools

        if _pools.any_pool(tissue):
            raise ValueError(f"{streams.name}: per-pulse transmit settings (a shim per pulse or a waveform per "
                             f"channel) play on the single-pool kernels; pools are not combined with them")
        self.streams, self.device, self.tissue = streams, device, tissue
        if device:
            from blochsim._arrays.device import device_inputs

            on_device = any(V.is_device_array(v) for v in tissue.values())
            self.intake = device_inputs(tissue, on_device)
            _, self.ifaces, self.arrays, shape = self.intake
        else:
            self.arrays, shape = streams.tissue(tissue)
        self.shape = tuple(np.broadcast_shapes(shape, S.shape[1:]))
        self.n = int(np.prod(self.shape, dtype=np.int64))
        self.present = set(tissue) | {"B1", "B1phase"}  # per-voxel phases: the complex path
        _, self.ps, _, _ = streams.stream(self.present, stream=st.stream)
        self.S, self.st = S, st
        self.threads = dispatch.call_threads(threads)
        bound = float(np.abs(S).sum(0).max(initial=0.0)) * float(np.abs(st.drive).max(initial=0.0))
        if not bound < V.MAGNITUDE_BOUNDS["B1"]:
            raise ValueError(f"the transmit field |sum_c B1[c] w_c| may reach {bound:g}, beyond "
                             f"{V.MAGNITUDE_BOUNDS['B1']:g} (single precision carries no more)")
        # each channel's sensitivity per voxel (one row when every voxel is
        # alike) and each setting's drive: the kernels form B_g per pulse
        maps = np.moveaxis(S, 0, -1)  # (*maps, channels)
        if all(d == 1 for d in maps.shape[:-1]):
            self.sensitivity = interleaved(maps.reshape(1, -1))
        else:
            self.sensitivity = interleaved(np.broadcast_to(maps, self.shape + maps.shape[-1:]).reshape(self.n, -1))
        self.drive = interleaved(st.drive)
        if device:
            per = self.n * (8 * self.ps.n_samples * 3 + 4 * len(tissue)) + self.sensitivity.nbytes
            memory.check_device(streams.name, self.n, per)
        else:
            self.si = V.si_planes(self.arrays, self.shape, _core.TISSUE_FIELDS)
            memory.check_call(streams.name, self.ps, self.shape, self.arrays, "jacobian", self.threads,
                              [_B1, _B1PHASE], outputs=3)

    def adjoint(self, names, cot, turned=()):
        """One adjoint sweep: (dL/d tissue ``names`` per public unit (n,
        len(names)), the per-event gradients (n_events, 4) as the adjoint
        gives them (a transmit pulse's flip column holds dL/d|B| there),
        dL/d|B_g| and dL/d arg B_g (n, G, 2)); ``cot`` (n, samples)
        complex64.  The pulses of the settings ``turned`` play a quarter
        turn on (for fields that are null everywhere: Play.setting_passes)."""
        fields, scale = reverse.fields_and_scale(names)
        ps = self.ps if not len(turned) else self._turned(np.isin(self.st.stream.transmit, turned))
        n, G = self.n, self.drive.shape[0]
        ev = np.zeros((self.st.stream.n_events, 4), np.float64)
        if self.device:
            from blochsim._arrays.device import DeviceArray

            c = DeviceArray.from_numpy(np.ascontiguousarray(cot, np.complex64))
            tg = DeviceArray((n, len(fields)), np.float32)
            txg = DeviceArray.from_numpy(np.zeros((n, G, 2), np.float32))

            if n:
                self._device_call(lambda dev, stream: _core.adjoint_cuda(ps, dev, n, list(fields), c.ptr, ev,
                                                                         tg.ptr, stream), gradient=txg.ptr)
            tg, txg = tg.get(), txg.get()
        else:
            tg = np.zeros((n, len(fields)), np.float32)
            txg = np.zeros((n, G, 2), np.float32)
            if n:
                _core.adjoint_host(ps, self.si + ((self.sensitivity, self.drive, -1, txg),), n, list(fields),
                                   np.ascontiguousarray(cot, np.complex64), ev, tg, self.threads)
        return tg.astype(np.float64) * scale, ev, txg.astype(np.float64)

    def _turned(self, where):
        """The call's packed stream with the pulses at ``where`` (n_events,
        bool) a quarter turn on."""
        s = self.st.stream
        turned = _with_pulses(s, s.flip_rad.astype(np.float64),
                              s.phase_rad.astype(np.float64) + np.where(where, np.pi / 2, 0.0))
        turned.transmit = s.transmit
        return self.streams.stream(self.present, stream=turned)[1]

    def _device_call(self, run, seeded=-1, gradient=0):
        """run(tissue, stream) on the GPU with the call's resident tissue
        and transmit settings (the B1 directions moving setting ``seeded``;
        the adjoint's gradient into the device pointer ``gradient``)."""
        from blochsim._arrays.device import DeviceArray, resident_tissue, work_stream

        own, stream = work_stream([i.stream for i in self.ifaces.values() if i.stream is not None])
        dev, keep = resident_tissue(self.arrays, self.ifaces, self.shape, self.n, own, stream)
        sens, drive = DeviceArray.from_numpy(self.sensitivity), DeviceArray.from_numpy(self.drive)
        stride = 0 if self.sensitivity.shape[0] == 1 else 2 * self.sensitivity.shape[1]
        tx = (sens.ptr, stride, drive.ptr, self.drive.shape[0], self.drive.shape[1], seeded, gradient)
        run(tuple(dev) + (tx,), stream)
        _core.stream_synchronize(stream)
        del keep, sens, drive

    def _tissue(self, seeded=-1):
        return self.si + ((self.sensitivity, self.drive, seeded, None),)

    def simulate(self, variant=0):
        """The signal (*shape, samples) complex64 NumPy."""
        if self.device:
            from blochsim._arrays.device import DeviceArray

            out = DeviceArray((self.n, self.ps.n_samples), np.complex64)
            if self.n:
                self._device_call(lambda dev, stream: _core.forward_cuda(self.ps, dev, self.n, out.ptr, stream))
            return out.get().reshape(self.shape + (self.ps.n_samples,))
        out = _core.new_result(self.shape + (self.ps.n_samples,), np.complex64)
        if self.n:
            _core.forward_host(self.ps, self._tissue(), self.n, out.reshape(self.n, -1), self.threads, variant)
        return out

    def _pass(self, g, fields, scale, variant, ps=None):
        """(signal, J (n, len(fields), samples)) with the B1 and B1phase
        directions moving setting g (of ``ps``, default the call's stream)."""
        n, k = self.n, self.ps.n_samples
        ps = self.ps if ps is None else ps
        if self.device:
            from blochsim._arrays.device import DeviceArray

            signal = DeviceArray((n, k), np.complex64)
            jac = DeviceArray((n, len(fields), k), np.complex64)
            if n:
                self._device_call(lambda dev, stream: _core.jacobian_cuda(
                    ps, dev, n, list(fields), list(scale), signal.ptr, jac.ptr, stream), g)
            return signal.get(), jac.get()
        signal = _core.new_result((n, k), np.complex64)
        jac = _core.new_result((n, len(fields), k), np.complex64)
        if n:
            _core.jacobian_host(ps, self._tissue(g), n, fields, scale, signal, jac, self.threads, variant)
        return signal, jac

    def setting_passes(self, names, variant=0, only=None):
        """Yields (g, signal, J_names, dS/d|B_g|, dS/d arg B_g, u_g, |B_g|,
        Q) per setting: J_names (n, len(names), samples) along the tissue
        ``names`` (other than B1) in the first pass only, None after; u_g
        and |B_g| as unit_field gives them.  Where the field is 0 (a gap
        of a waveform, channels that cancel) a change dB of it turns the
        pulses about the axis of dB: dS = dS/d|B| Re dB + Q Im dB, with
        dS/d|B| at arg B = 0 and Q (n, samples) at arg B = pi/2 (a second
        pass with the setting's pulses turned by a quarter; None when no
        voxel's field is 0)."""
        other, scale = reverse.fields_and_scale(names)
        for g in (range(self.st.count) if only is None else only):
            first = g == 0 and len(other) > 0
            fields = (list(other) if first else []) + [_B1, _B1PHASE]
            seeds = np.concatenate([scale, [1.0, 1.0]]) if first else np.ones(2)
            signal, jac = self._pass(g, fields, seeds, variant)
            m = len(fields) - 2
            u, mag = self.unit_field(g)
            quarter = None
            if np.any(mag == 0):
                quarter = self._pass(g, [_B1], np.ones(1), variant, self._turned(self.st.stream.transmit == g))[1][:, 0]
            yield g, signal, (jac[:, :m] if first else None), jac[:, m], jac[:, m + 1], u, mag, quarter

    def unit_field(self, g):
        """u_g = B_g / |B_g| (1 where the field is 0) and |B_g| of setting
        g, flat (n or 1,)."""
        B = np.tensordot(np.moveaxis(self.S, 0, -1), self.st.drive[g], axes=1)
        B = B.reshape(1) if B.size == 1 else np.broadcast_to(B, self.shape).reshape(-1)
        mag = np.abs(B)
        return np.where(mag > 0, B / np.where(mag > 0, mag, 1.0), 1.0), mag


def over(x, mag):
    """x / |B| where |B| > 0, else 0 (the phase of a null field moves with
    nothing), in the arrays' library."""
    xp = array_module(mag)
    return xp.where(mag > 0, x / xp.where(mag > 0, mag, 1.0), 0.0)


class Call:
    """A public call with per-pulse transmit settings: the signal, the
    Jacobian along the channels' maps (one forward-mode pass a setting) and
    the pullback to the tissue, the maps, the shim weights, the pulses'
    traced channel drives, durations and phases (one adjoint sweep, plus one
    with the null settings' pulses a quarter turn on); results in the
    inputs' array library.

    ``traced``: for protocol parameters of vjp, (each driven pulse's traced
    drive, its setting, the names, the checked protocol, the gradients'
    shapes, the provenance of the traced stream)."""

    def __init__(self, play, shim, given_complex, variant, libraries, traced=None):
        self.play, self.shim, self.given_complex, self.variant = play, shim, given_complex, variant
        #: the array library of each input passed as a device array
        self.libraries = libraries
        #: the library results go back in (None: NumPy)
        self.library = next(iter(libraries.values()), None)
        self.traced = traced

    def _out(self, a, library=None):
        from blochsim._arrays.device import to_library

        library = library or self.library
        return a if library is None else to_library(a, library)

    def simulate(self):
        return self._out(self.play.simulate(self.variant))

    def jacobian(self, names, one):
        play = self.play
        other = tuple(k for k in names if k != "B1")
        C = play.S.shape[0]
        n, k = play.n, play.ps.n_samples
        cols = {c: np.zeros((n, k), np.complex128) for c in range(2 * C)} if "B1" in names else {}
        signal, Jo = None, None
        if not cols:  # the tissue alone: one pass
            fields, scale = reverse.fields_and_scale(other)
            signal, Jo = play._pass(-1, fields, scale, self.variant)
        for g, sig, Jn, Jm, Jt, ug, mg, Q in (play.setting_passes(other, self.variant) if cols else ()):
            if signal is None:
                signal, Jo = sig, Jn
            for c in range(C):
                for part, dB in ((0, play.st.drive[g, c]), (1, 1j * play.st.drive[g, c])):
                    q = np.conj(ug) * dB
                    cols[2 * c + part] += Jm * q.real[:, None] + Jt * over(q.imag, mg)[:, None]
                    if Q is not None:  # a null field turns about the axis of dB
                        cols[2 * c + part] += Q * np.where(mg == 0, np.imag(dB), 0.0)[:, None]
        J = []
        for name in names:
            if name == "B1":
                J += [cols[i] for i in range(2 * C)]
            else:
                J.append(Jo[:, other.index(name)])
        J = np.stack(J, 1).astype(np.complex64).reshape(play.shape + (len(J), k))
        signal = signal.reshape(play.shape + (k,))
        return self._out(signal), self._out(J[..., 0, :] if one and J.shape[-2] == 1 else J)

    def _field_gradients(self, cot):
        """Per setting g: (u_g, |B_g|, dL/d|B_g|, dL/d arg B_g, dL/d Im B_g
        where B_g is null) per voxel, and the adjoint's (tissue, events)."""
        play, other = self.play, self._other
        tg, ev, txg = play.adjoint(other, cot)
        null = np.flatnonzero(~np.any(play.st.drive != 0, axis=1))  # drives of no channel: null everywhere
        quarter = play.adjoint((), cot, turned=null)[2][:, :, 0] if null.size else None
        per = {}
        for g in range(play.st.count):
            u, mag = play.unit_field(g)
            q = quarter[:, g] if quarter is not None and g in null else np.zeros_like(mag)
            per[g] = [u, mag, txg[:, g, 0], txg[:, g, 1], q]
        partial = [g for g in range(play.st.count) if g not in null and np.any(per[g][1] == 0)]
        for g, _, _, Jm, Jt, u, mag, Q in play.setting_passes((), self.variant, only=partial):
            # fields null in some voxels only: those voxels from one forward-mode pass and a quarter turn
            at = mag == 0
            per[g][2] = np.where(at, np.real(np.conj(cot) * Jm).sum(-1), per[g][2])
            per[g][4] = np.where(at, np.real(np.conj(cot) * Q).sum(-1), 0.0)
        return per, tg, ev

    def vjp(self, sim, names):
        from blochsim._protocol import check_diff_values

        play = self.play
        protocol = self.traced[2] if self.traced else []
        self._other = tuple(k for k in names if k not in ("B1", "shim") and k not in protocol)
        check_diff_values(self._other, play.tissue, "vjp")
        signal = play.simulate(self.variant)

        def pullback(cotangent):
            cot = reverse.cotangent(host_copy(cotangent), signal.shape, dtype=np.complex128).reshape(play.n, -1)
            C = play.S.shape[0]
            maps = play.S.shape[1:]
            per, tg, ev = self._field_gradients(cot)
            out = {name: reverse.reduce_to(tg[:, j].reshape(play.shape), _shape(play.tissue[name]))
                   for j, name in enumerate(self._other)}
            gS = np.zeros((C,) + tuple(maps), np.complex128)
            gw = np.zeros(self.shim.shape, np.complex128)
            Sflat = np.broadcast_to(play.S, (C,) + play.shape).reshape(C, -1)
            for g, (u, mag, g_mag, g_arg, g_quarter) in per.items():
                g_arg = over(g_arg, mag)

                def through(dB):  # dL for a change dB of setting g's field, per voxel
                    q = np.conj(u) * dB
                    return g_mag * q.real + g_arg * q.imag + np.where(mag == 0, g_quarter * np.imag(dB), 0.0)

                for c in range(C):
                    d = play.st.drive[g, c]
                    part = (through(d) + 1j * through(1j * d)).reshape(play.shape)
                    gS[c] += reverse.reduce_to(part.real, maps) + 1j * reverse.reduce_to(part.imag, maps)
                rows = np.flatnonzero(play.st.shim_rows == g) if "shim" in names else ()
                pulses = np.flatnonzero(self.traced[1] == g) if self.traced and self.traced[1] is not None else ()
                if len(rows) or len(pulses):
                    grad = np.array([complex(through(Sflat[c]).sum(), through(1j * Sflat[c]).sum())
                                     for c in range(C)])
                    if len(rows):
                        if self.shim.ndim == 2:
                            gw[rows] = grad
                        else:
                            gw += grad
                    for k in pulses:
                        _drive_gradient(out, self.traced, k, grad)
            if "B1" in names:
                out["B1"] = gS if self.given_complex else gS[0].real
            if "shim" in names:
                out["shim"] = gw
            if protocol:
                _, _, _, p, pshapes, prov = self.traced
                timing = reverse.assemble(protocol, p, prov, {k: np.shape(p[k]) for k in protocol}, ev, None, None,
                                          (), play.shape, {})
                for k in protocol:
                    g = out.get(k, np.zeros(np.shape(p[k]), np.complex128)) + timing[k]
                    g = g if np.iscomplexobj(p[k]) else g.real
                    out[k] = g.sum().reshape(()) if pshapes[k] == () and g.shape != () else g
            return {k: (self._out(out[k], self.libraries[k]) if k in self.libraries else out[k]) for k in names}

        return self._out(signal), pullback


def _drive_gradient(out, traced, k, grad):
    """Adds to ``out`` (protocol name -> complex128 gradient of its
    entries, dL/dRe + i dL/dIm) the share of driven pulse k, whose drive's
    gradient is ``grad`` (channels,): through the traced entries of its
    drive (a real entry takes dL/dRe of its channel, a complex one both)."""
    from blochsim.sequence.traced import Traced, TracedComplex

    sources, _, names, p = traced[:4]
    for c, x in enumerate(sources[k]):
        parts = ((x.re, grad[c].real), (x.im, grad[c].imag)) if isinstance(x, TracedComplex) else \
            ((x, grad[c].real),) if isinstance(x, Traced) else ()
        for t, dl in parts:
            for (name, index, part), coef in t.terms.items():
                if name in names:
                    g = out.setdefault(name, np.zeros(np.shape(p[name]), np.complex128))
                    g[index] += coef * dl * (1j if part else 1.0)


def _shape(a):
    """The shape of a NumPy value or a device array."""
    return tuple(a.shape) if hasattr(a, "shape") else np.shape(a)


