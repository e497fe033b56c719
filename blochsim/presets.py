"""Tissue presets: documented sets of tissue properties for the played
simulators, to start a simulation from values of the literature's order.

Each preset is a plain dict of public tissue properties (ms, Hz,
fractions of M0), so it can be edited, extended with B0 or B1 maps, or
broadcast against arrays before it goes to ``simulate``.
"""
from __future__ import annotations

__all__ = ["white_matter_four_pool"]


def white_matter_four_pool(ihmt: bool = True) -> dict:
    """Cerebral white matter at 3 T as four exchanging pools (a network,
    not a star; SPEC §3).

    Free water is the intra/extracellular water (IEW).  Pool B is myelin
    water (MW), trapped between the myelin bilayers.  The semisolid pool
    ``bound`` is the myelin's lipids and proteins, in contact with myelin
    water only; ``bound2`` is the non-myelin semisolid (axonal and glial
    membranes and proteins), in contact with IEW.  Water moves between the
    two water pools.  This is the four-pool model of Levesque & Pike (2009,
    MRM 62:1487).

    The values are rounded representatives of the ranges the literature
    reports: myelin water with a T2 of 10-20 ms and near a tenth of the
    water (MacKay et al. 1994, MRM 31:673); a semisolid share of 0.1-0.2 of
    M0 with a T2 near 12 us, exchanging with water at a few per second
    (Sled & Pike 2001, MRM 46:923); water exchange between MW and IEW at a
    few per second and the split of the semisolid between myelin and the
    rest (Levesque & Pike 2009); dipolar order of a few ms in the myelin
    semisolid (Varma et al. 2015, JMR 260:67).  They are a starting point
    for simulation, not a fit: take a source's own values for quantitative
    work.

    ======================== ================ ============================================
    property                 value            meaning
    ======================== ================ ============================================
    T1, T2                   1000, 70 ms      IEW
    poolB_fraction           0.07             MW share of M0
    poolB_T1, poolB_T2       400, 15 ms       MW
    poolB_exchange           6 Hz             MW <-> IEW: MW -> IEW at 6 x 0.75 /s
    bound_fraction           0.11             myelin semisolid
    bound_T1, bound_T2       1000 ms, 12 us
    bound_exchange           0 Hz             not in contact with IEW
    exchange_B_bound         150 Hz           MW <-> myelin semisolid: MW -> at 16.5 /s
    bound_T1D                6 ms             dipolar order (``ihmt=True`` only)
    bound2_fraction          0.07             non-myelin semisolid
    bound2_T1, bound2_T2     1000 ms, 10 us
    bound2_exchange          30 Hz            IEW <-> non-myelin semisolid: IEW -> at 2.1 /s
    ======================== ================ ============================================

    Parameters
    ----------
    ihmt : bool, optional
        Give the myelin semisolid its dipolar order (``bound_T1D``), for
        inhomogeneous MT (default True).

    Returns
    -------
    dict
        Public tissue properties, each a float; free water holds
        1 - 0.07 - 0.11 - 0.07 = 0.75 of M0.
    """
    t = dict(T1=1000.0, T2=70.0,
             poolB_fraction=0.07, poolB_T1=400.0, poolB_T2=15.0, poolB_exchange=6.0,
             bound_fraction=0.11, bound_T1=1000.0, bound_T2=0.012, bound_exchange=0.0,
             exchange_B_bound=150.0,
             bound2_fraction=0.07, bound2_T1=1000.0, bound2_T2=0.010, bound2_exchange=30.0)
    if ihmt:
        t["bound_T1D"] = 6.0
    return t
