"""Helpers the estimators share: ranges and grids, signals, simulated tables,
threads."""
from __future__ import annotations

import numbers
import operator

import numpy as np

from blochsim._engine import dispatch as _dispatch
from blochsim._arrays import validate as V


def _auto_count(name, value):
    """An option that is "auto", None or a positive integer."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    if isinstance(value, str):
        raise ValueError(f"{name} must be a positive integer, 'auto' or None, got {value!r}")
    return V.positive_int(name, value)


def _modelled(sim, name, what):
    if not isinstance(name, str):
        raise TypeError(f"{what}: parameter names are strings, got {name!r}")
    if name not in sim.tissue_properties:
        raise TypeError(f"{what}: {type(sim).__name__} does not model {name!r}; "
                        f"it models {list(sim.tissue_properties)}")


def _ranges(sim, ranges, what):
    """Split keyword ranges into {name: (low, high)} and fixed scalars."""
    spans, fixed = {}, {}
    for name, value in ranges.items():
        _modelled(sim, name, what)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            if not np.isfinite(value):
                raise ValueError(f"{what}: {name} = {value!r} is not finite")
            fixed[name] = float(value)
            continue
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"{what}: {name} must be a (low, high) pair or a fixed number, got {value!r}") from None
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ValueError(f"{what}: range of {name} ({low}, {high}) is not finite")
        if not low < high:
            raise ValueError(f"{what}: range of {name} needs low < high, got ({low}, {high})")
        spans[name] = (low, high)
    return spans, fixed


def _signals(signals, contrasts, what):
    """Signals as a complex array (*voxels, contrasts) on the host."""
    if V.is_device_array(signals):
        raise TypeError(f"{what}: signals are a device array; the estimators take NumPy arrays "
                        f"(copy with .get() or cupy.asnumpy)")
    s = np.asarray(signals)
    if s.ndim == 0 or s.shape[-1] != contrasts:
        raise ValueError(f"{what}: signals have {s.shape[-1] if s.ndim else 0} contrasts along their last "
                         f"axis (shape {s.shape}); the fitted simulator gives {contrasts}")
    if not np.issubdtype(s.dtype, np.number) or np.issubdtype(s.dtype, np.bool_):
        raise TypeError(f"{what}: signals must be numeric, got dtype {s.dtype}")
    bad = ~np.isfinite(s).all(axis=-1)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}: signals are not finite at voxel {at} ({s[at]!r:.60})")
    return s


def _simulate_table(sim, params, fixed, chunk):
    """Signals (n, contrasts) of the parameter columns in ``params``."""
    n = len(next(iter(params.values())))
    parts = []
    for a in range(0, n, chunk):
        kw = {k: v[a:a + chunk] for k, v in params.items()}
        parts.append(np.asarray(sim.simulate(**kw, **fixed)).reshape(len(kw[next(iter(kw))]), -1))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _some_contrasts(n, what):
    """Refuse fitting a simulator that gives no samples: nothing identifies
    the parameters (its maps would be undefined)."""
    if n == 0:
        raise ValueError(f"{what}: the simulator gives no samples (zero contrasts), so there is nothing to "
                         "estimate from")
    return n


def _contrasts(sim, fixed):
    """The number of contrasts sim gives (one probe voxel)."""
    probe = {k: 1.0 for k in sim.required}
    probe.update({k: v for k, v in fixed.items()})
    return np.asarray(sim.simulate(**probe)).shape[-1]


def _levelwise(parts, add=operator.add):
    """Sum an iterable pairwise, level by level (the first two, the next
    two, ..., then the pairs' sums likewise, an odd last one carried up),
    the tree :func:`blochsim.distributed.tree_sum` builds: a binary counter,
    folded from the right at the end, which is that tree for any count
    while holding only log2 of the parts."""
    stack = []  # (size, value), sizes strictly decreasing powers of two
    for v in parts:
        size = 1
        while stack and stack[-1][0] == size:
            v = add(stack.pop()[1], v)
            size *= 2
        stack.append((size, v))
    if not stack:
        raise ValueError("nothing to sum")
    v = stack.pop()[1]
    while stack:
        v = add(stack.pop()[1], v)
    return v


def _threads(sim):
    _dispatch.host_level()
    return _dispatch.call_threads(getattr(sim, "threads", None))
