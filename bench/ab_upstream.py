"""The reference host calls of ``bench/ab_host.py`` on the upstream PyPI
package ``blochsim`` 0.0.14 (torch-based, a different project of the same
name), for one run beside this build (bench/NOTES.md).

Install it where it cannot shadow this package, then run with that folder
first on the path (``-S`` keeps the site packages out)::

    pip download --no-deps blochsim==0.0.14 -d /tmp/up_dl
    pip install --target /tmp/up_site /tmp/up_dl/blochsim-0.0.14-*.whl torch scipy pypulseq
    PYTHONPATH=/tmp/up_site python -S bench/ab_upstream.py upstream

Prints the rows ``ab_host.py`` prints under the same names.  The train and
the tissues are ``blochsim.cli``'s reference ones, written out here because
this package cannot be imported beside the upstream one.
"""
import sys

import numpy as np
import torch

from blochsim.simulators.mrf import MRFSimulator
from timed import report  # bench/timed.py: run as a script, this folder is on the path


def reference(n):
    """``blochsim.cli.reference_flips(500)`` and ``reference_tissues(n)``."""
    flips = np.concatenate([np.linspace(5, 60, 250), np.linspace(60, 2, 250)])
    s = int(np.ceil(np.sqrt(n)))
    T1, T2 = np.meshgrid(np.geomspace(200, 3000, s), np.geomspace(10, 300, s), indexing="ij")
    return flips, T1.ravel()[:n].copy(), T2.ravel()[:n].copy()



def main(label, word=""):
    torch.set_num_threads(int(__import__("os").environ.get("BLOCHSIM_NUM_THREADS", "2")))
    flips, T1, T2 = reference(100_000)
    k = np.arange(500)
    real = MRFSimulator(flip=flips, TR=10.0, states=32)
    cplx = MRFSimulator(flip=flips, TR=10.0, phases=0.5 * 117.0 * k * (k + 1), states=32)
    t1, t2 = torch.as_tensor(T1[:10_000]), torch.as_tensor(T2[:10_000])
    calls = {
        "forward real 1e4": (lambda: real.simulate(T1=t1, T2=t2), 3),
        "forward complex 1e4": (lambda: cplx.simulate(T1=t1, T2=t2), 3),
        "jacobian (T1, T2) 1e4": (lambda: real.jacobian(("T1", "T2"), T1=t1, T2=t2), 3),
        "one voxel": (lambda: real.simulate(T1=1000.0, T2=80.0), 20),
        "one voxel, jacobian (T1, T2)": (lambda: real.jacobian(("T1", "T2"), T1=1000.0, T2=80.0), 20),
    }
    report(label, calls, word)


if __name__ == "__main__":
    main(*sys.argv[1:3]) if len(sys.argv) > 1 else main("upstream")
