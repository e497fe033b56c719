"""The host backend: simulate, jacobian, vjp and jacobian_vjp on the CPU's
kernels, from a packed stream and host tissue arrays."""
from __future__ import annotations

import numpy as np

from blochsim import _core
from blochsim._engine import memory, reverse
from blochsim._arrays import validate as V


def si_planes(arrays, shape):
    """Tissue arrays as float32 SI values (length n or 1) in TISSUE_FIELDS order."""
    return V.si_planes(arrays, shape, _core.TISSUE_FIELDS)


def ranges(arrays, shape):
    """si_planes holding each array's values once (their ranges, for the
    moment-keyed program), nothing broadcast to the voxel shape."""
    return V.si_planes(arrays, shape, _core.TISSUE_FIELDS, ranges_only=True)


def forward(owner, ps, arrays, shape, out, threads, variant, streamed=None):
    """The signal (*shape, samples) of host tissue arrays, into ``out``
    (checked) or a new array.  With ``streamed`` (a budget in bytes, 0 for
    most of the free device memory) the kernels run on the GPU, the tissue
    and the signal streaming through it in chunks of at most that size."""
    want = shape + (ps.n_samples,)
    if out is not None:
        V.check_host_out("out", out, want)
    memory.check_call(owner, ps, shape, arrays, "forward", threads, outputs=0 if out is not None else 1,
                       host_kernels=streamed is None)
    si = si_planes(arrays, shape)
    if out is None:
        out = _core.new_result(want, np.complex64)
    n = int(np.prod(shape, dtype=np.int64))
    flat = out.reshape(n, ps.n_samples)
    if streamed is not None:
        _core.forward_cuda_streamed(ps, si, n, flat, streamed)
    else:
        _core.forward_host(ps, si, n, flat, threads, variant)
    return out


def keyed_forward(owner, stream, ps, arrays, shape, out, threads):
    """The signal (*shape, samples) of host tissue arrays through the
    moment-keyed EPG (blochsim/sequence/keyed.py; ``stream`` carries the
    moments), into ``out`` (checked) or a new array."""
    from blochsim.sequence import keyed

    want = shape + (ps.n_samples,)
    if out is not None:
        V.check_host_out("out", out, want)
    program = keyed.program_for(owner, stream, ranges(arrays, shape), list(_core.TISSUE_FIELDS))
    n = int(np.prod(shape, dtype=np.int64))
    memory.check_host(owner, n, 8.0 * ps.n_samples * (out is None) + 4.0 * len(arrays),
                       4.0 * (12 * program.max_slots + 6 * ps.n_intervals) * 16 * max(1, min(threads, n)),
                       f"the moment-keyed EPG's workspaces ({program.max_slots:,} states)",
                       "fewer threads, or a file whose moments hold fewer states")
    si = si_planes(arrays, shape)
    if out is None:
        out = _core.new_result(want, np.complex64)
    flat = out.reshape(n, ps.n_samples)

    def run(i, j):
        part = tuple(a if a is None or a.shape[0] == 1 else a[i:j] for a in si)
        _core.forward_host(ps, part, j - i, flat[i:j], threads, program=program)

    keyed_run(owner, program, n, program.seconds(n, threads), threads, run)
    return out


def keyed_run(owner, program, n, seconds, threads, run, stacklevel=4):
    """run(i, j) computes voxels [i, j) of a moment-keyed call: at once, or,
    when the call is expected to take more than keyed.LONG_CALL_S
    (``seconds``), after a SlowCallWarning in pieces of about 2 % with
    progress on stderr (every piece's voxels computed as in one call);
    ``stacklevel`` points the warning at the user's call."""
    from blochsim.sequence import keyed

    if seconds <= keyed.LONG_CALL_S:
        run(0, n)
        return
    import sys
    import warnings

    warnings.warn(f"{owner}: the moment-keyed EPG holds up to {program.max_slots:,} states of this sequence "
                  f"({program.cost:,} state-events a voxel); {n:,} voxels on {threads} threads are expected to take "
                  f"about {seconds:.0f} s", keyed.SlowCallWarning, stacklevel=stacklevel)
    step = max(1, -(-n // 50))
    for i in range(0, n, step):
        j = min(n, i + step)
        run(i, j)
        sys.stderr.write(f"\r{owner}: {j:,} of {n:,} voxels ({100 * j // n} %)")
        sys.stderr.flush()
    sys.stderr.write("\n")


def _check_jacobian_out(out, shape, fields, ps, one):
    if out is not None:
        for name, a, want in V.jacobian_out_shapes(out, shape, len(fields), ps.n_samples, one):
            V.check_host_out(name, a, want)


def _play_jacobian(ps, si, shape, fields, scale, one, threads, out, **entry):
    """_core.jacobian_host into ``out`` or new arrays: (signal, J) shaped
    (*shape, samples) and (*shape, len(fields), samples), J without its
    direction axis for ``one`` name; ``out`` itself when given."""
    n = int(np.prod(shape, dtype=np.int64))
    if out is None:
        signal = _core.new_result(shape + (ps.n_samples,), np.complex64)
        jac = _core.new_result((n, len(fields), ps.n_samples), np.complex64)
    else:
        signal, jac = out
    # seeded with the SI value of one public unit: derivatives per public unit
    _core.jacobian_host(ps, si, n, fields, scale, signal.reshape(n, ps.n_samples),
                        jac.reshape(n, len(fields), ps.n_samples), threads, **entry)
    if out is not None:
        return out
    J = jac.reshape(shape + (len(fields), ps.n_samples))
    return signal, J[..., 0, :] if one else J


def jacobian(owner, ps, arrays, shape, fields, scale, one, threads, variant, out=None, entry="jacobian",
             outputs=None):
    """Signal (*shape, samples) and Jacobian (*shape, len(fields), samples;
    (*shape, samples) for ``one`` name) per public unit, into ``out``
    (checked) if given; and the SI planes.  The memory check counts
    ``outputs`` complex64 rows per voxel (default: the results not in
    ``out``) and the workspace of the host entry ``entry``."""
    _check_jacobian_out(out, shape, fields, ps, one)
    memory.check_call(owner, ps, shape, arrays, entry, threads, fields,
                       outputs=outputs if outputs is not None else (0 if out is not None else 1 + len(fields)))
    si = si_planes(arrays, shape)
    return _play_jacobian(ps, si, shape, fields, scale, one, threads, out, variant=variant), si


def keyed_jacobian(owner, stream, ps, arrays, shape, fields, scale, one, threads, out=None):
    """jacobian() through the moment-keyed EPG (``stream`` carries the
    moments): signal and Jacobian per public unit, into ``out`` if given."""
    from blochsim.sequence import keyed

    n = int(np.prod(shape, dtype=np.int64))
    _check_jacobian_out(out, shape, fields, ps, one)
    program = keyed.program_for(owner, stream, ranges(arrays, shape), list(_core.TISSUE_FIELDS))
    duals = len(fields) + 1
    memory.check_host(owner, n, 8.0 * ps.n_samples * (1 + len(fields)) * (out is None) + 4.0 * len(arrays),
                       4.0 * (12 * program.max_slots + 6 * ps.n_intervals) * 16 * duals * max(1, min(threads, n)),
                       f"the moment-keyed EPG's dual workspaces ({program.max_slots:,} states)",
                       "fewer threads or fewer directions")
    return _play_jacobian(ps, si_planes(arrays, shape), shape, fields, scale, one, threads, out, program=program)


def vjp(owner, s, ps, arrays, shape, names, tissue_names, p, prov, pshapes, threads, variant):
    """The signal and the pullback of the host adjoint."""
    fields, scale = reverse.fields_and_scale(tissue_names)
    n = int(np.prod(shape, dtype=np.int64))
    memory.check_call(owner, ps, shape, arrays, "adjoint", threads, fields, outputs=2)
    si = si_planes(arrays, shape)
    signal = _core.new_result(shape + (s.n_samples,), np.complex64)
    _core.forward_host(ps, si, n, signal.reshape(n, s.n_samples), threads, variant)
    tshapes = {k: np.shape(arrays[k]) for k in tissue_names}

    def pullback(cotangent):
        cot = reverse.cotangent(cotangent, signal.shape)
        ev = np.zeros((s.n_events, 4), dtype=np.float64)
        tg = np.zeros((n, len(fields)), dtype=np.float32)
        _core.adjoint_host(ps, si, n, fields, cot.reshape(n, s.n_samples), ev, tg, threads)
        return reverse.assemble(names, p, prov, pshapes, ev, tg, scale, tissue_names, shape, tshapes)

    return signal, pullback


def jacobian_vjp(owner, s, ps, arrays, shape, names, one, wrt_names, p, prov, pshapes, threads, variant):
    """The signal, the tissue Jacobian and the pullback of a cost of the
    Jacobian (the host's second-order adjoint, one sweep per direction)."""
    n = int(np.prod(shape, dtype=np.int64))
    fields, scale = reverse.fields_and_scale(names)
    (signal, J_out), si = jacobian(owner, ps, arrays, shape, fields, scale, one, threads, variant,
                                   entry="adjoint2", outputs=2 + 2 * len(fields))

    def pullback(J_cotangent, signal_cotangent=None):
        W = reverse.cotangent(J_cotangent, J_out.shape, "the Jacobian's").reshape(n, len(names), s.n_samples)
        ev = np.zeros((s.n_events, 4), dtype=np.float64)
        for j, field in enumerate(fields):
            part = np.zeros_like(ev)
            _core.adjoint2_host(ps, si, n, field, W, j, part, threads)
            ev += scale[j] * part  # J is per public unit of property j
        if signal_cotangent is not None:
            cot = reverse.cotangent(signal_cotangent, signal.shape).reshape(n, s.n_samples)
            part = np.zeros_like(ev)
            _core.adjoint_host(ps, si, n, [], cot, part, np.zeros((n, 0), np.float32), threads)
            ev += part
        return reverse.assemble(wrt_names, p, prov, pshapes, ev, None, None, (), shape, {})

    return signal, J_out, pullback
