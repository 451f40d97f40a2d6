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

namespace {
std::uint32_t round_head(std::uint32_t d) { return d <= 64 ? (d + 7) / 8 * 8 : (d + 15) / 16 * 16; }
}  // namespace

flash_tiles choose_flash_tiles(const device_info& info, std::uint32_t seq, std::uint32_t d, std::uint32_t dv) {
    // Largest first; the smallest fits the 16 KiB the Vulkan spec guarantees for heads of 256.
    static const std::uint32_t shapes[][2] = {{32, 32}, {16, 32}, {16, 16}, {8, 16}, {8, 8}, {4, 8}};
    flash_tiles t;
    t.d_max = round_head(d);
    t.dv_max = round_head(dv);
    t.wg = std::min<std::uint32_t>(64, info.max_workgroup_invocations);
    for (const auto& [br, bc] : shapes) {
        t.br = br;
        t.bc = bc;
        if (br > 16 && seq <= 64) continue;  // short sequences: more, smaller blocks
        if (t.shared_bytes() <= info.max_shared_memory) break;
    }
    return t;
}

void record_flash(executor& exec, pipeline_set& pipes, const device_info& info, bool fp16,
                  std::initializer_list<binding> bindings, const flash_push& push, std::uint32_t batches) {
    const flash_tiles tiles = choose_flash_tiles(info, push.seq, push.d, push.dv);
    const pipeline& p = pipes.get(fp16 ? shader_id::flash_f16 : shader_id::flash,
                                  static_cast<std::uint32_t>(bindings.size()), sizeof(flash_push), tiles.spec());
    const std::uint32_t groups[3] = {ceil_div(push.seq, tiles.br), 1, batches};
    exec.dispatch(p, bindings, &push, groups);
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
