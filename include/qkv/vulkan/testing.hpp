// Hooks for tests and measurements, kept out of the production API (qkv/vulkan/context.hpp):
// contexts whose calls take other paths (never other results beyond rounding), and the device's
// own ceiling that `qkv bench` states kernel throughput against. Production code never needs this
// header.
//
//   qkv::vulkan::context ctx = qkv::vulkan::testing::make_context({.validation = true},
//                                                                  {.max_decode_chunks = 1});
//   qkv::vulkan::testing::device_ceiling c = qkv::vulkan::testing::measure_ceiling(ctx);
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/device_info.hpp"
#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

struct external_device;  // qkv/vulkan/interop.hpp
class kv_cache;          // qkv/vulkan/kv_cache.hpp

namespace testing {

/// Each hook changes which path a call takes (never its result beyond rounding); all of them at
/// their defaults is a context as qkv::vulkan::context(options) makes it.
struct hooks {
    /// Pretend maxComputeWorkGroupCount is at most this in every dimension (0 = the device's own):
    /// exercises the dispatch-splitting path without enormous inputs.
    std::uint32_t max_workgroup_count = 0;

    /// Let one dispatch of the fused kernel cover at most this many keys (0 = what the device
    /// needs): exercises the key-chunk path, which CPU implementations such as lavapipe take for
    /// long sequences (their loops end after 65,535 iterations), without long sequences.
    std::uint32_t max_fused_keys_per_dispatch = 0;

    /// Let one chunk of the backward's fused order (dk and dv storing dR, then dq from it) cover at
    /// most this many (batch, query head)s (0 = as many as its dR scratch's budget takes):
    /// exercises the chunked fused order, which long sequences with many heads take, at small sizes.
    std::uint32_t max_fused_backward_heads = 0;

    /// Always stage uploads and downloads through host-visible buffers, as on a discrete GPU,
    /// even where device memory is host-visible (the calls' inputs and results, and the host
    /// appends of a kv_cache made from this context).
    bool force_staging = false;

    /// Fault injection: the n-th queue submission of this context (counting from 1) fails as if
    /// the driver returned VK_ERROR_DEVICE_LOST; 0 = never. The context then behaves exactly as
    /// after a real device loss.
    std::uint32_t simulate_device_lost_at_submit = 0;

    /// Choose the block_tiles family's tiles as for this device description (its type, subgroup
    /// size and limits) instead of the real device's, within the real device's shared memory and
    /// invocation limits. Proves a GPU's tile configuration correct on lavapipe.
    std::optional<device_info> fused_tiles_as{};

    /// The most chunks the split-S decode (context::sdpa with a kv_cache) cuts the keys into;
    /// 0 = chosen for the device, 1 = no split (as far as the device's loop limits allow).
    std::uint32_t max_decode_chunks = 0;

    /// The split-S decode's cpu kernel unrolls rows of up to this many texels (4 elements each)
    /// whole and takes its wide form (loops over the head's texels) beyond; 0 = chosen (32 texels,
    /// E or Ev up to 128). 1 puts every head wider than 4 on the wide form.
    std::uint32_t decode_unrolled_texels = 0;

    /// Pretend maxStorageBufferRange is at most this many bytes when a kv_cache of this context
    /// allocates its f32 / f16 storage (0 = the device's own): a cache past it is kept readable
    /// only through its texel views (a paged decode's pool), exercised without a big allocation.
    std::uint64_t kv_storage_range = 0;

    /// Fill every new host-visible allocation with 0xFF bytes (NaN as float32, all ones as words)
    /// before use: Vulkan memory starts with any contents, and a driver may hand out memory it used
    /// before, so a result that depends on fresh memory being zero shows up.
    bool poison_new_memory = false;

    /// A decode over device tensors raises its output flag by a subgroup vote wherever the device
    /// offers votes in compute shaders, a CPU device included (whose plan otherwise keeps the
    /// per-element flag, measured faster there): runs the vote form on lavapipe.
    bool decode_vote = false;
};

/// A context as qkv::vulkan::context(options) makes it, with `h` set.
[[nodiscard]] QKV_VULKAN_API context make_context(const context_options& options, const hooks& h);
/// A context on the caller's device (interop.hpp's make_context), with `h` set.
[[nodiscard]] QKV_VULKAN_API context make_context(const external_device& device, const context_options& options,
                                                  const hooks& h);

/// What the device itself can do, measured by microbenchmarks in the same process: the yardstick
/// that `qkv bench` reports each kernel against.
struct device_ceiling {
    double fma_gflops = 0;           ///< float32 fused multiply-add throughput (2 FLOP each)
    double copy_gb_per_s = 0;        ///< device-memory copy bandwidth (bytes read + written)
    double empty_submit_ms = 0;      ///< an empty command buffer: submit, wait on its fence (median)
    bool device_timestamps = false;  ///< true: GPU timestamps; false: host clock around the fence
};

/// Measures the device's arithmetic and memory ceilings and the cost of an empty submit (a
/// fraction of a second on a GPU, a few seconds on lavapipe), with temporary buffers, on `ctx`'s
/// queue under its lock.
[[nodiscard]] QKV_VULKAN_API device_ceiling measure_ceiling(context& ctx);

/// How many of qkv's device-side objects are alive in this process: device cores (a context's
/// device, memory and pipelines, shared by its calls, caches and tensors) and recordings (kept
/// ones, and those a core keeps after they were destroyed before their commands were known to
/// have completed). Once every qkv object made since is destroyed, both are back where they were:
/// nothing qkv made outlives them, so an application may destroy its VkDevice then.
struct live_objects {
    std::size_t device_cores = 0;
    std::size_t recordings = 0;
};
[[nodiscard]] QKV_VULKAN_API live_objects live() noexcept;

/// How many compute pipelines qkv has created in this process (a plan's, a call's, a measurement's):
/// a call's record() and run() create none, since planning the call built them.
[[nodiscard]] QKV_VULKAN_API std::size_t pipelines_created() noexcept;

/// The bytes of a q8_0 / q4_0 kv_cache's storage, read back from the device: K's blocks, then V's,
/// each (batch, kv_heads, capacity) rows of ggml's blocks (bytes_for(type, d_qk) and
/// bytes_for(type, d_v) bytes a row; rows not written hold whatever the memory held). For tests
/// that two ways of writing a cache leave the same bytes. Throws qkv::invalid_argument for an f32 /
/// f16 cache (kv_cache::keys() and values() are tensors) and while an append to it is pending.
struct cache_bytes {
    std::vector<std::byte> k, v;
};
[[nodiscard]] QKV_VULKAN_API cache_bytes cache_blocks(const kv_cache& cache);

}  // namespace testing
}  // namespace qkv::vulkan
