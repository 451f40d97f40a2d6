// qkv::quantize, qkv::dequantize, qkv::round_trip and the float16 conversions: the storage formats
// of qkv/runtime/element_type.hpp. The q8_0 and q4_0 rules are ggml's reference quantizers, step
// for step in float32 (this file is compiled with -ffp-contract=off: x · (1/d) + 8.5 must round
// twice, as ggml's C does, never once in a fused multiply-add).
#include "qkv/runtime/element_type.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/error.hpp"
#include "qkv/runtime/half.hpp"
#include "runtime/half_bits.hpp"

// F16C (x86's float16 conversion instructions, with AVX): compiled for those functions alone
// (target attributes, GCC and Clang) and chosen at run time where the CPU has them. MinGW's GCC
// does not keep 32-byte stack alignment for AVX values on Win64, so there the loops use 128-bit
// registers only.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define QKV_HALF_F16C 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace qkv {
namespace {

[[noreturn]] void fail(const std::string& message) { throw invalid_argument(message); }

std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return text;
}

std::string name_of(element_type type) { return std::string(to_string(type)); }

void check_known(element_type type, const char* what) {
    if (!is_known(type))
        fail(std::string(what) + ": unknown element type (" + std::to_string(static_cast<int>(type)) + ")");
}

/// The conversions to and from floats take the types that hold floats only.
void check_floats(element_type type, const char* what) {
    check_known(type, what);
    if (!holds_floats(type))
        fail(std::string(what) + ": " + name_of(type) +
             " holds integers, not floats: it is no storage format of float values (f32, f16, q8_0, q4_0)");
}

constexpr std::uint16_t half_exponent_mask = 0x7c00u;

void store_u16(std::byte* at, std::uint16_t bits) {
    at[0] = static_cast<std::byte>(bits & 0xffu);
    at[1] = static_cast<std::byte>(bits >> 8);
}

std::uint16_t load_u16(const std::byte* at) {
    return static_cast<std::uint16_t>(std::to_integer<unsigned>(at[0]) | (std::to_integer<unsigned>(at[1]) << 8));
}

void store_f32(std::byte* at, float value) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>((bits >> (8 * i)) & 0xffu);
}

float load_f32(const std::byte* at) {
    std::uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= std::to_integer<std::uint32_t>(at[i]) << (8 * i);
    return std::bit_cast<float>(bits);
}

/// The float16 of a block's scale d; refuses a d that rounds to inf.
std::uint16_t checked_scale(element_type type, float d, std::size_t block, const char* rule, const char* limit) {
    const std::uint16_t bits = to_half_bits(d);
    if ((bits & half_exponent_mask) == half_exponent_mask)
        fail("quantize to " + name_of(type) + ": block " + std::to_string(block) + " (elements " +
             std::to_string(block * 32) + " to " + std::to_string(block * 32 + 31) + ") needs the scale d = " + rule +
             " = " + number(static_cast<double>(d)) +
             ", beyond float16's range (65504); the block's values must stay " + limit);
    return bits;
}

void check_finite(element_type type, std::span<const float> values) {
    for (std::size_t i = 0; i < values.size(); ++i)
        if (!std::isfinite(values[i]))
            fail("quantize to " + name_of(type) + ": element " + std::to_string(i) + " is " +
                 number(static_cast<double>(values[i])) + "; " + name_of(type) + " stores finite values only");
}

/// ggml's quantize_row_q8_0_ref for one block of 32 values.
void quantize_q8_0_block(const float* x, std::byte* out, std::size_t block) {
    float amax = 0.0f;
    for (std::size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, checked_scale(element_type::q8_0, d, block, "max|x| / 127", "below about 8.32e6 in magnitude"));
    const bool zero = !std::isfinite(id);  // d below 2.9e-39: stored as 0 anyway
    for (std::size_t j = 0; j < 32; ++j) {
        const float scaled = x[j] * id;
        const int q = zero ? 0 : static_cast<int>(std::round(scaled));  // |q| <= 127
        out[2 + j] = static_cast<std::byte>(static_cast<std::uint8_t>(q & 0xff));
    }
}

/// ggml's quantize_row_q4_0_ref for one block of 32 values.
void quantize_q4_0_block(const float* x, std::byte* out, std::size_t block) {
    float amax = 0.0f, max = 0.0f;  // the first value of largest magnitude, with its sign
    for (std::size_t j = 0; j < 32; ++j)
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, checked_scale(element_type::q4_0, d, block, "m / -8", "below about 524,000 in magnitude"));
    const bool zero = !std::isfinite(id);
    const auto code = [&](float v) -> unsigned {
        if (zero) return 8u;
        const float shifted = v * id + 8.5f;  // in [0.5, 16.5]: truncation is the C cast's
        return std::min(15u, static_cast<unsigned>(static_cast<int>(shifted)));
    };
    for (std::size_t j = 0; j < 16; ++j) out[2 + j] = static_cast<std::byte>(code(x[j]) | (code(x[j + 16]) << 4));
}

}  // namespace

std::uint16_t to_half_bits(float value) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
    const std::uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) {  // inf, or NaN (made quiet, the payload's top bits kept)
        if (magnitude == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    }
    if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: rounds to inf
    if (magnitude >= 0x38800000u) {                                                   // >= 2^-14: a normal float16
        // Rebias the exponent (127 -> 15), then drop 13 mantissa bits, to nearest, ties to even;
        // a carry out of the mantissa correctly bumps the exponent.
        const std::uint32_t rebased = magnitude - 0x38000000u;
        std::uint32_t half = rebased >> 13;
        const std::uint32_t rest = rebased & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
        return static_cast<std::uint16_t>(sign | half);
    }
    if (magnitude <= 0x33000000u) return sign;  // <= 2^-25: rounds to ±0 (2^-25 itself ties to even, 0)
    // A float16 subnormal: the value in units of 2^-24, to nearest, ties to even.
    const std::uint32_t exponent = magnitude >> 23;  // 102 .. 112
    const std::uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14 .. 24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
}

float from_half_bits(std::uint16_t bits) {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu;
    const std::uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
        const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
        return sign ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

namespace {

#ifdef QKV_HALF_F16C
__attribute__((target("avx,f16c"))) void to_halves_f16c(const float* in, std::uint16_t* out, std::size_t n) {
    std::size_t i = 0;
#ifndef _WIN32
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i + 4 <= n; i += 4)
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i),
                         _mm_cvtps_ph(_mm_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    half_detail::to_halves(in + i, out + i, n - i);
}

// F16C's widening makes a signalling NaN quiet, where qkv::from_half_bits keeps every bit: a block
// holding an inf or NaN pattern (exponent all ones: rare in data) takes the branch-free loop.
__attribute__((target("avx,f16c"))) void from_halves_f16c(const std::uint16_t* in, float* out, std::size_t n) {
    const __m128i exponent = _mm_set1_epi16(0x7c00);
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent)) != 0) {
            half_detail::from_halves(in + i, out + i, 8);
            continue;
        }
#ifndef _WIN32
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
#else
        _mm_storeu_ps(out + i, _mm_cvtph_ps(h));
        _mm_storeu_ps(out + i + 4, _mm_cvtph_ps(_mm_unpackhi_epi64(h, h)));
#endif
    }
    half_detail::from_halves(in + i, out + i, n - i);
}

bool cpu_has_f16c() {
    static const bool has = [] {
        // AVX usable (the CPU has it and the OS saves its registers), and F16C's CPUID bit (Clang
        // 14's __builtin_cpu_supports does not know "f16c").
        __builtin_cpu_init();
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    }();
    return has;
}
#endif

void check_sizes(std::size_t in, std::size_t out, const char* what) {
    if (in != out)
        fail(std::string(what) + ": " + std::to_string(in) + " values in, room for " + std::to_string(out) +
             " out: the spans must have one size");
}

}  // namespace

void to_half_bits(std::span<const float> in, std::span<std::uint16_t> out) {
    check_sizes(in.size(), out.size(), "to_half_bits");
#ifdef QKV_HALF_F16C
    if (cpu_has_f16c()) return to_halves_f16c(in.data(), out.data(), in.size());
#endif
    half_detail::to_halves(in.data(), out.data(), in.size());
}

void from_half_bits(std::span<const std::uint16_t> in, std::span<float> out) {
    check_sizes(in.size(), out.size(), "from_half_bits");
#ifdef QKV_HALF_F16C
    if (cpu_has_f16c()) return from_halves_f16c(in.data(), out.data(), in.size());
#endif
    half_detail::from_halves(in.data(), out.data(), in.size());
}

std::size_t half_overflow_index(std::span<const float> values) {
    // Finite and at least 65520 in magnitude (0x477ff000 to 0x7f7fffff): what rounds to inf. The
    // scan is a branch-free OR over 32-bit lanes (vectorized); the index is looked for only when
    // there is one.
    std::uint32_t any = 0;
    for (const float v : values) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &v, 4);
        any |= static_cast<std::uint32_t>((bits & 0x7fffffffu) - 0x477ff000u < 0x7f800000u - 0x477ff000u);
    }
    if (any == 0) return values.size();
    for (std::size_t i = 0; i < values.size(); ++i)
        if (std::isfinite(values[i]) && std::fabs(values[i]) >= 65520.0f) return i;
    return values.size();  // not reached
}

namespace {

/// Values scaled a block at a time (4 KiB of float32 on the stack), each block handed to `use`
/// with its offset; stops where `use` returns true, and returns that block's offset (else n).
constexpr std::size_t scale_block = 1024;

template <class Use>
std::size_t scaled_blocks(std::span<const float> values, float scale, Use use) {
    float scaled[scale_block];
    for (std::size_t at = 0; at < values.size(); at += scale_block) {
        const std::size_t n = std::min(scale_block, values.size() - at);
        for (std::size_t i = 0; i < n; ++i) scaled[i] = values[at + i] * scale;
        if (use(std::span<const float>(scaled, n), at)) return at;
    }
    return values.size();
}

}  // namespace

void to_half_bits(std::span<const float> in, float scale, std::span<std::uint16_t> out) {
    check_sizes(in.size(), out.size(), "to_half_bits");
    if (scale == 1.0f) return to_half_bits(in, out);
    static_cast<void>(scaled_blocks(in, scale, [&](std::span<const float> block, std::size_t at) {
        to_half_bits(block, out.subspan(at, block.size()));
        return false;
    }));
}

std::size_t half_overflow_index(std::span<const float> values, float scale) {
    if (scale == 1.0f) return half_overflow_index(values);
    std::size_t bad = 0;
    const std::size_t at = scaled_blocks(values, scale, [&](std::span<const float> block, std::size_t) {
        bad = half_overflow_index(block);
        return bad < block.size();
    });
    return at < values.size() ? at + bad : values.size();
}

std::size_t bytes_for(element_type type, std::size_t count) {
    check_known(type, "bytes_for");
    const std::size_t block = block_size(type);
    if (count % block != 0)
        fail(name_of(type) + " stores blocks of " + std::to_string(block) + " values; " + std::to_string(count) +
             " is not a multiple of " + std::to_string(block));
    const std::size_t blocks = count / block;
    const std::size_t per_block = bytes_per_block(type);
    if (blocks > std::numeric_limits<std::size_t>::max() / per_block)
        fail("shape too large: " + std::to_string(count) + " " + name_of(type) + " values overflow a size");
    return blocks * per_block;
}

void quantize(element_type type, std::span<const float> values, std::span<std::byte> out) {
    check_floats(type, "quantize");
    const std::size_t need = bytes_for(type, values.size());
    if (out.size() != need)
        fail("quantize to " + name_of(type) + ": out has " + std::to_string(out.size()) + " bytes, expected " +
             std::to_string(need) + " for " + std::to_string(values.size()) + " values");
    switch (type) {
        case element_type::f32:
            for (std::size_t i = 0; i < values.size(); ++i) store_f32(out.data() + 4 * i, values[i]);
            return;
        case element_type::f16: {
            // Check every value first: nothing is written when one is refused.
            const std::size_t i = half_overflow_index(values);
            if (i < values.size())
                fail("quantize to f16: element " + std::to_string(i) + " is " + number(static_cast<double>(values[i])) +
                     ", beyond float16's range (a finite value must round to at most 65504 in magnitude)");
            if constexpr (std::endian::native == std::endian::little) {
                if (reinterpret_cast<std::uintptr_t>(out.data()) % alignof(std::uint16_t) == 0) {
                    to_half_bits(values, {reinterpret_cast<std::uint16_t*>(out.data()), values.size()});
                    return;
                }
            }
            std::vector<std::uint16_t> halves(values.size());
            to_half_bits(values, halves);
            for (std::size_t j = 0; j < values.size(); ++j) store_u16(out.data() + 2 * j, halves[j]);
            return;
        }
        case element_type::q8_0:
        case element_type::q4_0: {
            check_finite(type, values);
            // Quantize into a scratch copy, so that a block refused late leaves `out` untouched.
            std::vector<std::byte> blocks(need);
            const std::size_t per_block = bytes_per_block(type);
            for (std::size_t b = 0; b < values.size() / 32; ++b) {
                if (type == element_type::q8_0)
                    quantize_q8_0_block(values.data() + 32 * b, blocks.data() + per_block * b, b);
                else
                    quantize_q4_0_block(values.data() + 32 * b, blocks.data() + per_block * b, b);
            }
            std::copy(blocks.begin(), blocks.end(), out.begin());
            return;
        }
        case element_type::i32:  // refused by check_floats
            return;
    }
}

void dequantize(element_type type, std::span<const std::byte> in, std::span<float> out) {
    check_floats(type, "dequantize");
    const std::size_t need = bytes_for(type, out.size());
    if (in.size() != need)
        fail("dequantize " + name_of(type) + ": in has " + std::to_string(in.size()) + " bytes, expected " +
             std::to_string(need) + " for " + std::to_string(out.size()) + " values");
    switch (type) {
        case element_type::f32:
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_f32(in.data() + 4 * i);
            return;
        case element_type::f16:
            if constexpr (std::endian::native == std::endian::little) {
                if (reinterpret_cast<std::uintptr_t>(in.data()) % alignof(std::uint16_t) == 0) {
                    from_half_bits({reinterpret_cast<const std::uint16_t*>(in.data()), out.size()}, out);
                    return;
                }
            }
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = from_half_bits(load_u16(in.data() + 2 * i));
            return;
        case element_type::q8_0:
            for (std::size_t b = 0; b < out.size() / 32; ++b) {
                const std::byte* block = in.data() + 34 * b;
                const float d = from_half_bits(load_u16(block));
                for (std::size_t j = 0; j < 32; ++j) {
                    const auto q = static_cast<std::int8_t>(std::to_integer<std::uint8_t>(block[2 + j]));
                    out[32 * b + j] = static_cast<float>(q) * d;
                }
            }
            return;
        case element_type::q4_0:
            for (std::size_t b = 0; b < out.size() / 32; ++b) {
                const std::byte* block = in.data() + 18 * b;
                const float d = from_half_bits(load_u16(block));
                for (std::size_t j = 0; j < 16; ++j) {
                    const unsigned byte = std::to_integer<unsigned>(block[2 + j]);
                    out[32 * b + j] = static_cast<float>(static_cast<int>(byte & 0x0fu) - 8) * d;
                    out[32 * b + j + 16] = static_cast<float>(static_cast<int>(byte >> 4) - 8) * d;
                }
            }
            return;
        case element_type::i32:  // refused by check_floats
            return;
    }
}

std::vector<float> round_trip(element_type type, std::span<const float> values) {
    std::vector<std::byte> stored(bytes_for(type, values.size()));
    quantize(type, values, stored);
    std::vector<float> out(values.size());
    dequantize(type, stored, out);
    return out;
}

}  // namespace qkv
