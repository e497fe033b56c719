"""A numerical brain phantom: T1, T2, M0 and B1 maps on a square grid."""
from __future__ import annotations

import numpy as np

__all__ = ["TISSUES", "brain_phantom"]

#: approximate relaxation times (ms) and proton density of each class at
#: 3 T: white and grey matter after Stanisz et al. 2005 (MRM 54:507),
#: cerebrospinal fluid and subcutaneous fat of the order reported for 3 T.
TISSUES = {
    "white matter": dict(T1=1084.0, T2=69.0, M0=0.70),
    "grey matter": dict(T1=1820.0, T2=99.0, M0=0.80),
    "CSF": dict(T1=4000.0, T2=2000.0, M0=1.00),
    "fat": dict(T1=380.0, T2=130.0, M0=0.90),
}

# ellipses (centre x, centre y, half-axis x, half-axis y, class), later ones
# drawn over earlier ones, on [-1, 1]²
_ELLIPSES = [
    (0.0, 0.0, 0.80, 0.95, "fat"),
    (0.0, 0.0, 0.72, 0.87, "CSF"),
    (0.0, 0.0, 0.68, 0.83, "grey matter"),
    (0.0, 0.02, 0.52, 0.66, "white matter"),
    (-0.19, 0.10, 0.08, 0.24, "CSF"),
    (0.19, 0.10, 0.08, 0.24, "CSF"),
    (0.0, -0.45, 0.18, 0.10, "grey matter"),
    (-0.30, -0.25, 0.07, 0.07, "grey matter"),
    (0.30, -0.25, 0.07, 0.07, "grey matter"),
]


def brain_phantom(size: int = 96):
    """A two-dimensional brain phantom of ``size × size`` voxels.

    Ellipses of white and grey matter, cerebrospinal fluid (ventricles and
    the rim around the brain) and subcutaneous fat, with the values of
    :data:`TISSUES`, and a smooth transmit field B1 falling from 1.15 at
    the centre to about 0.85 at the edge of the head (the centre-bright
    pattern of 3 T), zero outside the head.

    Parameters
    ----------
    size : int
        Voxels along each side (at least 8).

    Returns
    -------
    dict
        ``"T1"``, ``"T2"`` (ms), ``"M0"``, ``"B1"`` (relative): float64
        arrays of shape (size, size), 0 outside the head; ``"label"``:
        int array, 0 outside the head and ``i + 1`` for the i-th class of
        :data:`TISSUES`; ``"mask"``: bool array, inside the head.
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 8:
        raise ValueError(f"size must be an integer >= 8, got {size!r}")
    c = (np.arange(size) + 0.5) / size * 2.0 - 1.0
    x, y = np.meshgrid(c, -c)
    names = list(TISSUES)
    label = np.zeros((size, size), np.int64)
    for cx, cy, ax, ay, kind in _ELLIPSES:
        inside = ((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2 <= 1.0
        label[inside] = names.index(kind) + 1
    mask = label > 0
    out = {k: np.zeros((size, size)) for k in ("T1", "T2", "M0")}
    for i, name in enumerate(names):
        for k in out:
            out[k][label == i + 1] = TISSUES[name][k]
    r2 = (x / 0.8) ** 2 + (y / 0.95) ** 2
    out["B1"] = np.where(mask, 1.15 - 0.30 * r2, 0.0)
    out["label"] = label
    out["mask"] = mask
    return out
