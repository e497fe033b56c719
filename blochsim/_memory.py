"""The host memory a call needs, checked before anything is allocated
(SPEC §8): a call that cannot fit is refused with how much it needs, how
much there is, and how to split it."""
from blochsim import _core


#: calls needing at most this many bytes are not checked (reading the
#: kernel's figure costs more than they do)
_UNCHECKED = 64.0 * 2**20


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
    need = n * per_voxel + fixed
    if need <= _UNCHECKED:
        return
    have = available()
    if need <= have:
        return
    detail = f"{n:,} voxels x {size(per_voxel)}"
    if fixed:
        detail += f" + {fixed_what} {size(fixed)}"
    if fixed >= 0.5 * have:
        remedy = f"{fixed_what} alone needs {size(fixed)}: {fixed_remedy}"
    else:
        most = max(int((have - fixed) // max(per_voxel, 1.0)), 1)
        remedy = (f"simulate at most {most:,} voxels a call (split the voxel arrays into chunks along their "
                  "first axis and call once a chunk)")
    raise MemoryError(f"{owner} needs {size(need)} of host memory ({detail}) and {size(have)} is available: "
                      f"{remedy}")
