# Declarations of src_cpp/include/blochsim/events.hpp and config.hpp.
from libc.stdint cimport int32_t, int64_t, uint32_t


cdef extern from "blochsim/config.hpp" namespace "blochsim" nogil:
    const int cuda_error_base
    const int out_of_memory
    const int interrupted
    const char* status_message(int status)


cdef extern from "blochsim/events.hpp" namespace "blochsim" nogil:
    cdef uint32_t event_rf
    cdef uint32_t event_inversion
    cdef uint32_t event_readout
    cdef uint32_t event_spoil
    cdef uint32_t event_saturation
    cdef uint32_t event_driven
    const int32_t max_transmit_settings

    cdef cppclass EventStream:
        int64_t n_events
        const int32_t* interval
        const uint32_t* flags
        const int32_t* shift_before
        const int32_t* shift_after
        const float* flip_rad
        const float* phase_rad
        const float* rx_phase_rad
        const int32_t* slot
        const int32_t* transmit
        int64_t n_intervals
        const double* duration_s
        const float* rf_table
        const float* rf_duration_s
        const float* rf_offset_hz
        const float* rf_power
        const int32_t* driven
        int64_t n_driven
        const double* driven_table
        int64_t n_samples
        int32_t states
        double dk_rad_per_m
        double voxel_size_m
        int32_t real_path
        float common_phase_rad

    cdef cppclass Property:
        const float* data
        int64_t stride
        float fallback

    cdef cppclass Transmit:
        Transmit()
        int32_t settings
        int32_t channels
        const float* sensitivity
        int64_t stride
        const float* drive
        int32_t seeded
        float* gradient

    cdef cppclass Tissue:
        int64_t n
        Transmit transmit

    Property& tissue_property(Tissue& t, int f)


cdef extern from "blochsim/events.hpp" namespace "blochsim" nogil:
    const int tissue_fields
    const int pool_field_count
    const int field_bound_T1D_s
    const int field_bound2_T1D_s
    const uint32_t field_single_pool_direction
    const uint32_t field_pooled_direction

    cdef struct FieldInfo:
        const char* name
        const char* unit
        float fallback
        uint32_t flags

    const FieldInfo field_table[]


cdef extern from "blochsim/pools/pools.hpp" namespace "blochsim" nogil:
    cdef cppclass Pools:
        int32_t n_exchanging
        int32_t bound
        int32_t lineshape
        int32_t bound2

    Property& pool_property(Pools& p, int f)


cdef extern from "blochsim/pools/lineshape.hpp" namespace "blochsim" nogil:
    void lineshape_g(int shape, double x, double& g, double& dg)
