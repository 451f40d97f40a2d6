// The plan of an sdpa call (context::sdpa): which route runs it (the fused kernels of one family,
// or the split-S decode kernels), that route's own plan, and where every tensor lives in the call's
// buffers (call_io.hpp). plan_sdpa (Q, K and V from the host) and plan_sdpa_cache (K and V in a
// kv_cache) are pure functions of the problem's shapes and options (no data is read), a device
// description and the settings: tests/sdpa_plan_test.cpp runs them against the fake devices.
//
// Route: few query rows per K/V head against many keys (decode_suits) go to the decode kernels
// where the device can run them for this shape, else to the fused kernels; a call against a cache
// always decodes (its K and V are the cache's texels). The choice is made here, from the plans'
// own refusals, never by catching an exception.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/call_io.hpp"
#include "kernels/flash_cpu.hpp"
#include "kernels/flash_gpu.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/sdpa_decode.hpp"
#include "kernels/settings.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

enum class sdpa_route { fused, decode };

/// A region of the call's inputs buffer.
struct region {
    std::uint64_t at = 0, bytes = 0;
};

/// What a decode call against a cache knows of the cache (kv_cache.cpp).
struct cache_desc {
    std::uint32_t capacity = 0;  ///< rows per (batch, kv head): the K/V views' row stride
    bool fp16 = false;           ///< K and V stored as float16 texels
};

struct sdpa_plan {
    sdpa_route route = sdpa_route::fused;
    bool q_fp16 = false;   ///< Q stored as float16 (precision fp16; both routes: README, "fp16")
    bool kv_fp16 = false;  ///< K and V stored as float16
    float scale = 1.0f;

    // ---- fused route ----
    flash_layout layout;  ///< the kernels' view of [q | k | v] in the inputs buffer, and of the output
    kernel_family family = kernel_family::gpu;
    flash_cpu_plan cpu;
    flash_gpu_plan gpu;
    bool weights = false;           ///< return_weights: flash_weights.comp after the kernel
    std::uint64_t state_bytes = 0;  ///< (max, sum) per row, where key chunks or the weights need it

    // ---- decode route ----
    decode_plan decode;

    // ---- buffers ----
    region q, k, v, mask_bits, additive;  ///< in role::inputs (k, v empty against a cache)
    std::uint64_t out_count = 0, weights_count = 0;
    buffer_plan buffers;
    std::vector<download> downloads;  ///< the output, then the weights where asked

    [[nodiscard]] bool fused() const { return route == sdpa_route::fused; }
    [[nodiscard]] bool cpu_family() const { return family == kernel_family::cpu; }
    [[nodiscard]] kernel_family kernel() const { return fused() ? family : decode.family; }
};

/// Q, K and V from the host. Throws limit_exceeded / unavailable (naming the limit) where no route
/// can run the call on this device.
sdpa_plan plan_sdpa(const sdpa_problem& problem, const device_desc& desc, const settings& set);

/// Q from the host, K and V (problem.shape.kv_len rows) in a cache described by `cache`: always the
/// decode route. Throws limit_exceeded / unavailable where the decode kernels cannot run it.
sdpa_plan plan_sdpa_cache(const sdpa_problem& problem, const cache_desc& cache, const device_desc& desc,
                          const settings& set);

}  // namespace qkv::vulkan::detail
