// Philox4x32: the counter-based random number generator of Salmon, Moraes, Dror and Shaw,
// "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), as Random123 defines it, and the
// generator behind PyTorch's and FlashAttention's dropout on CUDA (through cuRAND's Philox4_32_10).
//
//   constexpr qkv::philox_block r = qkv::philox4x32(counter, key);   // 10 rounds
//
// A pure function of a 128-bit counter (four 32-bit words) and a 64-bit key (two words): four
// 32-bit numbers per counter, every counter independent, so any random number of a stream can be
// computed where it is needed, in any order, on any thread, at compile time or in a shader. One
// round, with M0 = 0xD2511F53 and M1 = 0xCD9E8D57 and hi/lo the halves of a 32x32 -> 64-bit
// product:
//   (c0, c1, c2, c3) <- (hi(M1·c2) ^ c1 ^ k0, lo(M1·c2), hi(M0·c0) ^ c3 ^ k1, lo(M0·c0))
// and before every round but the first the key is bumped by the Weyl constants
// (k0, k1) <- (k0 + 0x9E3779B9, k1 + 0xBB67AE85), all mod 2^32. Tested against Random123's
// published known-answer vectors (tests/compile/dropout_static.cpp). The constants are restated for
// the shaders in shaders/contract/philox.h, which checks them against these.
#pragma once

#include <array>
#include <cstdint>

namespace qkv {

/// Four 32-bit words: a Philox counter, or the four numbers it gives.
using philox_block = std::array<std::uint32_t, 4>;
/// Philox4x32's key: two 32-bit words.
using philox_key = std::array<std::uint32_t, 2>;

/// Philox4x32's constants (Random123's PHILOX_M4x32_0/1 and PHILOX_W32_0/1) and its usual round
/// count, the one of Random123's philox4x32 and cuRAND's Philox4_32_10.
namespace philox_constants {
inline constexpr std::uint32_t m0 = 0xD2511F53u;  ///< multiplier of words 0 and 1
inline constexpr std::uint32_t m1 = 0xCD9E8D57u;  ///< multiplier of words 2 and 3
inline constexpr std::uint32_t w0 = 0x9E3779B9u;  ///< key bump of k0 (the golden ratio)
inline constexpr std::uint32_t w1 = 0xBB67AE85u;  ///< key bump of k1 (sqrt(3) - 1)
inline constexpr unsigned rounds = 10;
}  // namespace philox_constants

/// Philox4x32 with R rounds (10 unless asked) of `counter` under `key`.
template <unsigned R = philox_constants::rounds>
[[nodiscard]] constexpr philox_block philox4x32(philox_block counter, philox_key key) noexcept {
    using namespace philox_constants;
    for (unsigned round = 0; round < R; ++round) {
        if (round != 0) {
            key[0] += w0;
            key[1] += w1;
        }
        const std::uint64_t p0 = std::uint64_t{m0} * counter[0];
        const std::uint64_t p1 = std::uint64_t{m1} * counter[2];
        counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
                   static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    }
    return counter;
}

}  // namespace qkv
