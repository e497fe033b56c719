// The device backend of blochsim (CUDA C++, compiled by nvcc): the kernel
// templates instantiated for the GPU and the entries that launch them
// (cuda/: runtime, teams, and one file per kernel family).  Include it from a .cu file to embed the device backend in a C++
// program; the Python extension compiles it in src_cuda/launcher.cu.
//
// Kernels, for K orders with T = ceil(K / R) threads per problem, each
// holding R orders in registers:
//   warp_kernel   R = 32 (real path) or 8 (complex), T <= 32 (K <= 1024 /
//                 256): teams of T consecutive lanes, 32 / T to a warp (any
//                 T; the lanes left over replay a problem), boundary orders
//                 passed by warp shuffles;
//   block_kernel  R = 32 or 8, T <= 256 / 512 (K <= 8192 / 4096): teams of
//                 T threads, as many to a block (of up to 256 / 512) as fit,
//                 boundary orders through shared memory;
//   tail_kernel   beyond: a block team of the most threads holding the
//                 first orders in registers and the rest in device memory
//                 (epg::TailStore), so that the cost grows with K across the
//                 boundary (any K that fits in memory).
// shape_of() picks the warp or the block kernel by a cost model (threads
// per problem, spare threads included, times each thread's work), so that
// the cost grows with K in steps of one thread's orders rather than in
// powers of two.  The teams read the event records from a window in their
// block's shared memory (SharedRecords).
#pragma once

#include "cuda/adjoint.cuh"
#include "cuda/forward.cuh"
#include "cuda/jacobian.cuh"
#include "cuda/keyed.cuh"
#include "cuda/match.cuh"
#include "cuda/perk.cuh"
#include "cuda/pools.cuh"
