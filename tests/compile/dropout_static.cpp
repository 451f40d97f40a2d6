// Compile-time proofs of the dropout generator (qkv/philox.hpp, qkv/dropout.hpp): Philox4x32 against
// Random123's published known-answer vectors, the keep rule's threshold, the counter layout, and
// the shader contract's restatement of the constants (shaders/contract/philox.h checks itself
// against the core's when C++ includes it). The keep rate is measured at run time
// (tests/sdpa_backward_test.cpp).
#include <qkv/dropout.hpp>
#include <qkv/philox.hpp>

#include <cstdint>

#include "contract/philox.h"

namespace {

// Random123's known-answer vectors (its file kat_vectors; the Random123 library of D. E. Shaw
// Research), the lines "philox4x32 R counter[4] key[2] expected[4]":
//   philox4x32 7 00000000 00000000 00000000 00000000 00000000 00000000   5f6fb709 0d893f64 4f121f81 4f730a48
//   philox4x32 7 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   5207ddc2 45165e59 4d8ee751 8c52f662
//   philox4x32 7 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   4dfccaba 190a87f0 c47362ba b6b5242a
//   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
//   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
//   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
constexpr qkv::philox_block zeros{0, 0, 0, 0};
constexpr qkv::philox_block ones{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
constexpr qkv::philox_block pi{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};  // digits of pi
constexpr qkv::philox_key key_pi{0xa4093822u, 0x299f31d0u};
static_assert(qkv::philox4x32<7>(zeros, {0, 0}) ==
              qkv::philox_block{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u});
static_assert(qkv::philox4x32<7>(ones, {0xffffffffu, 0xffffffffu}) ==
              qkv::philox_block{0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u});
static_assert(qkv::philox4x32<7>(pi, key_pi) == qkv::philox_block{0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au});
static_assert(qkv::philox4x32(zeros, {0, 0}) == qkv::philox_block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
static_assert(qkv::philox4x32(ones, {0xffffffffu, 0xffffffffu}) ==
              qkv::philox_block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
static_assert(qkv::philox4x32(pi, key_pi) == qkv::philox_block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
static_assert(qkv::philox4x32<10>(pi, key_pi) == qkv::philox4x32(pi, key_pi));

// The keep rule: kept when x >= ⌈p·2^32⌉.
static_assert(qkv::dropout_threshold(0.0) == 0 && qkv::dropout_threshold(0.5) == 0x80000000u);
static_assert(qkv::dropout_threshold(0.25f) == 0x40000000u &&
              qkv::dropout_threshold(0.1) == 429496730u);  // ⌈429496729.6⌉
static_assert(qkv::dropout_threshold(0x1p-32) == 1 && qkv::dropout_threshold(0x1.8p-32) == 2);
// The largest float below 1 still fits 32 bits; a double within 2^-32 of 1 keeps nothing.
static_assert(qkv::dropout_threshold(0x1.fffffep-1f) == 0xffffff00u);
static_assert(qkv::dropout_threshold(1.0 - 0x1p-40) == std::uint64_t{1} << 32);

// The counter: (lo c, hi c, lo r, hi r), c = offset + ⌊j/4⌋ mod 2^64; the key (lo seed, hi seed).
static_assert(qkv::dropout_counter(0, 0, 0) == zeros);
static_assert(qkv::dropout_counter(7, 0x123456789ull, 9) == qkv::philox_block{9u, 0u, 0x23456789u, 1u});
static_assert(qkv::dropout_counter(~std::uint64_t{0}, 0, 4) == zeros);  // wraps
static_assert(qkv::dropout_counter(std::uint64_t{1} << 32, 0, 0) == qkv::philox_block{0u, 1u, 0u, 0u});
static_assert(qkv::dropout_key(0x0123456789abcdefull) == qkv::philox_key{0x89abcdefu, 0x01234567u});
static_assert(qkv::dropout_row(1, 2, 3, 4, 5) == (1 * 4 + 2) * 5 + 3);
// The draw of key j is word j mod 4 of its counter's block; four keys share a block.
constexpr qkv::dropout_stream stream{.seed = 0xa4093822299f31d0ull, .offset = 5, .threshold = 0x80000000u};
static_assert(stream.draw(0, 0) == qkv::philox4x32(qkv::philox_block{5, 0, 0, 0}, {0x299f31d0u, 0xa4093822u})[0]);
static_assert(stream.draw(3, 6) == qkv::philox4x32(qkv::philox_block{6, 0, 3, 0}, {0x299f31d0u, 0xa4093822u})[2]);
static_assert(stream.keeps(3, 6) == (stream.draw(3, 6) >= 0x80000000u));
// for_each_key gives every key of a range once, in order, the same as keeps().
static_assert([] {
    std::uint64_t next = 3;
    bool same = true;
    stream.for_each_key(11, 3, 14,
                        [&](std::uint64_t j, bool kept) { same = same && j == next++ && kept == stream.keeps(11, j); });
    return same && next == 14;
}());
// p = 0 keeps everything.
static_assert(qkv::dropout_stream{.seed = 1, .offset = 0, .threshold = 0}.keeps(0, 0));

// The shader contract's constants (its own QKV_CONTRACT_CHECKs compare them with the core's).
static_assert(qkv::contract::PHILOX_ROUNDS == 10u && qkv::contract::PHILOX_KEYS_PER_COUNTER == 4u);

}  // namespace
