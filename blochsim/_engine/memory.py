"""The memory a call needs, checked before anything is allocated (SPEC §8):
a call that cannot fit, on the host or on the device, is refused with how
much it needs, how much there is, and how to split it."""
import math

from blochsim import _core


#: host calls needing at most this many bytes are not checked (reading the
#: kernel's figure costs more than they do); the C++ entries' own check
#: (host/interrupt.hpp, workspace_fits) skips the same size
_UNCHECKED = float(_core.UNCHECKED_WORKSPACE_BYTES)

_SPLIT = "split the voxel arrays into chunks along their first axis and call once a chunk"


def available() -> float:
    """Bytes of host memory a new allocation can take (Linux: the kernel's
    MemAvailable; elsewhere the free physical pages)."""
    return float(_core.available_memory())


def size(nbytes: float) -> str:
    """A byte count for a message."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _refuse(owner, where, n, per_voxel, fixed, have, fixed_what="", fixed_remedy="", also=""):
    """The MemoryError of a call needing ``n * per_voxel + fixed`` bytes of
    ``where`` memory when ``have`` are available."""
    need = n * per_voxel + fixed
    detail = f"{n:,} voxels x {size(per_voxel)}"
    if fixed:
        detail += f" + {fixed_what} {size(fixed)}"
    if fixed >= 0.5 * have:
        remedy = f"{fixed_what} alone needs {size(fixed)}: {fixed_remedy}"
    else:
        most = max(int((have - fixed) // max(per_voxel, 1.0)), 1)
        remedy = f"simulate at most {most:,} voxels a call ({_SPLIT}){also}"
    return MemoryError(f"{owner} needs {size(need)} of {where} memory ({detail}) and {size(have)} is available: "
                       f"{remedy}")


def check_host(owner: str, n: int, per_voxel: float, fixed: float = 0.0, fixed_what: str = "",
               fixed_remedy: str = "") -> None:
    """Refuse a call that needs more host memory than is available.

    Parameters
    ----------
    owner : str
        What is called (``"FSESimulator.simulate"``), for the message.
    n : int
        Voxels of the call.
    per_voxel : float
        Bytes each voxel needs (outputs, tissue planes, intermediates).
    fixed : float
        Bytes the call needs whatever its voxels (the kernels' workspaces).
    fixed_what, fixed_remedy : str
        What the fixed bytes are, and what lowers them, for the message.

    Raises
    ------
    MemoryError
        Naming the bytes needed and available, and how to split the call.
    """
    if n * per_voxel + fixed <= _UNCHECKED:
        return
    have = available()
    if n * per_voxel + fixed > have and _core.kept_result_bytes():
        # the memory of dropped results, kept for the next ones, goes first
        _core.release_kept_results()
        have = available()
    if n * per_voxel + fixed > have:
        raise _refuse(owner, "host", n, per_voxel, fixed, have, fixed_what, fixed_remedy)


def check_call(owner, ps, shape, arrays, entry, threads, fields=(), outputs=1, pools=None, host_kernels=True):
    """Refuse (MemoryError, before anything is allocated) a host call whose
    memory does not fit: ``outputs`` complex64 rows of samples per voxel,
    the tissue planes and, with ``host_kernels``, the workspaces of the host
    entry ``entry`` (``_core.ENTRIES``) on ``threads`` threads with
    ``fields`` and the pool counts ``pools`` = (exchanging, semisolid,
    dipolar)."""
    n = math.prod(shape)
    # each property not a scalar: a float64 broadcast copy, its SI values, and the float32 plane
    planes = sum(1 for a in arrays.values() if getattr(a, "size", 1) != 1)
    per = 8.0 * ps.n_samples * outputs + 20.0 * planes
    fixed = 0.0
    if host_kernels and n:
        n_exchanging, bound, dipolar = pools if pools is not None else (0, 0, 0)
        fixed = _core.workspace_bytes(entry, ps, n, threads, list(fields), n_exchanging, bound, dipolar)
    check_host(owner, n, per, fixed, f"the workspace of states={ps.states} on {threads} thread(s)",
               "lower states (or threads)")


def check_device(owner: str, n: int, need: float) -> None:
    """Refuse (MemoryError) a device call needing ``need`` bytes for ``n``
    voxels when the device has less free, with a chunk size that fits."""
    free, _total = _core.memory_info()
    if need > free:
        raise _refuse(owner, "device", n, need / max(n, 1), 0.0, float(free),
                      also=", or pass NumPy arrays with device='cuda', which stream through the device in "
                           "chunks of budget_bytes")
