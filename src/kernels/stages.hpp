// The stages as host code: their push-constant blocks and flags (from the contract headers in
// shaders/contract/), tile choices per device, and the recording of one stage's dispatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/flash_tiles.hpp"
#include "kernels/gemm_tiles.hpp"
#include "qkv/runtime/problem.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

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

// Flags of the stages (shaders/contract/gemm.h, mask.h; the fused kernels' are in contract/flash.h).
inline constexpr std::uint32_t flag_bias = contract::PROJECT_FLAG_BIAS;                // project
inline constexpr std::uint32_t flag_causal = contract::MASK_FLAG_CAUSAL;               // scores, aggregate
inline constexpr std::uint32_t flag_mask = contract::MASK_FLAG_BOOLEAN;                // scores
inline constexpr std::uint32_t flag_additive = contract::MASK_FLAG_ADDITIVE;           // scores
inline constexpr std::uint32_t flag_gemm_accumulate = contract::GEMM_FLAG_ACCUMULATE;  // set by record_gemm
inline constexpr std::uint32_t flag_gemm_partial = contract::GEMM_FLAG_PARTIAL;        // more K chunks follow

/// Records the product over `batches` (batch x heads) grids as `step` (plan_gemm) says: one
/// dispatch per K chunk, with a barrier between them.
void record_gemm(recorder& exec, pipeline_set& pipes, const gemm_step& step, std::initializer_list<binding> bindings,
                 const gemm_push& push, std::uint32_t batches);

/// Records the in-place softmax of `rows` rows of `cols` scores with `shader` (softmax or
/// softmax_subgroup: a workgroup per row; softmax_cpu_tx: a row per invocation, which reads
/// `texels`, an RGBA32F view of the scores) and `workgroup` invocations (make_plan chose both and
/// checked the loop budget).
void record_softmax(recorder& exec, pipeline_set& pipes, shader_id shader, std::uint32_t workgroup, binding scores,
                    binding texels, std::uint32_t rows, std::uint32_t cols);

}  // namespace qkv::vulkan::detail
