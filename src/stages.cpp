#include "stages.hpp"

#include <algorithm>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

bool fits(const gemm_tiles& t, const device_info& info) {
    return t.threads() <= info.max_workgroup_invocations && t.shared_bytes() <= info.max_shared_memory;
}

}  // namespace

gemm_tiles choose_gemm_tiles(const device_info& info, std::uint64_t m, std::uint64_t n) {
    // Largest first. Every shape fits the 16 KiB of shared memory the Vulkan spec guarantees,
    // and the last needs only 64 invocations.
    static const gemm_tiles candidates[] = {
        {64, 64, 16, 4, 4},  // 256 invocations, 8 KiB
        {32, 32, 16, 2, 2},  // 256 invocations, 4 KiB
        {32, 32, 16, 4, 4},  // 64 invocations, 4 KiB
        {16, 16, 16, 2, 2},  // 64 invocations, 2 KiB
    };
    const bool small = m <= 32 || n <= 32;
    for (const auto& t : candidates) {
        if (small && t.bm > 32) continue;
        if (fits(t, info)) return t;
    }
    return candidates[3];
}

std::uint32_t softmax_workgroup(const device_info& info, std::uint64_t cols) {
    std::uint32_t wg = 1;
    const std::uint32_t cap = std::min<std::uint32_t>(256, info.max_workgroup_invocations);
    while (wg * 2 <= cap && wg < cols) wg *= 2;
    // At least one full subgroup, so subgroup operations see a whole subgroup.
    while (wg < info.subgroup_size && wg * 2 <= cap) wg *= 2;
    return wg;
}

void record_flash(executor& exec, pipeline_set& pipes, const device_info& info, bool fp16,
                  std::initializer_list<binding> bindings, const flash_push& push, std::uint32_t batches,
                  std::uint32_t chunk_keys, const device_info* tiles_as) {
    flash_tiles tiles = choose_flash_tiles(flash_tiles_device(info, tiles_as), push.seq, push.d, push.dv,
                                           pipes.dev().subgroups());
    if (tiles.shared_bytes() > info.max_shared_memory || tiles.wg > info.max_workgroup_invocations)
        throw limit_exceeded("the fused kernel needs " + std::to_string(tiles.shared_bytes()) + " bytes of shared memory and " +
                             std::to_string(tiles.wg) + " invocations per workgroup for head widths " +
                             std::to_string(push.d) + " / " + std::to_string(push.dv) + "; " + info.name + " has " +
                             std::to_string(info.max_shared_memory) + " bytes and " +
                             std::to_string(info.max_workgroup_invocations) + " invocations");
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

void record_gemm(executor& exec, pipeline_set& pipes, const device_info& info, shader_id shader,
                 std::initializer_list<binding> bindings, const gemm_push& push, std::uint32_t batches) {
    const gemm_tiles tiles = choose_gemm_tiles(info, push.M, push.N);
    const pipeline& p = pipes.get(shader, static_cast<std::uint32_t>(bindings.size()), sizeof(gemm_push), tiles.spec());
    const std::uint32_t groups[3] = {ceil_div(push.M, tiles.bm), ceil_div(push.N, tiles.bn), batches};
    exec.dispatch(p, bindings, &push, groups);
}

void record_softmax(executor& exec, pipeline_set& pipes, const device_info& info, binding scores, std::uint32_t rows,
                    std::uint32_t cols) {
    const std::uint32_t wg = softmax_workgroup(info, cols);
    const shader_id shader = info.subgroup_arithmetic ? shader_id::softmax_subgroup : shader_id::softmax;
    const pipeline& p = pipes.get(shader, 1, sizeof(softmax_push), {wg});
    softmax_push push;
    push.cols = cols;
    push.rows = rows;
    const std::uint32_t groups[3] = {rows, 1, 1};
    exec.dispatch(p, {scores}, &push, groups);
}

}  // namespace qkv::vulkan::detail
