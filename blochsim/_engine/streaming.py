"""NumPy inputs on the card (``device="cuda"``): a call's voxels in chunks
that fit the device budget, each chunk's tissue moved to the card and
played there, its results copied back into host arrays.  The forward
streams in C++ (``_core.forward_cuda_streamed``, double-buffered); the
Jacobian and reverse mode stream here, a chunk at a time, so that every
operation runs on any number of voxels.  The results do not depend on the
chunking: every voxel is computed alone, and event gradients are summed
over the chunks in their order."""
from __future__ import annotations

import math

import numpy as np

from blochsim import _core
from blochsim._arrays import validate as V
from blochsim._engine import device, host, memory, reverse


def chunk_voxels(n, per_voxel, budget):
    """Voxels a chunk holds: ``budget`` bytes (None: most of the free
    device memory) over ``per_voxel`` bytes, at least one."""
    if budget is None:
        free, _ = _core.memory_info()
        budget = free // 10 * 8
    return max(1, min(n, int(budget // max(per_voxel, 1))))


def chunks(arrays, shape, step):
    """(first, end, the tissue of voxels [first, end) as flat arrays) over
    the voxel shape, ``step`` voxels at a time; a broadcast view is read
    at the chunk's voxels only, a C-ordered array as a slice (no copy)."""
    n = math.prod(shape)
    # a C-ordered array of the voxel shape is sliced (a view); only
    # broadcast views and other layouts are gathered by index
    flat = {k: a.reshape(-1) for k, a in arrays.items()
            if a.size > 1 and a.shape == tuple(shape) and a.flags.c_contiguous}
    for i in range(0, n, step):
        j = min(n, i + step)
        at = None
        part = {}
        for k, a in arrays.items():
            if a.size == 1:
                part[k] = a
            elif k in flat:
                part[k] = flat[k][i:j]
            else:
                if at is None:
                    at = np.unravel_index(np.arange(i, j), shape) if shape else ()
                part[k] = np.broadcast_to(a, shape)[at]
        yield i, j, part


def _planes(arrays):
    return 4 * len(arrays)


def jacobian(owner, ps, arrays, shape, fields, scale, one, out, budget, names=None):
    """jacobian() of host arrays on the card: (signal, J) NumPy, into
    ``out`` (checked) if given."""
    n = math.prod(shape)
    ns, nd = ps.n_samples, len(fields)
    if out is not None:
        for name, a, want in V.jacobian_out_shapes(out, shape, nd, ns, one):
            V.check_host_out(name, a, want)
        signal, jac = out
    else:
        memory.check_host(owner, n, 8.0 * ns * (1 + nd))
        signal = _core.new_result(shape + (ns,), np.complex64)
        jac = _core.new_result(shape + (nd, ns), np.complex64)
    flat_s, flat_j = signal.reshape(n, ns), jac.reshape(n, nd, ns)
    step = chunk_voxels(n, 8 * ns * (1 + nd) + _planes(arrays), budget)
    for i, j, part in chunks(arrays, shape, step):
        device.jacobian(owner, ps, (True, {}, part, (j - i,)), names or fields, fields, scale, False,
                        (flat_s[i:j], flat_j[i:j]))
    if out is not None:
        return out
    return signal, (jac[..., 0, :] if one else jac)


def keyed_forward(owner, stream_of_moments, ps, arrays, shape, out, budget):
    """simulate() of host arrays on the card's moment-keyed EPG: the signal
    (NumPy) into ``out`` (checked) or a new array, chunk by chunk."""
    n = math.prod(shape)
    ns = ps.n_samples
    if out is not None:
        V.check_host_out("out", out, shape + (ns,))
    else:
        memory.check_host(owner, n, 8.0 * ns)
        out = _core.new_result(shape + (ns,), np.complex64)
    flat = out.reshape(n, ns)
    for i, j, part in chunks(arrays, shape, chunk_voxels(n, 8 * ns + _planes(arrays), budget)):
        device.keyed_from_host(owner, stream_of_moments, ps, part, (j - i,), flat[i:j])
    return out


def vjp(owner, s, ps, arrays, shape, names, tissue_names, p, prov, pshapes, budget):
    """vjp() of host arrays on the card: the signal (NumPy, streamed) and a
    pullback that runs the adjoint chunk by chunk (each chunk's tissue moved
    to the card again), the event gradients summed over the chunks."""
    fields, scale = reverse.fields_and_scale(tissue_names)
    n = math.prod(shape)
    signal = host.forward(owner, ps, arrays, shape, None, 1, 0, streamed=budget or 0)
    tshapes = {k: np.shape(arrays[k]) for k in tissue_names}
    step = chunk_voxels(n, 16 * s.n_samples + _planes(arrays) + 4 * len(fields), budget)

    def pullback(cotangent):
        if V.is_device_array(cotangent):
            from blochsim._arrays.device import to_host
            cotangent = to_host("cotangent", cotangent, allow_complex64=True)
        cot = reverse.cotangent(cotangent, signal.shape).reshape(n, s.n_samples)
        ev = np.zeros((s.n_events, 4), np.float64)
        tg = np.zeros((n, len(fields)), np.float32)
        for i, j, part in chunks(arrays, shape, step):
            _, raw = device.adjoint(owner, s, ps, (True, {}, part, (j - i,)), fields, forward=False)
            e, tg[i:j] = raw(np.ascontiguousarray(cot[i:j]))
            ev += e
        return reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

    return signal, pullback


def jacobian_vjp(owner, s, ps, arrays, shape, names, one, wrt_names, p, prov, pshapes, budget):
    """jacobian_vjp() of host arrays on the card: signal and Jacobian
    (NumPy) chunk by chunk, and a pullback whose second-order sweeps run
    chunk by chunk, the event gradients summed over the chunks."""
    fields, scale = reverse.fields_and_scale(names)
    nd = len(names)
    n = math.prod(shape)
    signal, J = jacobian(owner, ps, arrays, shape, fields, scale, False, None, budget, names)
    step = chunk_voxels(n, 16 * s.n_samples * (1 + nd) + _planes(arrays), budget)

    def pullback(J_cotangent, signal_cotangent=None):
        from blochsim._arrays.device import to_host
        if V.is_device_array(J_cotangent):
            J_cotangent = to_host("J_cotangent", J_cotangent, allow_complex64=True)
        W = reverse.cotangent(J_cotangent, shape + ((s.n_samples,) if one else (nd, s.n_samples)),
                              "the Jacobian's").reshape(n, nd, s.n_samples)
        sc = None
        if signal_cotangent is not None:
            if V.is_device_array(signal_cotangent):
                signal_cotangent = to_host("signal_cotangent", signal_cotangent, allow_complex64=True)
            sc = reverse.cotangent(signal_cotangent, signal.shape).reshape(n, s.n_samples)
        ev = np.zeros((s.n_events, 4), np.float64)
        for i, j, part in chunks(arrays, shape, step):
            _, _, raw = device.second_order(owner, s, ps, (True, {}, part, (j - i,)), names, False, forward=False)
            ev += raw(np.ascontiguousarray(W[i:j]), None if sc is None else np.ascontiguousarray(sc[i:j]))
        return reverse.assemble(wrt_names, p, prov, pshapes, ev, None, None, (), shape, {})

    return signal, (J[..., 0, :] if one else J), pullback
