# Declarations of src_cuda/launcher.hpp (the device backend launcher).

cdef extern from "launcher.hpp" namespace "blochsim::cuda" nogil:
    int available(char* why, int n)
