"""The pooled backend: calls with pools (SPEC §3) or exact rectangular
pulses, on the host's lanes or the device's pooled kernels; from a packed
stream and tissue arrays.

Device arrays stay on the device: the signal, the Jacobian and the
pullback's planes (a pooled call on the moment-keyed EPG, host-only, moves
them through the host).  NumPy inputs with device="cuda" run on the GPU
through the host-array entries.
"""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import device, host, memory, reverse, streaming
from blochsim._engine import pools as _pools
from blochsim._arrays import validate as V
from blochsim._arrays.device import (Interface, Shaped, device_cotangent, device_results, from_host,
                                     gradients_in_libraries, new_output, resident_tissue, to_host, work_stream)
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


def device_libraries(route, tissue):
    """Each tissue property passed as a device array: name -> its library."""
    return {k: Interface(k, tissue[k]).library for k in route.on_device if k != "out" and k in tissue}


def _tissue(tissue):
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items()}
    return arrays, (V.broadcast_voxels(arrays) if arrays else ())


def play(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed=None, one=False, budget=None):
    """simulate() or jacobian() with pools or exact rectangular pulses:
    (signal, J), J (*voxels, len(names), samples) or None without names.
    NumPy in and out (on the GPU when ``route`` says cuda); device arrays
    (inputs or output) are computed on the device (:func:`resident`), J
    shaped by ``one`` there.  ``pools`` is (exchanging pools, semisolid
    pools, those with dipolar order).
    ``keyed``: the event stream when it carries 3-D moments, played by the
    moment-keyed EPG on the host (device arrays moved through it).  NumPy
    on the GPU runs in chunks of at most ``budget`` bytes of device memory
    (None: most of the free memory)."""
    device_out = "out" in route.on_device
    if keyed is not None and keyed.moments is None:
        keyed = None
    if route.device == "cuda" and route.on_device and keyed is None:
        return resident(owner, ps, lineshape, tissue, pools, route, out, names, one)
    tissue, library = stage(route, tissue)
    if library is not None and out is not None and not device_out:
        raise TypeError("out must be a device array when tissue properties are device arrays")
    if device_out or library is not None:
        signal, J = _host_arrays(owner, ps, lineshape, tissue, pools, route, names, None, variant, keyed)
        return device_results(signal, J, out if device_out else None, library, one)
    return _host_arrays(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed, budget)


def _spans(n, per_voxel, gpu, budget):
    """[first, end) of the voxel chunks a pooled call of host arrays plays:
    one on the host, chunks under the device budget on the GPU."""
    step = streaming.chunk_voxels(n, per_voxel, budget) if gpu else max(n, 1)
    return [(i, min(n, i + step)) for i in range(0, n, step)]


def _part(planes, i, j):
    return tuple(a if a is None or a.shape[0] == 1 else a[i:j] for a in planes)


def _host_arrays(owner, ps, lineshape, tissue, pools, route, names, out, variant, keyed=None, budget=None):
    """play() of host arrays, into the host ``out`` (checked) if given;
    through the moment-keyed EPG on the host for a ``keyed`` stream."""
    gpu = route.device == "cuda" and keyed is None
    n_exchanging, bound, dipolar = pools
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
        # two states of 2 n + m complex planes over the slots, on duals of up to 4 directions
        state = (3 * n_exchanging + 3 + bound + dipolar) * 2 * program.max_slots
        memory.check_host(call, n, 8.0 * ns * (out is None) * (1 + len(names)),
                           8.0 * 2 * state * (1 + min(4, len(names))) * threads,
                           f"the moment-keyed EPG's pooled workspaces ({program.max_slots:,} states)",
                           "fewer threads, or a file whose moments hold fewer states")
    else:
        memory.check_call(call, ps, shape, arrays, "pooled", route.threads, fields,
                           outputs=0 if out is not None else 1 + len(names), pools=pools, host_kernels=not gpu)
    si, planes = si_planes(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS)
    if signal is None:
        signal = _core.new_result(want, np.complex64)
    if names and jac is None:
        jac = _core.new_result((n, len(names), ns), np.complex64)
    # seeded with the SI value of one public unit: derivatives per public unit
    seeds = [float(V.TISSUE_UNITS[k][0]) for k in names]
    flat = signal.reshape(n, ns)
    if program is None:
        for i, j in _spans(n, 8 * ns * (1 + len(names)) + 4 * len(arrays), gpu, budget):
            _core.pooled(ps, _part(si, i, j), _part(planes, i, j), n_exchanging, bound, lineshape, j - i, fields,
                         seeds, flat[i:j], None if jac is None else jac[i:j], route.threads, gpu,
                         bool(variant) and not names and not gpu)
    else:
        def run(i, j):
            part = [tuple(a if a is None or a.shape[0] == 1 else a[i:j] for a in x) for x in (si, planes)]
            _core.pooled(ps, part[0], part[1], n_exchanging, bound, lineshape, j - i, fields, seeds, flat[i:j],
                         None if jac is None else jac[i:j], route.threads, program=program)

        seconds = program.seconds(n, route.threads) * K.POOLED_SLOWDOWN * (3 * n_exchanging + 3 + bound + dipolar) / 3
        host.keyed_run(call, program, n, seconds * (1 + len(names)), route.threads, run, stacklevel=5)
    return signal, (jac.reshape(shape + (len(names), ns)) if names else None)


def _device_intake(tissue, route):
    """(host arrays, device-array interfaces, voxel shape) of a pooled call
    with device arrays.  The pool properties were copied to the host and
    checked there (``pools.drop_idle``: fractions and their sum); the
    tissue properties are checked on the device."""
    on_device = [k for k in route.on_device if k != "out"]
    arrays = {k: V.tissue_array(k, v) for k, v in tissue.items() if k not in on_device}
    ifaces = {k: Interface(k, tissue[k]) for k in on_device}
    shapes = {**arrays, **{k: Shaped(i.shape) for k, i in ifaces.items()}}
    return arrays, ifaces, (V.broadcast_voxels(shapes) if shapes else ())


def resident(owner, ps, lineshape, tissue, pools, route, out, names=(), one=False):
    """simulate() or jacobian() with pools for device-array inputs or
    output: the pooled kernels read the planes on the device and write
    device results, (signal, J) (J None without names)."""
    arrays, ifaces, shape = _device_intake(tissue, route)
    want = shape + (ps.n_samples,)
    if not names:
        return device.resident(f"{owner}.simulate", ps, arrays, ifaces, shape, want, out,
                               pools=(*pools[:2], lineshape)), None
    fields = [_pools.field_index(k) for k in names]
    seeds = [float(V.TISSUE_UNITS[k][0]) for k in names]
    jshape = shape + ((ps.n_samples,) if one else (len(names), ps.n_samples))
    if out is not None and not all(V.is_device_array(o) for o in out):
        raise TypeError("out must be a pair of device arrays when tissue properties or out[0] are device arrays")
    return device.resident(f"{owner}.jacobian", ps, arrays, ifaces, shape, want, None if out is None else out[0],
                           jacobian=(fields, seeds, len(names)),
                           jac_out=None if out is None else ("out[1]", out[1], jshape), pools=(*pools[:2], lineshape),
                           jac_shape=jshape)


def _event_mask(names, prov):
    """The event parameters the protocol names reach, as bits of the
    adjoint's directions (pools/adjoint.hpp EventSeeds order; the receiver
    phase costs nothing)."""
    columns = set()
    for k in names:
        if k in prov:
            columns.update(int(c) for c in prov[k][1])
    directions = (_GRAD_DURATION, _GRAD_FLIP, _GRAD_PHASE, _GRAD_RF_DURATION, _GRAD_RF_OFFSET)
    return sum(1 << d for d, c in enumerate(directions) if c in columns)


def _vjp_resident(owner, s, ps, lineshape, tissue, pools, route, names, tissue_names, p, prov, pshapes):
    """vjp() with pools for device-array inputs: the planes stay on the
    device for the signal and the pullback; the signal is a device array,
    the pullback takes a device or NumPy cotangent and returns the
    gradients of device-array properties in their library, the others
    NumPy."""
    arrays, ifaces, shape = _device_intake(tissue, route)
    n = int(np.prod(shape, dtype=np.int64))
    ns = s.n_samples
    fields = [_pools.field_index(k) for k in tissue_names]
    scale = np.array([V.TISSUE_UNITS[k][0] for k in tissue_names])
    tshapes = {k: (ifaces[k].shape if k in ifaces else np.shape(arrays[k])) for k in tissue_names}
    # the signal and its cotangent, the tissue planes and the tissue gradient
    memory.check_device(f"{owner}.vjp", n, n * (16 * ns + 4 * (len(arrays) + len(ifaces)) + 4 * len(fields)))
    own, st = work_stream([i.stream for i in ifaces.values() if i.stream is not None])
    dev, keep = resident_tissue(arrays, ifaces, shape, n, own, st)
    planes, keep_pools = resident_tissue(arrays, ifaces, shape, n, own, st, _core.POOL_FIELDS)
    library = next(iter(ifaces.values())).library if ifaces else "blochsim"
    signal, out_ptr = new_output(shape + (ns,), library)
    _core.pooled_cuda(ps, tuple(dev), tuple(planes), *pools[:2], lineshape, n, out_ptr, st)
    mask = _event_mask(names, prov)

    def pullback(cotangent):
        order = own if own is not None else st
        cot_ptr, cot_keep = device_cotangent(cotangent, shape + (ns,), "the signal's", order, st)
        ev = np.zeros((s.n_events, 6), dtype=np.float64)
        tg = np.zeros((n, len(fields)), dtype=np.float32)
        tbuf = _core.DeviceBuffer(max(tg.nbytes, 8), order)
        _core.pooled_adjoint_cuda(ps, tuple(dev), tuple(planes), *pools[:2], lineshape, n, fields, cot_ptr, ev, tbuf.ptr,
                                  mask, st)
        if tg.size:
            _core.copy_to_host(tg.reshape(-1).view(np.uint8), tbuf.ptr, st)
        _core.stream_synchronize(st)
        del cot_keep, tbuf
        grads = reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)
        return gradients_in_libraries(grads, {k: i.library for k, i in ifaces.items()})

    pullback._keep = (keep, keep_pools, own, dev, planes)
    return signal, pullback


def vjp(owner, s, ps, lineshape, tissue, pools, route, names, tissue_names, p, prov, pshapes, variant, budget=None):
    """vjp() with pools or exact rectangular pulses: the signal as
    simulate() computes it, the adjoint in double precision
    (pools/adjoint.hpp), on the GPU when ``route`` says cuda (device-array
    inputs moved through the host; the cotangent may be a device array, the
    gradients of device-array properties come back in their library)."""
    if route.device == "cuda" and [k for k in route.on_device if k != "out"]:
        return _vjp_resident(owner, s, ps, lineshape, tissue, pools, route, names, tissue_names, p, prov, pshapes)
    libraries = device_libraries(route, tissue)
    tissue, library = stage(route, tissue)
    gpu = route.device == "cuda"
    n_exchanging, bound, dipolar = pools
    arrays, shape = _tissue(tissue)
    n = int(np.prod(shape, dtype=np.int64))
    fields = [_pools.field_index(k) for k in tissue_names]
    # the adjoint's workspace here; the forward pass checks its own
    memory.check_call(f"{owner}.vjp", ps, shape, arrays, "pooled_adjoint", route.threads, fields, outputs=2,
                       pools=pools, host_kernels=not gpu)
    signal, _ = _host_arrays(owner, ps, lineshape, tissue, pools, route, (), None, variant, budget=budget)
    scale = np.array([V.TISSUE_UNITS[k][0] for k in tissue_names])
    tshapes = {k: np.shape(arrays[k]) for k in tissue_names}
    si, planes = si_planes(arrays, shape), V.si_planes(arrays, shape, _core.POOL_FIELDS)
    mask = _event_mask(names, prov)

    def pullback(cotangent):
        if V.is_device_array(cotangent):
            cotangent = to_host("cotangent", cotangent, allow_complex64=True)
        cot = reverse.cotangent(cotangent, signal.shape)
        ev = np.zeros((s.n_events, 6), dtype=np.float64)
        tg = np.zeros((n, len(fields)), dtype=np.float32)
        flat = cot.reshape(n, s.n_samples)
        for i, j in _spans(n, 8 * s.n_samples + 4 * (len(arrays) + len(fields)), gpu, budget):
            part = np.zeros_like(ev)
            _core.pooled_adjoint(ps, _part(si, i, j), _part(planes, i, j), n_exchanging, bound, lineshape, j - i,
                                 fields, flat[i:j], part, tg[i:j], route.threads, mask, gpu)
            ev += part
        grads = reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)
        return gradients_in_libraries(grads, libraries)

    if library is not None:
        return from_host(signal, library), pullback
    return signal, pullback
