#include "kernels/flash_backward_plan.hpp"

#include <algorithm>
#include <bit>
#include <numeric>
#include <string>

#include "contract/score.h"
#include "kernels/flash_cpu_plan.hpp"
#include "kernels/gemm_tiles.hpp"

namespace qkv::vulkan::detail {
namespace {

// llvmpipe ends every loop of an invocation after 65,535 iterations in total: one dispatch of the
// dq or dk/dv kernel takes at most this many steps of its one loop (with a margin), a fold this
// many terms of each output.
constexpr std::uint32_t max_steps_per_dispatch = 65535 - 1023;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

std::uint64_t bwd_fold::terms() const {
    std::uint64_t n = 1;
    for (int d = 0; d < 4; ++d)
        if (onto[d] == 1) n *= dims[d];
    return n;
}

std::uint32_t flash_bwd_plan::dispatches(const flash_layout& l) const {
    if (fused) {
        std::uint32_t n = 0;
        for (const head_chunk& c : fused_chunks(l))
            n += 1 + ceil_div(std::uint64_t{std::min(c.count, l.group())} * npad_q, dkdv_chunk);
        return n;
    }
    const std::uint32_t dq = l.kv_len == 0 ? 1 : ceil_div(l.kv_len, dq_chunk);
    const std::uint32_t dkdv = ceil_div(std::uint64_t{l.group()} * npad_q, dkdv_chunk);
    return dq + dkdv;
}

std::vector<flash_bwd_plan::head_chunk> flash_bwd_plan::fused_chunks(const flash_layout& l) const {
    std::vector<head_chunk> chunks;
    if (!fused || fused_heads == 0) return chunks;
    const std::uint32_t group = l.group(), heads = l.q_batches();
    if (fused_heads >= group) {
        for (std::uint32_t first = 0; first < heads; first += fused_heads)
            chunks.push_back({first, std::min(fused_heads, heads - first)});
    } else {
        for (std::uint32_t kvz = 0; kvz < l.kv_batches(); ++kvz)
            for (std::uint32_t u = 0; u < group; u += fused_heads)
                chunks.push_back({kvz * group + u, std::min(fused_heads, group - u)});
    }
    return chunks;
}

flash_bwd_plan plan_flash_backward(const device_desc& desc, const flash_layout& l, const flash_bwd_request& r,
                                   const settings& set) {
    const device_info& info = desc.info;
    flash_bwd_plan p;
    // One subgroup per workgroup and the widths in texels, as the forward's row_tiles family.
    const row_tiles_lanes lanes = plan_row_tiles_lanes(desc, l);
    p.wg = lanes.wg, p.d4 = lanes.d4, p.dv4 = lanes.dv4;
    // Rows (dq) or keys (dk/dv) per invocation, in registers with every loop over them unrolled:
    // dq keeps three texel rows per row (q, dO, dq), dk/dv four per key (k, v, dk, dv). Measured on
    // lavapipe at N = 1024 and 4096, d = 64 (docs/devices.md): 4 rows x 8 keys a step for dq and
    // 2 keys x 4 rows for dk/dv; half as many per invocation for each doubling of the width.
    const std::uint32_t widest = std::max(p.d4, p.dv4);
    // Powers of two, so that the dq block and the dk/dv step divide each other (npad_q).
    p.rpi = std::bit_floor(std::clamp<std::uint32_t>(64 / widest, 1, 8));
    p.kps = 8;  // a multiple of 4: one Philox evaluation per 4 keys of a row
    p.kpi = std::bit_floor(std::clamp<std::uint32_t>(32 / widest, 1, 8));  // a lane's keys share dropout counters
    p.rps = 4;
    // A GPU's registers are per invocation, not a CPU's stack: one row or key each, which keeps
    // three or four texel rows of the head's width in them (no measurement on a GPU here). The
    // test hook settings::fused_tiles_as plans them so on a CPU device.
    const device_info& as = set.fused_tiles_as ? *set.fused_tiles_as : info;
    if (as.type != device_type::cpu) p.rpi = 1, p.kpi = 1;
    p.shuffle = cpu_shuffle(as, p.wg, set) && cpu_shuffle(info, p.wg, set);
    if (set.backward_rows)
        p.rpi = set.backward_rows, p.kps = set.backward_keys, p.kpi = set.backward_own_keys,
        p.rps = set.backward_rows_step;
    std::uint32_t row_align = std::max(p.dq_block(), p.rps), key_align = std::max(p.kps, p.dkdv_block());
    flash_coop_bwd_plan coop;
    if (r.coop) {
        // Throws, naming why, where the family's plan refuses.
        coop = plan_flash_coop_backward(desc, l, r, set);
        p.coop = true, p.coop_tiles = coop.tiles;
        row_align = std::lcm(std::lcm(row_align, coop.tiles.dkdv_rows), coop.tiles.dq_rows());
        key_align = std::lcm(std::lcm(key_align, coop.tiles.dkdv_keys()), coop.tiles.dq_keys);
    }
    p.npad_q = static_cast<std::uint32_t>(align_up(std::max(l.q_len, 1u), row_align));
    p.npad_kv = static_cast<std::uint32_t>(align_up(std::max(l.kv_len, 1u), key_align));
    // Chunks: dq's key steps, dk/dv's row steps (beside a few iterations per head: the skips over
    // rows no key of the block sees, and the flags of the group's heads), each below the loop limit.
    std::uint64_t keys = std::uint64_t{max_steps_per_dispatch} * p.kps;
    const std::uint64_t head_iterations = 3 * std::uint64_t{l.group()} + 1;
    std::uint64_t slots =
        (max_steps_per_dispatch > head_iterations + 1 ? max_steps_per_dispatch - head_iterations : 1) *
        std::uint64_t{p.rps};
    if (const std::uint32_t at_most = set.max_fused_keys) {
        keys = std::min<std::uint64_t>(keys, std::max<std::uint64_t>(p.kps, at_most / p.kps * p.kps));
        slots = std::min<std::uint64_t>(slots, std::max<std::uint64_t>(p.rps, at_most / p.rps * p.rps));
    }
    if (p.coop) {
        // Whole steps of both dk/dv kernels (the coop one, and the scalar one's careful pipeline).
        const std::uint64_t both = std::lcm(p.rps, coop.tiles.dkdv_rows);
        slots = std::max(both, std::min<std::uint64_t>(slots, coop.dkdv_chunk) / both * both);
        const std::uint64_t steps = std::lcm(p.kps, coop.tiles.dq_keys);  // likewise for dq
        keys = std::max(steps, std::min<std::uint64_t>(keys, coop.dq_chunk) / steps * steps);
        p.coop_key_blocks = ceil_div(std::max(l.kv_len, 1u), coop.tiles.dkdv_keys());
        p.coop_row_blocks = ceil_div(std::max(l.q_len, 1u), coop.tiles.dq_rows());
    }
    p.dq_chunk = static_cast<std::uint32_t>(std::min<std::uint64_t>(keys, p.npad_kv));
    p.dkdv_chunk = static_cast<std::uint32_t>(std::min<std::uint64_t>(slots, std::uint64_t{l.group()} * p.npad_q));
    p.fold_chunk = max_steps_per_dispatch;
    if (set.max_fused_keys) p.fold_chunk = std::max(1u, std::min(p.fold_chunk, set.max_fused_keys));

    p.half = l.fp16;
    p.extras = (r.d_mask ? contract::BWD_WRITE_DS : 0u) | (r.check ? contract::BWD_CHECK : 0u);
    if (r.d_sinks) p.sinks = {true, {l.batch, l.heads, l.q_len, 1}, {1, l.heads, 1, 1}};
    if (r.d_mask)
        p.mask = {true,
                  {l.batch, l.heads, l.q_len, l.kv_len},
                  {r.mask_dims[0], r.mask_dims[1], r.mask_dims[2], r.mask_dims[3]}};

    const std::uint64_t align = std::max(desc.texel_alignment, desc.storage_alignment);
    const std::uint64_t tb = p.texel_bytes();
    p.q_texels = std::uint64_t{l.q_batches()} * p.npad_q * p.d4;
    p.k_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.d4;
    p.v_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.dv4;
    p.do_texels = std::uint64_t{l.q_batches()} * p.npad_q * p.dv4;
    p.k_flags_at = 0;
    p.q_flags_at = align_up(std::uint64_t{l.kv_batches()} * 4, desc.storage_alignment);
    p.flags_bytes = p.q_flags_at + std::uint64_t{l.q_batches()} * 4;
    p.q_at = align_up(p.flags_bytes, align);
    p.do_at = align_up(p.q_at + p.q_texels * tb, align);
    p.k_at = align_up(p.do_at + p.do_texels * tb, align);
    p.v_at = align_up(p.k_at + p.k_texels * tb, align);
    p.texel_bytes_total = p.v_at + p.v_texels * tb;

    const std::uint64_t rows = std::uint64_t{l.q_batches()} * l.q_len;
    p.stats_at = 0;
    p.stats_texels = std::uint64_t{l.q_batches()} * p.npad_q;
    p.sums_at = align_up(p.stats_texels * 16, desc.storage_alignment);
    p.sink_terms_at = align_up(p.sums_at + (r.check ? rows * 16 : 0), desc.storage_alignment);
    p.scratch_bytes = p.sink_terms_at + (r.d_sinks ? rows * 4 : 0);
    p.ds_bytes = r.d_mask ? rows * l.kv_len * 4 : 0;

    // The fused order, where it applies (flash_bwd_plan::fused), in chunks of (batch, query
    // head)s whose dR scratch stays within the budget and the device's storage range
    // (flash_bwd_plan::fused_heads).
    p.key_blocks = ceil_div(std::max(l.kv_len, 1u), p.dkdv_block());
    const std::uint64_t head_floats = std::uint64_t{p.key_blocks} * p.npad_q * p.dkdv_block();
    const std::uint64_t head_sums = r.check ? std::uint64_t{p.key_blocks} * p.npad_q * 16 : 0;
    const auto dr_of = [&](std::uint64_t heads) { return heads * head_floats * 4; };
    const auto sums_at_of = [&](std::uint64_t heads) { return align_up(dr_of(heads), desc.storage_alignment); };
    const auto fits = [&](std::uint64_t heads) {
        return sums_at_of(heads) + heads * head_sums <= fused_budget && dr_of(heads) <= info.max_storage_buffer_range &&
               std::max<std::uint64_t>(heads * head_sums, 1) <= info.max_storage_buffer_range &&
               heads * head_floats <= 0xffffffffu;
    };
    const std::uint32_t group = l.group(), heads = l.q_batches();
    std::uint64_t fit = std::min<std::uint64_t>(heads, fused_budget / (head_floats * 4 + head_sums));
    while (fit > 0 && !fits(fit)) --fit;  // the alignment's few bytes
    if (set.max_fused_heads) fit = std::min<std::uint64_t>(fit, set.max_fused_heads);
    // Whole (batch, K/V head)s where a group fits, parts of a group otherwise; chunks of equal
    // size (the last fewer), so that no chunk is a small remainder.
    std::uint32_t chunk_heads = 0;
    if (fit >= group) {
        const std::uint32_t kv_per = static_cast<std::uint32_t>(fit / group);
        chunk_heads = ceil_div(l.kv_batches(), ceil_div(l.kv_batches(), kv_per)) * group;
    } else if (fit > 0) {
        chunk_heads = ceil_div(group, ceil_div(group, fit));
    }
    if (set.backward_fused && !p.coop && p.shuffle && !r.d_mask && p.dkdv_block() % 4 == 0 &&
        p.key_blocks <= max_steps_per_dispatch && chunk_heads > 0) {
        p.fused = true;
        p.fused_heads = chunk_heads;
        p.dr_bytes = dr_of(chunk_heads), p.dr_sums_at = sums_at_of(chunk_heads);
        p.dr_sums_bytes = chunk_heads * head_sums;
        p.extras |= contract::BWD_STORE_DR;
    }
    return p;
}

flash_bwd_refusal check_flash_backward(const device_desc& desc, const flash_bwd_plan& p) {
    const device_info& info = desc.info;
    if (!desc.uniform_texels(p.half))
        return {std::string("the backward kernels read q, k, v and d_out through ") +
                    (p.half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") + " uniform texel buffers, which " +
                    info.name + " does not support",
                false};
    const std::uint64_t paired = p.paired() ? (p.do_at - p.q_at) / p.texel_bytes() + p.do_texels : 0;
    const std::uint64_t texels = std::max({p.q_texels, p.k_texels, p.v_texels, p.do_texels, p.stats_texels, paired});
    if (texels > desc.max_texel_elements)
        return {"the backward kernels would read " + std::to_string(texels) +
                    " texels through one texel buffer, more than this device's maxTexelBufferElements of " +
                    std::to_string(desc.max_texel_elements) + "; split the batch into several calls",
                true};
    const auto beyond = [&](const char* what, std::uint64_t bytes) -> std::string {
        if (bytes <= info.max_storage_buffer_range && bytes / 4 <= 0xffffffffu) return {};
        return std::string("the backward kernels' ") + what + " needs " + std::to_string(bytes) +
               " bytes, more than this device's maxStorageBufferRange of " +
               std::to_string(info.max_storage_buffer_range) + "; split the batch or the heads into several calls";
    };
    for (const auto& [what, bytes] :
         {std::pair{"texel buffer", p.texel_bytes_total}, std::pair{"scratch", p.scratch_bytes},
          std::pair{"dS scratch of the additive mask's gradient", p.ds_bytes}})
        if (std::string why = beyond(what, bytes); !why.empty()) return {why, true};
    return {};
}

}  // namespace qkv::vulkan::detail
