// The block_tiles family of the fused attention kernel (shaders/flash.comp): its plan (tiles and
// key chunks for one call on one device), a pure function of a device description (part of
// qkv_plan: no Vulkan). The tiles themselves: flash_tiles.hpp; the recording: flash_gpu.hpp.
#pragma once

#include <cstdint>

#include "kernels/flash_layout.hpp"
#include "kernels/flash_tiles.hpp"
#include "plan/settings.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

struct flash_gpu_plan {
    flash_tiles tiles;
    std::uint32_t chunk_keys = 0;  ///< keys per dispatch (all of them except on CPU devices)
    [[nodiscard]] std::uint32_t dispatches(std::uint32_t kv_len) const {
        return kv_len == 0 ? 1 : (kv_len + chunk_keys - 1) / chunk_keys;
    }
};

/// Tiles and key chunks for `layout` on the device `desc` describes (settings::fused_tiles_as and
/// max_fused_keys: the test hooks). Throws limit_exceeded when the tiles for these head widths do
/// not fit the device's shared memory or workgroup size. A pure function.
flash_gpu_plan plan_flash_gpu(const device_desc& desc, const flash_layout& layout, const settings& set);

}  // namespace qkv::vulkan::detail
