// qkv::element_type: how K and V are stored on a device (sdpa_options::kv_type), and the host-side
// conversions to and from those storage formats: qkv::quantize, qkv::dequantize, qkv::round_trip.
// One more type holds integers, not floats: i32, of device tensors of indices and lengths (a paged
// call's block table); it is no storage format of K or V (holds_floats is false), and the
// conversions refuse it.
//
//   f32   float32, 4 bytes per element
//   f16   IEEE float16 (binary16), 2 bytes per element; rounded to nearest, ties to even
//   q8_0  ggml's block_q8_0: blocks of 32 values, 34 bytes each: d (float16), then 32 int8 quants
//         d = max|x| / 127 (float32), q = round(x · (1/d)) (float32, halves away from zero);
//         x ≈ q · d, with d as stored (float16)
//   q4_0  ggml's block_q4_0: blocks of 32 values, 18 bytes each: d (float16), then 16 bytes of
//         4-bit quants, element j in the low nibble of byte j and element j + 16 in the high one
//         m = the first value of largest magnitude, with its sign; d = m / -8 (float32),
//         q = min(15, trunc(x · (1/d) + 8.5)) (float32); x ≈ (q - 8) · d, with d as stored
//   A block whose d is 0 (all zeros) or so small that 1/d overflows float32 (|d| < 2.9e-39)
//   stores the code of zero (q8_0: 0, q4_0: 8) and d rounded to float16 (±0): every value
//   dequantizes to 0. So does any block whose d rounds to 0 as a float16 (|d| <= 2^-25): its
//   quants are kept, its values dequantize to 0. The bytes are those of ggml's reference
//   quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) wherever those are defined (ggml's
//   conversion of an infinite 1/d to an integer is undefined behaviour).
//
// Byte order: every float16 and float32 is stored little-endian (the layout of ggml's structs and
// of the device buffers on every platform qkv supports), whatever the host's order.
//
// What is refused (qkv::invalid_argument, naming the element or block and the value; nothing is
// written): f16, a finite value beyond float16's range (|x| >= 65520, which would round to inf;
// NaN and ±inf are stored as such); q8_0 and q4_0, a NaN or infinite value, or a block whose d
// does not fit float16 (q8_0: max|x| / 127 rounds to inf, so max|x| >= about 8.3e6; q4_0:
// |m| / 8, so |m| >= about 524,000). f32 stores every float as it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "qkv/runtime/export.hpp"

namespace qkv {

enum class element_type {
    f32,   ///< float32
    f16,   ///< float16 (binary16)
    q8_0,  ///< ggml's q8_0: 32 int8 quants and a float16 scale per block
    q4_0,  ///< ggml's q4_0: 32 4-bit quants and a float16 scale per block
    i32,   ///< int32 (two's complement, little-endian): indices and lengths, not K/V storage
};

/// "f32", "f16", "q8_0", "q4_0", "i32" ("unknown" for a value outside the enum).
[[nodiscard]] constexpr std::string_view to_string(element_type type) {
    switch (type) {
        case element_type::f32:
            return "f32";
        case element_type::f16:
            return "f16";
        case element_type::q8_0:
            return "q8_0";
        case element_type::q4_0:
            return "q4_0";
        case element_type::i32:
            return "i32";
    }
    return "unknown";
}

/// The element type named `name` ("f32", "f16", "q8_0", "q4_0", "i32"; exact spelling), or none.
[[nodiscard]] constexpr std::optional<element_type> parse_element_type(std::string_view name) {
    for (const element_type t :
         {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0, element_type::i32})
        if (name == to_string(t)) return t;
    return std::nullopt;
}

/// Whether `type` is one of the enum's values.
[[nodiscard]] constexpr bool is_known(element_type type) {
    return type == element_type::f32 || type == element_type::f16 || type == element_type::q8_0 ||
           type == element_type::q4_0 || type == element_type::i32;
}

/// Whether `type` holds float values (f32, f16, q8_0, q4_0): the types K, V, q and outputs may have,
/// and the only ones quantize, dequantize and round_trip take (i32 holds integers).
[[nodiscard]] constexpr bool holds_floats(element_type type) { return is_known(type) && type != element_type::i32; }

/// Whether `type` stores blocks of values with a shared scale (q8_0, q4_0).
[[nodiscard]] constexpr bool is_quantized(element_type type) {
    return type == element_type::q8_0 || type == element_type::q4_0;
}

/// Elements per block: 32 for q8_0 and q4_0, 1 for f32, f16 and i32 (0 for an unknown value).
[[nodiscard]] constexpr std::size_t block_size(element_type type) {
    return is_quantized(type) ? 32 : is_known(type) ? 1 : 0;
}

/// Bytes per block: f32 4, f16 2, q8_0 34 (d, then 32 quants), q4_0 18 (d, then 16 bytes of
/// nibbles), i32 4 (0 for an unknown value).
[[nodiscard]] constexpr std::size_t bytes_per_block(element_type type) {
    switch (type) {
        case element_type::f32:
            return 4;
        case element_type::f16:
            return 2;
        case element_type::q8_0:
            return 2 + 32;
        case element_type::q4_0:
            return 2 + 16;
        case element_type::i32:
            return 4;
    }
    return 0;
}

/// Bytes that `count` elements of `type` take. Throws qkv::invalid_argument when `count` is not a
/// multiple of block_size(type), when the size overflows std::size_t, or for an unknown type.
[[nodiscard]] QKV_RUNTIME_API std::size_t bytes_for(element_type type, std::size_t count);

/// Stores `values` as `type` into `out`, which must hold exactly bytes_for(type, values.size())
/// bytes (see the header comment for the formats and what is refused: qkv::invalid_argument; i32,
/// which holds no floats, is refused too).
QKV_RUNTIME_API void quantize(element_type type, std::span<const float> values, std::span<std::byte> out);

/// Reads `out.size()` elements of `type` from `in`, which must hold exactly
/// bytes_for(type, out.size()) bytes. Every stored pattern is accepted (a float16 NaN or inf
/// gives NaN or inf; a q8_0 quant of -128 gives -128 · d). i32 is refused (qkv::invalid_argument).
QKV_RUNTIME_API void dequantize(element_type type, std::span<const std::byte> in, std::span<float> out);

/// dequantize(quantize(values)): the values as a device storing them as `type` sees them.
[[nodiscard]] QKV_RUNTIME_API std::vector<float> round_trip(element_type type, std::span<const float> values);

/// float16 conversions, bit patterns in a std::uint16_t: to nearest, ties to even; beyond float16's range ±inf,
/// NaN stays NaN (quiet, sign kept). Nothing is refused (quantize(element_type::f16, ...) is the checked form).
/// from_half_bits is exact. Many values at once (vectorized, the same bits): qkv/runtime/half.hpp.
[[nodiscard]] QKV_RUNTIME_API std::uint16_t to_half_bits(float value);
[[nodiscard]] QKV_RUNTIME_API float from_half_bits(std::uint16_t bits);

}  // namespace qkv
