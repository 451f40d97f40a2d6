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
std::uint32_t round_up(std::uint32_t v, std::uint32_t m) { return (v + m - 1) / m * m; }
std::uint32_t pow2_at_least(std::uint32_t v) {
    std::uint32_t p = 8;
    while (p < v) p *= 2;
    return p;
}
}  // namespace

flash_tiles choose_flash_tiles(const device_info& info, std::uint32_t seq, std::uint32_t d, std::uint32_t dv) {
    // The shader's register blocking needs min(BC, WG) | WG, BC | ... (see flash.comp): WG and BC
    // powers of two, BR a multiple of WG / min(BC, WG) and of WG / min(DV_MAX, WG), and V widths
    // below WG rounded to a power of two. Largest tiles first; the last fits the 16 KiB of shared
    // memory the Vulkan spec guarantees, for heads up to 256.
    struct shape {
        std::uint32_t wg, br, bc;
    };
    // CPU devices (lavapipe: SIMD across invocations, one workgroup per core) run best with few
    // invocations, each holding a large block of scores and outputs in registers; GPUs need
    // enough invocations per workgroup to fill a warp or wave.
    static const shape cpu_shapes[] = {{16, 16, 64}, {16, 16, 32}, {16, 16, 16}, {16, 8, 16}, {16, 8, 8}};
    static const shape gpu_shapes[] = {{64, 32, 32}, {64, 16, 32}, {64, 16, 16}, {64, 8, 16}, {64, 8, 8}};
    const auto& shapes = info.type == device_type::cpu ? cpu_shapes : gpu_shapes;
    flash_tiles t;
    t.d_max = round_up(d, 8);
    for (const shape& sh : shapes) {
        t.wg = sh.wg;
        t.br = sh.br;
        t.bc = sh.bc;
        t.dv_max = dv < t.wg ? pow2_at_least(dv) : round_up(dv, 16);
        if (t.br > 16 && seq <= 64) continue;  // short sequences: more, smaller blocks
        if (t.shared_bytes() <= info.max_shared_memory && t.wg <= info.max_workgroup_invocations) break;
    }
    return t;
}

std::uint32_t flash_chunk_keys(const device_info& info, std::uint32_t seq, std::uint32_t d, std::uint32_t dv,
                               std::uint32_t at_most) {
    const std::uint32_t cap = at_most ? std::min(seq, at_most) : seq;
    if (info.type != device_type::cpu) return cap;
    const flash_tiles t = choose_flash_tiles(info, seq, d, dv);
    const auto per = [&](std::uint64_t work) { return (work + t.wg - 1) / t.wg; };  // iterations per invocation
    // Loops that stay loops (dynamic bounds) per K/V tile, as flash.comp runs them: the K load,
    // the dot products over d, row maxima, probabilities, row sums, the V load, and the values.
    const std::uint64_t per_tile = 1 + per(std::uint64_t{t.bc} * d) + d + per(t.br) * t.bc + per(std::uint64_t{t.br} * t.bc) +
                                   per(t.br) * t.bc + per(std::uint64_t{t.bc} * dv) + t.bc;
    const std::uint64_t fixed = per(std::uint64_t{t.br} * d) + 4 * per(t.br);  // Q load, row set-up and hand-over
    constexpr std::uint64_t budget = 65535 - 4096;                               // with a margin
    const std::uint64_t tiles = std::max<std::uint64_t>(1, (budget - fixed) / per_tile);
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(cap, tiles * t.bc));
}

void record_flash(executor& exec, pipeline_set& pipes, const device_info& info, bool fp16,
                  std::initializer_list<binding> bindings, const flash_push& push, std::uint32_t batches,
                  std::uint32_t chunk_keys) {
    const flash_tiles tiles = choose_flash_tiles(info, push.seq, push.d, push.dv);
    const pipeline& p = pipes.get(fp16 ? shader_id::flash_f16 : shader_id::flash,
                                  static_cast<std::uint32_t>(bindings.size()), sizeof(flash_push), tiles.spec());
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
