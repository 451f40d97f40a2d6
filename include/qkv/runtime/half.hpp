// float16 conversions of many values at once: the span forms of qkv::to_half_bits and
// qkv::from_half_bits (qkv/runtime/element_type.hpp), and the check before a float16 store. Every
// bulk float16 conversion of the library (uploads, downloads, cache appends, quantize, the Python
// arrays) goes through these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "qkv/runtime/export.hpp"

namespace qkv {

/// out[i] = to_half_bits(in[i]) (from_half_bits(in[i])) for every i, bit for bit the scalar
/// conversions of element_type.hpp (to nearest, ties to even; ±inf past float16's range; NaN
/// quiet with its sign; subnormals exact), vectorized: the CPU's F16C instructions where it has
/// them, else branch-free loops the compiler vectorizes. The spans must have one size
/// (qkv::invalid_argument).
QKV_RUNTIME_API void to_half_bits(std::span<const float> in, std::span<std::uint16_t> out);
QKV_RUNTIME_API void from_half_bits(std::span<const std::uint16_t> in, std::span<float> out);

/// The index of the first value that is finite and rounds to ±inf in float16 (at least 65520 in
/// magnitude), or values.size() where there is none: the check before a float16 store.
[[nodiscard]] QKV_RUNTIME_API std::size_t half_overflow_index(std::span<const float> values);

/// The same of every value times `scale` (the float multiply, then the conversion): bit for bit
/// the forms above over a scaled copy of the values, without that copy (the values are scaled in
/// blocks of a few KiB on the stack). The spans of to_half_bits must have one size
/// (qkv::invalid_argument).
QKV_RUNTIME_API void to_half_bits(std::span<const float> in, float scale, std::span<std::uint16_t> out);
[[nodiscard]] QKV_RUNTIME_API std::size_t half_overflow_index(std::span<const float> values, float scale);

}  // namespace qkv
