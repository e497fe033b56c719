"""The timing loop of the A/B scripts (``ab_host.py``, ``ab_upstream.py``),
with no import of either package."""
import time

import numpy as np


def timed(f, repeats):
    """Median, least and greatest wall time of ``repeats`` calls of ``f``
    after one warm-up call, seconds."""
    f()
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return np.median(t), min(t), max(t)
