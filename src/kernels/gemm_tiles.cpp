#include "kernels/gemm_tiles.hpp"

#include <algorithm>
#include <string>

#include "contract/gemm.h"
#include "qkv/runtime/error.hpp"

namespace qkv::vulkan::detail {
namespace {

bool fits(const gemm_tiles& t, const device_info& info) {
    return t.threads() <= info.max_workgroup_invocations && t.shared_bytes() <= info.max_shared_memory;
}

}  // namespace

bool cpu_kernels(const device_info& info, qkv::kernel_family requested) {
    if (requested == qkv::kernel_family::automatic) return info.type == device_type::cpu;
    return requested == qkv::kernel_family::row_tiles;
}

bool cpu_shuffle(const device_info& info, std::uint32_t workgroup, const settings& set) {
    // The workgroup must be one subgroup of the reported size: sure on a CPU device, whose
    // subgroup is its SIMD vector (lavapipe: 8 lanes of AVX2); not on a GPU, which may compile a
    // workgroup into subgroups of another size unless asked otherwise.
    return set.cpu_shuffle && info.type == device_type::cpu && info.subgroup_shuffle && workgroup == info.subgroup_size;
}

std::uint32_t cpu_lanes(const device_info& info) {
    return std::clamp<std::uint32_t>(info.subgroup_size, 1, info.max_workgroup_invocations);
}

contract::gemm_spec gemm_tiles::spec() const {
    contract::gemm_spec s{};
    s.workgroup = threads();
    s.bm = bm, s.bn = bn, s.bk = bk, s.tm = tm, s.tn = tn;
    return s;
}

std::uint64_t gemm_tiles::loop_iterations(std::uint64_t k) const {
    if (cpu) return k / bk + bk + 2;  // the unrolled k loop, the tail, and their exits
    // Per BK step: the step itself, the A- and B-tile loads (loops whose trip count depends on
    // the invocation), and one exit check for each load loop.
    const std::uint64_t wg = threads();
    const std::uint64_t per_step = 3 + (std::uint64_t{bm} * bk + wg - 1) / wg + (std::uint64_t{bk} * bn + wg - 1) / wg;
    return (k + bk - 1) / bk * per_step + 1;
}

gemm_tiles choose_gemm_tiles(const device_info& info, std::uint64_t m, std::uint64_t n, bool cpu) {
    if (cpu) {
        // One subgroup per workgroup (the size the driver reports, never assumed), so every
        // invocation is a lane of one SIMD vector; BM rows of A read at uniform addresses, TN
        // gathered values of B per lane and k. Fewer rows and columns for small products.
        gemm_tiles t;
        t.cpu = true;
        const std::uint32_t lanes = cpu_lanes(info);
        // Measured on lavapipe (N = 4096 x 64 x 192): 8 rows x 4 lane-columns beat 8x2, 16x2, 4x8.
        t.tn = n > 2 * lanes ? 4 : (n > lanes ? 2 : 1);
        t.bm = m >= 8 ? 8 : (m >= 4 ? 4 : 1);
        t.tm = t.bm;
        t.bn = lanes * t.tn;
        t.bk = 4;
        return t;
    }
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

gemm_tiles choose_projection_tiles_cpu(const device_info& info, std::uint64_t m, std::uint64_t n) {
    gemm_tiles t;
    t.cpu = true;
    const std::uint32_t lanes = cpu_lanes(info);
    // Measured on lavapipe (N = 4096 x 64 x 192, loaded machine): 8 rows per lane x 16 columns
    // took 20 ms against 31-45 ms for the columns variant (8 x 4); 2x8, 4x16, 16x8, 16x16 and 8x32
    // were slower. Rows: as many as M fills, at most 8 per lane; columns: at most 16.
    t.tm = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((m + lanes - 1) / lanes, 1, 8));
    t.tn = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(n, 1, 16));
    t.bm = lanes * t.tm;
    t.bn = t.tn;
    t.bk = 4;
    return t;
}

std::uint32_t gemm_chunk_k(const device_info& info, const gemm_tiles& tiles, std::uint32_t k) {
    if (info.type != device_type::cpu || tiles.loop_iterations(k) < cpu_loop_limit - 1024) return std::max(k, 1u);
    // The largest whole number of BK steps that stays under the limit, with a margin.
    std::uint64_t lo = tiles.bk, hi = k;  // loop_iterations grows with k: bisect on multiples of BK
    while (hi - lo > tiles.bk) {
        const std::uint64_t mid = (lo + hi) / 2 / tiles.bk * tiles.bk;
        if (mid <= lo) break;
        (tiles.loop_iterations(mid) < cpu_loop_limit - 1024 ? lo : hi) = mid;
    }
    return static_cast<std::uint32_t>(lo);
}

// The staged path stores B x H x N x N float scores in one binding of at most 2^32 bytes, so
// N <= 32,768 on any device, and every workgroup may have 128 invocations (the Vulkan minimum of
// maxComputeWorkGroupInvocations): at that worst case the softmax and the aggregation stay far
// below a CPU implementation's loop limit, and the aggregation is split along N anyway.
static_assert(3 * (32768 / 128 + 1) + 2 * (1 + 7) < cpu_loop_limit);
// On CPU devices the softmax uses one subgroup per row where the budget allows (softmax_workgroup
// doubles it otherwise): lavapipe's 8 lanes at N = 32,768 stay under the limit too.
static_assert(3 * (32768 / 8 + 1) + 2 * (1 + 1) < cpu_loop_limit);

std::uint64_t softmax_loop_iterations(std::uint32_t workgroup, std::uint32_t cols, std::uint32_t subgroup_size,
                                      bool subgroup_arithmetic) {
    // softmax.comp: the maximum, the exponentials and the division each stride over the row;
    // each reduction is a tree of log2(workgroup) steps, or a loop over the subgroups' partials.
    const std::uint64_t per_pass = (std::uint64_t{cols} + workgroup - 1) / workgroup + 1;
    std::uint64_t reduction = 1;
    if (subgroup_arithmetic) {
        const std::uint32_t sg = std::max(subgroup_size, 1u);
        const std::uint64_t subgroups = (workgroup + sg - 1) / sg;
        reduction += (subgroups + sg - 1) / sg;
    } else {
        for (std::uint32_t w = workgroup; w > 1; w /= 2) ++reduction;
    }
    return 3 * per_pass + 2 * reduction;
}

std::uint32_t softmax_workgroup(const device_info& info, std::uint64_t cols) {
    std::uint32_t wg = 1;
    const std::uint32_t cap = std::min<std::uint32_t>(256, info.max_workgroup_invocations);
    if (info.type == device_type::cpu) {
        // One workgroup runs on one CPU thread with the invocations as SIMD lanes: one subgroup
        // (no switching between vectors at each barrier), larger only where a row would take an
        // invocation past the loop limit.
        while (wg * 2 <= cap && wg < info.subgroup_size) wg *= 2;
        while (wg * 2 <= cap &&
               softmax_loop_iterations(wg, static_cast<std::uint32_t>(std::min<std::uint64_t>(cols, 0xffffffffu)),
                                       info.subgroup_size, info.subgroup_arithmetic) >= cpu_loop_limit - 1024)
            wg *= 2;
        return wg;
    }
    while (wg * 2 <= cap && wg < cols) wg *= 2;
    // At least one full subgroup, so subgroup operations see a whole subgroup.
    while (wg < info.subgroup_size && wg * 2 <= cap) wg *= 2;
    return wg;
}

namespace {
shader_id cpu_twin(shader_id shader) {
    switch (shader) {
        case shader_id::project:
            return shader_id::project_cpu;
        case shader_id::project_f16:
            return shader_id::project_cpu_f16;
        case shader_id::scores:
            return shader_id::scores_cpu;
        case shader_id::scores_f16:
            return shader_id::scores_cpu_f16;
        case shader_id::aggregate:
            return shader_id::aggregate_cpu;
        case shader_id::aggregate_f16:
            return shader_id::aggregate_cpu_f16;
        default:
            return shader;
    }
}
}  // namespace

gemm_step plan_gemm(const device_info& info, bool cpu, shader_id shader, std::uint64_t m, std::uint64_t n,
                    std::uint32_t k) {
    const bool rows = cpu && (shader == shader_id::project || shader == shader_id::project_f16);
    gemm_step s;
    s.shader = cpu ? cpu_twin(shader) : shader;
    s.tiles = rows ? choose_projection_tiles_cpu(info, m, n) : choose_gemm_tiles(info, m, n, cpu);
    s.chunk_k = gemm_chunk_k(info, s.tiles, k);
    return s;
}

gemm_step plan_projection_texels(const device_info& info, const settings& set, bool fp16, std::uint64_t m,
                                 std::uint64_t n, std::uint32_t k) {
    gemm_step s;
    gemm_tiles& t = s.tiles;
    t.cpu = true;
    const std::uint32_t lanes = cpu_lanes(info);
    const bool shuffle = cpu_shuffle(info, lanes, set);
    // Eight-column stores where every store lands on whole groups of 8 (C's offset is 0 here) and
    // fp32 can be packed into 64-bit integers (TN a multiple of 8 as well, below).
    const bool wide = shuffle && n % 8 == 0 && (fp16 || info.shader_int64);
    // Rows per lane x columns, measured on lavapipe at N = 4096, d_in = d = 64 (docs/devices.md):
    // with the weights fetched per lane, 8 x 16; shared by shuffles, 4 x 32 (the k loop's
    // accumulators are reloaded once per texel step, so the wider tile costs no more spills and
    // fetches fewer rows of X per FMA). Rows as many as M fills.
    const std::uint64_t rows = shuffle ? 4 : 8, cols = shuffle ? 32 : 16;
    t.tm = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((m + lanes - 1) / lanes, 1, rows));
    t.tn = static_cast<std::uint32_t>(std::clamp<std::uint64_t>(wide ? n / 8 * 8 : n / 4 * 4, wide ? 8 : 4, cols));
    if (set.project_rows) t.tm = set.project_rows, t.tn = set.project_cols;  // QKV_PROJECT_TILES
    t.bm = lanes * t.tm;
    t.bn = t.tn;
    t.bk = 4;  // one texel of k per loop iteration: any chunk of whole texels needs no tail
    s.chunk_k = gemm_chunk_k(info, t, k);
    if (!shuffle)
        s.shader = fp16 ? shader_id::project_cpu_tx_f16 : shader_id::project_cpu_tx;
    else if (wide && t.tn % 8 == 0)
        s.shader = fp16 ? shader_id::project_cpu_tx_wide_f16 : shader_id::project_cpu_tx_wide;
    else
        s.shader = fp16 ? shader_id::project_cpu_tx_shuffle_f16 : shader_id::project_cpu_tx_shuffle;
    return s;
}

gemm_step plan_staged_texels(const device_info& info, shader_id shader, std::uint64_t m, std::uint64_t n,
                             std::uint32_t k) {
    gemm_step s;
    s.shader = shader;
    gemm_tiles& t = s.tiles;
    t.cpu = true;
    const std::uint32_t lanes = cpu_lanes(info);
    // As the projection's shuffle variants: 4 rows per lane x 32 columns (docs/devices.md).
    t.tm = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((m + lanes - 1) / lanes, 1, 4));
    t.tn = static_cast<std::uint32_t>(std::clamp<std::uint64_t>((n + 3) / 4 * 4, 4, 32));
    t.bm = lanes * t.tm;
    t.bn = t.tn;
    t.bk = 4;  // one texel of k per loop iteration
    s.chunk_k = gemm_chunk_k(info, t, k);
    s.vec_store = n % 4 == 0;  // rows of C n wide (scores: the keys; the aggregation, always 4k: ignores it)
    return s;
}

}  // namespace qkv::vulkan::detail
