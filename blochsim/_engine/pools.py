"""Pool properties of the played simulators (SPEC §3): which pools a call
turns on, the checks on their values, and their SI arrays for the kernels."""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._arrays import validate as V

#: the exchanging pools with transverse states, in the order they are filled
POOL_LETTERS = "BCDE"
_POOL_COLUMNS = ("fraction", "exchange", "T1", "T2", "shift")

#: the network beyond the star: dipolar order, a second semisolid pool,
#: pair rates ``exchange_X_Y`` (X before Y in B, C, D, E, bound, bound2)
NETWORK_PROPERTIES = ("bound_T1D", "bound2_fraction", "bound2_exchange", "bound2_T1", "bound2_T2",
                      "bound2_T1D") + V.PAIR_RATES

#: public names of every pool property
POOL_PROPERTIES = ("bound_fraction", "bound_exchange", "bound_T1", "bound_T2") + tuple(
    f"pool{x}_{c}" for x in POOL_LETTERS for c in _POOL_COLUMNS) + NETWORK_PROPERTIES


def _pool_of(name: str) -> str:
    """The prefix whose ``_fraction`` switches on the pool of property
    ``name`` (not a pair rate)."""
    return name.rsplit("_", 1)[0]


#: lineshapes of the semisolid pool (the protocol parameter ``lineshape``)
LINESHAPES = _core.LINESHAPES


def lineshape(offset, bound_T2, shape: str = "super-lorentzian"):
    """Absorption lineshape G of the semisolid pool, as the kernels use it.

    G is a density over angular frequency (integral of G d(2 pi f) = 1), so
    that a field of B1 amplitude w1 (rad/s) saturates the pool at the rate
    W = pi w1^2 G (Henkelman et al. 1993, MRM 29:759).  The
    super-Lorentzian (Morrison & Henkelman 1995, MRM 33:475) is its
    defining integral (to about 1e-10) down to x = 2 pi offset bound_T2 =
    1e-3 (13 Hz at 12 us), where it diverges slowly towards resonance, and
    the even quadratic matched there in value and slope inside that.
    ``"super-lorentzian-cutoff"`` is the classic form (Gloor, Scheffler &
    Bieri 2008, MRM 60:691): the continuation from 1.5 kHz x (12 us /
    bound_T2) instead, 0.5-0.95 of the integral between 50 Hz and 1 kHz.

    Parameters
    ----------
    offset : float or array_like
        Frequency offset from the pool's resonance, Hz.
    bound_T2 : float or array_like
        T2 of the semisolid pool, ms (broadcast against ``offset``).
    shape : {"super-lorentzian", "lorentzian", "gaussian", "super-lorentzian-cutoff"}

    Returns
    -------
    numpy.ndarray, float64, the broadcast shape
        G in seconds (per rad/s).
    """
    if shape not in LINESHAPES:
        raise ValueError(f"shape must be one of {list(LINESHAPES)}, got {shape!r}")
    f = V.as_float_array("offset", offset)
    V.check_finite("offset", f)
    t2 = V.as_float_array("bound_T2", bound_T2)
    V.check_finite("bound_T2", t2)
    V.check_bound("bound_T2", t2, 0.0, True, "ms")
    f, t2 = np.broadcast_arrays(np.asarray(f, np.float64), np.asarray(t2, np.float64) * 1e-3)
    x = np.ascontiguousarray((2.0 * np.pi * f * t2).reshape(-1))
    g = np.empty_like(x)
    dg = np.empty_like(x)
    _core.lineshape_values(LINESHAPES.index(shape), x, g, dg)
    return (g * t2.reshape(-1)).reshape(f.shape)


def any_pool(names) -> bool:
    """Whether any pool property is among ``names``."""
    return any(k in POOL_PROPERTIES for k in names)


def configuration(names, owner: str):
    """(n_exchanging, semisolid pools, dipolar) of a call naming the tissue
    properties ``names``: the exchanging pools B-E, the semisolid pools
    (``bound``, then ``bound2``), and how many of those carry dipolar
    order (a T1D).

    Refuses a pool property given without its fraction, a pair rate whose
    pools are not both on, an exchanging pool named while an earlier
    letter is missing (pools fill B, C, D, E in order), a second semisolid
    pool without the first, and diffusion or flow with pools.
    """
    names = set(names)
    for k in names:
        if k in V.PAIR_RATES:
            for x in k.split("_")[1:]:
                frac = (x if x.startswith("bound") else f"pool{x}") + "_fraction"
                if frac not in names:
                    raise ValueError(f"{k} was given without {frac}: a pair rate links two pools that are on")
        elif k in POOL_PROPERTIES and not k.endswith("_fraction"):
            frac = _pool_of(k) + "_fraction"
            if frac not in names:
                raise ValueError(f"{k} was given without {frac}: a pool is switched on by its fraction")
    n = 0
    for i, x in enumerate(POOL_LETTERS):
        if f"pool{x}_fraction" in names:
            if i != n:
                raise ValueError(f"pool{x}_fraction was given without pool{POOL_LETTERS[n]}_fraction: "
                                 f"exchanging pools are named in order (B, C, D, E)")
            n += 1
    bound = int("bound_fraction" in names)
    if "bound2_fraction" in names:
        if not bound:
            raise ValueError("bound2_fraction was given without bound_fraction: semisolid pools are named in "
                             "order (bound, bound2)")
        bound = 2
    for k in ("D", "v"):
        if k in names and (n or bound):
            raise ValueError(f"{owner}: {k} is not modelled together with pools (SPEC §3); "
                             f"simulate the pools without {k}")
    return n, bound, int("bound_T1D" in names) + int("bound2_T1D" in names)


def check_fractions(arrays: dict, shape) -> None:
    """Refuses fractions above 1 or summing past 1 in any voxel."""
    fracs = {k: v for k, v in arrays.items() if k.endswith("_fraction")}
    for k, v in fracs.items():
        v = np.asarray(v)
        V.check_bound(k, v, 0.0, False)
        bad = v > 1.0
        if np.any(bad):
            raise ValueError(f"{k} must be <= 1, got {V._first_bad(v, bad)}")
    if len(fracs) < 2:
        return
    total = sum(np.broadcast_to(np.asarray(v, dtype=np.float64), shape) for v in fracs.values())
    bad = total > 1.0 + 1e-6
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0]) if np.ndim(total) else ()
        parts = ", ".join(f"{k}={float(np.broadcast_to(v, shape)[where]):g}" for k, v in fracs.items())
        raise ValueError(f"pool fractions sum to {float(total[where]):g} > 1 at voxel {where} ({parts}); "
                         f"free water holds 1 minus their sum")


def field_index(name: str) -> int:
    """The kernels' field index of a tissue or pool property (public name)."""
    si = V.TISSUE_UNITS[name][1]
    if si in _core.TISSUE_FIELDS:
        return _core.TISSUE_FIELDS.index(si)
    return len(_core.TISSUE_FIELDS) + _core.POOL_FIELDS.index(si)


def drop_idle(tissue: dict, names, owner: str) -> dict:
    """``tissue`` without the pools whose fraction is 0 in every voxel and
    whose properties are not differentiated (``names``): such a pool holds
    no magnetisation and exchanges none, so the call plays as if it were
    absent (and, with no pool left, through the single-pool kernels, with
    their results bit for bit).  Checks the pool configuration first."""
    configuration(tissue, owner)
    on_device = any(V.is_device_array(v) for v in tissue.values())
    if on_device:
        from blochsim._arrays.device import to_host

    host = {k: V.tissue_array(k, to_host(k, v) if V.is_device_array(v) else v)
            for k, v in tissue.items() if k in POOL_PROPERTIES}
    fracs = {k: v for k, v in host.items() if k.endswith("_fraction")}
    if fracs:
        check_fractions(fracs, V.broadcast_voxels(fracs))
    if on_device:
        # device arrays stay in the pooled path (whose results equal the
        # single-pool ones to round-off) rather than coming back to the host
        return tissue
    names = set(names)
    if any(k in NETWORK_PROPERTIES for k in tissue):
        # a network's pools stay as named (a pair rate names both of its pools)
        return tissue

    def idle(prefix):
        frac = host.get(prefix + "_fraction")
        return frac is not None and not np.any(frac) and not any(k.startswith(prefix + "_") for k in names)

    drop = []
    if idle("bound"):
        drop.append("bound")
    for x in reversed(POOL_LETTERS):
        if f"pool{x}_fraction" not in host:
            continue
        if not idle(f"pool{x}"):
            break
        drop.append(f"pool{x}")
    if not drop:
        return tissue
    kept = {k: v for k, v in tissue.items() if not any(k.startswith(d + "_") for d in drop)}
    # the dropped properties still shape the result: the first kept one carries their shape
    full = V.broadcast_voxels({k: np.asarray(v) for k, v in tissue.items()})
    first = next(iter(kept), None)
    if first is not None and V.broadcast_voxels({k: np.asarray(v) for k, v in kept.items()}) != full:
        kept[first] = np.broadcast_to(V.tissue_array(first, kept[first]), full)
    return kept
