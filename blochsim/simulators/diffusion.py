"""Diffusion and perfusion: diffusion-weighted and tensor signals, arterial
spin labelling."""
from __future__ import annotations

import numpy as np

from blochsim._arrays import validate as V
from blochsim.simulator import ClosedFormSimulator
from blochsim.simulators._common import _complex_step, _echo_within, _function_form, _need, _scalar

__all__ = ["ASLSimulator", "DiffusionSimulator", "DiffusionTensorSimulator", "asl_sim", "dti_sim", "dwi_sim"]


class DiffusionSimulator(ClosedFormSimulator):
    """Diffusion-weighted spin echo (Stejskal & Tanner 1965, J Chem Phys
    42:288): S = M0 · A · e^{−b·D}, with A the spin echo's weighting,
    e^{−TE/T2} for one shot (TR None) or (1 − 2e^{−(TR−TE/2)/T1} +
    e^{−TR/T1}) e^{−TE/T2} with repetition.  ``b`` is in s/mm² and D in
    µm²/ms (b·D = b·D·1e-3).

    Parameters
    ----------
    b : array_like, s/mm²
        b-value per contrast.
    TE : float, ms
    TR : float, ms, optional

    Tissue: T2, D (µm²/ms, required), T1 (ms, needed with TR), M0.

    Examples
    --------
    >>> from blochsim.simulators import DiffusionSimulator
    >>> DiffusionSimulator(b=[0.0, 1000.0], TE=80.0).simulate(T2=80.0, D=0.7).real.round(4)
    array([0.3679, 0.1827])
    """

    protocol = {"b": None, "TE": None, "TR": None}
    tissue_properties = ("T1", "T2", "M0", "D")
    required = ("T2", "D")

    def check_protocol(self, p):
        if p["b"] is None or p["TE"] is None:
            return p
        p["b"] = np.atleast_1d(V.protocol_array("b", p["b"], low=0.0, unit="s/mm^2"))
        p["TE"] = _scalar("TE", p["TE"], low=0.0, unit="ms")
        if p["TR"] is not None:
            p["TR"] = _scalar("TR", p["TR"], low=0.0, strict=True, unit="ms")
            _echo_within(p, p["TR"])
        return p

    def signal(self, p, t):
        _need(self, p, ("b", "TE"))
        a = np.exp(-p["TE"] / t["T2"])
        if p["TR"] is not None:
            if "T1" not in t:
                raise TypeError("DiffusionSimulator needs tissue property 'T1' with a TR")
            T1 = t["T1"]
            a = a * (1 - 2 * np.exp(-(p["TR"] - p["TE"] / 2) / T1) + np.exp(-p["TR"] / T1))
        return t.get("M0", 1.0) * a * np.exp(-1e-3 * p["b"] * t["D"])

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)


TENSOR = ("Dxx", "Dyy", "Dzz", "Dxy", "Dxz", "Dyz")


class DiffusionTensorSimulator(DiffusionSimulator):
    """Diffusion tensor imaging (Basser, Mattiello & LeBihan 1994, Biophys
    J 66:259): the spin echo of :class:`DiffusionSimulator` with the
    diffusion weighting of gradient direction g,

        S = M0 · A · e^{−b gᵀ D g},

    D the symmetric tensor (Dxx, Dyy, Dzz, Dxy, Dxz, Dyz; µm²/ms, the
    scanner frame).  :meth:`fit_tensor` inverts it (log-linear least
    squares).

    Parameters
    ----------
    b : array_like, s/mm², shape (n,)
    directions : array_like, shape (n, 3)
        Gradient direction per contrast (normalised here; any row for b = 0).
    TE : float, ms
    TR : float, ms, optional

    Tissue: T2 (ms), Dxx, Dyy, Dzz (µm²/ms, required), Dxy, Dxz, Dyz
    (default 0), T1 (ms, needed with TR), M0.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import DiffusionTensorSimulator
    >>> g = np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]])
    >>> sim = DiffusionTensorSimulator(b=[0.0] + [1000.0] * 6, directions=g, TE=80.0)
    >>> s = sim.simulate(T2=80.0, Dxx=1.7, Dyy=0.3, Dzz=0.3)
    >>> {k: round(float(v), 3) for k, v in sim.fit_tensor(s).items() if k in ("Dxx", "Dyy")}
    {'Dxx': 1.7, 'Dyy': 0.3}
    """

    protocol = {"b": None, "directions": None, "TE": None, "TR": None}
    tissue_properties = ("T1", "T2", "M0") + TENSOR
    required = ("T2", "Dxx", "Dyy", "Dzz")

    def check_protocol(self, p):
        p = super().check_protocol(p)
        if p["b"] is None or p["TE"] is None:
            return p
        if p["directions"] is None:
            raise ValueError("DiffusionTensorSimulator needs directions, one (x, y, z) per b-value")
        g = np.asarray(p["directions"])
        # integer directions ((1, 0, 0), ...) are exact and common: take them as floats
        g = V.protocol_array("directions", g.astype(np.float64) if g.dtype.kind in "iu" else g, ndim_max=2)
        if g.shape != (p["b"].shape[0], 3):
            raise ValueError(f"directions must have shape ({p['b'].shape[0]}, 3), one per b-value, got {g.shape}")
        norm = np.linalg.norm(g, axis=1)
        if np.any((norm == 0) & (p["b"] > 0)):
            raise ValueError(f"directions has a zero row at b > 0 (row {int(np.argmax((norm == 0) & (p['b'] > 0)))})")
        p["directions"] = g / np.where(norm > 0, norm, 1.0)[:, None]
        return p

    @staticmethod
    def _design(g):
        """Rows (gx², gy², gz², 2gxgy, 2gxgz, 2gygz): gᵀDg = row · tensor."""
        x, y, z = g.T
        return np.stack([x * x, y * y, z * z, 2 * x * y, 2 * x * z, 2 * y * z], axis=1)

    def signal(self, p, t):
        _need(self, p, ("b", "TE", "directions"))
        adc = sum(t.get(k, 0.0) * c for k, c in zip(TENSOR, self._design(p["directions"]).T))
        flat = {k: v for k, v in t.items() if k not in TENSOR}
        return DiffusionSimulator.signal(self, p, {**flat, "D": adc})

    def fit_tensor(self, signals, **protocol):
        """The tensor and the b = 0 signal from signals by log-linear least
        squares (Basser 1994).

        Parameters
        ----------
        signals : array_like, shape (*voxels, n)
            Magnitudes are used; the design needs at least six
            non-collinear directions at b > 0 and one b = 0 or a seventh
            measurement.
        **protocol
            Protocol overrides, as for :meth:`simulate`.

        Returns
        -------
        dict
            ``Dxx`` … ``Dyz`` (µm²/ms) and ``S0`` (the signal at b = 0),
            each shaped ``voxels``.
        """
        p = self._protocol_values(protocol)
        _need(self, p, ("b", "TE", "directions"))
        s = np.abs(np.asarray(signals))
        if s.shape[-1:] != p["b"].shape:
            raise ValueError(f"signals must end in {p['b'].shape[0]} contrasts, got shape {s.shape}")
        A = np.concatenate([np.ones((p["b"].shape[0], 1)), -1e-3 * p["b"][:, None] * self._design(p["directions"])],
                           axis=1)
        if np.linalg.matrix_rank(A) < 7:
            raise ValueError("the b-values and directions do not determine the tensor (fewer than six "
                             "independent directions, or no b = 0)")
        y = np.log(np.maximum(s, np.finfo(float).tiny)).reshape(-1, s.shape[-1])
        x = np.linalg.lstsq(A, y.T, rcond=None)[0]
        out = {k: x[i + 1].reshape(s.shape[:-1]) for i, k in enumerate(TENSOR)}
        out["S0"] = np.exp(x[0]).reshape(s.shape[:-1])
        return out


class ASLSimulator(ClosedFormSimulator):
    """Arterial spin labelling difference signal by the general kinetic
    model (Buxton et al. 1998, MRM 40:383): labelled blood arrives after
    the transit time ATT, exchanges into tissue (single compartment, blood
    –tissue partition λ) and relaxes there with the apparent T1app =
    1/(1/T1 + f/λ):

        ΔM(t) = 2 M0b f ∫ c(t') e^{−(t − t')/T1app} dt',

    f = CBF/6000 (ml/g/s), M0b = M0/λ, and the delivery c(t') = α e^{−ATT/T1b}
    (pCASL, a label of duration τ leaving the labelling plane from 0 to τ)
    or α e^{−t'/T1b} (PASL, a bolus of duration τ), for ATT ≤ t' ≤ ATT + τ.

    Parameters
    ----------
    times : array_like, ms
        pCASL: post-labelling delays (readout at τ + PLD); PASL: inversion
        times (readout at TI).
    labeling : "pcasl" or "pasl"
    tau : float, ms
        Label (or bolus) duration.
    alpha : float
        Labelling efficiency.
    T1blood : float, ms
        Arterial blood T1 (1650 ms at 3 T).
    partition : float, ml/g
        λ.

    Tissue: CBF (ml/100 g/min, required), ATT (ms), T1 (ms, default
    T1blood), M0.

    Examples
    --------
    >>> from blochsim.simulators import ASLSimulator
    >>> asl = ASLSimulator(times=[1800.0], tau=1800.0)
    >>> float(asl.simulate(CBF=60.0, ATT=1000.0, M0=1.0).real[0].round(5))
    0.00683
    """

    protocol = {"times": None, "labeling": "pcasl", "tau": 1800.0, "alpha": 0.85, "T1blood": 1650.0,
                "partition": 0.9}
    tissue_properties = ("CBF", "ATT", "T1", "M0")
    required = ("CBF",)

    def check_protocol(self, p):
        if p["times"] is None:
            return p
        p["times"] = np.atleast_1d(V.protocol_array("times", p["times"], low=0.0, unit="ms"))
        if p["labeling"] not in ("pcasl", "pasl"):
            raise ValueError(f"labeling must be 'pcasl' or 'pasl', got {p['labeling']!r}")
        p["tau"] = _scalar("tau", p["tau"], low=0.0, strict=True, unit="ms")
        p["alpha"] = _scalar("alpha", p["alpha"], low=0.0)
        if p["alpha"] > 1.0:
            raise ValueError(f"alpha (the labelling efficiency) must be <= 1, got {p['alpha']:g}")
        p["T1blood"] = _scalar("T1blood", p["T1blood"], low=0.0, strict=True, unit="ms")
        p["partition"] = _scalar("partition", p["partition"], low=0.0, strict=True)
        return p

    def signal(self, p, t):
        if p["times"] is None:
            raise TypeError("ASLSimulator needs protocol parameter 'times'")
        lam, tau, T1b = p["partition"], p["tau"] * 1e-3, p["T1blood"] * 1e-3
        f = t["CBF"] / 6000.0
        att = t.get("ATT", 0.0) * 1e-3
        T1 = t.get("T1", p["T1blood"]) * 1e-3
        k_app = 1 / T1 + f / lam
        tt = (p["times"] + (p["tau"] if p["labeling"] == "pcasl" else 0.0)) * 1e-3
        # the arrived part of the label: [att, min(t, att + tau)], as a span
        # (real parts decide the branches, so that a complex step passes)
        d = tt - att
        inside = (np.real(d) > 0) & (np.real(d) < tau)
        span = np.where(inside, d, np.clip(np.real(d), 0.0, tau))
        arrived = np.real(d) > 0
        # time since the first arrival (0 before it), so that no exponent is positive
        lead = np.where(arrived, tt - att, 0.0)
        if p["labeling"] == "pcasl":
            # ∫_att^end e^{-att/T1b} e^{-(t - t')k} dt' = e^{-att/T1b} e^{-(t - end)k} (1 - e^{-span k})/k
            integral = np.exp(-att / T1b) * np.exp(-(lead - span) * k_app) * -np.expm1(-span * k_app) / k_app
        else:
            # ∫_att^end e^{-t'/T1b} e^{-(t - t')k} dt' = e^{-att/T1b} [e^{-(t - att)k} - e^{-(t - end)k - span/T1b}] / kd
            # with kd = 1/T1b - k (its limit span e^{-(t - att)k} as kd -> 0)
            kd = 1 / T1b - k_app
            small = np.abs(kd) * tau < 1e-8
            kd_safe = np.where(small, 1.0, kd)
            first = np.exp(-lead * k_app)
            last = np.exp(-(lead - span) * k_app - span / T1b)
            integral = np.exp(-att / T1b) * np.where(small, span * first, (first - last) / kd_safe)
        return 2 * t.get("M0", 1.0) / lam * f * p["alpha"] * integral

    def derivatives(self, p, t, names, s):
        return _complex_step(self, p, t, names)


dwi_sim = _function_form(DiffusionSimulator, "dwi_sim")
asl_sim = _function_form(ASLSimulator, "asl_sim")
dti_sim = _function_form(DiffusionTensorSimulator, "dti_sim")
