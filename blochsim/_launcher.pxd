# Declarations of src_cuda/launcher.hpp (the device backend launcher): its
# memory, copy and stream helpers and the estimators' kernels; the EPG
# operations are reached through calls.hpp (_calls.pxd).
from libc.stddef cimport size_t
from libc.stdint cimport int64_t

from blochsim._events cimport EventStream, Pools, Tissue
from blochsim._host cimport KeyedProgram, MatchProblem, MatchResult, NoiseKey, PerkModel


cdef extern from "launcher.hpp" namespace "blochsim::cuda" nogil:
    cdef struct ValueCheck:
        const float* x
        int64_t count
        int check_lower
        float lower
        int strict

    int available(char* why, int n)
    int device_malloc(void** p, size_t nbytes, char* err, int n)
    int device_free(void* p, char* err, int n)
    int device_malloc_async(void** p, size_t nbytes, void* stream, char* err, int n)
    int device_free_async(void* p, void* stream, char* err, int n)
    int copy_to_device(void* dst, const void* src, size_t nbytes, void* stream, char* err, int n)
    int copy_to_host(void* dst, const void* src, size_t nbytes, void* stream, char* err, int n)
    int stream_create(void** stream, char* err, int n)
    int stream_destroy(void* stream, char* err, int n)
    int stream_synchronize(void* stream, char* err, int n)
    int memory_info(size_t* free_bytes, size_t* total_bytes, char* err, int n)
    int current_device(int* device, char* err, int n)
    int pointer_device(const void* p, int* device, char* err, int n)
    int expand_to_float(const void* src, int src_is_f64, int ndim, const int64_t* shape,
                        const int64_t* strides, double scale, float* dst, int64_t count, void* stream, char* err, int n)
    int keep_stream(const EventStream& s, EventStream* view, void** buf, char* err, int n)
    void free_kept_stream(void* buf)
    int first_bad_values(const ValueCheck* checks, int m, int64_t* index, float* bad_value, void* stream,
                         char* err, int n)
    int match(const MatchProblem& p, const MatchResult& r, void* stream, char* err, int n)
    int match_max_k()
    int perk_inputs(const float* s, int64_t count, int64_t c, int mode, int normalize, const float* basis,
                    int64_t r, const float* known, int64_t nk, float* x, int64_t d, void* stream, char* err, int n)
    int perk_moments(const PerkModel& m, const float* x, const double* t, int64_t count, int64_t p, float scale,
                     double* sz, double* szz, double* stz, void* stream, char* err, int n)
    int noise_add(float* z, int64_t count, int64_t first, double sigma, const NoiseKey& k, void* stream, char* err,
                  int n)
    int add(double* a, const double* b, int64_t count, void* stream, char* err, int n)
    int perk(const PerkModel& m, const float* x, const float* g, int64_t count, float* out, float* xbar,
             void* stream, char* err, int n)
    int project(const float* rows, int64_t count, int64_t c, const float* basis, int64_t r, int unit, float* out,
                double* norms, void* stream, char* err, int n)
    int candidate_dots(const float* atoms, const float* signals, int64_t count, int64_t m, int64_t c,
                       double* dots, double* norms, void* stream, char* err, int n)
    size_t bytes_per_problem(const EventStream& s, const Tissue& t)
