// Complex Gaussian noise from a counter-based generator: the same numbers
// on the host and on the device, for any split of the work.
//
// Value i of a draw is one call of Philox4x32-10 (Salmon, Moraes, Dror and
// Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11) on the
// counter (i mod 2^32, i / 2^32, block, stream) under a 64-bit key.  Its
// four words make two uniforms of 53 bits, u1 in (0, 1] and u2 in [0, 1),
// and the Box–Muller transform (Box and Muller, Ann. Math. Stat. 29, 1958)
// turns them into two independent standard normals, the real and imaginary
// parts:
//
//     re = sqrt(-2 ln u1) cos(2π u2),   im = sqrt(-2 ln u1) sin(2π u2).
//
// The transform runs in double precision; the host's and the device's
// libraries may differ in the last bit of a normal, which single-precision
// signals never see but rarely.
#pragma once

#include <cmath>
#include <cstdint>

#include "config.hpp"

namespace blochsim {

struct NoiseKey {
  uint32_t key0 = 0, key1 = 0;  // the seed's 64 bits
  uint32_t block = 0;           // counter word 2: a block of draws
  uint32_t stream = 0;          // counter word 3: what the draws are for
};

// The ten rounds of Philox4x32 on counter c under key (k0, k1), in place
// (the multipliers and the Weyl key schedule of Salmon et al., table 2).
BLOCHSIM_HD inline void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[1] = static_cast<uint32_t>(p1);
    c[3] = static_cast<uint32_t>(p0);
    c[0] = n0;
    c[2] = n2;
  }
}

// The complex standard normal of index i under k (real and imaginary parts
// each of unit variance).
BLOCHSIM_HD inline void noise_normal(int64_t i, const NoiseKey& k, double& re, double& im) {
  const uint64_t u = static_cast<uint64_t>(i);
  uint32_t c[4] = {static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), k.block, k.stream};
  philox4x32_10(c, k.key0, k.key1);
  const double two53 = 1.0 / 9007199254740992.0;
  const double u1 = (static_cast<double>((static_cast<uint64_t>(c[0]) << 21) | (c[1] >> 11)) + 1.0) * two53;
  const double u2 = static_cast<double>((static_cast<uint64_t>(c[2]) << 21) | (c[3] >> 11)) * two53;
  const double r = ::sqrt(-2.0 * ::log(u1)), a = 6.283185307179586476925286766559 * u2;
  re = r * ::cos(a);
  im = r * ::sin(a);
}

// z[j] += sigma · (complex normal of index first + j) for complex64 z
// (interleaved float pairs), the sum formed in double.
BLOCHSIM_HD BLOCHSIM_FORCEINLINE void noise_add_one(float* z, int64_t j, int64_t first, double sigma,
                                                    const NoiseKey& k) {
  double re, im;
  noise_normal(first + j, k, re, im);
  z[2 * j] = static_cast<float>(static_cast<double>(z[2 * j]) + sigma * re);
  z[2 * j + 1] = static_cast<float>(static_cast<double>(z[2 * j + 1]) + sigma * im);
}

}  // namespace blochsim
