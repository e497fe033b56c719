"""The device backend: simulate, jacobian, vjp and jacobian_vjp on the GPU,
from packed streams and tissue (device arrays, or NumPy arrays moved
through the device); results in the inputs' array library."""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import memory, reverse
from blochsim._arrays import validate as V
from blochsim._arrays.device import (Interface, device_cotangent, gradients_in_libraries, new_output, resident_tissue,
                                     work_stream)


def resident(owner, ps, arrays, ifaces, shape, want, out, jacobian=None, jac_out=None, pools=None, keyed=None,
             jac_shape=None):
    """The device path for device-array inputs (results stay on the device).
    With ``jacobian`` = (fields, scale, count) it returns (signal, J), J
    into ``jac_out`` = (name, device array, shape) if given.  With
    ``pools`` = (n_exchanging, semisolid pools, lineshape index) the pooled kernels
    play it (and its Jacobian along pool and tissue fields); with
    ``keyed`` (a stream of 3-D moments) the moment-keyed EPG.  J is made of
    shape ``jac_shape`` (default (*shape, count, samples))."""
    n = int(np.prod(shape, dtype=np.int64))
    streams = [i.stream for i in ifaces.values() if i.stream is not None]
    out_iface = None
    if out is not None:
        if not V.is_device_array(out):
            raise TypeError("out must be a device array when tissue properties are device arrays")
        out_iface = Interface("out", out, allow_complex64=True)
        if out_iface.dtype != np.complex64 or out_iface.shape != want:
            raise ValueError(f"out must be a C-contiguous complex64 device array of shape {want}, "
                             f"got shape {out_iface.shape}")
        if out_iface.stream is not None:
            streams.append(out_iface.stream)
    jac_iface = None
    if jac_out is not None:
        name, a, w = jac_out
        jac_iface = Interface(name, a, allow_complex64=True)
        if jac_iface.dtype != np.complex64 or jac_iface.shape != w:
            raise ValueError(f"{name} must be a C-contiguous complex64 device array of shape {w}, "
                             f"got shape {jac_iface.shape}")
        if jac_iface.stream is not None:
            streams.append(jac_iface.stream)
    # memory: the outputs plus one float32 plane per property
    need = (0 if out is not None else n * ps.n_samples * 8) + 4 * n * (len(arrays) + len(ifaces))
    if jacobian is not None and jac_out is None:
        need += n * ps.n_samples * 8 * jacobian[2]
    memory.check_device(owner, n, need)
    own, stream = work_stream(streams)
    dev, keep = resident_tissue(arrays, ifaces, shape, n, own, stream)
    library = next(iter(ifaces.values())).library if ifaces else "blochsim"
    if out_iface is not None:
        result, out_ptr = out, out_iface.ptr
    else:
        result, out_ptr = new_output(want, library)
    if jacobian is not None:
        fields, scale, count = jacobian
        # seeded with the SI value of one public unit: derivatives per
        # public unit
        if jac_iface is not None:
            jac, jac_ptr = jac_out[1], jac_iface.ptr
        else:
            jac, jac_ptr = new_output(jac_shape or shape + (count, want[-1]), library)
        if pools is not None:
            planes, keep_pools = resident_tissue(arrays, ifaces, shape, n, own, stream, _core.POOL_FIELDS)
            _core.pooled_cuda(ps, tuple(dev), tuple(planes), *pools, n, out_ptr, stream, fields, scale, jac_ptr)
        else:
            _core.jacobian_cuda(ps, tuple(dev), n, fields, scale, out_ptr, jac_ptr, stream)
        _core.stream_synchronize(stream)
        return result, jac
    if pools is not None:
        planes, keep_pools = resident_tissue(arrays, ifaces, shape, n, own, stream, _core.POOL_FIELDS)
        _core.pooled_cuda(ps, tuple(dev), tuple(planes), *pools, n, out_ptr, stream)
        return result
    if keyed is not None:
        _keyed(owner, keyed, ps, dev, n, out_ptr, stream)
        return result
    _core.forward_cuda(ps, tuple(dev), n, out_ptr, stream)
    # The work is ordered after the producer's on its stream (if it gave
    # one); waiting for it hands back a result any stream may read.
    _core.stream_synchronize(stream)
    return result


def _keyed(owner, stream_of_moments, ps, dev, n, out_ptr, stream):
    """The moment-keyed EPG of device planes ``dev``: its program is built
    for the call's B1, T1 and T2 ranges (read back from the device)."""
    from blochsim.sequence import keyed

    names = list(_core.TISSUE_FIELDS)
    si = [None] * len(names)
    for name in ("B1", "T1_s", "T2_s", "v_m_s"):
        e = dev[names.index(name)]
        if e is not None:
            ptr, stride = e
            h = np.empty(n if stride else 1, np.float32)
            _core.copy_to_host(h.view(np.uint8), ptr, stream)
            si[names.index(name)] = h
    program = keyed.program_for(owner, stream_of_moments, tuple(si), names)
    _core.forward_cuda(ps, tuple(dev), n, out_ptr, stream, program=program)
    _core.stream_synchronize(stream)


def jacobian(owner, ps, intake, names, fields, scale, one, out=None):
    """jacobian() on the GPU: device arrays in and out, or NumPy in and out
    (moved through the device whole) with device='cuda'.  ``intake`` is
    :func:`blochsim._arrays.device.device_inputs`' (host_only, interfaces, host
    arrays, voxel shape)."""
    host_only, ifaces, arrays, shape = intake
    want = shape + (ps.n_samples,)
    checked = None
    if out is not None:
        checked = V.jacobian_out_shapes(out, shape, len(fields), ps.n_samples, one)
        for name, a, w in checked:
            if host_only:
                V.check_host_out(name, a, w)
            elif not V.is_device_array(a):
                raise TypeError(f"{name} must be a device array when tissue properties are device arrays")
    result, J = resident(owner, ps, arrays, ifaces, shape, want, None if out is None or host_only else out[0],
                         jacobian=(fields, scale, len(names)),
                         jac_out=None if out is None or host_only else checked[1])
    if host_only:
        result, J = result.get(), J.get()
        if out is not None:
            np.copyto(out[0], result)
            np.copyto(out[1], J[..., 0, :] if one else J)
            return out
    if out is not None:
        return out
    return result, (J[..., 0, :] if one else J)


def vjp(owner, s, ps, intake, names, tissue_names, fields, scale, p, prov, pshapes):
    """vjp() on the GPU: device tissue arrays (or NumPy ones with
    device='cuda', moved to the device).  The signal comes back in the
    inputs' library (NumPy for NumPy inputs); the pullback takes a device
    or NumPy cotangent and returns the gradients of tissue properties
    passed as device arrays in their library, the others NumPy."""
    host_only, ifaces, arrays, shape = intake
    tshapes = {k: (ifaces[k].shape if k in ifaces else np.shape(arrays[k])) for k in tissue_names}
    signal, raw = adjoint(owner, s, ps, intake, fields)
    libraries = {k: i.library for k, i in ifaces.items()}

    def pullback(cotangent):
        ev, tg = raw(cotangent)
        grads = reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)
        return gradients_in_libraries(grads, libraries)

    pullback._keep = raw._keep
    return (signal.get() if host_only else signal), pullback


def adjoint(owner, s, ps, intake, fields, forward=True):
    """The tissue planes of ``intake`` on the device, the signal (in the
    inputs' library; None without ``forward``) and ``raw(cotangent)``:
    the adjoint's (event gradients (n_events, 4), tissue gradients (n,
    len(fields)) per SI unit), NumPy."""
    host_only, ifaces, arrays, shape = intake
    n = int(np.prod(shape, dtype=np.int64))
    want = shape + (s.n_samples,)
    # the signal and its cotangent, the tissue planes and the tissue gradient
    memory.check_device(owner, n, n * (16 * s.n_samples + 4 * (len(arrays) + len(ifaces)) + 4 * len(fields)))
    own, cuda_stream = work_stream([i.stream for i in ifaces.values() if i.stream is not None])
    dev, keep = resident_tissue(arrays, ifaces, shape, n, own, cuda_stream)
    library = next(iter(ifaces.values())).library if ifaces else "blochsim"
    signal = None
    if forward:
        signal, out_ptr = new_output(want, library)
        _core.forward_cuda(ps, dev, n, out_ptr, cuda_stream)
        _core.stream_synchronize(cuda_stream)

    def raw(cotangent):
        order = own if own is not None else cuda_stream
        cot_ptr, cot_keep = device_cotangent(cotangent, want, "the signal's", order, cuda_stream)
        ev = np.zeros((s.n_events, 4), dtype=np.float64)
        tg = np.zeros((n, len(fields)), dtype=np.float32)
        tbuf = _core.DeviceBuffer(max(tg.nbytes, 8), order)
        _core.adjoint_cuda(ps, dev, n, fields, cot_ptr, ev, tbuf.ptr, cuda_stream)
        if tg.size:
            _core.copy_to_host(tg.reshape(-1).view(np.uint8), tbuf.ptr, cuda_stream)
        _core.stream_synchronize(cuda_stream)
        del cot_keep, tbuf
        return ev, tg

    raw._keep = (keep, own, dev)
    return signal, raw


def jacobian_vjp(owner, s, ps, intake, names, one, wrt_names, p, prov, pshapes):
    """jacobian_vjp() on the GPU: the Jacobian in the inputs' library
    (NumPy for NumPy inputs), the pullback taking a device or NumPy
    Jacobian cotangent and returning NumPy gradients."""
    host_only, ifaces, arrays, shape = intake
    signal, J, raw = second_order(owner, s, ps, intake, names, one)

    def pullback(J_cotangent, signal_cotangent=None):
        ev = raw(J_cotangent, signal_cotangent)
        return reverse.assemble(wrt_names, p, prov, pshapes, ev, None, None, (), shape, {})

    pullback._keep = raw._keep
    J_out = J[..., 0, :] if one else J
    if host_only:
        return signal.get(), (J.get()[..., 0, :] if one else J.get()), pullback
    return signal, J_out, pullback


def second_order(owner, s, ps, intake, names, one, forward=True):
    """The tissue planes of ``intake`` on the device, the signal and
    Jacobian (*shape, len(names), samples) in the inputs' library (None
    without ``forward``) and ``raw(J_cotangent, signal_cotangent=None)``:
    the event gradients (n_events, 4) of the cost, per public unit of each
    direction, NumPy."""
    host_only, ifaces, arrays, shape = intake
    n = int(np.prod(shape, dtype=np.int64))
    nd = len(names)
    fields, scale = reverse.fields_and_scale(names)
    # the signal and its Jacobian, their cotangents, the tissue planes
    memory.check_device(owner, n, n * (16 * s.n_samples * (1 + nd) + 4 * (len(arrays) + len(ifaces))))
    own, cuda_stream = work_stream([i.stream for i in ifaces.values() if i.stream is not None])
    dev, keep = resident_tissue(arrays, ifaces, shape, n, own, cuda_stream)
    library = next(iter(ifaces.values())).library if ifaces else "blochsim"
    signal = J = None
    if forward:
        signal, out_ptr = new_output(shape + (s.n_samples,), library)
        J, jac_ptr = new_output(shape + (nd, s.n_samples), library)
        _core.jacobian_cuda(ps, dev, n, fields, scale, out_ptr, jac_ptr, cuda_stream)
        _core.stream_synchronize(cuda_stream)
    J_shape = shape + ((s.n_samples,) if one else (nd, s.n_samples))

    def upload(c, want, what):
        return device_cotangent(c, want, what, own if own is not None else cuda_stream, cuda_stream)

    def raw(J_cotangent, signal_cotangent=None):
        ptr, held = upload(J_cotangent, J_shape, "the Jacobian's")
        ev = np.zeros((s.n_events, 4), dtype=np.float64)
        for j, field in enumerate(fields):
            part = np.zeros_like(ev)
            # direction j's cotangent: row stride nd samples, offset j rows
            _core.adjoint2_cuda(ps, dev, n, field, ptr + 8 * j * s.n_samples, nd * s.n_samples, part,
                                cuda_stream)
            ev += scale[j] * part
        if signal_cotangent is not None:
            sptr, sheld = upload(signal_cotangent, shape + (s.n_samples,), "the signal's")
            part = np.zeros_like(ev)
            tbuf = _core.DeviceBuffer(8, own if own is not None else cuda_stream)
            _core.adjoint_cuda(ps, dev, n, [], sptr, part, tbuf.ptr, cuda_stream)
            ev += part
            del sheld, tbuf
        del held
        return ev

    raw._keep = (keep, own, dev)
    return signal, J, raw


def keyed_from_host(owner, stream_of_moments, ps, arrays, shape, out):
    """The moment-keyed EPG on the device for host tissue arrays: the planes
    go to the card, the signal comes back into ``out`` (checked) or a new
    array."""
    want = shape + (ps.n_samples,)
    if out is not None:
        V.check_host_out("out", out, want)
    n = int(np.prod(shape, dtype=np.int64))
    memory.check_device(owner, n, n * ps.n_samples * 8 + 4 * n * len(arrays))
    own, stream = work_stream([])
    dev, keep = resident_tissue(arrays, {}, shape, n, own, stream)
    buf = _core.DeviceBuffer(max(8 * n * ps.n_samples, 8), own if own is not None else stream)
    _keyed(owner, stream_of_moments, ps, dev, n, buf.ptr, stream)
    result = out if out is not None else np.empty(want, dtype=np.complex64)
    if result.size:
        _core.copy_to_host(result.reshape(-1).view(np.uint8), buf.ptr, stream)
    return result
