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

from blochsim import _modifiers
from blochsim._closed_form import ClosedFormSimulator
from blochsim._engine import dispatch, pools
from blochsim._engine.request import Request
from blochsim._engine.table import run
from blochsim._protocol import PLAYED_COMMON, Played, check_diff_values

__all__ = ["ClosedFormSimulator", "PLAYED_COMMON", "Simulator"]

#: The simulator of each sequence-file format, for Simulator.from_pulseq.
#: The format's package adds its own when imported (blochsim.pulseq, which
#: ``import blochsim`` imports), so that this module need not import it.
FILE_SIMULATORS: dict = {}
#: writers of sequence files by format, filled by their packages (blochsim.pulseq)
FILE_WRITERS: dict = {}


class Simulator(Played):
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
    shim : array_like, complex, shape (channels,) or (pulses, channels), optional
        Parallel transmission: the complex weight of each transmit channel,
        for all pulses, or one row per RF pulse the stream plays (in
        order).  ``B1`` is then given as the channels' complex relative
        sensitivities, shape ``(channels, *voxels)``, and each pulse plays
        with the voxel's field B = sum_c B1[c] shim[c] (flip times abs(B),
        phase plus angle(B)).  A complex ``B1`` without ``shim`` drives
        every channel with weight 1; pulses with their own drive
        (``Pulse.channels``, a ``SampledPulse`` waveform per channel) take
        theirs.  ``jacobian`` with respect to ``"B1"`` gives 2 * channels
        columns (d/dRe and d/dIm of each channel's map); ``vjp`` reaches
        ``"B1"`` (complex, shaped as the maps) and ``"shim"`` (complex,
        dL/dRe + i dL/dIm, shaped as given).  NumPy or device maps.  A shim
        per pulse or pulses with their own drive play on the single-pool
        kernels (no pools, no ``repetitions="auto"`` or slice profile).
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
    device : {"cpu", "cuda", "auto"}, optional
        Force a backend; by default NumPy inputs run on the host.  "auto"
        runs them on the GPU when one is usable (with the device's limits:
        see :meth:`jacobian_vjp`), else on the host; a Dask worker with a
        GPU runs its chunks there.
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
            unit, never rounded, or on the moment-keyed EPG where no one
            unit holds them; "keyed": the moment-keyed EPG always;
            "spoil"; or a callable given each
            :class:`blochsim.pulseq.PulseqBlock` and returning the shifts at
            its end), ``axis``, ``unit``, ``field_strength``,
            ``voxel_size_m`` (the voxel the moments are measured against, 1
            mm unless given), ``frame`` ("spec", default, or "pulseq": the
            samples in the format's receiver frame, the complex conjugate),
            and any :class:`Simulator` option
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
        return FILE_SIMULATORS["pulseq"](path=path, **options)

    def to_pulseq(self, path, system=None, rf_duration=0.1, voxel_size_m=None, spoil_cycles=4.0, **values):
        """Write the sequence this simulator plays as a Pulseq file (format
        1.4, through pypulseq: ``pip install 'blochsim[pulseq]'``), to run
        on a scanner or to read back with :meth:`from_pulseq`.

        Each instant of the train becomes an RF or ADC block centred on it:
        pulses as block pulses of ``rf_duration``, an inversion as a 180°
        block pulse, a readout as one ADC sample, ``Dephase`` as a z
        gradient of one cycle an order across ``voxel_size_m``, ``Spoil``
        as an x gradient of ``spoil_cycles`` cycles (a physical spoiler),
        delays as the time between (:mod:`blochsim.pulseq.writer`).

        Parameters
        ----------
        path : str or os.PathLike
            The ``.seq`` file to write.
        system : pypulseq.Opts, optional
            The scanner's limits (default ``pypulseq.Opts()``: no dead
            times); events closer than they allow are refused.
        rf_duration : float, ms, optional
            Duration of each block pulse (default 0.1 ms).
        voxel_size_m : float, m, optional
            The voxel a Dephase order dephases by one cycle (default 1 mm).
        spoil_cycles : float, optional
            Cycles across the voxel of each Spoil's gradient (default 4).
        **values
            Protocol values, as for :meth:`simulate` (no tissue).

        Returns
        -------
        str
            The path written.

        Examples
        --------
        >>> import numpy as np
        >>> from blochsim.simulators import FSESimulator
        >>> fse = FSESimulator(ESP=10.0, flip=np.full(8, 150.0))
        >>> fse.to_pulseq("fse.seq")                                   # doctest: +SKIP
        >>> back = Simulator.from_pulseq("fse.seq", rf="hard")        # doctest: +SKIP
        >>> np.allclose(back.simulate(T1=1000.0, T2=80.0), fse.simulate(T1=1000.0, T2=80.0), atol=1e-5)  # doctest: +SKIP
        True
        """
        return FILE_WRITERS["pulseq"](self, path, system=system, rf_duration=rf_duration, voxel_size_m=voxel_size_m,
                                      spoil_cycles=spoil_cycles, **values)

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
        done, values = _modifiers.apply(self, "simulate", values, out=out)
        if done is not None:
            return done
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        route = dispatch.route(self.device, self.threads, tissue, out)
        return run(Request("simulate", self._streams(p), tissue, route, out=out))

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
        done, values = _modifiers.apply(self, "jacobian", values, diff, order, out=out)
        if done is not None:
            return done
        names, proto, tissue = self._jacobian_request(diff, order, values)
        p = self._protocol_values(proto)
        if out is not None and (not isinstance(out, tuple) or len(out) != 2):
            raise TypeError(f"out must be a tuple (signal, J) of two arrays, got {type(out).__name__}")
        route = dispatch.route(self.device, self.threads, tissue, out)
        return run(Request("jacobian", self._streams(p), tissue, route, names=tuple(names),
                           one=isinstance(diff, str), out=out))

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
            ``dL/dRe s + i dL/dIm s`` of a real loss L (so L = sum abs(s)² has
            cotangent ``2 * s``), returns a dict mapping each name of ``wrt``
            to dL/d name, float64, shaped like the parameter (a protocol
            parameter as given; a tissue property as passed, summed over the
            voxels it broadcasts to), per public unit (per degree of flip and
            phase, per ms of TR, ESP, TE, TI, T1, T2, per µT of a waveform);
            complex128 dL/dRe + i dL/dIm for a complex protocol parameter
            (a complex RF waveform).  A protocol parameter
            is shared by every voxel, so its gradient sums over them.  A
            tissue property passed as a device array (CuPy, PyTorch) gets
            its gradient as a float64 array of that library, on the device.

        Notes
        -----
        With pools or exact rectangular pulses (:class:`RectPulse`) the
        adjoint runs in double precision one voxel at a time
        (pools/adjoint.hpp), on the host or, with ``device="cuda"`` or
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
        done, values = _modifiers.apply(self, "vjp", values, names)
        if done is not None:
            return done
        proto, tissue = self._split(values)
        p = self._protocol_values(proto)
        protocol_names, tissue_names = self._vjp_names(names, p)
        check_diff_values(tissue_names, tissue, "vjp")
        route = dispatch.route(self.device, self.threads, tissue)
        traced = self._traced_stream(p, proto, protocol_names)
        return run(Request("vjp", self._streams(p), tissue, route, names=tuple(tissue_names), wrt=names,
                           protocol_names=tuple(protocol_names), traced=traced))

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
        _, values = _modifiers.apply(self, "jacobian_vjp", values)
        names, proto, tissue = self._jacobian_request(diff, 1, values)
        wrt_names = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        p = self._protocol_values(proto)
        if pools.any_pool(tissue) or self._packed(p).driven is not None:
            raise ValueError(f"{type(self).__name__}.jacobian_vjp: second order is not available with pools or "
                             f"exact rectangular pulses (RectPulse); the tissue Jacobian (jacobian) and reverse "
                             f"mode (vjp) are")
        protocol_names, tissue_wrt = self._vjp_names(wrt_names, p)
        if tissue_wrt:
            raise TypeError(f"jacobian_vjp differentiates with respect to protocol parameters; "
                            f"{tissue_wrt[0]!r} is a tissue property")
        route = dispatch.route(self.device, self.threads, tissue)
        traced = self._traced_stream(p, proto, protocol_names)
        return run(Request("jacobian_vjp", self._streams(p), tissue, route, names=tuple(names),
                           one=isinstance(diff, str), wrt=wrt_names, protocol_names=tuple(protocol_names),
                           traced=traced))
