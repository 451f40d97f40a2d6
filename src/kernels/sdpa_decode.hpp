// Split-S decode (flash-decoding) for small q_len and long kv_len: its recording.
// shaders/sdpa_decode.comp (row_tiles and block_tiles variants) writes partial softmax states per
// chunk of keys, shaders/sdpa_merge.comp combines them in a fixed order. Its plan: decode_plan.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/decode_plan.hpp"
#include "kernels/flash_coop.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// Q, K and V as float16 rows in storage buffers, for the cooperative-matrix family: each binding
/// from its buffer's start, the rows' first element (in halves) beside it. The same memory as the
/// texel views (the decode route's layouts of whole texels).
struct decode_rows {
    binding q, k, v;
    std::uint32_t q_off = 0, k_off = 0, v_off = 0;
};
/// `bytes` of float16 rows at byte `offset` of `buffer`, as decode_rows binds them.
inline binding rows_binding(VkBuffer buffer, VkDeviceSize offset, VkDeviceSize bytes) {
    return {buffer, 0, offset + bytes};
}

/// Buffers of one decode call: Q texels ([z][rows][e4], RGBA32F), K and V (texel views, or with
/// quantized blocks the storage bindings k_blocks, v_blocks), the masks (bound to any buffer when
/// absent), the partial states, the output (B, Hq, L, Ev), the score params (contract/score.h,
/// always) and the log-sum-exp (B, Hq, L) (bound to the output when not asked for).
/// The overflow guard's passes run with the decode (a call over device tensors), into the guard's
/// zeroed words `result`: the merge's output pass over every element it writes (sdpa_merge.comp's
/// QKV_MERGE_GUARD form, by a subgroup vote where the plan says), and the rows pass over the first
/// q_rows rows of q (d values each, from element q_off of `q`, float16 where `half`). Where
/// `q_texels` (the kernel's Q texels hold exactly those rows' values, zeros past d) and the family
/// reads q's texels (not coopmat), the decode kernel runs the rows pass as it reads q
/// (DECODE_SPEC_GUARD) and the merge does not; otherwise the merge runs it.
struct merge_guard {
    binding q, result;
    std::uint32_t q_rows = 0, d = 0, q_off = 0;
    bool half = false;
    bool q_texels = false;
};

struct decode_io {
    VkBufferView q = VK_NULL_HANDLE, k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
    binding k_blocks, v_blocks;
    binding mask, additive, stats, acc, out, params, lse;
    binding gate;                        ///< the flags word a gated decode reads (decode_values::gated)
    decode_rows rows;                    ///< family coopmat: Q, K and V as float16 rows
    const merge_guard* guard = nullptr;  ///< the merge runs the guard's passes too (else none)
};

/// Records the decode dispatch, a barrier and the merge dispatch. `careful`: V may hold NaN or Inf.
void record_decode(recorder& exec, pipeline_set& pipes, const decode_plan& plan, const decode_io& io,
                   const contract::decode_push& push, decode_values values);

}  // namespace qkv::vulkan::detail
