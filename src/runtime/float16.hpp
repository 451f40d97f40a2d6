// IEEE binary16 conversions, written once for every path that stores float16: the Vulkan calls'
// fp16 uploads, the K/V cache's fp16 rows, and the runtime's quantizers. Header-only, internal.
#pragma once

#include <bit>
#include <cstdint>

namespace qkv::detail {

/// Whether a finite float rounds to a float16 beyond its largest finite value (65504), i.e. to
/// infinity: |x| >= 65520.
[[nodiscard]] inline bool half_overflows(float x) {
    const std::uint32_t abs = std::bit_cast<std::uint32_t>(x) & 0x7fffffffu;
    return abs >= 0x477ff000u && abs < 0x7f800000u;
}

/// The float16 bits nearest to `x` (ties to even); a finite value beyond float16's range becomes
/// infinity (check half_overflows first where that must not happen), NaN stays NaN (quiet).
[[nodiscard]] inline std::uint16_t to_half(float x) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to 65536 or more
    if (abs < 0x38800000u) {                                                    // a subnormal half (or zero)
        if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);         // at most half the smallest: 0
        const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126u - (abs >> 23);  // 14..24
        std::uint32_t h = mant >> shift;
        const std::uint32_t rest = mant & ((1u << shift) - 1u), half_way = 1u << (shift - 1u);
        if (rest > half_way || (rest == half_way && (h & 1u))) ++h;
        return static_cast<std::uint16_t>(sign | h);
    }
    std::uint32_t h = (abs - 0x38000000u) >> 13;  // rebias the exponent: 127 -> 15
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: still right
    return static_cast<std::uint16_t>(sign | h);
}

/// The float value of float16 bits (exact).
[[nodiscard]] inline float from_half(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {  // zero or subnormal: mant · 2^-24
        const float m = static_cast<float>(mant) * 0x1p-24f;
        return sign ? -m : m;
    }
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace qkv::detail
