// The stages as host code: their push-constant blocks and flags (from the contract headers in
// shaders/contract/), tile choices per device, and the recording of one stage's dispatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "executor.hpp"
#include "flash_tiles.hpp"
#include "gemm_tiles.hpp"
#include "pipelines.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::vulkan::detail {

/// The matrix products' push constants (shaders/contract/gemm.h). No member initializers (GLSL
/// has none): start from gemm_push_defaults().
using gemm_push = contract::gemm_push;
/// One product over the whole of each operand: one head, B's columns contiguous, no scaling.
inline gemm_push gemm_push_defaults() {
    gemm_push p{};
    p.heads = 1;
    p.b_cs = 1;
    p.scale = 1.0f;
    return p;
}

/// The softmax's push constants (shaders/contract/softmax.h).
using softmax_push = contract::softmax_push;

/// Mirrors shaders/flash.comp.
struct flash_push {
    group_offset offset;
    std::uint32_t seq = 0, d = 0, dv = 0, ld = 0, heads = 1;
    std::uint32_t k_off = 0, v_off = 0;
    std::uint32_t o_rs = 0, o_bs = 0;
    float scale = 1.0f;
    std::uint32_t flags = 0;
    std::uint32_t mask_bs = 0, add_bs = 0;
    std::uint32_t kv_begin = 0, kv_stop = 0;  // set by record_flash, per key chunk
};
static_assert(sizeof(flash_push) <= 128);
static_assert(sizeof(flash_push) == describe(shader_id::flash).push_bytes, "shaders/shader_table.def");

/// The widest head (of Q/K and of V) the fused kernel takes; wider heads use the staged path.
inline constexpr std::uint32_t fused_max_head = 256;

// Flags of the stages (shaders/contract/gemm.h, mask.h) and of the fused kernel.
inline constexpr std::uint32_t flag_bias = contract::PROJECT_FLAG_BIAS;       // project
inline constexpr std::uint32_t flag_causal = contract::MASK_FLAG_CAUSAL;      // scores, aggregate, flash
inline constexpr std::uint32_t flag_mask = contract::MASK_FLAG_BOOLEAN;       // scores, flash
inline constexpr std::uint32_t flag_additive = contract::MASK_FLAG_ADDITIVE;  // scores, flash
inline constexpr std::uint32_t flag_resume = 8;                               // flash: continue from the chunk state
inline constexpr std::uint32_t flag_partial = 16;                             // flash: more key chunks follow
inline constexpr std::uint32_t flag_gemm_accumulate = contract::GEMM_FLAG_ACCUMULATE;  // set by record_gemm
inline constexpr std::uint32_t flag_gemm_partial = contract::GEMM_FLAG_PARTIAL;        // more K chunks follow

/// Records the fused attention of every (batch, head) of `batches`: one dispatch per `chunk_keys`
/// keys (from flash_chunk_keys, with the same `tiles_as`), with `bindings` ending in the
/// chunk-state buffer.
void record_flash(executor& exec, pipeline_set& pipes, const device_info& info, bool fp16,
                  std::initializer_list<binding> bindings, const flash_push& push, std::uint32_t batches,
                  std::uint32_t chunk_keys, const device_info* tiles_as = nullptr);

/// Records the product over `batches` (batch x heads) grids as `step` (plan_gemm) says: one
/// dispatch per K chunk, with a barrier between them.
void record_gemm(executor& exec, pipeline_set& pipes, const gemm_step& step, std::initializer_list<binding> bindings,
                 const gemm_push& push, std::uint32_t batches);

/// Records the in-place softmax of `rows` rows of `cols` scores with `shader` (softmax or
/// softmax_subgroup) and `workgroup` invocations (make_plan chose both and checked the loop budget).
void record_softmax(executor& exec, pipeline_set& pipes, shader_id shader, std::uint32_t workgroup, binding scores,
                    std::uint32_t rows, std::uint32_t cols);

}  // namespace qkv::vulkan::detail
