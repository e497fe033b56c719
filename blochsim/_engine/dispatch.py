"""Backend selection: host (NumPy) or CUDA (device arrays)."""
from __future__ import annotations

import os
import sys
from typing import NamedTuple

from blochsim import _core

_CUDA_STATUS = None


def cuda_status():
    """(usable, reason) of the CUDA backend, probed once."""
    global _CUDA_STATUS
    if _CUDA_STATUS is None:
        _CUDA_STATUS = _core.cuda_available()
    return _CUDA_STATUS


def any_lazy(values) -> bool:
    """Whether a value is a Dask array (never imports Dask: without it
    imported, none can be)."""
    da = sys.modules.get("dask.array")
    return da is not None and any(isinstance(v, da.Array) for v in values.values())


def worker_threads():
    """Host threads of a task running in a Dask worker: the CPUs shared
    among the worker's task threads; None outside a worker's task."""
    d = sys.modules.get("distributed")
    if d is None:
        return None
    try:
        worker = d.get_worker()
    except ValueError:
        return None
    tasks = getattr(getattr(worker, "state", worker), "nthreads", 1) or 1
    return max(1, default_threads() // tasks)


def thread_env(n) -> dict:
    """Environment giving a worker process ``n`` CPUs: blochsim's host
    threads and the BLAS threads NumPy's products use (Dask's nannies set
    the latter to 1)."""
    n = str(int(n))
    return {"BLOCHSIM_NUM_THREADS": n, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def is_device_array(x) -> bool:
    """True for objects exposing the CUDA array interface."""
    return hasattr(x, "__cuda_array_interface__")


#: Lanes (problems a vector) of the host kernels of each level.
HOST_LANES = {"x86-64": 4, "x86-64-v3": 8, "x86-64-v4": 16, "generic": 4}


def host_level() -> str:
    """The x86-64 level whose host kernels run: the best this CPU supports,
    or the one ``$BLOCHSIM_HOST_ISA`` names (read once, at the first host
    call).  Raises RuntimeError, naming the variable and its value, when
    that level is unknown or beyond this CPU."""
    isa = _core.host_instruction_set()
    if isa.startswith("refused: "):
        raise RuntimeError(isa[len("refused: "):])
    return isa


def backends():
    """What is built and usable.

    Returns
    -------
    dict
        ``{"cpu": {"available": bool, "isa": str, "lanes": int, "threads": int,
        "reason": str}, "cuda": {"available": bool, "reason": str}}``: the
        host's x86-64 level (``"x86-64"``, ``"x86-64-v3"``, ``"x86-64-v4"``,
        or ``"generic"`` off x86-64) and its lanes, the default threads, and
        why a backend cannot run.
    """
    ok, why = cuda_status()
    isa = _core.host_instruction_set()
    refused = isa.startswith("refused: ")
    return {
        "cpu": {"available": not refused, "isa": "" if refused else isa, "lanes": HOST_LANES.get(isa, 0),
                "threads": default_threads(), "reason": isa[len("refused: "):] if refused else ""},
        "cuda": {"available": ok, "reason": "" if ok else why},
    }


def default_threads() -> int:
    """Host threads: $BLOCHSIM_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("BLOCHSIM_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"BLOCHSIM_NUM_THREADS must be an integer, got {env!r}") from None
        if n < 1:
            raise ValueError(f"BLOCHSIM_NUM_THREADS must be >= 1, got {n}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def resolve_device(device, device_input=None) -> str:
    """The backend a call runs on: ``device`` if given ("auto": the GPU when
    one is usable, else the host), else the GPU when ``device_input`` (the
    name of an input that is a device array) is set."""
    asked = device
    if device is None:
        device = "cuda" if device_input else "cpu"
    elif device == "auto":
        device = "cuda" if device_input or cuda_status()[0] else "cpu"
        asked = None if device_input else "auto"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")
    if device == "cuda":
        ok, why = cuda_status()
        if not ok:
            if asked is None:
                raise RuntimeError(f"{device_input} is a device array (__cuda_array_interface__), but the "
                                   f"CUDA backend cannot run: {why}")
            raise RuntimeError(f"device='cuda' was asked for, but the CUDA backend cannot run: {why}")
    return device


class Route(NamedTuple):
    """Where one call runs."""

    #: "cpu" or "cuda"
    device: str
    #: names of the inputs that are device arrays (``"out"`` for a device output)
    on_device: list
    #: host threads
    threads: int


def route(asked, threads, tissue, out=None) -> Route:
    """The backend of a call: ``asked`` (a simulator's ``device``) if set,
    else the GPU when a tissue value (or ``out``, an array or a tuple of
    arrays) is a device array; ``threads`` if set, else
    :func:`default_threads`.  Refuses device arrays on a call forced to the
    host, and a GPU call without a usable CUDA backend."""
    on_device = [k for k, v in tissue.items() if is_device_array(v)]
    outs = out if isinstance(out, tuple) else (out,)
    if any(o is not None and is_device_array(o) for o in outs):
        on_device.append("out")
    device = resolve_device(asked, on_device[0] if on_device else None)
    if device == "cpu" and on_device:
        raise ValueError(f"device='cpu' was asked for, but {on_device[0]} is a device array")
    if device == "cpu":
        host_level()
    return Route(device, on_device, call_threads(threads))


def call_threads(threads=None) -> int:
    """Host threads of a call: ``threads`` if set, else the share of a Dask
    worker's task (:func:`worker_threads`), else :func:`default_threads`."""
    if threads is not None:
        return threads
    return worker_threads() or default_threads()
