// The row_tiles family of the fused attention kernel (shaders/flash_cpu.comp): its recording. Its
// plan (tiles, texel layout, the checks that decide whether it can run): flash_cpu_plan.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/flash_cpu_plan.hpp"
#include "kernels/flash_io.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

struct flash_cpu_views {
    buffer_view q, k, v;
};
flash_cpu_views make_flash_cpu_views(const device& dev, const buffer& texels, const flash_cpu_plan& plan);

/// Where the kernel's packed texels live: `texels` (at least plan.bytes, created with
/// VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT) and its views from make_flash_cpu_views.
struct flash_cpu_texels {
    VkBuffer texels = VK_NULL_HANDLE;
    VkBufferView q = VK_NULL_HANDLE, k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
};

/// Records the packing of Q, K and V (from io.qkv, as `layout` addresses them) into the texel
/// buffer, then the kernel over every (batch, query head) and row block, one dispatch pair per
/// plan.chunk_keys keys. `stats`: the last chunk also stores each row's final (max, sum).
/// `v_finite`: the caller knows every value of V is finite (sdpa's host scan), so the careful
/// pipeline (for the (batch, head)s whose V holds NaN or Inf) is neither built nor dispatched; its
/// unrolled select per product costs LLVM tens of seconds to compile at wide heads (docs/devices.md).
void record_flash_cpu(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const flash_cpu_plan& plan,
                      const flash_io& io, const flash_cpu_texels& texels, bool stats = false, bool v_finite = false);

}  // namespace qkv::vulkan::detail
