// The GPU family of the fused attention kernel (shaders/flash.comp): its plan (tiles and key
// chunks for one call on one device) and its recording. The tiles themselves are chosen by the
// pure functions of flash_tiles.hpp.
#pragma once

#include <cstdint>

#include "kernels/flash_layout.hpp"
#include "kernels/flash_tiles.hpp"
#include "kernels/settings.hpp"
#include "vk/device.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

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

/// Records the kernel over every (batch, query head) and row block, one dispatch per key chunk.
/// `stats`: the last dispatch also stores each row's final (max, sum) in io.state (for the weights).
void record_flash_gpu(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const flash_gpu_plan& plan,
                      const flash_io& io, bool stats = false);

/// Records flash_weights.comp: weights (batch, heads, L, S) into `weights` from the state a
/// kernel of either family stored with `stats`, with the score rules of io.params (always given).
/// Throws limit_exceeded when the grid or E is too large.
void record_flash_weights(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const flash_io& io,
                          binding weights);

}  // namespace qkv::vulkan::detail
