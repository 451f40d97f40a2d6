// K and V as a call stores them (sdpa_options::kv_type, qkv/runtime/element_type.hpp), on the
// host: the values a device holding them sees (for the fused route, which rounds on the host and
// uploads float32, and for the overflow rule's facts), and rows of ggml's blocks (for the decode
// route and the K/V cache, whose kernels read the blocks themselves).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "qkv/runtime/element_type.hpp"

namespace qkv::vulkan::detail {

/// `values` as `type` stores them: f32 as they are; f16 rounded to nearest even (a finite value
/// beyond float16's range throws numeric_overflow naming `what` and the element, as put_halves);
/// q8_0 / q4_0 through qkv::round_trip (a NaN or infinite value, or a block whose scale does not fit
/// float16, throws qkv::invalid_argument naming `what`).
std::vector<float> stored_values(element_type type, std::span<const float> values, const char* what);

/// `rows` rows of `width` values from `src` (width a multiple of 32), each quantized on its own as
/// `type` (q8_0 or q4_0) with qkv::quantize, written one after another from `at` (bytes_for(type,
/// width) bytes a row). Refusals as stored_values.
void put_block_rows(std::byte* at, element_type type, const float* src, std::size_t rows, std::size_t width,
                    const char* what);

}  // namespace qkv::vulkan::detail
