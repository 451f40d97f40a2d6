#include "kernels/flash_cpu_plan.hpp"

#include <algorithm>
#include <string>

#include "contract/score.h"
#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

// llvmpipe ends every loop of an invocation after 65,535 iterations in total. The key-step loop
// is the kernel's only loop (every other one has a constant trip count and is unrolled), so one
// dispatch may take this many steps, with a margin.
constexpr std::uint32_t max_steps_per_dispatch = 65535 - 1023;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

row_tiles_lanes plan_row_tiles_lanes(const device_desc& desc, const flash_layout& l) {
    row_tiles_lanes r;
    const std::uint32_t max_wg = desc.max_workgroup_x();
    r.wg = desc.info.subgroup_size;
    if (!power_of_two(r.wg) || r.wg > max_wg) {
        r.wg = 8;
        while (r.wg > max_wg) r.wg /= 2;
    }
    r.d4 = ceil_div(std::max(l.d, 1u), 4);
    r.dv4 = ceil_div(std::max(l.dv, 1u), 4);
    return r;
}

flash_cpu_plan plan_flash_cpu(const device_desc& desc, const flash_layout& l, const settings& set) {
    const device_info& info = desc.info;
    flash_cpu_plan p;
    const row_tiles_lanes lanes = plan_row_tiles_lanes(desc, l);
    p.wg = lanes.wg, p.d4 = lanes.d4, p.dv4 = lanes.dv4;
    // Each invocation keeps rpi rows of Q and of the accumulator in registers (spilled to the
    // stack beyond the CPU's vector registers), and every loop over them is unrolled. LLVM's
    // compile time grows faster than that unrolled body: measured on lavapipe with Mesa's shader
    // cache off (docs/devices.md), rows x texels-per-row of 32 compile in ~3.5 s, 64 in ~9 s and
    // 128 (8 rows of d = 64) in ~32 s for each new shape and mask. So the tile is capped at 32:
    // at d = 64 that is 2 rows x 8 keys, about 25 % slower per call than 8 x 4 but 8x faster to
    // build. settings::flash_cpu_rows/keys (QKV_FLASH_CPU_TILES=rows,keys) override it (e.g. 8,4
    // for long-running work).
    const std::uint32_t widest = std::max(p.d4, p.dv4);
    p.rpi = 8;
    while (p.rpi > 1 && p.rpi * widest > 32) p.rpi /= 2;
    p.kps = p.rpi <= 2 ? 8 : 4;
    if (set.flash_cpu_rows) p.rpi = set.flash_cpu_rows, p.kps = set.flash_cpu_keys;
    // Dropout draws one Philox block per 4 keys of a row: steps of whole blocks (flash_cpu.comp).
    if ((l.features & contract::SCORE_DROPOUT) != 0) p.kps = (p.kps + 3) / 4 * 4;
    p.shuffle = cpu_shuffle(info, p.wg, set);
    p.npad_q = static_cast<std::uint32_t>(align_up(std::max(l.q_len, 1u), p.block()));
    p.npad_kv = static_cast<std::uint32_t>(align_up(std::max(l.kv_len, 1u), p.kps));
    std::uint64_t chunk = std::uint64_t{max_steps_per_dispatch} * p.kps;
    if (const std::uint32_t at_most = set.max_fused_keys)
        chunk = std::min<std::uint64_t>(chunk, std::max<std::uint64_t>(p.kps, at_most / p.kps * p.kps));
    p.chunk_keys = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, p.npad_kv));

    p.half = l.fp16;
    const std::uint64_t align = std::max(desc.texel_alignment, desc.storage_alignment);
    p.q_texels = std::uint64_t{l.q_batches()} * p.npad_q * p.d4;
    p.k_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.d4;
    p.v_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.dv4;
    p.flags_bytes = std::uint64_t{l.kv_batches()} * 4;
    p.q_offset = align_up(p.flags_bytes, align);
    p.k_offset = align_up(p.q_offset + p.q_texels * p.texel_bytes(), align);
    p.v_offset = align_up(p.k_offset + p.k_texels * p.texel_bytes(), align);
    p.bytes = p.v_offset + p.v_texels * p.texel_bytes();
    return p;
}

flash_cpu_refusal check_flash_cpu(const device_desc& desc, const flash_cpu_plan& p) {
    const device_info& info = desc.info;
    if (!desc.uniform_texels(p.half))
        return {std::string("the cpu kernel family needs ") + (p.half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") +
                    " uniform texel buffers, which " + info.name + " does not support; use the gpu kernel family",
                false};
    const std::uint64_t max_texels = desc.max_texel_elements;
    const std::uint64_t texels = std::max({p.q_texels, p.k_texels, p.v_texels});
    if (texels > max_texels)
        return {"the cpu kernel family would read " + std::to_string(texels) +
                    " texels through one texel buffer, more than this device's maxTexelBufferElements of " +
                    std::to_string(max_texels) + "; split the batch into several calls or use the gpu kernel family",
                true};
    if (p.bytes > info.max_storage_buffer_range || p.bytes / 4 > 0xffffffffu)
        return {"the cpu kernel family's texel buffer needs " + std::to_string(p.bytes) +
                    " bytes, more than this device's maxStorageBufferRange of " +
                    std::to_string(info.max_storage_buffer_range) + "; split the batch into several calls",
                true};
    return {};
}

}  // namespace qkv::vulkan::detail
