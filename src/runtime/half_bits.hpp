// The float16 conversions of many values at once, branch-free: each value's result is chosen by
// selects over bit operations (no branch depends on the data), so that the compilers vectorize
// the loops (SSE2 on any x86-64, NEON on ARM). The results are exactly the scalar
// qkv::to_half_bits / qkv::from_half_bits ones (element_type.cpp defines those; the tests compare
// every float16 and millions of floats): to nearest, ties to even, ±inf past float16's range, NaN
// made quiet with its sign and the payload's top bits kept. qkv::to_half_bits(std::span, std::span)
// and qkv::from_half_bits(std::span, std::span) use these, or the CPU's F16C instructions where it
// has them (element_type.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace qkv::half_detail {

/// a where the condition holds, else b: a mask, not a branch.
inline std::uint32_t pick(bool condition, std::uint32_t a, std::uint32_t b) {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
    return (a & mask) | (b & ~mask);
}

/// float32 bits -> float16 bits.
inline std::uint16_t to_half(std::uint32_t bits) {
    const std::uint32_t sign = (bits >> 16) & 0x8000u;
    const std::uint32_t magnitude = bits & 0x7fffffffu;
    // A normal float16 (2^-14 <= |x| < 65520; a carry out of the mantissa bumps the exponent, up
    // to inf for 65520 <= |x| < 65536): rebias the exponent (127 -> 15) and drop 13 mantissa bits,
    // to nearest, ties to even (0xfff plus the kept mantissa's last bit).
    const std::uint32_t normal = (magnitude - 0x38000000u + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
    // A float16 subnormal or zero (|x| < 2^-14): adding 0.5 puts the value in units of 2^-24 into
    // the mantissa of the float sum, rounded by the addition to nearest, ties to even (a float32
    // subnormal input, or one flushed to zero, gives ±0 either way).
    float magnitude_f = 0.0f;
    std::memcpy(&magnitude_f, &magnitude, 4);
    const float sum = magnitude_f + 0.5f;
    std::uint32_t sum_bits = 0;
    std::memcpy(&sum_bits, &sum, 4);
    const std::uint32_t subnormal = sum_bits - 0x3f000000u;
    const std::uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x3ffu);
    std::uint32_t half = pick(magnitude < 0x38800000u, subnormal, normal);
    half = pick(magnitude >= 0x47800000u, 0x7c00u, half);  // |x| >= 65536, and inf
    half = pick(magnitude > 0x7f800000u, nan, half);
    return static_cast<std::uint16_t>(sign | half);
}

/// float16 bits -> float32 bits (exact).
inline std::uint32_t from_half(std::uint32_t half) {
    const std::uint32_t sign = (half & 0x8000u) << 16;
    const std::uint32_t magnitude = half & 0x7fffu;
    const std::uint32_t normal = (magnitude << 13) + 0x38000000u;  // exponent rebiased 15 -> 127
    const std::uint32_t special = normal + 0x38000000u;            // exponent 31 -> 255: inf, NaN (as it is)
    const float scaled = static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f;  // subnormal, exact
    std::uint32_t subnormal = 0;
    std::memcpy(&subnormal, &scaled, 4);
    std::uint32_t bits = pick(magnitude >= 0x7c00u, special, normal);
    bits = pick(magnitude < 0x0400u, subnormal, bits);
    return sign | bits;
}

inline void to_halves(const float* in, std::uint16_t* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, in + i, 4);
        out[i] = to_half(bits);
    }
}

inline void from_halves(const std::uint16_t* in, float* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t bits = from_half(in[i]);
        std::memcpy(out + i, &bits, 4);
    }
}

}  // namespace qkv::half_detail
