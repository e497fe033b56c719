# Declarations of src_cpp/host/dispatch.hpp (the host backend): the
# estimators' kernels, the host level, workspaces and the interrupt poll;
# the EPG operations are reached through calls.hpp (_calls.pxd).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from blochsim._events cimport EventStream, Pools, Tissue


cdef extern from "blochsim/perk.hpp" namespace "blochsim" nogil:
    const int perk_max_outputs

    cdef cppclass PerkModel:
        int64_t d
        int64_t F
        int64_t p
        const float* omega
        const float* phase
        const float* weight
        const float* offset


cdef extern from "blochsim/match.hpp" namespace "blochsim" nogil:
    const int match_max_k

    cdef cppclass MatchProblem:
        int64_t n
        int64_t atoms
        int64_t dim
        int k
        const float* signal
        const float* atom

    cdef cppclass MatchResult:
        int64_t* index
        float* power
        double* dot


cdef extern from "blochsim/epg/keyed.hpp" namespace "blochsim" nogil:
    cdef cppclass KeyedProgram:
        int64_t n_events
        int32_t max_slots
        const int32_t* slots
        const int64_t* first
        const int32_t* dst
        const int32_t* src
        int64_t n_reach
        const uint8_t* reach
        int64_t n_k2
        const double* k2
        const int64_t* k2_first


cdef extern from "blochsim/host/interrupt.hpp" namespace "blochsim" nogil:
    cdef struct Interrupt:
        int (*poll)(void* ctx) noexcept
        void* ctx
    const double unchecked_workspace_bytes


cdef extern from "blochsim/noise.hpp" namespace "blochsim" nogil:
    cdef cppclass NoiseKey:
        uint32_t key0
        uint32_t key1
        uint32_t block
        uint32_t stream


cdef extern from "dispatch.hpp" namespace "blochsim" nogil:
    int host_perk_dispatch(const PerkModel& m, const float* x, const float* g, int64_t n, float* out,
                           float* xbar, int threads)
    int host_match_dispatch(const MatchProblem& p, const MatchResult& r, int threads)
    int host_noise_add(float* z, int64_t n, int64_t first, double sigma, const NoiseKey& k, int threads)
    const char* host_isa()
    double host_workspace_bytes(int entry, const EventStream& s, const Pools* p, int64_t n, int threads,
                                const int* fields, int n_dirs, unsigned mask)
    double host_available_memory()
    Interrupt host_set_interrupt(Interrupt i)

