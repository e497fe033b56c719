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


def report(label, calls, word=""):
    """One line per call of ``calls`` ({name: (f, repeats)}) whose name holds
    ``word``: label, name, median and [least, greatest], milliseconds."""
    for name, (f, repeats) in calls.items():
        if word not in name:
            continue
        med, lo, hi = timed(f, repeats)
        print(f"{label}\t{name}\t{med * 1e3:.3f} ms\t[{lo * 1e3:.3f}, {hi * 1e3:.3f}]", flush=True)
