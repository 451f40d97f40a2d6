// The kernels of calls over device tensors (src/api/sdpa_call.cpp, kv_cache.cpp): a tensor copied
// into or out of a call's buffers, a tensor packed into rows of whole texels (the decode kernels'
// and a K/V cache's layout), and the device pass of the overflow rule. Compute dispatches only,
// so every access of a recorded call is a compute-shader access.
#pragma once

#include <cstdint>

#include "contract/tensor.h"
#include "qkv/runtime/element_type.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// dst[dst_off + i] = src[src_off + i] for i < count, in elements of 4 bytes (or 2 with `half`).
void record_tensor_copy(recorder& rec, pipeline_set& pipes, binding src, std::uint32_t src_off, binding dst,
                        std::uint32_t dst_off, std::uint32_t count, bool half);
/// A rows x cols block: dst[dst_off + r·dst_rs + c] = src[src_off + r·src_rs + c] (4-byte elements,
/// or 2-byte ones with `half`).
void record_block_copy(recorder& rec, pipeline_set& pipes, binding src, std::uint32_t src_off, std::uint32_t src_rs,
                       binding dst, std::uint32_t dst_off, std::uint32_t dst_rs, std::uint32_t rows, std::uint32_t cols,
                       bool half = false);

/// The values of a float16 or quantized tensor as float32 (tensor_widen.comp): `rows` rows of
/// `cols` values of `type` (f16, q8_0 or q4_0), row 0 from byte `src_byte` of `src`, into `dst`
/// from float `dst_off`, contiguous. Exactly qkv::dequantize's values.
void record_tensor_widen(recorder& rec, pipeline_set& pipes, binding src, std::uint64_t src_byte, element_type type,
                         binding dst, std::uint64_t dst_off, std::uint64_t rows, std::uint64_t cols);

/// A (groups, rows, width) tensor of `src` (float32, or float16 with `half`; from element src_off,
/// contiguous unless its strides are given) as rows of `w4` texels of 4 values (zero-padded) into
/// `dst`: row r of group z lands at texel at + (z·stride + r)·w4. RGBA32F texels, or RGBA16F with
/// `texels_half`.
struct texel_pack {
    std::uint32_t groups = 1, rows = 0, width = 0, w4 = 0;
    std::uint32_t src_off = 0, at = 0, stride = 0;
    bool half = false;         ///< the source is float16
    bool texels_half = false;  ///< RGBA16F texels (else RGBA32F)
    /// The source's strides in elements between groups and between rows; 0: contiguous
    /// (rows x width, width).
    std::uint32_t group_stride = 0, row_stride = 0;
};
void record_texel_pack(recorder& rec, pipeline_set& pipes, binding src, binding dst, binding flags,
                       const texel_pack& pack);

/// The device pass of the overflow rule over q (q_rows rows of d), k (k_rows of d) and v (k_rows
/// of dv) into `result` (contract/tensor.h's words, zeroed before); q_rows or k_rows may be 0.
struct guard_rows {
    std::uint32_t q_rows = 0, k_rows = 0, q_len = 1, kv_len = 1, d = 0, dv = 0;
    std::uint32_t q_off = 0, k_off = 0, v_off = 0;
    bool half = false;
};
void record_guard_rows(recorder& rec, pipeline_set& pipes, binding q, binding k, binding v, binding result,
                       const guard_rows& rows);
/// Its output pass: GUARD_FLAG_OUTPUT_NONFINITE where an element of the float32 `out` is not finite.
void record_guard_output(recorder& rec, pipeline_set& pipes, binding out, std::uint32_t out_off, std::uint32_t count,
                         binding result);
/// Both passes in one dispatch (either may be null), where nothing between them needs the rows'
/// verdict: the host reads it after the call.
struct guard_output {
    binding out;
    std::uint32_t off = 0, count = 0;
};
void record_guard(recorder& rec, pipeline_set& pipes, binding q, binding k, binding v, binding result,
                  const guard_rows* rows, const guard_output* output);

}  // namespace qkv::vulkan::detail
