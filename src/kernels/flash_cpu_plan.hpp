// The row_tiles family of the fused attention kernel (shaders/flash_cpu.comp): its plan for one
// call on one device (tiles, texel-buffer layout, key chunks) and the checks that decide whether
// it can run, as pure functions of a device description (part of qkv_plan: no Vulkan). Its
// recording: flash_cpu.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "contract/flash.h"
#include "kernels/flash_layout.hpp"
#include "plan/settings.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// Shape and layout of one call of the CPU-device kernel.
struct flash_cpu_plan {
    // Tiles (specialization constants): invocations per workgroup (the subgroup size), query rows
    // per invocation, keys per step, and the head widths in texels of 4 values.
    std::uint32_t wg = 8, rpi = 4, kps = 8, d4 = 1, dv4 = 1;
    /// K and V rows shared by subgroupShuffle (flash_cpu_shuffle): only on a CPU device whose
    /// workgroup is exactly one subgroup of the size it reports, with shuffles in compute.
    bool shuffle = false;
    std::uint32_t npad_q = 0;      ///< Q rows per (batch, query head) in the texel buffer
    std::uint32_t npad_kv = 0;     ///< K and V rows per (batch, K/V head)
    std::uint32_t chunk_keys = 0;  ///< keys per dispatch (a multiple of kps)
    bool half = false;             ///< RGBA16F texels (fp16 precision), else RGBA32F
    // The texel buffer: per-(batch, K/V head) flags, then Q, K and V, each region aligned for a view.
    std::uint64_t flags_bytes = 0, q_offset = 0, k_offset = 0, v_offset = 0, bytes = 0;
    std::uint64_t q_texels = 0, k_texels = 0, v_texels = 0;  ///< elements of the three views

    [[nodiscard]] std::uint32_t block() const { return wg * rpi; }
    [[nodiscard]] std::uint64_t texel_bytes() const { return half ? 8 : 16; }
    /// The kernel's constants for these tiles, mask kinds and score rules (contract/score.h)
    /// (`careful`: the pipeline for V with NaN or Inf).
    [[nodiscard]] contract::flash_cpu_spec spec(std::uint32_t masks, bool careful, std::uint32_t features = 0) const {
        return {wg, rpi, kps, d4, dv4, masks, careful ? 1u : 0u, features};
    }
    /// Dispatches of the kernel for kv_len keys (two per key chunk: plain and careful pipelines).
    [[nodiscard]] std::uint32_t dispatches(std::uint32_t kv_len) const {
        return 2 * (kv_len == 0 ? 1 : (kv_len + chunk_keys - 1) / chunk_keys);
    }
};

/// What the row_tiles family's forward (plan_flash_cpu) and backward (plan_flash_backward) kernels
/// share: one subgroup per workgroup, the lanes of one SIMD vector on a CPU device (a device that
/// reports no usable subgroup size gets 8, or fewer if its workgroups are smaller), and the head
/// widths in texels of 4 values.
struct row_tiles_lanes {
    std::uint32_t wg = 8, d4 = 1, dv4 = 1;
};
row_tiles_lanes plan_row_tiles_lanes(const device_desc& desc, const flash_layout& layout);

/// Plans the kernel for `layout` (its fp16 flag picks RGBA16F texels) on the device `desc`
/// describes; settings::max_fused_keys (if not 0) caps the keys per dispatch, flash_cpu_rows/keys
/// override the tile. A pure function.
flash_cpu_plan plan_flash_cpu(const device_desc& desc, const flash_layout& layout, const settings& set);

/// Why this device cannot run the plan, or an empty `why` when it can: a texel format it lacks
/// (limit = false), or a size beyond maxTexelBufferElements / maxStorageBufferRange (limit = true).
struct flash_cpu_refusal {
    std::string why;
    bool limit = false;
};
flash_cpu_refusal check_flash_cpu(const device_desc& desc, const flash_cpu_plan& plan);

}  // namespace qkv::vulkan::detail
