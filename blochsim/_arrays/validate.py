"""Checks on user input, made before any kernel runs (SPEC §8).

Every refusal names the parameter and the offending value.  Public units are
the console's (ms, degrees, Hz, µm²/ms, m/s); conversion to SI happens here.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from blochsim._engine.dispatch import cuda_status, is_device_array

# Public name -> (factor to SI, SI name, lower bound or None, strict bound?)
TISSUE_UNITS = {
    "T1": (1e-3, "T1_s", 0.0, True),
    "T2": (1e-3, "T2_s", 0.0, True),
    "T2star": (1e-3, "T2star_s", 0.0, True),
    # reversible (Lorentzian) dephasing, applied to samples by their dephasing time
    "T2prime": (1e-3, "T2prime_s", 0.0, True),
    "M0": (1.0, "M0", None, False),
    "B1": (1.0, "B1", None, False),
    "B0": (1.0, "B0_hz", None, False),
    "B1phase": (np.pi / 180.0, "B1phase_rad", None, False),
    "inv_efficiency": (1.0, "inv_efficiency", None, False),
    "D": (1e-9, "D_m2_s", 0.0, False),
    "v": (1.0, "v_m_s", None, False),
    # the diffusion tensor's components (µm²/ms) in the scanner frame
    "Dxx": (1e-9, "Dxx_m2_s", 0.0, False),
    "Dyy": (1e-9, "Dyy_m2_s", 0.0, False),
    "Dzz": (1e-9, "Dzz_m2_s", 0.0, False),
    "Dxy": (1e-9, "Dxy_m2_s", None, False),
    "Dxz": (1e-9, "Dxz_m2_s", None, False),
    "Dyz": (1e-9, "Dyz_m2_s", None, False),
    # water-fat imaging: the fat share of M0
    "fat_fraction": (1.0, "fat_fraction", 0.0, False),
    # arterial spin labelling: cerebral blood flow (ml/100 g/min) and the
    # arterial transit time (ms)
    "CBF": (1.0, "CBF", 0.0, False),
    "ATT": (1e-3, "ATT_s", 0.0, False),
    # pools (SPEC §3): fractions of the equilibrium magnetisation, exchange
    # rate constants in Hz, times in ms, chemical shifts in Hz
    "bound_fraction": (1.0, "bound_fraction", 0.0, False),
    "bound_exchange": (1.0, "bound_exchange_hz", 0.0, False),
    "bound_T1": (1e-3, "bound_T1_s", 0.0, True),
    "bound_T2": (1e-3, "bound_T2_s", 0.0, True),
    # the exchange network beyond the star (SPEC §3): dipolar order (T1D,
    # ms), a second semisolid pool, a rate constant (Hz) per pair of pools
    "bound_T1D": (1e-3, "bound_T1D_s", 0.0, True),
    "bound2_fraction": (1.0, "bound2_fraction", 0.0, False),
    "bound2_exchange": (1.0, "bound2_exchange_hz", 0.0, False),
    "bound2_T1": (1e-3, "bound2_T1_s", 0.0, True),
    "bound2_T2": (1e-3, "bound2_T2_s", 0.0, True),
    "bound2_T1D": (1e-3, "bound2_T1D_s", 0.0, True),
}
#: the pools a pair rate names, in the order its name gives them
NETWORK_POOLS = ("B", "C", "D", "E", "bound", "bound2")
PAIR_RATES = tuple(f"exchange_{a}_{b}" for i, a in enumerate(NETWORK_POOLS) for b in NETWORK_POOLS[i + 1:])
for _k in PAIR_RATES:
    TISSUE_UNITS[_k] = (1.0, _k + "_hz", 0.0, False)
for _x in "BCDE":
    TISSUE_UNITS.update({
        f"pool{_x}_fraction": (1.0, f"pool{_x}_fraction", 0.0, False),
        f"pool{_x}_exchange": (1.0, f"pool{_x}_exchange_hz", 0.0, False),
        f"pool{_x}_T1": (1e-3, f"pool{_x}_T1_s", 0.0, True),
        f"pool{_x}_T2": (1e-3, f"pool{_x}_T2_s", 0.0, True),
        f"pool{_x}_shift": (1.0, f"pool{_x}_shift_hz", None, False),
    })

#: the tissue properties by their SI field names
SI_TO_PUBLIC = {v[1]: k for k, v in TISSUE_UNITS.items()}

# properties bounded above too (shares of the magnetisation)
_FLOAT32_MAX = float(np.finfo(np.float32).max)
UPPER_BOUNDS = {"fat_fraction": 1.0}
# |value| past which single precision cannot carry a property through the
# kernels exactly (signals and derivatives within float32; phases of B0 and
# shifts over a second resolved to a fraction of a degree)
MAGNITUDE_BOUNDS = {"M0": 1e30, "B0": 1e6, "B1": 1e3, "v": 1e3, **{f"pool{x}_shift": 1e6 for x in "BCDE"}}

UNIT_NAMES = {
    "T1": "ms", "T2": "ms", "T2star": "ms", "T2prime": "ms", "M0": "", "B1": "", "B0": "Hz",
    "B1phase": "deg", "inv_efficiency": "", "D": "um^2/ms", "v": "m/s", "Dxx": "um^2/ms", "Dyy": "um^2/ms", "Dzz": "um^2/ms",
    "Dxy": "um^2/ms", "Dxz": "um^2/ms", "Dyz": "um^2/ms", "fat_fraction": "", "CBF": "ml/100g/min", "ATT": "ms",
    "bound_fraction": "", "bound_exchange": "Hz", "bound_T1": "ms", "bound_T2": "ms", "bound_T1D": "ms",
    "bound2_fraction": "", "bound2_exchange": "Hz", "bound2_T1": "ms", "bound2_T2": "ms", "bound2_T1D": "ms",
    **{k: "Hz" for k in PAIR_RATES},
}
for _x in "BCDE":
    UNIT_NAMES.update({f"pool{_x}_fraction": "", f"pool{_x}_exchange": "Hz", f"pool{_x}_T1": "ms",
                       f"pool{_x}_T2": "ms", f"pool{_x}_shift": "Hz"})


def _first_bad(arr: np.ndarray, mask: np.ndarray) -> str:
    if arr.ndim == 0:
        return repr(arr.item())
    where = tuple(int(i) for i in np.argwhere(mask)[0])
    return f"{arr[where].item()!r} at index {where}"


def as_float_array(name: str, value) -> np.ndarray:
    """Return ``value`` as a floating NumPy array or raise naming ``name``.

    Python numbers and sequences of them are accepted; NumPy arrays must
    already have a floating dtype (an integer or complex array is refused,
    since a silent cast would hide a unit or type mistake).
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real floating-point value, got {value!r}")
    if isinstance(value, numbers.Real) and not isinstance(value, np.generic):
        return np.asarray(float(value), dtype=np.float64)
    if isinstance(value, (list, tuple)):
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be real numbers, got {value!r}") from None
        return arr
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if not np.issubdtype(arr.dtype, np.floating):
            raise TypeError(
                f"{name} must have a floating-point dtype (float32 or float64), got dtype {arr.dtype}")
        return arr
    raise TypeError(f"{name} must be a float or an array of floats, got {type(value).__name__}")


def check_finite(name: str, arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr)
    if np.any(bad):
        raise ValueError(f"{name} must be finite, got {_first_bad(arr, bad)}")


def check_bound(name: str, arr: np.ndarray, low: float, strict: bool, unit: str = "") -> None:
    bad = arr <= low if strict else arr < low
    if np.any(bad):
        op = ">" if strict else ">="
        u = f" {unit}" if unit else ""
        raise ValueError(f"{name} must be {op} {low:g}{u}, got {_first_bad(arr, bad)}")


def distinct(arr: np.ndarray) -> np.ndarray:
    """A view of ``arr`` holding each of its values once along every axis it
    repeats with stride 0 (a broadcast view): what a check of its values
    needs, never more memory than the array owns."""
    if arr.ndim == 0 or 0 not in arr.strides:
        return arr
    return arr[tuple(slice(0, 1) if st == 0 else slice(None) for st in arr.strides)]


def tissue_array(name: str, value) -> np.ndarray:
    """Validate one tissue property in public units; returns float array.
    The checks read each stored value once: a broadcast view (zero
    strides) is checked without being expanded, and every bound is judged
    from the least and greatest values (two reductions; NaN carries through
    both); only a failure looks at the values one by one, to name the
    first that fails."""
    if is_device_array(value):
        raise device_unavailable_error(name)
    given = as_float_array(name, value)
    arr = distinct(given)
    if arr.size == 0:
        return given
    lo, hi = float(arr.min()), float(arr.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        check_finite(name, arr)
    scale, _, low, strict = TISSUE_UNITS[name]
    if low is not None and (lo <= low if strict else lo < low):
        check_bound(name, arr, low, strict, UNIT_NAMES[name])
    if name in UPPER_BOUNDS and hi > UPPER_BOUNDS[name]:
        raise ValueError(f"{name} must be <= {UPPER_BOUNDS[name]:g}, got {_first_bad(arr, arr > UPPER_BOUNDS[name])}")
    peak = max(-lo, hi)
    bound = MAGNITUDE_BOUNDS.get(name)
    if bound is not None and peak > bound:
        u = f" {UNIT_NAMES[name]}" if UNIT_NAMES.get(name) else ""
        raise ValueError(f"{name} must be within +-{bound:g}{u} (single precision carries no more), got "
                         f"{_first_bad(arr, np.abs(arr) > bound)}")
    if peak * scale > _FLOAT32_MAX:
        raise ValueError(f"{name} is beyond single precision in SI units, got "
                         f"{_first_bad(arr, np.abs(arr) * scale > _FLOAT32_MAX)}")
    return given


def device_unavailable_error(name: str) -> Exception:
    ok, why = cuda_status()
    return RuntimeError(
        f"{name} is a device array (__cuda_array_interface__), but the CUDA backend cannot run: {why}")


def broadcast_voxels(arrays: dict) -> tuple:
    """The voxel shape the tissue arrays broadcast to, or a ValueError naming them."""
    try:
        return np.broadcast_shapes(*(a.shape for a in arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {tuple(a.shape)}" for k, a in arrays.items())
        raise ValueError(f"tissue properties do not broadcast to one voxel shape: {shapes}") from None


def protocol_array(name: str, value, *, low=None, strict=False, unit="", ndim_max=1,
                   length=None) -> np.ndarray:
    """Validate a protocol parameter (float64, finite, optional bound and shape)."""
    if is_device_array(value):
        raise TypeError(f"{name} is a protocol parameter and must be a host value, not a device array")
    arr = np.asarray(as_float_array(name, value), dtype=np.float64)
    if arr.ndim > ndim_max:
        raise ValueError(f"{name} must have at most {ndim_max} dimension(s), got shape {arr.shape}")
    check_finite(name, arr)
    if low is not None:
        check_bound(name, arr, low, strict, unit)
    if length is not None and arr.ndim == 1 and arr.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries, got {arr.shape[0]}")
    return arr


def positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def si_planes(arrays: dict, shape, si_names, ranges_only=False) -> tuple:
    """The arrays (public names and units) as float32 SI values, flat
    (length n of the voxel shape, or 1 for a scalar), in the order of the
    SI names ``si_names``; None where a property is absent.  With
    ``ranges_only`` each holds the array's values once (axes broadcast with
    zero strides taken once, nothing broadcast to the voxel shape): the
    same range, for a check that needs no more."""
    out = []
    for name in si_names:
        pub = SI_TO_PUBLIC.get(name)
        if pub in arrays:
            a = arrays[pub]
            if a.size == 1:  # a scalar: its SI value rounded to float32 once
                out.append(np.array([float(a.reshape(-1)[0]) * TISSUE_UNITS[pub][0]], dtype=np.float32))
                continue
            if ranges_only:
                a = distinct(np.asarray(a))
            flat = np.asarray(a, dtype=np.float64).reshape(-1) if ranges_only else np.broadcast_to(a, shape).reshape(-1)
            out.append(np.ascontiguousarray(flat * TISSUE_UNITS[pub][0], dtype=np.float32))
        else:
            out.append(None)
    return tuple(out)


def check_host_out(name, a, want):
    """Refuses a host output that is not a writeable C-contiguous complex64
    NumPy array of shape ``want``."""
    if not isinstance(a, np.ndarray) or a.dtype != np.complex64 or a.shape != want \
            or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError(
            f"{name} must be a writeable C-contiguous complex64 array of shape {want}, got "
            f"{type(a).__name__} {getattr(a, 'dtype', '')} {getattr(a, 'shape', '')}")


def jacobian_out_shapes(out, shape, count, samples, one):
    """(name, array, wanted shape) of a Jacobian's ``out`` pair: the signal
    (*shape, samples) and J (*shape, count, samples), or (*shape, samples)
    for ``one`` name."""
    return [("out[0]", out[0], shape + (samples,)),
            ("out[1]", out[1], shape + ((samples,) if one else (count, samples)))]


def into(out, s):
    """``s`` as complex64, written into ``out`` when one is given (and
    checked); a device array stays one, of its library."""
    if is_device_array(s):
        if getattr(s, "dtype", None) != np.complex64:
            if hasattr(s, "astype"):
                s = s.astype(np.complex64)
            else:  # a PyTorch tensor
                import torch

                s = s.to(torch.complex64)
        if out is None:
            return s
        if not is_device_array(out) or tuple(out.shape) != tuple(s.shape) or out.dtype != s.dtype:
            raise ValueError(f"out must be a complex64 device array of shape {tuple(s.shape)}")
        out[...] = s
        return out
    s = np.asarray(s).astype(np.complex64)
    if out is None:
        return s
    check_host_out("out", out, s.shape)
    out[...] = s
    return out


def shim_weights(raw, channels):
    """The shim weights of parallel transmission, complex128: (channels,)
    for every pulse, or (pulses, channels) one row per RF pulse;
    ``channels`` -1 takes any count."""
    if is_device_array(raw):
        raise TypeError("shim is a protocol parameter and must be a host value, not a device array")
    w = np.asarray(raw)
    if w.dtype.kind not in "biufc":
        raise TypeError(f"shim must be complex numbers, one per channel, got dtype {w.dtype}")
    w = w.astype(np.complex128)
    if w.ndim not in (1, 2) or w.shape[-1] == 0 or (w.ndim == 2 and w.shape[0] == 0):
        raise ValueError(f"shim must have shape (channels,) or (pulses, channels), got {w.shape}")
    if channels >= 0 and w.shape[-1] != channels:
        raise ValueError(f"shim has {w.shape[-1]} weights per pulse but B1 has {channels} channel(s) on its first "
                         f"axis")
    if not np.all(np.isfinite(w)):
        raise ValueError("shim must be finite")
    return w
