"""The base of simulators with an analytic signal, computed in NumPy with
analytic derivatives."""
from __future__ import annotations

import numpy as np

from blochsim import _modifiers
from blochsim._engine import reverse as _reverse
from blochsim._arrays import validate as V
from blochsim._protocol import Base, check_diff_values


class ClosedFormSimulator(Base):
    """Base class of simulators with an analytic signal.

    Computed in NumPy in the precision of the inputs: float64 inputs (and
    Python floats) give complex128, float32 inputs complex64.  Subclasses
    define :meth:`signal`.  One that models ``B1`` also takes static
    parallel transmission (a complex multi-channel ``B1`` and ``shim``
    weights, as :class:`blochsim.Simulator` describes).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # a closed form whose flips B1 scales takes static pTx as the
        # played simulators do (_modifiers.transmit)
        if "B1" in cls.tissue_properties:
            cls._common = {**cls._common, "shim": None}

    def signal(self, p: dict, t: dict):
        """Signal from the protocol and tissue (public units, broadcast)."""
        raise NotImplementedError

    def to_pulseq(self, path, **options):
        """Not available: a closed form plays no train of events to write.

        Raises
        ------
        TypeError
            Always; :meth:`blochsim.Simulator.to_pulseq` writes the
            simulators that play operators (FSE, FLASH, MRF, TrueFISP, ...).
        """
        raise TypeError(f"{type(self).__name__} has no played sequence to write (a closed form): to_pulseq writes "
                        "the simulators that play operators")

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
        done = _modifiers.transmit(self, "simulate", values)
        if done is not None:
            return done
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
        done = _modifiers.transmit(self, "vjp", values, names)
        if done is not None:
            return done
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
        check_diff_values(tissue_names, tissue, "vjp")
        tshapes = {k: np.shape(V.tissue_array(k, tissue[k])) for k in tissue_names}
        m0 = t.pop("M0", 1.0)
        unit = self.signal(p, t)
        samples = np.shape(unit)[-1]
        dt = self.derivatives(p, t, tuple(k for k in tissue_names if k != "M0"), unit)
        dt["M0"] = unit
        dp = self.protocol_derivatives(p, t, tuple(proto_names), unit) if proto_names else {}
        signal = np.ascontiguousarray(np.broadcast_to(m0 * unit, shape + (samples,)), dtype=ctype)

        def pullback(cotangent):
            g = _reverse.cotangent(cotangent, signal.shape, dtype=np.complex128)
            out = {}
            for k in names:
                d = dt[k] if k == "M0" else m0 * (dt[k] if k in dt else dp[k])
                prod = np.real(np.conj(g) * np.broadcast_to(d, signal.shape))
                if k in tshapes:
                    out[k] = _reverse.reduce_to(prod.sum(axis=-1), tshapes[k])
                else:
                    per_contrast = prod.reshape(-1, samples).sum(axis=0)
                    out[k] = _reverse.reduce_to(per_contrast, np.shape(p[k]))
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
        done = _modifiers.transmit(self, "jacobian", values, diff, order)
        if done is not None:
            return done
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
