# Declarations of src_cpp/host/calls.hpp (the extension's entries: one per
# operation, each taking one Call).
from libc.stddef cimport size_t
from libc.stdint cimport int64_t

from blochsim._events cimport EventStream, Pools, Tissue
from blochsim._host cimport KeyedProgram


cdef extern from "calls.hpp" namespace "blochsim" nogil:
    cdef enum CallPlace:
        on_host
        on_device
        through_device

    cdef cppclass Call:
        int place
        const EventStream* stream
        const KeyedProgram* program
        const Tissue* tissue
        const Pools* pools
        const int* fields
        int n_dirs
        const float* seeds
        float* out
        float* jac
        const float* cot
        int64_t cot_stride
        int outer_field
        double* ev_grad
        float* tgrad
        unsigned mask
        int threads
        int variant
        void* cuda_stream
        const EventStream* kept
        size_t budget_bytes
        char* err
        int err_len

    int call_forward(const Call& c) noexcept
    int call_jacobian(const Call& c) noexcept
    int call_adjoint(const Call& c) noexcept
    int call_adjoint2(const Call& c) noexcept
    int call_pooled(const Call& c) noexcept
    int call_pooled_adjoint(const Call& c) noexcept


ctypedef int (*CallEntry)(const Call& c) noexcept nogil
