"""One unknown from one real feature of the signal, by interpolation in a
simulated table."""
from __future__ import annotations

import numpy as np

from blochsim.estimators._common import _modelled, _signals, _simulate_table, _some_contrasts


class LookupTable:
    """One unknown from one real feature of the signal, by interpolation.

    Parameters
    ----------
    simulator : blochsim.Simulator or blochsim.ClosedFormSimulator
    feature : callable, optional
        ``feature(signals)`` maps signals (n, contrasts) to one real value
        each (n,).  Default: the real part of a one-contrast signal.

    Examples
    --------
    >>> import numpy as np
    >>> from blochsim.simulators import InversionRecoverySimulator
    >>> from blochsim.estimators import LookupTable
    >>> sim = InversionRecoverySimulator(TI=[400.0])
    >>> lut = LookupTable(sim).fit(T1=np.linspace(100.0, 3000.0, 500))
    >>> float(np.round(lut.map(sim.simulate(T1=900.0))["T1"], 1))
    900.0
    """

    def __init__(self, simulator, feature=None):
        self.simulator = simulator
        if feature is not None and not callable(feature):
            raise TypeError(f"feature must be callable, got {type(feature).__name__}")
        self.feature = feature
        self._table = None

    def _feature(self, s, what):
        if self.feature is not None:
            f = np.asarray(self.feature(s), dtype=np.float64)
            if f.shape != s.shape[:1]:
                raise ValueError(f"{what}: feature must give one value per signal, got shape {f.shape} for "
                                 f"{s.shape[0]} signals")
            return f
        if s.shape[1] != 1:
            raise ValueError(f"{what}: the signal has {s.shape[1]} contrasts; give a feature that reduces them "
                             f"to one real value")
        return np.real(s[:, 0]).astype(np.float64)

    def fit(self, **grid):
        """Tabulate the feature over one parameter's grid.

        Parameters
        ----------
        **grid
            Exactly one ``name=values`` (1-D array, the unknown) and any
            number of fixed ``name=value``.

        Returns
        -------
        LookupTable
            self, fitted.  The table keeps the longest run of the grid over
            which the feature is strictly monotonic; signals whose feature
            falls outside that run map to NaN.
        """
        axes, fixed = {}, {}
        for k, v in grid.items():
            _modelled(self.simulator, k, "LookupTable.fit")
            a = np.asarray(v, dtype=np.float64)
            if a.ndim == 0:
                fixed[k] = float(a)
            elif a.ndim == 1 and len(a) >= 2 and np.all(np.isfinite(a)):
                axes[k] = np.sort(a)
            else:
                raise ValueError(f"LookupTable.fit: {k} must be a finite 1-D array of at least 2 values "
                                 f"or a number")
        if len(axes) != 1:
            raise ValueError(f"LookupTable.fit: exactly one unknown (a 1-D array) is needed, got "
                             f"{list(axes) or 'none'}")
        (name, values), = axes.items()
        s = _simulate_table(self.simulator, {name: values}, fixed, 65536)
        self.contrasts = _some_contrasts(s.shape[1], "LookupTable.fit")
        f = self._feature(s, "LookupTable.fit")
        if not np.all(np.isfinite(f)):
            bad = int(np.flatnonzero(~np.isfinite(f))[0])
            raise ValueError(f"LookupTable.fit: the feature is not finite at {name} = {float(values[bad])!r}")
        # the longest strictly monotonic run
        step = np.sign(np.diff(f))
        best, start = (0, 0), 0
        for i in range(1, len(step) + 1):
            if i == len(step) or step[i] != step[start] or step[i] == 0:
                if step[start] != 0 and i - start > best[1] - best[0]:
                    best = (start, i)
                start = i
        if best[1] == best[0]:
            raise ValueError(f"LookupTable.fit: the feature is not monotonic anywhere over the {name} grid")
        run = slice(best[0], best[1] + 1)
        fv, pv = f[run], values[run]
        if fv[0] > fv[-1]:
            fv, pv = fv[::-1], pv[::-1]
        self.name, self.fixed, self._table = name, fixed, (fv, pv)
        self.valid = (float(pv.min()), float(pv.max()))
        return self

    def map(self, signals):
        """The unknown of each signal.

        Parameters
        ----------
        signals : array_like, shape (*voxels, contrasts)

        Returns
        -------
        dict
            ``{name: values}`` shaped ``voxels`` (float64; NaN outside the
            table's monotonic run).
        """
        if self._table is None:
            raise RuntimeError("LookupTable.map needs a fitted table: call fit() first")
        s = _signals(signals, self.contrasts, "LookupTable.map")
        shape = s.shape[:-1]
        f = self._feature(s.reshape(-1, self.contrasts), "LookupTable.map")
        fv, pv = self._table
        out = np.interp(f, fv, pv, left=np.nan, right=np.nan)
        return {self.name: out.reshape(shape)}
