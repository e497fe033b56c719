# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled core of blochsim: thin wrappers over the C++ backends.

Nothing here validates physics; blochsim's Python layer does that before any
call, and the C++ side re-checks the stream's integrity (indices, slots).
Device pointers travel as Python ints.
"""
from cpython.exc cimport PyErr_CheckSignals
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stddef cimport size_t
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

from blochsim._events cimport (EventStream, Pools, Property, Tissue, cuda_error_base, interrupted, lineshape_g,
                              out_of_memory, status_message)
from blochsim._host cimport (Interrupt, PerkModel, host_available_memory, host_perk_dispatch, host_set_interrupt,
                             host_workspace_bytes, perk_max_outputs)
from blochsim._host cimport (host_adjoint2_dispatch, host_adjoint_dispatch, host_forward_dispatch, host_forward_registers, host_isa,
                             host_jacobian_dispatch, host_jacobian_registers, host_pooled_adjoint_dispatch,
                             host_pooled_dispatch, host_pooled_registers)
cimport blochsim._launcher as L

# Order of the tissue entries handed to the forward functions.
TISSUE_FIELDS = ("T1_s", "T2_s", "M0", "B1", "B1phase_rad", "B0_hz", "D_m2_s", "v_m_s",
                 "inv_efficiency")
_FALLBACK = (1.0e30, 1.0e30, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0)
# Pool fields after them (pools.hpp PoolField): the semisolid pool's, then
# five per exchanging pool B, C, D, E.
POOL_FIELDS = ("bound_fraction", "bound_exchange_hz", "bound_T1_s", "bound_T2_s") + tuple(
    f"pool{x}_{c}" for x in "BCDE" for c in ("fraction", "exchange_hz", "T1_s", "T2_s", "shift_hz"))
LINESHAPES = ("super-lorentzian", "lorentzian", "gaussian", "super-lorentzian-cutoff")

DEF ERRLEN = 512


class CudaError(RuntimeError):
    """A CUDA call failed; the message starts with the CUDA error name."""


cdef int _raise(int st, const char* err, list holder=None) except -1:
    if st == 0:
        return 0
    msg = err.decode(errors="replace")
    if st == interrupted:
        # the exception the signal handler raised (KeyboardInterrupt for Ctrl-C)
        raise holder[0] if holder else KeyboardInterrupt()
    if st >= cuda_error_base:
        raise CudaError(msg)
    if not msg:
        msg = status_message(st).decode()
    if st == out_of_memory:
        raise MemoryError("blochsim: " + msg)
    raise ValueError("blochsim: " + msg)


cdef int _poll(void* ctx) noexcept with gil:
    """Runs the Python signal handlers (in the main thread; elsewhere a no-op)
    between blocks of a long call; an exception they raise stops the call
    and is kept in ctx (a list) to be raised when it returns."""
    try:
        PyErr_CheckSignals()
    except BaseException as e:
        (<list> ctx).append(e)
        return 1
    return 0


cdef Interrupt _listen(list holder) noexcept:
    """Installs _poll for the calls this thread makes; returns the previous poll."""
    cdef Interrupt i
    i.poll = _poll
    i.ctx = <void*> holder
    return host_set_interrupt(i)


cdef class PackedStream:
    """An event stream (blochsim.sequence.EventStream) with its scalar
    settings, held as the C struct the backends read."""
    cdef EventStream s
    cdef object refs

    def __cinit__(self, stream, int states, double dk_rad_per_m, double voxel_size_m,
                  bint real_path, float common_phase_rad):
        cdef const int32_t[::1] interval = stream.interval
        cdef const uint32_t[::1] flags = stream.flags
        cdef const int32_t[::1] sb = stream.shift_before
        cdef const int32_t[::1] sa = stream.shift_after
        cdef const float[::1] flip = stream.flip_rad
        cdef const float[::1] phase = stream.phase_rad
        cdef const float[::1] rx = stream.rx_phase_rad
        cdef const int32_t[::1] slot = stream.slot
        cdef const double[::1] dur = stream.duration_s
        cdef const float[:, ::1] rft = stream.rf_table
        cdef const float[::1] rfd = getattr(stream, "rf_duration_s", None)
        cdef const float[::1] rfo = getattr(stream, "rf_offset_hz", None)
        cdef const float[::1] rfp = getattr(stream, "rf_power", None)
        cdef const int32_t[::1] drv = getattr(stream, "driven", None)
        cdef const double[:, ::1] drt = getattr(stream, "driven_table", None)
        cdef int64_t ne = interval.shape[0]
        if (flags.shape[0] != ne or sb.shape[0] != ne or sa.shape[0] != ne or flip.shape[0] != ne
                or phase.shape[0] != ne or rx.shape[0] != ne or slot.shape[0] != ne):
            raise ValueError("blochsim internal error: event arrays differ in length")
        if rft is not None and (rft.shape[0] != ne or rft.shape[1] != 8):
            raise ValueError("blochsim internal error: rf_table must have shape (n_events, 8)")
        if ((rfd is not None and rfd.shape[0] != ne) or (rfo is not None and rfo.shape[0] != ne)
                or (rfp is not None and rfp.shape[0] != ne)):
            raise ValueError("blochsim internal error: pulse arrays differ in length from the events")
        if drv is not None and (drv.shape[0] != ne or drt is None or drt.shape[1] != 4):
            raise ValueError("blochsim internal error: driven pulse arrays")
        self.refs = (interval, flags, sb, sa, flip, phase, rx, slot, dur, rft, rfd, rfo, rfp, drv, drt)
        self.s.n_events = ne
        if ne > 0:
            self.s.interval = &interval[0]
            self.s.flags = &flags[0]
            self.s.shift_before = &sb[0]
            self.s.shift_after = &sa[0]
            self.s.flip_rad = &flip[0]
            self.s.phase_rad = &phase[0]
            self.s.rx_phase_rad = &rx[0]
            self.s.slot = &slot[0]
            if rft is not None:
                self.s.rf_table = &rft[0, 0]
            if rfd is not None:
                self.s.rf_duration_s = &rfd[0]
            if rfo is not None:
                self.s.rf_offset_hz = &rfo[0]
            if rfp is not None:
                self.s.rf_power = &rfp[0]
            if drv is not None:
                self.s.driven = &drv[0]
                self.s.n_driven = drt.shape[0]
                if drt.shape[0] > 0:
                    self.s.driven_table = &drt[0, 0]
        self.s.n_intervals = dur.shape[0]
        if dur.shape[0] > 0:
            self.s.duration_s = &dur[0]
        self.s.n_samples = stream.n_samples
        self.s.states = states
        self.s.dk_rad_per_m = dk_rad_per_m
        self.s.voxel_size_m = voxel_size_m
        self.s.real_path = 1 if real_path else 0
        self.s.common_phase_rad = common_phase_rad

    @property
    def n_samples(self):
        return self.s.n_samples

    @property
    def states(self):
        return self.s.states


cdef Property* _field(Tissue* t, int i) noexcept:
    if i == 0: return &t.T1_s
    if i == 1: return &t.T2_s
    if i == 2: return &t.M0
    if i == 3: return &t.B1
    if i == 4: return &t.B1phase_rad
    if i == 5: return &t.B0_hz
    if i == 6: return &t.D_m2_s
    if i == 7: return &t.v_m_s
    return &t.inv_efficiency


cdef object _host_tissue(Tissue* t, tuple tissue, int64_t n):
    """Point t at float32 host arrays (length n or 1, or None)."""
    cdef const float[::1] view
    cdef Property* p
    refs = []
    if len(tissue) != 9:
        raise ValueError("blochsim internal error: tissue tuple has the wrong length")
    t.n = n
    for i in range(9):
        p = _field(t, i)
        p.data = NULL
        p.stride = 0
        p.fallback = _FALLBACK[i]
        arr = tissue[i]
        if arr is None:
            continue
        view = arr
        if view.shape[0] == 0:
            if n != 0:
                raise ValueError("blochsim internal error: empty tissue array")
            continue
        refs.append(view)
        p.data = &view[0]
        p.stride = 0 if view.shape[0] == 1 else 1
    return refs


def forward_host(PackedStream ps, tuple tissue, int64_t n, float complex[:, ::1] out, int threads,
                 int variant=0):
    """Play a packed stream for n problems on the host.

    ``tissue`` holds one float32 array (length n or 1) or None per name of
    TISSUE_FIELDS, in SI units; ``out`` is complex64 of shape (n, n_samples),
    written in place.  ``variant`` 0 runs the host backend; 1 or 4 run the
    device's register path on the host with a team of that many members (for
    tests).
    """
    cdef Tissue t
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output has shape (%d, %d), expected (%d, %d)"
                         % (out.shape[0], out.shape[1], n, ps.s.n_samples))
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        if variant == 0:
            st = host_forward_dispatch(ps.s, t, outp, threads)
        else:
            st = host_forward_registers(ps.s, t, outp, variant)
    host_set_interrupt(prev)
    _raise(st, err, holder)


cdef Property* _pool_field(Pools* p, int i) noexcept:
    if i == 0: return &p.bound_fraction
    if i == 1: return &p.bound_exchange_hz
    if i == 2: return &p.bound_T1_s
    if i == 3: return &p.bound_T2_s
    return &p.pool[(i - 4) // 5][(i - 4) % 5]


cdef list _host_pools(Pools* p, tuple pools, int n_exchanging, bint bound, int lineshape):
    """Point p at float32 host arrays (length n or 1, or None) in POOL_FIELDS order."""
    cdef Property* q
    cdef const float[::1] view
    keep = []
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound else 0
    p.lineshape = lineshape
    for i in range(len(POOL_FIELDS)):
        q = _pool_field(p, i)
        arr = pools[i]
        if arr is None:
            q.data = NULL
            continue
        view = arr
        if view.shape[0] == 0:
            q.data = NULL
            continue
        keep.append(view)
        q.data = &view[0]
        q.stride = 0 if view.shape[0] == 1 else 1
    return keep


def pooled(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, bint bound, int lineshape,
           int64_t n, fields, seeds, float complex[:, ::1] out, jac, int threads, bint gpu=False,
           bint registers=False):
    """Signal (and Jacobian) of a packed stream with pools: on the host, or
    with ``gpu`` moved through the device (host arrays in and out).
    ``registers`` (host, no fields): the device's register team emulated on
    the host, for tests.

    ``tissue`` as in :func:`forward_host`; ``pools`` holds one float32 array
    (length n or 1) or None per name of POOL_FIELDS, in SI units;
    ``lineshape`` indexes LINESHAPES.  ``fields`` are indices into
    TISSUE_FIELDS + POOL_FIELDS (possibly none) with their ``seeds``;
    ``jac`` is complex64 of shape (n, len(fields), n_samples), or None
    without fields.
    """
    cdef Tissue t
    cdef Pools p
    cdef float complex[:, :, ::1] jv
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[33]
    cdef float cs[33]
    cdef float* jacp = NULL
    cdef char err[ERRLEN]
    err[0] = 0
    if nd > 33 or len(seeds) != nd or len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pooled call arguments")
    for i in range(nd):
        cf[i] = int(fields[i])
        cs[i] = float(seeds[i])
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shapes")
    keep = _host_tissue(&t, tissue, n)
    keep += _host_pools(&p, pools, n_exchanging, bound, lineshape)
    if nd > 0:
        jv = jac
        if jv.shape[0] != n or jv.shape[1] != nd or jv.shape[2] != ps.s.n_samples:
            raise ValueError("blochsim internal error: Jacobian shape")
        if n > 0 and ps.s.n_samples > 0:
            jacp = <float*> &jv[0, 0, 0]
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        if gpu:
            st = L.pooled(ps.s, t, p, cf, nd, cs, outp, jacp, err, ERRLEN)
        elif registers:
            st = host_pooled_registers(ps.s, t, p, outp)
        else:
            st = host_pooled_dispatch(ps.s, t, p, cf, nd, cs, outp, jacp, threads)
    host_set_interrupt(prev)
    _raise(st, err, holder)


cdef int _device_pools(Pools* p, tuple pools, int n_exchanging, bint bound, int lineshape) except -1:
    """Point p at device float32 planes: one (pointer, stride) pair or None
    per POOL_FIELDS entry."""
    cdef Property* q
    if len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pools tuple has the wrong length")
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound else 0
    p.lineshape = lineshape
    for i in range(len(POOL_FIELDS)):
        q = _pool_field(p, i)
        q.data = NULL
        q.stride = 0
        if pools[i] is not None:
            ptr, stride = pools[i]
            q.data = <const float*> <uintptr_t> ptr
            q.stride = stride
    return 0


def pooled_cuda(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, bint bound, int lineshape,
                int64_t n, uintptr_t out_ptr, uintptr_t stream):
    """The pooled signal of device tissue and pool planes (one (pointer,
    stride) pair or None per TISSUE_FIELDS and POOL_FIELDS entry, float32 SI
    values, checked by the caller) into a device complex64 output, ordered
    on ``stream`` and synchronised with it."""
    cdef Tissue t
    cdef Pools p
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    _device_tissue(&t, tissue, n)
    _device_pools(&p, pools, n_exchanging, bound, lineshape)
    if n == 0 or ps.s.n_samples == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.pooled_resident(ps.s, t, p, <float*> out_ptr, <void*> stream, err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def pooled_adjoint(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, bint bound, int lineshape,
                   int64_t n, fields, const float complex[:, ::1] cot, double[:, ::1] ev_grad,
                   float[:, ::1] tgrad, int threads, unsigned mask=31, bint gpu=False):
    """Reverse mode of a packed stream with pools: on the host, or with
    ``gpu`` on the device (host arrays in and out).

    ``tissue``, ``pools``, ``lineshape`` and ``fields`` as in :func:`pooled`;
    ``cot`` (n, n_samples) complex64 is the cotangent; ``ev_grad``
    (n_events, 6) float64 receives dL / d(interval duration_s, flip_rad,
    phase_rad, rx_phase_rad, pulse duration_s, pulse offset_hz) of each
    event summed over the problems; ``tgrad`` (n, len(fields)) float32
    receives dL / d field per problem, in SI units.  ``mask`` picks the
    event columns computed (bits 0-4: interval duration, flip, phase, pulse
    duration, pulse offset; the others stay 0).
    """
    cdef Tissue t
    cdef Pools p
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[33]
    cdef char err[ERRLEN]
    err[0] = 0
    if nd > 33 or len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pooled adjoint arguments")
    for i in range(nd):
        cf[i] = int(fields[i])
    if cot.shape[0] != n or cot.shape[1] != ps.s.n_samples or ev_grad.shape[0] != ps.s.n_events \
            or ev_grad.shape[1] != 6 or tgrad.shape[0] != n or tgrad.shape[1] != nd:
        raise ValueError("blochsim internal error: pooled adjoint shapes")
    keep = _host_tissue(&t, tissue, n)
    keep += _host_pools(&p, pools, n_exchanging, bound, lineshape)
    cdef const float* cotp = <const float*> &cot[0, 0] if n > 0 and ps.s.n_samples > 0 else NULL
    cdef double* evp = &ev_grad[0, 0] if ps.s.n_events > 0 else NULL
    cdef float* tgp = &tgrad[0, 0] if n > 0 and nd > 0 else NULL
    if ps.s.n_events == 0 or n == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        if gpu:
            st = L.pooled_adjoint(ps.s, t, p, cf, nd, cotp, evp, tgp, mask, err, ERRLEN)
        else:
            st = host_pooled_adjoint_dispatch(ps.s, t, p, cf, nd, cotp, evp, tgp, threads, mask)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def lineshape_values(int shape, const double[::1] x, double[::1] g, double[::1] dg):
    """g(x) and dg/dx of lineshape LINESHAPES[shape] (lineshape.hpp) at each x."""
    cdef Py_ssize_t i
    if shape < 0 or shape >= len(LINESHAPES) or g.shape[0] != x.shape[0] or dg.shape[0] != x.shape[0]:
        raise ValueError("blochsim internal error: lineshape arguments")
    with nogil:
        for i in range(x.shape[0]):
            lineshape_g(shape, x[i], g[i], dg[i])


def jacobian_host(PackedStream ps, tuple tissue, int64_t n, fields, seeds, float complex[:, ::1] out,
                  float complex[:, :, ::1] jac, int threads, int variant=0):
    """Signal and tissue Jacobian of a packed stream for n problems on the
    host, in one pass.

    ``fields`` are indices into TISSUE_FIELDS (distinct, at least one);
    ``jac`` is complex64 of shape (n, len(fields), n_samples): the derivative
    of each sample with respect to each field, direction j seeded with
    ``seeds[j]`` (d SI value / d direction: the SI value of one public unit
    gives derivatives per public unit).  ``tissue`` and
    ``out`` as in :func:`forward_host`; ``variant`` 4 runs the device's
    Jacobian register path on the host (a team of four, for tests).
    """
    cdef Tissue t
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[9]
    cdef float cs[9]
    cdef char err[ERRLEN]
    err[0] = 0
    if nd < 1 or nd > 9 or len(seeds) != nd:
        raise ValueError("blochsim internal error: 1 to 9 Jacobian directions, one seed each")
    for i in range(nd):
        cf[i] = int(fields[i])
        cs[i] = float(seeds[i])
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples or jac.shape[0] != n or jac.shape[1] != nd \
            or jac.shape[2] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shapes")
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    cdef float* jacp = <float*> &jac[0, 0, 0]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        if variant == 0:
            st = host_jacobian_dispatch(ps.s, t, cf, nd, outp, jacp, threads, cs)
        else:
            st = host_jacobian_registers(ps.s, t, cf, nd, outp, jacp, cs)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def adjoint_host(PackedStream ps, tuple tissue, int64_t n, fields, const float complex[:, ::1] cot,
                 double[:, ::1] ev_grad, float[:, ::1] tgrad, int threads):
    """Reverse mode of a packed stream for n problems on the host.

    ``cot`` (n, n_samples) complex64 is the cotangent dL/dRe s + i dL/dIm s;
    ``ev_grad`` (n_events, 4) float64 receives dL / d(duration_s, flip_rad,
    phase_rad, rx_phase_rad) of each event summed over the problems;
    ``tgrad`` (n, len(fields)) float32 receives dL / d field per problem
    (``fields`` indices into TISSUE_FIELDS, distinct, possibly none).
    """
    cdef Tissue t
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[9]
    cdef char err[ERRLEN]
    err[0] = 0
    if nd > 9:
        raise ValueError("blochsim internal error: 0 to 9 adjoint tissue directions")
    for i in range(nd):
        cf[i] = int(fields[i])
    if cot.shape[0] != n or cot.shape[1] != ps.s.n_samples or ev_grad.shape[0] != ps.s.n_events \
            or ev_grad.shape[1] != 4 or tgrad.shape[0] != n or tgrad.shape[1] != nd:
        raise ValueError("blochsim internal error: adjoint shapes")
    keep = _host_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef const float* cotp = <const float*> &cot[0, 0] if n > 0 and ps.s.n_samples > 0 else NULL
    cdef double* evp = &ev_grad[0, 0]
    cdef float* tgp = &tgrad[0, 0] if n > 0 and nd > 0 else NULL
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = host_adjoint_dispatch(ps.s, t, cf, nd, cotp, evp, tgp, threads)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def adjoint2_host(PackedStream ps, tuple tissue, int64_t n, int outer_field, const float complex[:, :, ::1] cot,
                  int j, double[:, ::1] ev_grad, int threads):
    """Second order on the host: ``ev_grad`` (n_events, 4) float64 receives
    d/d TISSUE_FIELDS[outer_field] (SI unit) of the event gradients of the
    cotangent ``cot[:, j]``, ``cot`` a (n, n_dirs, n_samples) complex64
    Jacobian cotangent, summed over the problems."""
    cdef Tissue t
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    if cot.shape[0] != n or cot.shape[2] != ps.s.n_samples or not 0 <= j < cot.shape[1] \
            or ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    keep = _host_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef const float* cotp = <const float*> &cot[0, j, 0] if n > 0 and ps.s.n_samples > 0 else NULL
    cdef int64_t stride = cot.shape[1] * cot.shape[2]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = host_adjoint2_dispatch(ps.s, t, outer_field, cotp, stride, &ev_grad[0, 0], threads)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def jacobian_cuda(PackedStream ps, tuple tissue, int64_t n, fields, seeds, uintptr_t out_ptr, uintptr_t jac_ptr,
                  uintptr_t stream):
    """Device tissue (as :func:`forward_cuda`) into a device complex64 output
    and a device (n, len(fields), n_samples) complex64 Jacobian, on
    ``stream``; direction j seeded with ``seeds[j]`` (d SI value / d
    direction)."""
    cdef Tissue t
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[9]
    cdef float cs[9]
    cdef char err[ERRLEN]
    err[0] = 0
    if nd < 1 or nd > 9 or len(seeds) != nd:
        raise ValueError("blochsim internal error: 1 to 9 Jacobian directions")
    for i in range(nd):
        cf[i] = int(fields[i])
        cs[i] = float(seeds[i])
    _device_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.jacobian(ps.s, t, cf, cs, nd, <float*> out_ptr, <float*> jac_ptr, <void*> stream, err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def adjoint_cuda(PackedStream ps, tuple tissue, int64_t n, fields, uintptr_t cot_ptr, double[:, ::1] ev_grad,
                 uintptr_t tgrad_ptr, uintptr_t stream):
    """Reverse mode on the device: device tissue (as :func:`forward_cuda`),
    a device (n, n_samples) complex64 cotangent and a device (n,
    len(fields)) float32 tissue gradient; ``ev_grad`` (n_events, 4) float64
    on the host, as :func:`adjoint_host`.  Synchronises ``stream``."""
    cdef Tissue t
    cdef int st
    cdef int nd = len(fields)
    cdef int cf[9]
    cdef char err[ERRLEN]
    err[0] = 0
    if nd > 9 or ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    for i in range(nd):
        cf[i] = int(fields[i])
    _device_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.adjoint(ps.s, t, cf, nd, <const float*> cot_ptr, &ev_grad[0, 0], <float*> tgrad_ptr, <void*> stream,
                       err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def adjoint2_cuda(PackedStream ps, tuple tissue, int64_t n, int outer_field, uintptr_t cot_ptr, int64_t cot_stride,
                  double[:, ::1] ev_grad, uintptr_t stream):
    """Second order on the device: device tissue (as :func:`forward_cuda`), a
    device cotangent (row stride ``cot_stride`` complex values), ``ev_grad``
    as :func:`adjoint2_host`.  Synchronises ``stream``."""
    cdef Tissue t
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    if ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    _device_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.adjoint2(ps.s, t, outer_field, <const float*> cot_ptr, cot_stride, &ev_grad[0, 0], <void*> stream,
                        err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def cuda_jacobian_max_states(bint real_path):
    """The most states a device Jacobian holds on that path (0 without CUDA)."""
    return L.jacobian_max_states(1 if real_path else 0)


def forward_cuda_streamed(PackedStream ps, tuple tissue, int64_t n, float complex[:, ::1] out,
                          size_t budget_bytes):
    """Host tissue and host output, streamed through the device in chunks of
    at most ``budget_bytes`` of device memory (0: most of what is free)."""
    cdef Tissue t
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shape")
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.forward_streamed(ps.s, t, outp, budget_bytes, err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


cdef int _device_tissue(Tissue* t, tuple tissue, int64_t n) except -1:
    """Point t at device float32 planes: one (pointer, stride) pair or None
    per TISSUE_FIELDS entry."""
    cdef Property* p
    t.n = n
    for i in range(9):
        p = _field(t, i)
        p.data = NULL
        p.stride = 0
        p.fallback = _FALLBACK[i]
        if tissue[i] is not None:
            ptr, stride = tissue[i]
            p.data = <const float*> <uintptr_t> ptr
            p.stride = stride
    return 0


def forward_cuda(PackedStream ps, tuple tissue, int64_t n, uintptr_t out_ptr, uintptr_t stream):
    """Device tissue (one (pointer, stride) pair or None per TISSUE_FIELDS
    entry, float32 SI values) into a device complex64 output, on ``stream``."""
    cdef Tissue t
    cdef int st
    cdef char err[ERRLEN]
    err[0] = 0
    _device_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = L.forward(ps.s, t, <float*> out_ptr, <void*> stream, err, ERRLEN)
    host_set_interrupt(prev)
    _raise(st, err, holder)


def cuda_bytes_per_problem(PackedStream ps):
    """Device bytes one problem needs (output, tissue, scratch)."""
    cdef Tissue t
    return L.bytes_per_problem(ps.s, t)


ENTRIES = ("forward", "jacobian", "adjoint", "adjoint2", "pooled", "pooled_adjoint")


def workspace_bytes(str entry, PackedStream ps, int64_t n, int threads, fields=(), int n_exchanging=0,
                    bint bound=False, unsigned mask=31):
    """Bytes the host entry ``entry`` (ENTRIES) allocates beyond its inputs
    and outputs for n problems on ``threads`` threads (host.hpp
    workspace_bytes); ``fields`` its directions (indices as the entry's),
    the pool counts for the pooled entries."""
    cdef Pools p
    cdef int cf[33]
    cdef int nd = len(fields)
    if nd > 33:
        raise ValueError("blochsim internal error: too many directions")
    for i in range(nd):
        cf[i] = int(fields[i])
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound else 0
    p.lineshape = 0
    return host_workspace_bytes(ENTRIES.index(entry), ps.s, &p, n, threads, cf, nd, mask)


def available_memory():
    """Bytes of host memory a new allocation can take (interrupt.hpp)."""
    return host_available_memory()


def host_instruction_set():
    """Name of the x86-64 level the host kernels run with on this CPU."""
    return host_isa().decode()


def cuda_available():
    """(usable, reason): whether the device backend can run, and why not."""
    cdef char why[ERRLEN]
    cdef int ok
    why[0] = 0
    ok = L.available(why, ERRLEN)
    return bool(ok), why.decode(errors="replace")


# --------------------------------------------------------------------------
# Device memory, copies and streams

cdef class DeviceBuffer:
    """Owns ``nbytes`` of device memory (freed when the object goes).

    With ``stream`` (a :class:`CudaStream`, kept alive by the buffer, or the
    handle of a stream that outlives it) the memory is allocated and freed
    in that stream's order, without synchronising the device.  Without it,
    allocation and release are synchronous and the memory is usable from
    any stream.
    """
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef uintptr_t stream
    cdef bint ordered
    cdef object owner

    def __cinit__(self, size_t nbytes, stream=None):
        cdef void* p = NULL
        cdef char err[ERRLEN]
        err[0] = 0
        self.ptr = 0
        self.nbytes = nbytes
        self.ordered = stream is not None
        self.owner = stream if isinstance(stream, CudaStream) else None
        if isinstance(stream, CudaStream):
            self.stream = <uintptr_t> stream.handle
        else:
            self.stream = <uintptr_t> (int(stream) if stream is not None else 0)
        if self.ordered:
            _raise(L.device_malloc_async(&p, nbytes, <void*> self.stream, err, ERRLEN), err)
        else:
            _raise(L.device_malloc(&p, nbytes, err, ERRLEN), err)
        self.ptr = <uintptr_t> p

    def __dealloc__(self):
        cdef char err[ERRLEN]
        if self.ptr:
            if self.ordered:
                L.device_free_async(<void*> self.ptr, <void*> self.stream, err, ERRLEN)
            else:
                L.device_free(<void*> self.ptr, err, ERRLEN)
            self.ptr = 0


def copy_to_device(uintptr_t dst, const uint8_t[::1] src, uintptr_t stream):
    """Copy a host byte buffer to device memory (ordered on stream)."""
    cdef char err[ERRLEN]
    err[0] = 0
    if src.shape[0] == 0:
        return
    _raise(L.copy_to_device(<void*> dst, &src[0], src.shape[0], <void*> stream, err, ERRLEN), err)


def copy_to_host(uint8_t[::1] dst, uintptr_t src, uintptr_t stream):
    """Copy device memory into a host byte buffer; waits for the stream."""
    cdef char err[ERRLEN]
    err[0] = 0
    if dst.shape[0] == 0:
        return
    with nogil:
        st = L.copy_to_host(&dst[0], <const void*> src, dst.shape[0], <void*> stream, err, ERRLEN)
    _raise(st, err)


cdef class CudaStream:
    """A non-blocking CUDA stream owned by blochsim."""
    cdef readonly uintptr_t handle

    def __cinit__(self):
        cdef void* s = NULL
        cdef char err[ERRLEN]
        err[0] = 0
        self.handle = 0
        _raise(L.stream_create(&s, err, ERRLEN), err)
        self.handle = <uintptr_t> s

    def __dealloc__(self):
        cdef char err[ERRLEN]
        if self.handle:
            L.stream_destroy(<void*> self.handle, err, ERRLEN)


def stream_synchronize(uintptr_t stream):
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.stream_synchronize(<void*> stream, err, ERRLEN)
    _raise(st, err)


def memory_info():
    """(free, total) device memory in bytes."""
    cdef size_t f = 0, t = 0
    cdef char err[ERRLEN]
    err[0] = 0
    _raise(L.memory_info(&f, &t, err, ERRLEN), err)
    return f, t


def current_device():
    cdef int d = -1
    cdef char err[ERRLEN]
    err[0] = 0
    _raise(L.current_device(&d, err, ERRLEN), err)
    return d


def pointer_device(uintptr_t ptr):
    """The device a pointer belongs to, -1 for host memory."""
    cdef int d = -1
    cdef char err[ERRLEN]
    err[0] = 0
    _raise(L.pointer_device(<const void*> ptr, &d, err, ERRLEN), err)
    return d


def expand_to_float(uintptr_t src, bint src_is_f64, tuple shape, tuple strides, double scale,
                    uintptr_t dst, int64_t count, uintptr_t stream):
    """dst[i] = float32(scale * src[offset(i)]) over the index space `shape`
    (element strides, 0 on broadcast axes)."""
    cdef int64_t sh[8]
    cdef int64_t stv[8]
    cdef int nd = len(shape)
    cdef char err[ERRLEN]
    err[0] = 0
    if nd > 8:
        raise ValueError("blochsim: device tissue arrays may have at most 8 dimensions")
    for i in range(nd):
        sh[i] = shape[i]
        stv[i] = strides[i]
    _raise(L.expand_to_float(<const void*> src, src_is_f64, nd, sh, stv, scale, <float*> dst, count,
                             <void*> stream, err, ERRLEN), err)


def first_bad_value(uintptr_t x, int64_t count, bint check_lower, float lower, bint strict,
                    uintptr_t stream):
    """(index, value) of the first non-finite or out-of-bound element, or
    (-1, nan); synchronises the stream."""
    cdef int64_t idx = -1
    cdef float v = float("nan")
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.first_bad_value(<const float*> x, count, check_lower, lower, strict, &idx, &v,
                               <void*> stream, err, ERRLEN)
    _raise(st, err)
    return idx, v


# --------------------------------------------------------------------------
# DLPack export (dlpack.h v0.8 ABI)

ctypedef struct DLDevice:
    int device_type
    int device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void* data
    DLDevice device
    int ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept

DEF KDLCUDA = 2
DEF KDLFLOAT = 2
DEF KDLCOMPLEX = 5


cdef void _dl_deleter(DLManagedTensor* m) noexcept with gil:
    if m.manager_ctx != NULL:
        Py_DECREF(<object> m.manager_ctx)
    free(m.dl_tensor.shape)
    free(m)


cdef void _capsule_deleter(object capsule) noexcept:
    cdef DLManagedTensor* m
    if PyCapsule_IsValid(capsule, b"dltensor"):
        m = <DLManagedTensor*> PyCapsule_GetPointer(capsule, b"dltensor")
        m.deleter(m)


def dlpack_capsule(owner, uintptr_t ptr, tuple shape, int type_code, int bits, int device_id):
    """A DLPack capsule over device memory that keeps ``owner`` alive.
    type_code: 'float' or 'complex' per DLPack (2 or 5)."""
    cdef DLManagedTensor* m = <DLManagedTensor*> malloc(sizeof(DLManagedTensor))
    cdef int nd = len(shape)
    if m == NULL:
        raise MemoryError()
    m.dl_tensor.shape = <int64_t*> malloc(sizeof(int64_t) * (nd if nd > 0 else 1))
    if m.dl_tensor.shape == NULL:
        free(m)
        raise MemoryError()
    for i in range(nd):
        m.dl_tensor.shape[i] = shape[i]
    m.dl_tensor.data = <void*> ptr
    m.dl_tensor.device.device_type = KDLCUDA
    m.dl_tensor.device.device_id = device_id
    m.dl_tensor.ndim = nd
    m.dl_tensor.dtype.code = type_code
    m.dl_tensor.dtype.bits = bits
    m.dl_tensor.dtype.lanes = 1
    m.dl_tensor.strides = NULL
    m.dl_tensor.byte_offset = 0
    Py_INCREF(owner)
    m.manager_ctx = <void*> owner
    m.deleter = _dl_deleter
    return PyCapsule_New(m, b"dltensor", _capsule_deleter)


PERK_MAX_OUTPUTS = perk_max_outputs


def perk(const float[:, ::1] omega, const float[::1] phase, const float[:, ::1] weight, const float[::1] offset,
         const float[:, ::1] x, float[:, ::1] out, g=None, xbar=None, int threads=1):
    """PERK's fused map on the host (perk.hpp): out (n, p) = offset +
    weight @ cos(omega @ x.T + phase) per voxel row of x (n, d), without
    the (n, F) feature matrix.  With a cotangent ``g`` (n, p) of the
    estimates, also writes its pullback to x into ``xbar`` (n, d)."""
    cdef PerkModel m
    cdef const float[:, ::1] gv
    cdef float[:, ::1] xv
    cdef const float* gp = NULL
    cdef float* xp = NULL
    cdef int st
    m.F = omega.shape[0]
    m.d = omega.shape[1]
    m.p = weight.shape[0]
    if (phase.shape[0] != m.F or weight.shape[1] != m.F or offset.shape[0] != m.p or x.shape[1] != m.d
            or out.shape[0] != x.shape[0] or out.shape[1] != m.p):
        raise ValueError("blochsim internal error: perk array shapes")
    m.omega = &omega[0, 0]
    m.phase = &phase[0]
    m.weight = &weight[0, 0]
    m.offset = &offset[0]
    cdef int64_t n = x.shape[0]
    if g is not None:
        gv = g
        xv = xbar
        if gv.shape[0] != n or gv.shape[1] != m.p or xv.shape[0] != n or xv.shape[1] != m.d:
            raise ValueError("blochsim internal error: perk pullback shapes")
        if n > 0:
            gp = &gv[0, 0]
            xp = &xv[0, 0]
    cdef const float* xin = &x[0, 0] if n > 0 else NULL
    cdef float* op = &out[0, 0] if n > 0 else NULL
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = host_perk_dispatch(m, xin, gp, n, op, xp, threads)
    host_set_interrupt(prev)
    _raise(st, b"", holder)
