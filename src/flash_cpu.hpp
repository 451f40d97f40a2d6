// The CPU-device family of the fused attention kernel (shaders/flash_cpu.comp): its tile choice,
// its texel-buffer layout, the checks that decide whether it can run, and its recording.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor.hpp"
#include "memory.hpp"
#include "pipelines.hpp"

namespace qkv::vulkan::detail {

/// Mirrors the push-constant block of shaders/flash_cpu.comp.
struct flash_cpu_push {
    group_offset offset;
    std::uint32_t seq = 0, npad = 0, dv = 0, heads = 1;
    std::uint32_t o_rs = 0, o_bs = 0;
    float scale = 1.0f;
    std::uint32_t flags = 0;
    std::uint32_t mask_bs = 0, add_bs = 0;
    std::uint32_t kv_begin = 0, kv_stop = 0;  // set by record_flash_cpu, per key chunk
    std::uint32_t blocks = 0;                 // set by record_flash_cpu
};
static_assert(sizeof(flash_cpu_push) <= 128);

/// Shape and layout of one call of the CPU-device kernel.
struct flash_cpu_plan {
    // Tiles (specialization constants): invocations per workgroup (the subgroup size), query rows
    // per invocation, keys per step, and the head widths in texels of 4 values.
    std::uint32_t wg = 8, rpi = 4, kps = 8, d4 = 1, dv4 = 1;
    std::uint32_t seq = 0, d = 0, dv = 0, heads = 1, batches = 0;  // batches = batch x heads
    std::uint32_t npad = 0;                                        ///< rows per (batch, head) in the texel buffers
    std::uint32_t chunk_keys = 0;                                  ///< keys per dispatch (a multiple of kps)
    bool half = false;                                             ///< RGBA16F texels (fp16 precision), else RGBA32F
    VkFormat format = VK_FORMAT_R32G32B32A32_SFLOAT;
    // The texel buffer: per-(batch, head) flags, then Q, K and V, each region aligned for a view.
    std::uint64_t flags_bytes = 0, q_offset = 0, k_offset = 0, v_offset = 0, bytes = 0;
    std::uint64_t qk_texels = 0, v_texels = 0;  ///< elements of the Q and K views, of the V view

    [[nodiscard]] std::uint32_t block() const { return wg * rpi; }
    [[nodiscard]] std::uint64_t texel_bytes() const { return half ? 8 : 16; }
    [[nodiscard]] std::vector<std::uint32_t> spec() const { return {wg, rpi, kps, d4, dv4}; }
};

/// Plans the kernel for `batches` (batch x heads) heads of d (Q, K) and dv (V) columns over seq
/// rows; `at_most` (if not 0) caps the keys per dispatch (context_options::max_fused_keys_per_dispatch).
flash_cpu_plan plan_flash_cpu(const device& dev, bool fp16, std::uint32_t batches, std::uint32_t heads,
                              std::uint32_t seq, std::uint32_t d, std::uint32_t dv, std::uint32_t at_most = 0);

/// Why this device cannot run the plan, or an empty `why` when it can: a texel format it lacks
/// (limit = false), or a size beyond maxTexelBufferElements / maxStorageBufferRange (limit = true).
struct flash_cpu_refusal {
    std::string why;
    bool limit = false;
};
flash_cpu_refusal check_flash_cpu(const device& dev, const flash_cpu_plan& plan);

/// What the kernel reads and writes. `texels` is a buffer of at least plan.bytes with
/// VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT; q, k, v are views of it made by make_flash_cpu_views.
struct flash_cpu_io {
    binding qkv;  ///< the projected Q|K|V rows (float32, or float16 with qkv_fp16)
    bool qkv_fp16 = false;
    VkBuffer texels = VK_NULL_HANDLE;
    VkBufferView q = VK_NULL_HANDLE, k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
    binding mask_bits, additive, out, state;
};

struct flash_cpu_views {
    buffer_view q, k, v;
};
flash_cpu_views make_flash_cpu_views(const device& dev, const buffer& texels, const flash_cpu_plan& plan);

/// Records the packing of Q, K and V into the texel buffer, then the kernel over every
/// (batch, head) and row block, one dispatch per plan.chunk_keys keys. `push` carries the shape,
/// strides, scale and mask flags; `ld`, `k_col`, `v_col` locate K and V in a Q|K|V row.
void record_flash_cpu(executor& exec, pipeline_set& pipes, const flash_cpu_plan& plan, const flash_cpu_io& io,
                      const flash_cpu_push& push, std::uint32_t ld, std::uint32_t k_col, std::uint32_t v_col);

}  // namespace qkv::vulkan::detail
