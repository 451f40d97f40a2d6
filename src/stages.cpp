#include "stages.hpp"

#include <algorithm>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_flash(executor& exec, pipeline_set& pipes, const device_info& info, bool fp16,
                  std::initializer_list<binding> bindings, const flash_push& push, std::uint32_t batches,
                  std::uint32_t chunk_keys, const device_info* tiles_as) {
    flash_tiles tiles =
        choose_flash_tiles(flash_tiles_device(info, tiles_as), push.seq, push.d, push.dv, pipes.dev().subgroups());
    if (tiles.shared_bytes() > info.max_shared_memory || tiles.wg > info.max_workgroup_invocations)
        throw limit_exceeded(
            "the fused kernel needs " + std::to_string(tiles.shared_bytes()) + " bytes of shared memory and " +
            std::to_string(tiles.wg) + " invocations per workgroup for head widths " + std::to_string(push.d) + " / " +
            std::to_string(push.dv) + "; " + info.name + " has " + std::to_string(info.max_shared_memory) +
            " bytes and " + std::to_string(info.max_workgroup_invocations) + " invocations");
    // vec4 loads need every Q|K|V element offset the shader forms to be a multiple of 4.
    tiles.vec4 = push.d % 4 == 0 && push.dv % 4 == 0 && push.ld % 4 == 0 && push.k_off % 4 == 0 && push.v_off % 4 == 0;
    const shader_id shader = tiles.subgroup ? (fp16 ? shader_id::flash_subgroup_f16 : shader_id::flash_subgroup)
                                            : (fp16 ? shader_id::flash_f16 : shader_id::flash);
    const pipeline& p = pipes.get(shader, static_cast<std::uint32_t>(bindings.size()), sizeof(flash_push), tiles.spec(),
                                  tiles.required_subgroup);
    const std::uint32_t groups[3] = {ceil_div(push.seq, tiles.br), 1, batches};
    for (std::uint32_t begin = 0; begin < push.seq; begin += chunk_keys) {
        flash_push part = push;
        part.kv_begin = begin;
        part.kv_stop = std::min(push.seq, begin + chunk_keys);
        if (begin > 0) part.flags |= flag_resume;
        if (part.kv_stop < push.seq) part.flags |= flag_partial;
        if (begin > 0) exec.compute_barrier();
        exec.dispatch(p, bindings, &part, groups);
    }
}

void record_gemm(executor& exec, pipeline_set& pipes, const gemm_step& step, std::initializer_list<binding> bindings,
                 const gemm_push& push, std::uint32_t batches) {
    const pipeline& p = pipes.get(step.shader, step.tiles.spec());
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
        exec.dispatch(p, bindings, &part, groups);
    }
}

void record_softmax(executor& exec, pipeline_set& pipes, shader_id shader, std::uint32_t workgroup, binding scores,
                    std::uint32_t rows, std::uint32_t cols) {
    std::vector<std::uint32_t> spec(1);
    spec[contract::SOFTMAX_SPEC_WORKGROUP] = workgroup;
    const pipeline& p = pipes.get(shader, spec);
    softmax_push push{};
    push.cols = cols;
    push.rows = rows;
    const std::uint32_t groups[3] = {rows, 1, 1};
    exec.dispatch(p, {scores}, &push, groups);
}

}  // namespace qkv::vulkan::detail
