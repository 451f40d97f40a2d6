// The block_tiles family of the fused attention kernel (shaders/flash.comp): its recording, and
// the weights kernel's. Its plan (tiles and key chunks): flash_gpu_plan.hpp.
#pragma once

#include <cstdint>

#include "kernels/flash_gpu_plan.hpp"
#include "kernels/flash_io.hpp"
#include "vk/device.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

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
