"""The counter-based noise generator of the C++ core (noise.hpp) against a
Philox4x32-10 written here, itself checked against the Random123
known-answer vectors (Salmon et al., SC'11; the library's
``tests/kat_vectors``), and the normals' distribution."""
import numpy as np
import pytest
from scipy import stats

from blochsim._arrays import noise as _noise

M = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c, k0, k1 = list(ctr), key[0], key[1]
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M, p1 & M, ((p0 >> 32) ^ c[3] ^ k1) & M, p0 & M]
    return c


@pytest.mark.parametrize("ctr, key, want", [
    ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    ([M, M, M, M], [M, M], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
    ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
     [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
])
def test_the_reference_philox_gives_the_known_answers(ctr, key, want):
    assert philox4x32_10(ctr, key) == want


def reference(i, seed_key, block, stream):
    c = philox4x32_10([i & M, i >> 32, block, stream], [seed_key & M, seed_key >> 32])
    u1 = (((c[0] << 21) | (c[1] >> 11)) + 1) / 2.0 ** 53
    u2 = ((c[2] << 21) | (c[3] >> 11)) / 2.0 ** 53
    r, a = np.sqrt(-2 * np.log(u1)), 2 * np.pi * u2
    return r * np.cos(a), r * np.sin(a)


@pytest.mark.parametrize("seed_key, block, stream, first", [(0, 0, 0, 0), (2 ** 64 - 1, 7, 1, 2 ** 33 - 5),
                                                          (_noise.key(42), 3, 0, 1000)])
def test_the_core_draws_the_reference_normals(seed_key, block, stream, first):
    base = np.linspace(-1, 1, 40).astype(np.float32) * (1 + 1j)
    z = base.astype(np.complex64).copy()
    _noise.add(z, 0.25, seed_key, block, stream, threads=2, first=first)
    want = np.array([complex(*reference(first + j, seed_key, block, stream)) for j in range(len(z))])
    np.testing.assert_allclose(z, (base + 0.25 * want).astype(np.complex64), rtol=1e-6, atol=1e-7)


def test_a_draw_is_the_same_for_any_split_and_thread_count():
    whole = np.zeros(100_003, np.complex64)
    _noise.add(whole, 1.0, 9, 2, 1, threads=1)
    parts = np.zeros_like(whole)
    for a, b in [(0, 4095), (4095, 60_000), (60_000, len(parts))]:
        piece = np.zeros(b - a, np.complex64)
        _noise.add(piece, 1.0, 9, 2, 1, threads=2, first=a)
        parts[a:b] = piece
    np.testing.assert_array_equal(whole, parts)
    other = np.zeros_like(whole)
    _noise.add(other, 1.0, 9, 3, 1)  # another block: other numbers
    assert np.abs(np.corrcoef(whole.real, other.real)[0, 1]) < 0.02


def test_the_normals_are_standard_and_independent():
    z = np.zeros(400_000, np.complex64)
    _noise.add(z, 1.0, _noise.key(5), 0, 0, threads=2)
    for part in (z.real, z.imag):
        assert stats.kstest(part.astype(np.float64), "norm").pvalue > 1e-3
        assert abs(part.mean()) < 5 / np.sqrt(len(z))
        assert abs(part.var() - 1) < 5 * np.sqrt(2 / len(z))
    assert abs(np.mean(z.real * z.imag)) < 5 / np.sqrt(len(z))
    assert abs(np.mean(z.real[1:] * z.real[:-1])) < 5 / np.sqrt(len(z))


def test_noise_needs_contiguous_complex64():
    with pytest.raises(TypeError, match="complex64"):
        _noise.add(np.zeros(4, np.complex128), 1.0, 0, 0, 0)
    with pytest.raises(TypeError, match="complex64"):
        _noise.add(np.zeros((4, 4), np.complex64)[:, ::2], 1.0, 0, 0, 0)
