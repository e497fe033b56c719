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

from libcpp.vector cimport vector

import numpy as np

from blochsim._events cimport (EventStream, field_bound_T1D_s, field_bound2_T1D_s, Pools, Property, Tissue, Transmit, cuda_error_base,
                              field_pooled_direction, field_single_pool_direction, field_table, interrupted,
                              lineshape_g, max_transmit_settings, out_of_memory, pool_field_count, pool_property,
                              status_message, tissue_fields, tissue_property)
from blochsim._calls cimport (Call, CallEntry, call_adjoint, call_adjoint2, call_forward, call_jacobian, call_pooled,
                              call_pooled_adjoint, on_device, on_host, through_device)
from blochsim._host cimport (Interrupt, KeyedProgram, MatchProblem, MatchResult, NoiseKey, PerkModel, host_available_memory,
                             host_isa, host_match_dispatch, host_noise_add, host_perk_dispatch, host_set_interrupt,
                             host_workspace_bytes, match_max_k, perk_max_outputs, unchecked_workspace_bytes)
cimport blochsim._launcher as L

# --------------------------------------------------------------------------
# Result buffers: the host kernels' new outputs.  A result of tens of
# megabytes is a fresh mapping whose pages the operating system zeroes as
# the kernels first write them (15 % of a forward call, 23 % of a Jacobian,
# bench/NOTES.md); the memory of a result that has been dropped is kept for
# the next one of the same size, its pages already mapped.

cdef extern from *:
    """
    #include <stdlib.h>
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    #if defined(_WIN32)
    #include <malloc.h>
    #endif
    /* nbytes (rounded up to the alignment) of host memory: 64-byte aligned,
       2 MiB aligned and offered to transparent huge pages from 4 MiB. */
    static void* blochsim_result_alloc(size_t nbytes) {
      const size_t align = nbytes >= ((size_t)4 << 20) ? ((size_t)2 << 20) : 64;
      const size_t size = (nbytes + align - 1) / align * align + (nbytes == 0 ? align : 0);
      void* p = NULL;
    #if defined(_WIN32)
      p = _aligned_malloc(size, align);
    #else
      if (posix_memalign(&p, align, size) != 0) p = NULL;
    #endif
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
      if (p && align > 64) madvise(p, size, MADV_HUGEPAGE);
    #endif
      return p;
    }
    static void blochsim_result_free(void* p) {
    #if defined(_WIN32)
      _aligned_free(p);
    #else
      free(p);
    #endif
    }
    """
    void* blochsim_result_alloc(size_t nbytes) nogil
    void blochsim_result_free(void* p) nogil

DEF RESULT_SLOTS = 4
# results smaller than this are left to NumPy; at most RESULT_KEPT bytes kept
cdef size_t RESULT_MIN = 1 << 20
cdef size_t RESULT_KEPT = 1 << 30
cdef void* _kept_ptr[RESULT_SLOTS]
cdef size_t _kept_size[RESULT_SLOTS]
cdef size_t _kept_bytes = 0


cdef class ResultBuffer:
    """``nbytes`` of host memory for a result array (exposed through
    ``__array_interface__``), taken from the buffers of dropped results of
    the same size when one is kept; given back to them when the last array
    over it goes."""
    cdef void* ptr
    cdef readonly size_t nbytes

    def __cinit__(self, size_t nbytes):
        global _kept_bytes
        self.nbytes = nbytes
        self.ptr = NULL
        for i in range(RESULT_SLOTS):
            if _kept_ptr[i] != NULL and _kept_size[i] == nbytes:
                self.ptr, _kept_ptr[i] = _kept_ptr[i], NULL
                _kept_bytes -= nbytes
                return
        self.ptr = blochsim_result_alloc(nbytes)
        if self.ptr == NULL:
            raise MemoryError(f"blochsim: {nbytes} bytes of host memory for a result are not available")

    def __dealloc__(self):
        global _kept_bytes
        if self.ptr == NULL:
            return
        if _kept_bytes + self.nbytes <= RESULT_KEPT:
            for i in range(RESULT_SLOTS):
                if _kept_ptr[i] == NULL:
                    _kept_ptr[i], _kept_size[i] = self.ptr, self.nbytes
                    _kept_bytes += self.nbytes
                    return
        blochsim_result_free(self.ptr)

    @property
    def __array_interface__(self):
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (<uintptr_t> self.ptr, False), "version": 3}


def new_result(shape, dtype):
    """An uninitialised C-contiguous NumPy array for a kernel's output: over
    a ResultBuffer from 1 MiB up (the memory of dropped results reused),
    np.empty below."""
    dt = np.dtype(dtype)
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dt.itemsize
    if nbytes < RESULT_MIN:
        return np.empty(shape, dt)
    return np.asarray(ResultBuffer(nbytes)).view(dt).reshape(shape)


def kept_result_bytes():
    """Bytes of dropped results' memory kept for the next ones."""
    return _kept_bytes


def release_kept_results():
    """Frees the memory kept from dropped results."""
    global _kept_bytes
    for i in range(RESULT_SLOTS):
        if _kept_ptr[i] != NULL:
            blochsim_result_free(_kept_ptr[i])
            _kept_ptr[i] = NULL
    _kept_bytes = 0


cdef tuple _field_table():
    return tuple((field_table[i].name.decode(), field_table[i].unit.decode(), field_table[i].fallback,
                  bool(field_table[i].flags & field_single_pool_direction),
                  bool(field_table[i].flags & field_pooled_direction)) for i in range(pool_field_count))


#: The tissue and pool fields of the ABI in their order (fields.hpp's
#: field_table): (SI name, SI unit, value when absent, a direction of the
#: single-pool derivatives, a direction of the pooled derivatives).
FIELD_TABLE = _field_table()
#: The tissue fields (the planes handed to the kernels, in this order) and
#: the pool fields after them.
TISSUE_FIELDS = tuple(f[0] for f in FIELD_TABLE[:tissue_fields])
POOL_FIELDS = tuple(f[0] for f in FIELD_TABLE[tissue_fields:])
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


cdef int _run(CallEntry entry, Call& c) except -1:
    """Runs one entry (calls.hpp) with the GIL released and the Ctrl-C
    poll installed; a failed status becomes the exception it names."""
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    c.err = err
    c.err_len = ERRLEN
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = entry(c)
    host_set_interrupt(prev)
    return _raise(st, err, holder)


cdef class PackedStream:
    """An event stream (blochsim.sequence.EventStream) with its scalar
    settings, held as the C struct the backends read."""
    cdef EventStream s
    cdef object refs
    # the stream's copy on one device (kept_on), made by the first forward
    # call there and kept for the next ones
    cdef EventStream kept_view
    cdef void* kept_buf
    cdef int kept_on

    def __dealloc__(self):
        if self.kept_buf != NULL:
            L.free_kept_stream(self.kept_buf)

    cdef const EventStream* kept(self) except? NULL:
        """The stream's copy on the current device, made on first use; NULL
        on another device than the one it was made on (the call copies it)."""
        cdef int d = -1
        cdef char err[ERRLEN]
        err[0] = 0
        _raise(L.current_device(&d, err, ERRLEN), err)
        if self.kept_buf == NULL:
            _raise(L.keep_stream(self.s, &self.kept_view, &self.kept_buf, err, ERRLEN), err)
            self.kept_on = d
        return &self.kept_view if self.kept_on == d else NULL

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
        cdef const int32_t[::1] tx = getattr(stream, "transmit", None)
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
        if tx is not None and tx.shape[0] != ne:
            raise ValueError("blochsim internal error: transmit settings differ in length from the events")
        self.refs = (interval, flags, sb, sa, flip, phase, rx, slot, dur, rft, rfd, rfo, rfp, drv, drt, tx)
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
            if tx is not None:
                self.s.transmit = &tx[0]
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
    def n_intervals(self):
        return self.s.n_intervals

    @property
    def states(self):
        return self.s.states


cdef object _host_tissue(Tissue* t, tuple tissue, int64_t n):
    """Point t at float32 host arrays (length n or 1, or None), one per
    TISSUE_FIELDS entry; an optional last entry (sensitivity, drive, seeded,
    gradient) holds the transmit settings (events.hpp Transmit): float32
    (n or 1, channels, 2) Re, Im of each channel's sensitivity, float32
    (settings, channels, 2) Re, Im of each setting's drive, the setting the
    B1 directions move (-1: none), and None or a zeroed float32 (n,
    settings, 2) the adjoint adds dL/d|B| and dL/d arg B into."""
    cdef const float[:, :, ::1] sens
    cdef const float[:, :, ::1] drive
    cdef float[:, :, ::1] grad
    cdef const float[::1] view
    cdef Property* p
    refs = []
    if len(tissue) not in (tissue_fields, tissue_fields + 1):
        raise ValueError("blochsim internal error: tissue tuple has the wrong length")
    t.n = n
    t.transmit = Transmit()
    if len(tissue) > tissue_fields and tissue[tissue_fields] is not None:
        sens, drive, seeded, gradient = tissue[tissue_fields]
        if (sens.shape[2] != 2 or drive.shape[2] != 2 or sens.shape[0] not in (1, n) or sens.shape[1] < 1
                or drive.shape[1] != sens.shape[1] or drive.shape[0] < 1):
            raise ValueError("blochsim internal error: transmit sensitivities (n or 1, channels, 2) and drives "
                             "(settings, channels, 2)")
        refs += [sens, drive]
        t.transmit.settings = drive.shape[0]
        t.transmit.channels = drive.shape[1]
        t.transmit.sensitivity = &sens[0, 0, 0]
        t.transmit.stride = 0 if sens.shape[0] == 1 else 2 * sens.shape[1]
        t.transmit.drive = &drive[0, 0, 0]
        t.transmit.seeded = seeded
        if gradient is not None:
            grad = gradient
            if grad.shape[0] != n or grad.shape[1] != drive.shape[0] or grad.shape[2] != 2:
                raise ValueError("blochsim internal error: transmit gradient must be (n, settings, 2)")
            refs.append(grad)
            if n > 0:
                t.transmit.gradient = &grad[0, 0, 0]
        tissue = tissue[:tissue_fields]
    for i in range(tissue_fields):
        p = &tissue_property(t[0], i)
        p.data = NULL
        p.stride = 0
        p.fallback = field_table[i].fallback
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
                 int variant=0, program=None):
    """Play a packed stream for n problems on the host.

    ``tissue`` holds one float32 array (length n or 1) or None per name of
    TISSUE_FIELDS, in SI units; ``out`` is complex64 of shape (n, n_samples),
    written in place.  ``variant`` 0 runs the host backend; 1, 4, 5 or 8 run
    the device's register path on the host (for tests: a team of 1 or 4
    members, 4 with a tail in memory, or 4 members of 8 orders each).  With
    ``program`` (a blochsim.sequence.keyed.KeyedProgram of the stream) the
    moment-keyed EPG plays it (epg/keyed.hpp).
    """
    cdef Tissue t
    cdef KeyedProgram k
    cdef bint keyed = program is not None
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output has shape (%d, %d), expected (%d, %d)"
                         % (out.shape[0], out.shape[1], n, ps.s.n_samples))
    refs = _keyed_program(&k, ps, program) if keyed else None
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    cdef Call c
    c.stream, c.tissue, c.out, c.threads, c.variant = &ps.s, &t, outp, threads, variant
    if keyed:
        c.program = &k
    _run(call_forward, c)


cdef object _keyed_program(KeyedProgram* k, PackedStream ps, program):
    """Point k at a blochsim.sequence.keyed.KeyedProgram of ps's stream;
    returns the views that keep its arrays alive."""
    cdef const int32_t[::1] slots = program.slots
    cdef const int64_t[::1] first = program.first
    cdef const int32_t[::1] dst = program.dst
    cdef const int32_t[::1] src = program.src
    cdef const double[::1] k2 = program.k2
    cdef const int64_t[::1] k2_first = program.k2_first
    cdef const uint8_t[::1] reach = program.reach
    if slots.shape[0] != 2 * ps.s.n_events or first.shape[0] != 2 * ps.s.n_events + 1 or dst.shape[0] != src.shape[0]:
        raise ValueError("blochsim internal error: the keyed program does not fit its stream")
    k.n_events = ps.s.n_events
    k.max_slots = program.max_slots
    if ps.s.n_events > 0:
        k.slots = &slots[0]
        k.first = &first[0]
    if dst.shape[0] > 0:
        k.dst = &dst[0]
        k.src = &src[0]
    k.n_reach = reach.shape[0]
    if reach.shape[0] > 0:
        k.reach = &reach[0]
    if k2_first.shape[0] != 2 * ps.s.n_events:
        raise ValueError("blochsim internal error: the keyed program's wavenumbers do not fit its stream")
    k.n_k2 = k2.shape[0]
    if k2.shape[0] > 0 and ps.s.n_events > 0:
        k.k2 = &k2[0]
        k.k2_first = &k2_first[0]
    return (slots, first, dst, src, k2, k2_first, reach)


cdef list _host_pools(Pools* p, tuple pools, int n_exchanging, int bound, int lineshape):
    """Point p at float32 host arrays (length n or 1, or None) in POOL_FIELDS order."""
    cdef Property* q
    cdef const float[::1] view
    keep = []
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound > 0 else 0
    p.bound2 = 1 if bound > 1 else 0
    p.lineshape = lineshape
    for i in range(len(POOL_FIELDS)):
        q = &pool_property(p[0], tissue_fields + i)
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


def pooled(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, int bound, int lineshape,
           int64_t n, fields, seeds, float complex[:, ::1] out, jac, int threads, bint gpu=False,
           bint registers=False, program=None):
    """Signal (and Jacobian) of a packed stream with pools: on the host, or
    with ``gpu`` moved through the device (host arrays in and out).
    ``registers`` (host, no fields): the device's register team emulated on
    the host, for tests.  With ``program`` (a
    blochsim.sequence.keyed.KeyedProgram of the stream) the moment-keyed
    EPG plays it on the host (pools/keyed.hpp).

    ``tissue`` as in :func:`forward_host`; ``pools`` holds one float32 array
    (length n or 1) or None per name of POOL_FIELDS, in SI units;
    ``lineshape`` indexes LINESHAPES.  ``fields`` are indices into
    TISSUE_FIELDS + POOL_FIELDS (possibly none) with their ``seeds``;
    ``jac`` is complex64 of shape (n, len(fields), n_samples), or None
    without fields.
    """
    cdef Tissue t
    cdef Pools p
    cdef KeyedProgram k
    cdef bint keyed = program is not None
    cdef float complex[:, :, ::1] jv
    cdef int nd = len(fields)
    cdef vector[int] cf
    cdef vector[float] cs
    cdef float* jacp = NULL
    if len(seeds) != nd or len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pooled call arguments")
    cf = [int(f) for f in fields]
    cs = [float(x) for x in seeds]
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shapes")
    if keyed and (gpu or registers):
        raise ValueError("blochsim internal error: the keyed pooled EPG runs on the host")
    refs = _keyed_program(&k, ps, program) if keyed else None
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
    cdef Call c
    c.place = through_device if gpu else on_host
    c.stream, c.tissue, c.pools, c.out, c.jac, c.threads = &ps.s, &t, &p, outp, jacp, threads
    c.fields, c.n_dirs, c.seeds, c.variant = cf.data(), nd, cs.data(), 1 if registers else 0
    if keyed:
        c.program = &k
    _run(call_pooled, c)


cdef int _device_pools(Pools* p, tuple pools, int n_exchanging, int bound, int lineshape) except -1:
    """Point p at device float32 planes: one (pointer, stride) pair or None
    per POOL_FIELDS entry."""
    cdef Property* q
    if len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pools tuple has the wrong length")
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound > 0 else 0
    p.bound2 = 1 if bound > 1 else 0
    p.lineshape = lineshape
    for i in range(len(POOL_FIELDS)):
        q = &pool_property(p[0], tissue_fields + i)
        q.data = NULL
        q.stride = 0
        if pools[i] is not None:
            ptr, stride = pools[i]
            q.data = <const float*> <uintptr_t> ptr
            q.stride = stride
    return 0


def pooled_cuda(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, int bound, int lineshape,
                int64_t n, uintptr_t out_ptr, uintptr_t stream, fields=(), seeds=(), uintptr_t jac_ptr=0):
    """The pooled signal of device tissue and pool planes (one (pointer,
    stride) pair or None per TISSUE_FIELDS and POOL_FIELDS entry, float32 SI
    values, checked by the caller) into a device complex64 output, and with
    ``fields`` (indices into TISSUE_FIELDS + POOL_FIELDS, with their
    ``seeds``) its Jacobian into the device complex64 array at ``jac_ptr``
    (n, len(fields), n_samples); ordered on ``stream`` and synchronised with
    it."""
    cdef Tissue t
    cdef Pools p
    cdef int nd = len(fields)
    cdef vector[int] cf = [int(f) for f in fields]
    cdef vector[float] cs = [float(x) for x in seeds]
    if len(seeds) != nd or (nd > 0 and jac_ptr == 0):
        raise ValueError("blochsim internal error: pooled device Jacobian arguments")
    _device_tissue(&t, tissue, n)
    _device_pools(&p, pools, n_exchanging, bound, lineshape)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.pools = on_device, &ps.s, &t, &p
    c.fields, c.n_dirs, c.seeds, c.out, c.jac = cf.data(), nd, cs.data(), <float*> out_ptr, <float*> jac_ptr
    c.cuda_stream = <void*> stream
    _run(call_pooled, c)


def pooled_adjoint_cuda(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, int bound, int lineshape,
                        int64_t n, fields, uintptr_t cot_ptr, double[:, ::1] ev_grad, uintptr_t tgrad_ptr,
                        unsigned mask, uintptr_t stream):
    """Reverse mode with pools of device tissue and pool planes (as
    :func:`pooled_cuda`): the device cotangent (n, n_samples) complex64 at
    ``cot_ptr``; ``ev_grad`` (n_events, 6) float64, host, receives the
    event gradients (as :func:`pooled_adjoint`); the device float32 array at
    ``tgrad_ptr`` (n, len(fields)) the tissue gradients.  Ordered on
    ``stream`` and synchronised with it."""
    cdef Tissue t
    cdef Pools p
    cdef int nd = len(fields)
    cdef vector[int] cf = [int(f) for f in fields]
    if ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 6:
        raise ValueError("blochsim internal error: pooled adjoint shapes")
    _device_tissue(&t, tissue, n)
    _device_pools(&p, pools, n_exchanging, bound, lineshape)
    if ps.s.n_events == 0 or n == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.pools, c.fields, c.n_dirs = on_device, &ps.s, &t, &p, cf.data(), nd
    c.cot, c.ev_grad, c.tgrad, c.mask = <const float*> cot_ptr, &ev_grad[0, 0], <float*> tgrad_ptr, mask
    c.cuda_stream = <void*> stream
    _run(call_pooled_adjoint, c)


def pooled_adjoint(PackedStream ps, tuple tissue, tuple pools, int n_exchanging, int bound, int lineshape,
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
    cdef int nd = len(fields)
    cdef vector[int] cf
    if len(pools) != len(POOL_FIELDS):
        raise ValueError("blochsim internal error: pooled adjoint arguments")
    cf = [int(f) for f in fields]
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
    cdef Call c
    c.place = through_device if gpu else on_host
    c.stream, c.tissue, c.pools, c.fields, c.n_dirs = &ps.s, &t, &p, cf.data(), nd
    c.cot, c.ev_grad, c.tgrad, c.mask, c.threads = cotp, evp, tgp, mask, threads
    _run(call_pooled_adjoint, c)


def lineshape_values(int shape, const double[::1] x, double[::1] g, double[::1] dg):
    """g(x) and dg/dx of lineshape LINESHAPES[shape] (pools/lineshape.hpp) at each x."""
    cdef Py_ssize_t i
    if shape < 0 or shape >= len(LINESHAPES) or g.shape[0] != x.shape[0] or dg.shape[0] != x.shape[0]:
        raise ValueError("blochsim internal error: lineshape arguments")
    with nogil:
        for i in range(x.shape[0]):
            lineshape_g(shape, x[i], g[i], dg[i])


def jacobian_host(PackedStream ps, tuple tissue, int64_t n, fields, seeds, float complex[:, ::1] out,
                  float complex[:, :, ::1] jac, int threads, int variant=0, program=None):
    """Signal and tissue Jacobian of a packed stream for n problems on the
    host, in one pass.

    ``fields`` are indices into TISSUE_FIELDS (distinct, at least one);
    ``jac`` is complex64 of shape (n, len(fields), n_samples): the derivative
    of each sample with respect to each field, direction j seeded with
    ``seeds[j]`` (d SI value / d direction: the SI value of one public unit
    gives derivatives per public unit).  ``tissue`` and
    ``out`` as in :func:`forward_host`; ``variant`` 4 runs the device's
    Jacobian register path on the host (a team of four, for tests), 5 the
    same team with the orders past its registers in a tail; with
    ``program`` the moment-keyed EPG plays it, as in :func:`forward_host`.
    """
    cdef Tissue t
    cdef KeyedProgram k
    cdef bint keyed = program is not None
    cdef int nd = len(fields)
    cdef vector[int] cf
    cdef vector[float] cs
    if nd < 1 or nd > tissue_fields or len(seeds) != nd:
        raise ValueError("blochsim internal error: 1 to tissue_fields Jacobian directions, one seed each")
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples or jac.shape[0] != n or jac.shape[1] != nd \
            or jac.shape[2] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shapes")
    cf = [int(f) for f in fields]
    cs = [float(x) for x in seeds]
    refs = _keyed_program(&k, ps, program) if keyed else None
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    cdef float* jacp = <float*> &jac[0, 0, 0]
    cdef Call c
    c.stream, c.tissue, c.fields, c.n_dirs, c.seeds = &ps.s, &t, cf.data(), nd, cs.data()
    c.out, c.jac, c.threads, c.variant = outp, jacp, threads, variant
    if keyed:
        c.program = &k
    _run(call_jacobian, c)


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
    cdef int nd = len(fields)
    cdef vector[int] cf
    if nd > tissue_fields:
        raise ValueError("blochsim internal error: 0 to tissue_fields adjoint tissue directions")
    cf = [int(f) for f in fields]
    if cot.shape[0] != n or cot.shape[1] != ps.s.n_samples or ev_grad.shape[0] != ps.s.n_events \
            or ev_grad.shape[1] != 4 or tgrad.shape[0] != n or tgrad.shape[1] != nd:
        raise ValueError("blochsim internal error: adjoint shapes")
    keep = _host_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef const float* cotp = <const float*> &cot[0, 0] if n > 0 and ps.s.n_samples > 0 else NULL
    cdef double* evp = &ev_grad[0, 0]
    cdef float* tgp = &tgrad[0, 0] if n > 0 and nd > 0 else NULL
    cdef Call c
    c.stream, c.tissue, c.fields, c.n_dirs = &ps.s, &t, cf.data(), nd
    c.cot, c.ev_grad, c.tgrad, c.threads = cotp, evp, tgp, threads
    _run(call_adjoint, c)


def adjoint2_host(PackedStream ps, tuple tissue, int64_t n, int outer_field, const float complex[:, :, ::1] cot,
                  int j, double[:, ::1] ev_grad, int threads):
    """Second order on the host: ``ev_grad`` (n_events, 4) float64 receives
    d/d TISSUE_FIELDS[outer_field] (SI unit) of the event gradients of the
    cotangent ``cot[:, j]``, ``cot`` a (n, n_dirs, n_samples) complex64
    Jacobian cotangent, summed over the problems."""
    cdef Tissue t
    if cot.shape[0] != n or cot.shape[2] != ps.s.n_samples or not 0 <= j < cot.shape[1] \
            or ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    keep = _host_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef const float* cotp = <const float*> &cot[0, j, 0] if n > 0 and ps.s.n_samples > 0 else NULL
    cdef int64_t stride = cot.shape[1] * cot.shape[2]
    cdef Call c
    c.stream, c.tissue, c.outer_field, c.cot, c.cot_stride = &ps.s, &t, outer_field, cotp, stride
    c.ev_grad, c.threads = &ev_grad[0, 0], threads
    _run(call_adjoint2, c)


def jacobian_cuda(PackedStream ps, tuple tissue, int64_t n, fields, seeds, uintptr_t out_ptr, uintptr_t jac_ptr,
                  uintptr_t stream):
    """Device tissue (as :func:`forward_cuda`) into a device complex64 output
    and a device (n, len(fields), n_samples) complex64 Jacobian, on
    ``stream``; direction j seeded with ``seeds[j]`` (d SI value / d
    direction)."""
    cdef Tissue t
    cdef int nd = len(fields)
    cdef vector[int] cf
    cdef vector[float] cs
    if nd < 1 or nd > tissue_fields or len(seeds) != nd:
        raise ValueError("blochsim internal error: 1 to tissue_fields Jacobian directions")
    cf = [int(f) for f in fields]
    cs = [float(x) for x in seeds]
    _device_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.fields, c.n_dirs, c.seeds = on_device, &ps.s, &t, cf.data(), nd, cs.data()
    c.out, c.jac, c.cuda_stream = <float*> out_ptr, <float*> jac_ptr, <void*> stream
    _run(call_jacobian, c)


def adjoint_cuda(PackedStream ps, tuple tissue, int64_t n, fields, uintptr_t cot_ptr, double[:, ::1] ev_grad,
                 uintptr_t tgrad_ptr, uintptr_t stream):
    """Reverse mode on the device: device tissue (as :func:`forward_cuda`),
    a device (n, n_samples) complex64 cotangent and a device (n,
    len(fields)) float32 tissue gradient; ``ev_grad`` (n_events, 4) float64
    on the host, as :func:`adjoint_host`.  Synchronises ``stream``."""
    cdef Tissue t
    cdef int nd = len(fields)
    cdef vector[int] cf
    if nd > tissue_fields or ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    cf = [int(f) for f in fields]
    _device_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.fields, c.n_dirs = on_device, &ps.s, &t, cf.data(), nd
    c.cot, c.ev_grad, c.tgrad, c.cuda_stream = <const float*> cot_ptr, &ev_grad[0, 0], <float*> tgrad_ptr, <void*> stream
    _run(call_adjoint, c)


def adjoint2_cuda(PackedStream ps, tuple tissue, int64_t n, int outer_field, uintptr_t cot_ptr, int64_t cot_stride,
                  double[:, ::1] ev_grad, uintptr_t stream):
    """Second order on the device: device tissue (as :func:`forward_cuda`), a
    device cotangent (row stride ``cot_stride`` complex values), ``ev_grad``
    as :func:`adjoint2_host`.  Synchronises ``stream``."""
    cdef Tissue t
    if ev_grad.shape[0] != ps.s.n_events or ev_grad.shape[1] != 4:
        raise ValueError("blochsim internal error: adjoint shapes")
    _device_tissue(&t, tissue, n)
    if ps.s.n_events == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.outer_field = on_device, &ps.s, &t, outer_field
    c.cot, c.cot_stride, c.ev_grad, c.cuda_stream = <const float*> cot_ptr, cot_stride, &ev_grad[0, 0], <void*> stream
    _run(call_adjoint2, c)


def forward_cuda_streamed(PackedStream ps, tuple tissue, int64_t n, float complex[:, ::1] out,
                          size_t budget_bytes):
    """Host tissue and host output, streamed through the device in chunks of
    at most ``budget_bytes`` of device memory (0: most of what is free)."""
    cdef Tissue t
    if out.shape[0] != n or out.shape[1] != ps.s.n_samples:
        raise ValueError("blochsim internal error: output shape")
    keep = _host_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    cdef Call c
    c.place, c.stream, c.tissue, c.out, c.budget_bytes = through_device, &ps.s, &t, outp, budget_bytes
    _run(call_forward, c)


cdef int _device_tissue(Tissue* t, tuple tissue, int64_t n) except -1:
    """Point t at device float32 planes: one (pointer, stride) pair or None
    per TISSUE_FIELDS entry; an optional last entry (sensitivity pointer,
    stride, drive pointer, settings, channels, seeded, gradient) holds the transmit
    settings (as _host_tissue's, device memory, the stride in floats
    between problems), and the adjoint's gradient pointer (0: none)."""
    cdef Property* p
    t.n = n
    t.transmit = Transmit()
    if len(tissue) > tissue_fields and tissue[tissue_fields] is not None:
        sens, stride, drive, settings, channels, seeded, gradient = tissue[tissue_fields]
        t.transmit.settings = settings
        t.transmit.channels = channels
        t.transmit.sensitivity = <const float*> <uintptr_t> sens
        t.transmit.stride = stride
        t.transmit.drive = <const float*> <uintptr_t> drive
        t.transmit.seeded = seeded
        t.transmit.gradient = <float*> <uintptr_t> gradient
        tissue = tissue[:tissue_fields]
    for i in range(tissue_fields):
        p = &tissue_property(t[0], i)
        p.data = NULL
        p.stride = 0
        p.fallback = field_table[i].fallback
        if tissue[i] is not None:
            ptr, stride = tissue[i]
            p.data = <const float*> <uintptr_t> ptr
            p.stride = stride
    return 0


def forward_cuda(PackedStream ps, tuple tissue, int64_t n, uintptr_t out_ptr, uintptr_t stream, program=None):
    """Device tissue (one (pointer, stride) pair or None per TISSUE_FIELDS
    entry, float32 SI values) into a device complex64 output, on ``stream``;
    with ``program`` through the moment-keyed EPG (cuda/keyed.cuh)."""
    cdef Tissue t
    cdef KeyedProgram k
    cdef bint keyed = program is not None
    refs = _keyed_program(&k, ps, program) if keyed else None
    _device_tissue(&t, tissue, n)
    if n == 0 or ps.s.n_samples == 0:
        return
    cdef Call c
    c.place, c.stream, c.tissue, c.out, c.cuda_stream = on_device, &ps.s, &t, <float*> out_ptr, <void*> stream
    if keyed:
        c.program = &k
    else:
        c.kept = ps.kept()
    _run(call_forward, c)


def cuda_bytes_per_problem(PackedStream ps):
    """Device bytes one problem needs (output, tissue, scratch)."""
    cdef Tissue t
    return L.bytes_per_problem(ps.s, t)


#: the most transmit settings (distinct channel drives) a stream's pulses may name (events.hpp)
MAX_TRANSMIT_SETTINGS = max_transmit_settings

ENTRIES = ("forward", "jacobian", "adjoint", "adjoint2", "pooled", "pooled_adjoint")


def workspace_bytes(str entry, PackedStream ps, int64_t n, int threads, fields=(), int n_exchanging=0,
                    int bound=0, int dipolar=0, unsigned mask=31):
    """Bytes the host entry ``entry`` (ENTRIES) allocates beyond its inputs
    and outputs for n problems on ``threads`` threads (host/epg.hpp
    workspace_bytes); ``fields`` its directions (indices as the entry's),
    the pool counts for the pooled entries: exchanging pools, semisolid
    pools, and how many of those carry dipolar order."""
    cdef Pools p
    cdef float one = 1.0
    cdef vector[int] cf
    cdef int nd = len(fields)
    if nd > pool_field_count:
        raise ValueError("blochsim internal error: too many directions")
    cf = [int(f) for f in fields]
    p.n_exchanging = n_exchanging
    p.bound = 1 if bound > 0 else 0
    p.bound2 = 1 if bound > 1 else 0
    p.lineshape = 0
    if dipolar > 0:
        pool_property(p, field_bound_T1D_s).data = &one
    if dipolar > 1:
        pool_property(p, field_bound2_T1D_s).data = &one
    return host_workspace_bytes(ENTRIES.index(entry), ps.s, &p, n, threads, cf.data(), nd, mask)


#: workspaces of at most this many bytes are not checked (host/interrupt.hpp)
UNCHECKED_WORKSPACE_BYTES = unchecked_workspace_bytes


def available_memory():
    """Bytes of host memory a new allocation can take (host/interrupt.hpp)."""
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


include "_core_device.pxi"


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


cdef NoiseKey _noise_key(uint64_t key, uint32_t block, uint32_t stream):
    cdef NoiseKey k
    k.key0 = <uint32_t> (key & 0xFFFFFFFFu)
    k.key1 = <uint32_t> (key >> 32)
    k.block = block
    k.stream = stream
    return k


def noise_add(float[::1] z, int64_t first, double sigma, uint64_t key, uint32_t block, uint32_t stream,
              int threads=1):
    """z (complex64 viewed as 2n floats) += sigma · complex standard normals
    first .. first + n - 1 of the counter-based generator (noise.hpp) under
    the 64-bit key, block and stream."""
    cdef NoiseKey k = _noise_key(key, block, stream)
    cdef int st
    if z.shape[0] % 2:
        raise ValueError("blochsim internal error: noise_add needs complex values")
    if z.shape[0] == 0:
        return
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = host_noise_add(&z[0], z.shape[0] // 2, first, sigma, k, threads)
    host_set_interrupt(prev)
    _raise(st, b"", holder)


MATCH_MAX_K = match_max_k


def match(const float[:, ::1] signals, const float[:, ::1] atoms, int64_t[:, ::1] index, float[:, ::1] power,
          double[:, ::1] dot, int threads=1):
    """Fused dictionary matching on the host (match.hpp): for each signal
    row (n, 2·dim: complex parts interleaved) the k = index.shape[1] atoms
    (rows of ``atoms``, same layout) of largest abs(<atom, s>)², ties to the
    lower index, without the signals × atoms score matrix.  Writes their
    indices, single-precision powers (the ranking key) and double-precision
    inner products (dot, (n, 2k)); slots past the atoms hold -1, -1, 0."""
    cdef MatchProblem p
    cdef MatchResult r
    cdef int st
    p.n = signals.shape[0]
    p.atoms = atoms.shape[0]
    p.dim = signals.shape[1] // 2
    p.k = index.shape[1]
    if (signals.shape[1] % 2 or atoms.shape[1] != signals.shape[1] or index.shape[0] != p.n
            or power.shape[0] != p.n or power.shape[1] != p.k or dot.shape[0] != p.n or dot.shape[1] != 2 * p.k):
        raise ValueError("blochsim internal error: match array shapes")
    if p.n > 0:
        p.signal = &signals[0, 0]
        r.index = &index[0, 0]
        r.power = &power[0, 0]
        r.dot = &dot[0, 0]
    if p.atoms > 0:
        p.atom = &atoms[0, 0]
    holder = []
    cdef Interrupt prev = _listen(holder)
    with nogil:
        st = host_match_dispatch(p, r, threads)
    host_set_interrupt(prev)
    _raise(st, b"", holder)
