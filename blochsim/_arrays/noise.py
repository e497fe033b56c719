"""Complex Gaussian noise from the counter-based generator of the C++ core
(``noise.hpp``: Philox4x32-10 and the Box–Muller transform): the same
numbers on the host and on the device, for any split of the work, so that
a seeded acquisition or PERK training draws the same noise wherever it
runs."""
import numpy as np

from blochsim import _core

#: counter word 3 of each use of the generator
ACQUISITION, PERK_TRAINING = 0, 1


def key(seed) -> int:
    """The generator's 64-bit key from a seed (an int or a SeedSequence's
    entropy), through NumPy's SeedSequence."""
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])


def add(z, sigma: float, seed_key: int, block: int, stream: int, threads: int = 1, first: int = 0):
    """Add ``sigma`` times complex standard normals (each part of variance
    1) to the complex64 values of ``z`` in place: value j gets normal
    ``first + j`` of (seed_key, block, stream).  ``z`` is a C-contiguous
    NumPy complex64 array or a complex64 DeviceArray (added on the device).
    Returns z."""
    from blochsim._arrays.device import DeviceArray
    if isinstance(z, DeviceArray):
        if z.dtype != np.complex64:
            raise TypeError("blochsim internal error: device noise needs complex64")
        _core.noise_add_device(z.ptr, int(np.prod(z.shape, dtype=np.int64)), first, float(sigma), seed_key, block,
                               stream, 0)
        return z
    if z.dtype != np.complex64 or not z.flags.c_contiguous:
        raise TypeError("blochsim internal error: host noise needs C-contiguous complex64")
    _core.noise_add(z.reshape(-1).view(np.float32), first, float(sigma), seed_key, block, stream, threads)
    return z
