// The plan of an sdpa call (context::sdpa): which route runs it (the fused kernels of one family,
// or the split-S decode kernels), that route's own plan, and where every tensor lives in the call's
// buffers (run/io.hpp). plan_sdpa (Q, K and V from the host) and plan_sdpa_cache (K and V in a
// kv_cache) are pure functions of the problem's shapes and options (no data is read), a device
// description and the settings: tests/sdpa_plan_test.cpp runs them against the fake devices.
//
// Route: few query rows per K/V head against many keys (decode_suits) go to the decode kernels
// where the device can run them for this shape, else to the fused kernels; a call against a cache
// always decodes (its K and V are the cache's texels or blocks). The choice is made here, from the
// plans' own refusals, never by catching an exception.
//
// The rules beyond PyTorch's SDPA (qkv/runtime/sdpa.hpp: window, softcap, ALiBi, sinks, lse) are
// the plan's `features` (contract/score.h), the kernels' FEATURES constant; their values go to a
// params region of the inputs (put_score_params). K/V storage (options.kv_type): the decode route
// stores K and V as the type says (RGBA32F or RGBA16F texels, or ggml's q8_0 / q4_0 blocks, which
// the decode kernel dequantizes); the fused route rounds them on the host (qkv::round_trip) and
// uploads float32 (float16 when Q and K/V are both f16), the same values in float32 arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/decode_plan.hpp"
#include "kernels/flash_coop_plan.hpp"
#include "kernels/flash_cpu_plan.hpp"
#include "kernels/flash_gpu_plan.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/score_positions.hpp"
#include "plan/buffers.hpp"
#include "plan/settings.hpp"
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
    std::uint32_t capacity = 0;                ///< rows per (batch, kv head): the K/V row stride
    element_type kv_type = element_type::f32;  ///< f32 / f16 texels, or q8_0 / q4_0 blocks
    /// The storage is read only through texel views (past maxStorageBufferRange): no family that
    /// reads K and V rows from storage buffers (the cooperative-matrix one).
    bool texels_only = false;
};

struct sdpa_plan {
    sdpa_route route = sdpa_route::fused;
    bool q_fp16 = false;   ///< Q stored as float16 (precision fp16; both routes: README, "fp16")
    bool kv_fp16 = false;  ///< K and V stored as float16 (texels on the decode route, the binding's type on the fused)
    element_type kv_type = element_type::f32;  ///< how K and V are stored (stored_kv_type, or the cache's)
    float scale = 1.0f;
    std::uint32_t features = 0;  ///< contract/score.h's SCORE_* rules of the call

    // ---- fused route ----
    flash_layout layout;  ///< the kernels' view of [q | k | v] in the inputs buffer, and of the output
    kernel_family family = kernel_family::block_tiles;
    flash_cpu_plan cpu;
    flash_gpu_plan gpu;
    flash_coop_plan coop;  ///< where the cooperative-matrix family can run (coop_refusal)
    bool weights = false;  ///< return_weights: flash_weights.comp after the kernel
    /// Rounded on the host before the upload as float32: Q through float16 (precision fp16 when K/V
    /// are not f16), K and V through kv_type (when it is not the binding's own type).
    bool round_q = false, round_kv = false;
    std::uint64_t state_bytes = 0;  ///< (max, sum) per row, where key chunks or the weights need it

    // ---- decode route ----
    decode_plan decode;

    // ---- buffers ----
    region q, k, v, mask_bits, additive;  ///< in role::inputs (k, v empty against a cache)
    region params;                        ///< in role::inputs: the score params (put_score_params)
    std::uint64_t out_count = 0, weights_count = 0;
    std::uint64_t lse_count = 0, lse_at = 0;  ///< return_lse: floats at byte lse_at of role::out
    buffer_plan buffers;
    std::vector<download> downloads;  ///< the output, then the weights where asked, then the lse where asked

    [[nodiscard]] bool fused() const { return route == sdpa_route::fused; }
    [[nodiscard]] bool cpu_family() const { return family == kernel_family::row_tiles; }
    [[nodiscard]] kernel_family kernel() const { return fused() ? family : decode.family; }
    /// Index of the lse in `downloads`.
    [[nodiscard]] std::size_t lse_download() const { return downloads.size() - 1; }
    [[nodiscard]] bool kv_blocks() const { return is_quantized(kv_type); }
};

/// The contract/score.h features of a problem: softcap, ALiBi, the window, sinks, lse, dropout.
std::uint32_t score_features(const sdpa_problem& problem);
/// Bytes of the score params of a problem (score_params, then a (slope, sink) pair per query head).
std::uint64_t score_params_bytes(const sdpa_shape& shape);
/// Writes the score params of `problem` (its features `features`): the window's sides (clamped to
/// kv_len + q_len), the softcap, dropout's seed, offset, threshold and scale, each head's ALiBi
/// slope (qkv::alibi_slope, float64 rounded once) and sink (-inf without).
void put_score_params(std::byte* at, const sdpa_problem& problem, std::uint32_t features);

/// Q, K and V from the host. Throws limit_exceeded / unavailable (naming the limit) where no route
/// can run the call on this device.
sdpa_plan plan_sdpa(const sdpa_problem& problem, const device_desc& desc, const settings& set);

/// The fused route alone, whatever the shape: the layout the backward pass plans on. Throws as
/// plan_sdpa.
sdpa_plan plan_sdpa_fused(const sdpa_problem& problem, const device_desc& desc, const settings& set);

/// Q from the host, K and V (problem.shape.kv_len rows) in a cache described by `cache`: always the
/// decode route. Throws limit_exceeded / unavailable where the decode kernels cannot run it.
sdpa_plan plan_sdpa_cache(const sdpa_problem& problem, const cache_desc& cache, const device_desc& desc,
                          const settings& set);

}  // namespace qkv::vulkan::detail
