"""The pooled backend: calls with pools (SPEC §3) or exact rectangular
pulses, on the host's lanes or the device's pooled kernels; from a packed
stream and tissue arrays.

The pooled Jacobian and adjoint take host arrays: device-array inputs (and
outputs) are moved through the host, run on the GPU and come back as device
arrays; a pooled simulate of device arrays runs on the device throughout.
"""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import device, host, memory, reverse
from blochsim._engine import pools as _pools
from blochsim._arrays import validate as V
from blochsim._arrays.device import Interface, Shaped, device_results, from_host, to_host
from blochsim._engine.host import si_planes
from blochsim.sequence.packing import _GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RF_DURATION, _GRAD_RF_OFFSET


def stage(route, tissue):
    """The tissue of a pooled call with its device arrays copied to the
    host, and the array library of those inputs (None without one)."""
    names = [k for k in route.on_device if k != "out"]
    if not names:
        return tissue, None
    library = Interface(names[0], tissue[names[0]]).library
    return {k: (to_host(k, v) if k in names else v) for k, v in tissue.items()}, library


def _tissue(tissue):
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items()}
    return arrays, (V.broadcast_voxels(arrays) if arrays else ())


def play(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed=None):
    """simulate() or jacobian() with pools or exact rectangular pulses:
    (signal, J), J (*voxels, len(names), samples) or None without names.
    NumPy in and out (on the GPU when ``route`` says cuda); the signal of
    device arrays is computed on the device (:func:`resident`), their
    Jacobian is moved through the host and comes back as device arrays.
    ``pools`` is (exchanging pools, bound pool).  ``keyed``: the event
    stream when it carries 3-D moments, played by the moment-keyed EPG on
    the host (device arrays moved through it)."""
    device_out = "out" in route.on_device
    if keyed is not None and keyed.moments is None:
        keyed = None
    if not names and route.device == "cuda" and route.on_device and keyed is None:
        return resident(owner, ps, lineshape, tissue, pools, route, out), None
    tissue, library = stage(route, tissue)
    if library is not None and out is not None and not device_out:
        raise TypeError("out must be a device array when tissue properties are device arrays")
    if device_out or library is not None:
        signal, J = _host_arrays(owner, ps, lineshape, tissue, pools, route, names, None, variant, keyed)
        return device_results(signal, J, out if device_out else None, library, names)
    return _host_arrays(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed)


def _host_arrays(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed=None):
    """play() of host arrays, into the host ``out`` (checked) if given;
    through the moment-keyed EPG on the host for a ``keyed`` stream."""
    gpu = route.device == "cuda" and keyed is None
    n_exchanging, bound = pools
    arrays, shape = _tissue(tissue)
    n = int(np.prod(shape, dtype=np.int64))
    ns = ps.n_samples
    want = shape + (ns,)
    signal = jac = None
    if out is not None:
        if names:
            for name, a, w in V.jacobian_out_shapes(out, shape, len(names), ns, len(names) == 1):
                V.check_host_out(name, a, w)
            signal, jac = out[0], out[1].reshape(n, len(names), ns)
        else:
            V.check_host_out("out", out, want)
            signal = out
    fields = [_pools.field_index(k) for k in names]
    call = f"{owner}.{'jacobian' if names else 'simulate'}"
    program = None
    if keyed is not None:
        from blochsim.sequence import keyed as K
        program = K.program_for(call, keyed, host.ranges(arrays, shape), list(_core.TISSUE_FIELDS))
        threads = max(1, min(route.threads, n))
        # two states of 3 n + bound complex planes over the slots, on duals of up to 4 directions
        state = (3 * n_exchanging + 3 + bound) * 2 * program.max_slots
        memory.check_host(call, n, 8.0 * ns * (out is None) * (1 + len(names)),
                           8.0 * 2 * state * (1 + min(4, len(names))) * threads,
                           f"the moment-keyed EPG's pooled workspaces ({program.max_slots:,} states)",
                           "fewer threads, or a file whose moments hold fewer states")
    else:
        memory.check_call(call, ps, shape, arrays, "pooled", route.threads, fields,
                           outputs=0 if out is not None else 1 + len(names), pools=pools, host_kernels=not gpu)
    si, planes = si_planes(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS)
    if signal is None:
        signal = np.empty(want, dtype=np.complex64)
    if names and jac is None:
        jac = np.empty((n, len(names), ns), dtype=np.complex64)
    # seeded with the SI value of one public unit: derivatives per public unit
    seeds = [float(V.TISSUE_UNITS[k][0]) for k in names]
    flat = signal.reshape(n, ns)
    if program is None:
        _core.pooled(ps, si, planes, n_exchanging, bound, lineshape, n, fields, seeds, flat, jac,
                     route.threads, gpu, bool(variant) and not names and not gpu)
    else:
        def run(i, j):
            part = [tuple(a if a is None or a.shape[0] == 1 else a[i:j] for a in x) for x in (si, planes)]
            _core.pooled(ps, part[0], part[1], n_exchanging, bound, lineshape, j - i, fields, seeds, flat[i:j],
                         None if jac is None else jac[i:j], route.threads, program=program)

        seconds = program.seconds(n, route.threads) * K.POOLED_SLOWDOWN * (3 * n_exchanging + 3 + bound) / 3
        host.keyed_run(call, program, n, seconds * (1 + len(names)), route.threads, run, stacklevel=5)
    return signal, (jac.reshape(shape + (len(names), ns)) if names else None)


def resident(owner, ps, lineshape, tissue, pools, route, out):
    """simulate() with pools for device-array inputs or output: the pooled
    kernels read the device arrays and write a device result.  The pool
    properties were copied to the host and checked there
    (``_pools.drop_idle``: fractions and their sum); the tissue properties
    are checked on the device."""
    on_device = [k for k in route.on_device if k != "out"]
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in on_device}
    ifaces = {k: Interface(k, tissue[k]) for k in on_device}
    shapes = {**arrays, **{k: Shaped(i.shape) for k, i in ifaces.items()}}
    shape = V.broadcast_voxels(shapes) if shapes else ()
    return device.resident(f"{owner}.simulate", ps, arrays, ifaces, shape, shape + (ps.n_samples,), out,
                                    pools=(*pools, lineshape))


def vjp(owner, s, ps, lineshape, tissue, pools, route, names, tissue_names, p, prov, pshapes, variant):
    """vjp() with pools or exact rectangular pulses: the signal as
    simulate() computes it, the adjoint in double precision
    (pools/adjoint.hpp), on the GPU when ``route`` says cuda (device-array
    inputs moved through the host; the cotangent may be a device array, the
    gradients are NumPy)."""
    tissue, library = stage(route, tissue)
    gpu = route.device == "cuda"
    n_exchanging, bound = pools
    arrays, shape = _tissue(tissue)
    n = int(np.prod(shape, dtype=np.int64))
    fields = [_pools.field_index(k) for k in tissue_names]
    # the adjoint's workspace here; the forward pass checks its own
    memory.check_call(f"{owner}.vjp", ps, shape, arrays, "pooled_adjoint", route.threads, fields, outputs=2,
                       pools=pools, host_kernels=not gpu)
    signal, _ = _host_arrays(owner, ps, lineshape, tissue, pools, route, (), None, variant)
    scale = np.array([V.TISSUE_UNITS[k][0] for k in tissue_names])
    tshapes = {k: np.shape(arrays[k]) for k in tissue_names}
    si, planes = si_planes(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS)
    # the event parameters the protocol names reach, as bits of the
    # adjoint's directions (pools/adjoint.hpp EventSeeds order; the
    # receiver phase costs nothing)
    columns = set()
    for k in names:
        if k in prov:
            columns.update(int(c) for c in prov[k][1])
    directions = (_GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RF_DURATION, _GRAD_RF_OFFSET)
    mask = sum(1 << d for d, c in enumerate(directions) if c in columns)

    def pullback(cotangent):
        if V.is_device_array(cotangent):
            cotangent = to_host("cotangent", cotangent, allow_complex64=True)
        cot = reverse.cotangent(cotangent, signal.shape)
        ev = np.zeros((s.n_events, 6), dtype=np.float64)
        tg = np.zeros((n, len(fields)), dtype=np.float32)
        _core.pooled_adjoint(ps, si, planes, n_exchanging, bound, lineshape, n, fields,
                             cot.reshape(n, s.n_samples), ev, tg, route.threads, mask, gpu)
        return reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

    if library is not None:
        return from_host(signal, library), pullback
    return signal, pullback
