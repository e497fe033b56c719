# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Compiled core of blochsim: thin wrappers over the C++ backends.

Nothing here validates physics; blochsim's Python layer does that before any
call, and the C++ side re-checks the stream's integrity (indices, slots).
"""
from libc.stdint cimport int32_t, int64_t, uint32_t

from blochsim._events cimport EventStream, Property, Tissue, status_message
from blochsim._host cimport host_forward_dispatch, host_forward_registers, host_isa
from blochsim._launcher cimport available

# Order of the tissue arrays handed to forward_host.
TISSUE_FIELDS = ("T1_s", "T2_s", "M0", "B1", "B1phase_rad", "B0_hz", "D_m2_s", "v_m_s",
                 "inv_efficiency")


cdef class _Keep:
    """Holds the buffers a Property points into for the duration of a call."""
    cdef list refs

    def __cinit__(self):
        self.refs = []


cdef Property _property(object arr, float fallback, _Keep keep) except *:
    cdef Property p
    cdef const float[::1] view
    p.data = NULL
    p.stride = 0
    p.fallback = fallback
    if arr is None:
        return p
    view = arr
    keep.refs.append(view)
    if view.shape[0] == 0:
        raise ValueError("blochsim internal error: empty tissue array")
    p.data = &view[0]
    p.stride = 0 if view.shape[0] == 1 else 1
    return p


def forward_host(const int32_t[::1] interval, const uint32_t[::1] flags,
                 const int32_t[::1] shift_before, const int32_t[::1] shift_after,
                 const float[::1] flip_rad, const float[::1] phase_rad,
                 const float[::1] rx_phase_rad, const int32_t[::1] slot,
                 const double[::1] duration_s, int64_t n_samples, int states,
                 double dk_rad_per_m, double voxel_size_m, bint real_path,
                 float common_phase_rad, tuple tissue, int64_t n,
                 float complex[:, ::1] out, int threads, const float[:, ::1] rf_table=None,
                 int variant=0):
    """Play an event stream for n problems on the host.

    The arrays are the event stream of events.hpp; ``tissue`` holds one
    float32 array (length n or 1) or None per name of TISSUE_FIELDS, in SI
    units; ``out`` is complex64 of shape (n, n_samples), written in place.
    """
    cdef EventStream s
    cdef Tissue t
    cdef _Keep keep = _Keep()
    cdef int st
    cdef int64_t ne = interval.shape[0]
    if (flags.shape[0] != ne or shift_before.shape[0] != ne or shift_after.shape[0] != ne
            or flip_rad.shape[0] != ne or phase_rad.shape[0] != ne
            or rx_phase_rad.shape[0] != ne or slot.shape[0] != ne):
        raise ValueError("blochsim internal error: event arrays differ in length")
    if out.shape[0] != n or out.shape[1] != n_samples:
        raise ValueError("blochsim internal error: output has shape (%d, %d), expected (%d, %d)"
                         % (out.shape[0], out.shape[1], n, n_samples))
    if len(tissue) != len(TISSUE_FIELDS):
        raise ValueError("blochsim internal error: tissue tuple has the wrong length")
    s.n_events = ne
    if ne > 0:
        s.interval = &interval[0]
        s.flags = &flags[0]
        s.shift_before = &shift_before[0]
        s.shift_after = &shift_after[0]
        s.flip_rad = &flip_rad[0]
        s.phase_rad = &phase_rad[0]
        s.rx_phase_rad = &rx_phase_rad[0]
        s.slot = &slot[0]
    s.n_intervals = duration_s.shape[0]
    s.duration_s = &duration_s[0] if duration_s.shape[0] > 0 else NULL
    s.rf_table = NULL
    if rf_table is not None:
        if rf_table.shape[0] != ne or rf_table.shape[1] != 6:
            raise ValueError("blochsim internal error: rf_table must have shape (n_events, 6)")
        if ne > 0:
            s.rf_table = &rf_table[0, 0]
    s.n_samples = n_samples
    s.states = states
    s.dk_rad_per_m = dk_rad_per_m
    s.voxel_size_m = voxel_size_m
    s.real_path = 1 if real_path else 0
    s.common_phase_rad = common_phase_rad

    t.n = n
    t.T1_s = _property(tissue[0], 1.0e30, keep)
    t.T2_s = _property(tissue[1], 1.0e30, keep)
    t.M0 = _property(tissue[2], 1.0, keep)
    t.B1 = _property(tissue[3], 1.0, keep)
    t.B1phase_rad = _property(tissue[4], 0.0, keep)
    t.B0_hz = _property(tissue[5], 0.0, keep)
    t.D_m2_s = _property(tissue[6], 0.0, keep)
    t.v_m_s = _property(tissue[7], 0.0, keep)
    t.inv_efficiency = _property(tissue[8], 1.0, keep)
    if n == 0 or n_samples == 0:
        return
    cdef float* outp = <float*> &out[0, 0]
    with nogil:
        if variant == 0:
            st = host_forward_dispatch(s, t, outp, threads)
        else:
            st = host_forward_registers(s, t, outp, variant)
    if st != 0:
        raise ValueError("blochsim: " + status_message(st).decode())


def host_instruction_set():
    """Name of the x86-64 level the host kernels run with on this CPU."""
    return host_isa().decode()


def cuda_available():
    """(usable, reason): whether the device backend can run, and why not."""
    cdef char why[512]
    cdef int ok
    why[0] = 0
    ok = available(why, 512)
    return bool(ok), why.decode()
