# Included by _core.pyx: device memory, copies and streams, and the DLPack
# export of device arrays.  It uses _core.pyx's cimports and _raise.

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


def first_bad_values(checks, uintptr_t stream):
    """For each check (pointer to float32, count, check_lower, lower,
    strict): (index, value) of its first non-finite or out-of-bound
    element, or (-1, nan); one synchronisation of the stream for all."""
    cdef int m = len(checks)
    cdef vector[L.ValueCheck] cs = vector[L.ValueCheck](m)
    cdef vector[int64_t] idx = vector[int64_t](m, -1)
    cdef vector[float] v = vector[float](m, float("nan"))
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    for j, (x, count, check_lower, lower, strict) in enumerate(checks):
        cs[j].x = <const float*> <uintptr_t> x
        cs[j].count = count
        cs[j].check_lower = 1 if check_lower else 0
        cs[j].lower = lower
        cs[j].strict = 1 if strict else 0
    if m == 0:
        return []
    with nogil:
        st = L.first_bad_values(cs.data(), m, idx.data(), v.data(), <void*> stream, err, ERRLEN)
    _raise(st, err)
    return [(idx[j], v[j]) for j in range(m)]


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


# --------------------------------------------------------------------------
# Dictionary matching on the device


def match_device_max_k():
    """The largest k the device's matching kernel keeps (0 without CUDA)."""
    return L.match_max_k()


def match_device(uintptr_t signals, uintptr_t atoms, int64_t n, int64_t n_atoms, int64_t dim, int k,
                 uintptr_t index, uintptr_t power, uintptr_t dot, uintptr_t stream):
    """The fused matching kernel on the device (cuda/match.cuh): device
    pointers to signals (n, dim) and atoms (n_atoms, dim) complex64, and to
    the outputs index (n, k) int64, power (n, k) float32 and dot (n, k)
    complex128 (match()'s on the host).  Ordered on ``stream``."""
    cdef MatchProblem p
    cdef MatchResult r
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    p.n = n
    p.atoms = n_atoms
    p.dim = dim
    p.k = k
    p.signal = <const float*> signals
    p.atom = <const float*> atoms
    r.index = <int64_t*> index
    r.power = <float*> power
    r.dot = <double*> dot
    with nogil:
        st = L.match(p, r, <void*> stream, err, ERRLEN)
    _raise(st, err)


def project_device(uintptr_t rows, int64_t count, int64_t c, uintptr_t basis, int64_t r, bint unit, uintptr_t out,
                   uintptr_t norms, uintptr_t stream):
    """Row norms (float64, may be 0: not written) and the rows (count, c)
    complex64, scaled to unit norm when ``unit``, projected on the basis
    (c, r) (0: copied) into out, on the device, ordered on ``stream``."""
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.project(<const float*> rows, count, c, <const float*> basis, r, unit, <float*> out,
                       <double*> norms, <void*> stream, err, ERRLEN)
    _raise(st, err)


def candidate_dots_device(uintptr_t atoms, uintptr_t signals, int64_t count, int64_t m, int64_t c, uintptr_t dots,
                          uintptr_t norms, uintptr_t stream):
    """<atom, signal> (complex128) and norms (float64) of each signal's m
    candidate atoms (count·m, c) on the device, ordered on ``stream``."""
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.candidate_dots(<const float*> atoms, <const float*> signals, count, m, c, <double*> dots,
                              <double*> norms, <void*> stream, err, ERRLEN)
    _raise(st, err)


def perk_device(uintptr_t omega, uintptr_t phase, uintptr_t weight, uintptr_t offset, int64_t d, int64_t F,
                int64_t p, uintptr_t x, int64_t count, uintptr_t out, uintptr_t g, uintptr_t xbar, uintptr_t stream):
    """PERK's fused map (and, with g, its pullback into xbar) on the device
    (cuda/perk.cuh): every argument a device pointer (0: absent), the
    model omega (F, d), phase (F), weight (p, F), offset (p) float32, x
    (count, d), out (count, p).  Ordered on ``stream``."""
    cdef PerkModel m
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    m.d = d
    m.F = F
    m.p = p
    m.omega = <const float*> omega
    m.phase = <const float*> phase
    m.weight = <const float*> weight
    m.offset = <const float*> offset
    with nogil:
        st = L.perk(m, <const float*> x, <const float*> g, count, <float*> out, <float*> xbar, <void*> stream,
                    err, ERRLEN)
    _raise(st, err)


def perk_inputs_device(uintptr_t s, int64_t count, int64_t c, int mode, bint normalize, uintptr_t basis, int64_t r,
                       uintptr_t known, int64_t nk, uintptr_t x, int64_t d, uintptr_t stream):
    """PERK's inputs x (count, d) float32 from signals s (count, c)
    complex64 on the device: mode 0 Cartesian parts, 1 magnitudes;
    normalised; projected on basis (values, r) float32 (0: kept); known
    columns (count, nk) appended.  Ordered on ``stream``."""
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.perk_inputs(<const float*> s, count, c, mode, normalize, <const float*> basis, r,
                           <const float*> known, nk, <float*> x, d, <void*> stream, err, ERRLEN)
    _raise(st, err)


def perk_moments_device(uintptr_t omega, uintptr_t phase, int64_t d, int64_t F, uintptr_t x, uintptr_t t,
                        int64_t count, int64_t p, float scale, uintptr_t sz, uintptr_t szz, uintptr_t stz,
                        uintptr_t stream):
    """The sums of one PERK training block on the device (cuda/perk.cuh):
    features of x (count, d) float32 from omega (F, d) and phase (F), and
    in float64 their sum (F), Gram matrix (F, F) and products with the
    targets t (count, p) float64 (p, F).  Device pointers, ordered on
    ``stream``."""
    cdef PerkModel m
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    m.d = d
    m.F = F
    m.p = 1
    m.omega = <const float*> omega
    m.phase = <const float*> phase
    with nogil:
        st = L.perk_moments(m, <const float*> x, <const double*> t, count, p, scale, <double*> sz, <double*> szz,
                            <double*> stz, <void*> stream, err, ERRLEN)
    _raise(st, err)


def noise_add_device(uintptr_t z, int64_t count, int64_t first, double sigma, uint64_t key, uint32_t block,
                     uint32_t stream_tag, uintptr_t stream):
    """z (count complex64 on the device) += sigma · complex standard normals
    first .. first + count - 1 of the counter-based generator (noise.hpp, the
    host's numbers) under the 64-bit key, block and stream tag.  Ordered on
    ``stream``."""
    cdef NoiseKey k = _noise_key(key, block, stream_tag)
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.noise_add(<float*> z, count, first, sigma, k, <void*> stream, err, ERRLEN)
    _raise(st, err)


def add_device(uintptr_t a, uintptr_t b, int64_t count, uintptr_t stream):
    """a += b for count float64 values on the device, ordered on ``stream``."""
    cdef char err[ERRLEN]
    cdef int st
    err[0] = 0
    with nogil:
        st = L.add(<double*> a, <const double*> b, count, <void*> stream, err, ERRLEN)
    _raise(st, err)
