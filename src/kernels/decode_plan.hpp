// Split-S decode (flash-decoding) for small q_len and long kv_len: its plan, a pure function of
// the shape and the device description (part of qkv_plan: no Vulkan; tests/decode_plan_test.cpp
// runs it against fake devices), and the push block it leads to. The recording: sdpa_decode.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "contract/decode.h"
#include "kernels/flash_coop_plan.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/device_info.hpp"

namespace qkv::vulkan::detail {

/// The split's limits, shared by the decode plan and the paged plan (paged_plan.hpp).
// llvmpipe ends every loop of an invocation after 65,535 iterations in all, silently. Each plan
// keeps its bound (decode_plan::max_loop, paged_plan::max_loop) at or below this, a quarter of the limit.
inline constexpr std::uint32_t decode_loop_budget = 16384;
// The merge loops twice over a row's chunks.
inline constexpr std::uint32_t decode_max_chunks_total = 4096;
// Workgroups a call aims for (row blocks x chunks x groups): enough for every thread of a CPU
// device (llvmpipe gives each thread a contiguous range), and for the compute units of a GPU.
inline constexpr std::uint32_t decode_target_groups_cpu = 64, decode_target_groups_gpu = 512;
// No chunk shorter than this (unless the keys run out): below it the partials cost more than the
// parallelism gains.
inline constexpr std::uint32_t decode_min_chunk_cpu = 1024, decode_min_chunk_gpu = 256;

/// What a decode call asks for.
struct decode_request {
    sdpa_shape shape{};
    std::uint32_t kv_stride = 0;  ///< rows per (batch, kv head) in the K/V texel buffers (>= kv_len)
    std::uint32_t masks = 0;      ///< contract::MASK_FLAG_* bits (mask.h)
    kernel_family kernel = kernel_family::automatic;
    /// 0: the split is chosen for the device; n > 0: at most n chunks (1 = no split), unless the
    /// per-invocation loop limit needs more.
    std::uint32_t max_chunks = 0;
    std::uint32_t features = 0;                            ///< contract/score.h's SCORE_* bits
    std::uint32_t kv_format = contract::DECODE_KV_TEXELS;  ///< texels, or q8_0 / q4_0 blocks
    /// The keys [kv_first, kv_end) some query row may see (causal and the window); the chunks cover
    /// only these (kv_end is capped at kv_len).
    std::uint32_t kv_first = 0, kv_end = 0xffffffffu;
    /// With kernel == coopmat: the cooperative-matrix family's tiles for this call (check_coop,
    /// by the caller, which holds the device description).
    coop_tiles coop{};
};

/// What the recorder knows of V: finite (the plain kernel), maybe NaN or Inf (the careful one), or
/// known only to the device (one pipeline with both paths, the flags word choosing: contract/decode.h,
/// DECODE_VALUES_GATED).
enum class decode_values { finite, nonfinite, gated };

/// The decode kernel's shape for one call.
struct decode_plan {
    kernel_family family = kernel_family::row_tiles;
    bool subgroup = false;  ///< gpu variant: tile maxima by subgroupMax (else a shared-memory tree)
    bool shuffle = false;   ///< cpu variant: K and V rows shared by subgroupShuffle (cpu_shuffle in flash_cpu.hpp)
    /// The merge's guard form (a call over device tensors) raises its output flag by a subgroup
    /// vote (sdpa_merge.comp, QKV_SUBGROUP_VOTE): the device offers votes in compute shaders and is
    /// not a CPU (settings::decode_vote: a CPU too).
    bool vote = false;
    std::uint32_t wg = 8;   ///< invocations per workgroup
    std::uint32_t rpi = 1;  ///< cpu: rows per invocation; gpu: rows per workgroup
    std::uint32_t kps = 8;  ///< cpu: keys per step; gpu: keys per tile (= wg)
    std::uint32_t e4 = 1, ev4 = 1, masks = 0;
    std::uint32_t features = 0, kv_format = contract::DECODE_KV_TEXELS;
    /// cpu: 0, every texel of a row unrolled; n > 0, the wide form, whose loops over E and Ev take
    /// n texels an iteration (n divides e4 and ev4; 8, one block, for quantized K/V)
    std::uint32_t tb = 0;
    std::uint32_t kv_first = 0, kv_end = 0;  ///< the keys the chunks cover
    std::uint32_t groups = 0;                ///< batch x kv_heads
    std::uint32_t rows = 0;                  ///< G x q_len rows per group
    std::uint32_t q_len = 0, kv_len = 0, kv_stride = 0, d = 0, dv = 0, q_heads = 0;
    coop_tiles coop{};             ///< family coopmat: its tiles (the request's), one subgroup per workgroup
    std::uint32_t row_blocks = 0;  ///< per group
    std::uint32_t chunk = 0;       ///< keys per chunk, a multiple of kps
    std::uint32_t chunks = 0;      ///< P
    std::uint32_t max_loop = 0;    ///< an upper bound of the loop iterations of one invocation
    /// Why the kernel cannot run this request (a limit of the kernel, named with its value); empty
    /// when it can. Only try_plan_decode returns a plan with a refusal.
    std::string refusal;

    [[nodiscard]] std::uint64_t q_texels() const { return std::uint64_t{groups} * rows * e4; }
    [[nodiscard]] std::uint64_t partials() const { return std::uint64_t{groups} * rows * chunks; }
    [[nodiscard]] std::uint64_t stats_bytes() const { return partials() * 8; }
    [[nodiscard]] std::uint64_t acc_bytes() const { return partials() * ev4 * 16; }
    [[nodiscard]] std::uint64_t out_bytes() const { return std::uint64_t{groups} * rows * dv * 4; }
    /// The kernel's constants for what is known of V (shaders/values.glsl); `guard`: the kernel runs
    /// the overflow guard's rows pass over q (contract/decode.h, DECODE_SPEC_GUARD).
    [[nodiscard]] contract::decode_spec spec(decode_values values, bool guard = false) const;
};

/// Plans a decode call on a device described by `info`: a pure function. Where the shape cannot
/// be run (more chunks or rows than the kernel supports), the plan's `refusal` says why.
decode_plan try_plan_decode(const device_info& info, const decode_request& request, const settings& set = {});
/// The same, throwing limit_exceeded with the refusal.
decode_plan plan_decode(const device_info& info, const decode_request& request, const settings& set = {});

/// Whether the split-S decode kernels suit this problem better than the fused ones: few query
/// rows per K/V head (small q_len), many keys, no attention weights requested.
bool decode_suits(const sdpa_shape& shape, bool return_weights);

/// The push block's per-problem fields: scale, causal offset, head counts, mask strides, and the
/// power of two the values accumulate scaled by (sdpa_guard.hpp: value_scale).
contract::decode_push decode_push_for(const decode_plan& plan, const sdpa_problem& problem, float v_scale);

}  // namespace qkv::vulkan::detail
