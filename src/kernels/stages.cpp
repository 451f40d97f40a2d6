#include "kernels/stages.hpp"

#include <algorithm>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_gemm(executor& exec, pipeline_set& pipes, const gemm_step& step, std::initializer_list<binding> bindings,
                 const gemm_push& push, std::uint32_t batches) {
    const bool texels = texel_gemm(step.shader);
    std::vector<std::uint32_t> spec = step.tiles.spec();
    if (texels) {  // contract/gemm.h: the dispatch's bounds, layout and store flags as constants
        spec.resize(contract::GEMM_SPEC_TEXEL_COUNT);
        spec[contract::GEMM_SPEC_EXACT] = push.M % step.tiles.bm == 0 && push.N % step.tiles.bn == 0 ? 1 : 0;
        spec[contract::GEMM_SPEC_SKIP_ZERO] = step.skip_zero ? 1 : 0;
        spec[contract::GEMM_SPEC_VEC_STORE] = step.vec_store ? 1 : 0;
    }
    const std::uint32_t groups[3] = {ceil_div(push.M, step.tiles.bm), ceil_div(push.N, step.tiles.bn), batches};
    const std::uint32_t chunk = step.chunk_k;
    // A K of 0 (no inner dimension) is one dispatch that stores zeros (plus bias, scale, masks).
    for (std::uint32_t begin = 0; begin < std::max(push.K, 1u); begin += chunk) {
        gemm_push part = push;
        part.k_begin = begin;
        part.K = std::min(push.K - std::min(push.K, begin), chunk);
        part.a_off = push.a_off + begin;              // A's columns are contiguous
        part.b_off = push.b_off + begin * push.b_rs;  // B's rows are b_rs apart
        if (begin > 0) part.flags |= flag_gemm_accumulate;
        if (std::uint64_t{begin} + chunk < push.K) part.flags |= flag_gemm_partial;
        if (begin > 0) exec.compute_barrier();
        if (texels) spec[contract::GEMM_SPEC_STORE] = part.flags;
        exec.dispatch(pipes.get(step.shader, spec), bindings, &part, groups);
    }
}

void record_softmax(executor& exec, pipeline_set& pipes, shader_id shader, std::uint32_t workgroup, binding scores,
                    binding texels, std::uint32_t rows, std::uint32_t cols) {
    softmax_push push{};
    push.cols = cols;
    push.rows = rows;
    if (shader == shader_id::softmax_cpu_tx) {
        static_assert(row_matches<softmax_push>(shader_id::softmax_cpu_tx, "st"));
        std::vector<std::uint32_t> spec(2);
        spec[contract::SOFTMAX_SPEC_WORKGROUP] = workgroup;
        spec[contract::SOFTMAX_SPEC_EXACT] = rows % workgroup == 0 ? 1 : 0;
        const std::uint32_t groups[3] = {ceil_div(rows, workgroup), 1, 1};
        exec.dispatch(pipes.get(shader, spec), {scores, texels}, &push, groups);
        return;
    }
    std::vector<std::uint32_t> spec(1);
    spec[contract::SOFTMAX_SPEC_WORKGROUP] = workgroup;
    const std::uint32_t groups[3] = {rows, 1, 1};
    exec.dispatch(pipes.get(shader, spec), {scores}, &push, groups);
}

}  // namespace qkv::vulkan::detail
