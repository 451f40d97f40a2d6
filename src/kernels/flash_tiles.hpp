// The fused kernel's (GPU family, shaders/flash.comp) tile choice and key-chunk length: pure
// functions of a device description, so they are unit-tested against fake devices without one.
#pragma once

#include <cstdint>
#include <vector>

#include "contract/flash.h"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// The widest head (of Q/K and of V) both fused families take, in attention() and sdpa alike
/// (DeepSeek's MLA: 576 for Q and K, 512 for V): the block_tiles family's tiles shrink to fit
/// (flash_tiles.cpp), the row_tiles family keeps one row per invocation. Wider heads: the staged
/// path.
inline constexpr std::uint32_t fused_max_head = 576;

/// Tile shape of the fused kernel (GPU family, shaders/flash.comp): WG invocations in WG / team
/// row teams of `team` lanes; BR query rows per workgroup (br / (wg / team) per team); BC keys per
/// K/V tile; the head widths rounded up (they size the shared tiles and the register blocks).
struct flash_tiles {
    std::uint32_t wg = 64, br = 16, bc = 32, d_max = 64, dv_max = 64, team = 8;
    std::uint32_t q_regs = 0;             ///< 1: the query rows stay in registers (else in shared memory)
    std::uint32_t vec4 = 0;               ///< 1: widths, strides and offsets allow vec4 loads (set by plan_flash_gpu)
    std::uint32_t fallback = 1;           ///< 0: subgroups of `team` lanes are guaranteed: no shared reductions
    bool subgroup = false;                ///< the team reductions may use subgroupMax / subgroupAdd
    std::uint32_t required_subgroup = 0;  ///< requiredSubgroupSize of the pipeline (0: none)
    [[nodiscard]] std::uint32_t teams() const { return wg / team; }
    [[nodiscard]] std::uint32_t rows_per_team() const { return br / teams(); }
    [[nodiscard]] std::uint32_t shared_bytes() const {
        const std::uint32_t d4 = d_max / 4, dv4 = dv_max / 4;
        return 16 * (bc * (d4 + 1) + bc * dv4 + (q_regs ? 1 : br * d4)) +
               4 * (br * bc + br + 2 * (fallback ? br * team : 1)) + 8;
    }
    /// The kernel's constants for these tiles and the call's score rules (contract/score.h's SCORE_* bits).
    [[nodiscard]] contract::flash_spec spec(std::uint32_t features = 0) const {
        return {wg, br, bc, d_max, dv_max, team, q_regs, vec4, fallback, features};
    }
};

/// The tiles of the fused kernel for this device and head widths: a pure function of the device
/// description (type, subgroup size, shared memory and invocation limits), unit-tested against
/// fake devices. Where `control` lets the pipeline require the team size as its subgroup size
/// (full subgroups), the shared-memory reduction buffers are left out.
flash_tiles choose_flash_tiles(const device_info& info, std::uint32_t seq, std::uint32_t d, std::uint32_t dv,
                               const subgroup_control& control = {});

/// The device description the fused kernel's tiles are chosen for: `info` itself, or (a test
/// hook, context_options::fused_tiles_as) `as` with the limits of `info` where they are lower and
/// subgroup operations only where both have them.
device_info flash_tiles_device(const device_info& info, const device_info* as);

/// Keys per dispatch of the fused kernel: all of them, except on CPU implementations, where one
/// invocation may run at most 65,535 loop iterations in all (llvmpipe ends its loops silently
/// after that). There each dispatch covers as many K/V tiles as fit in that budget, and the
/// online-softmax state is carried to the next dispatch in a buffer of B x H x N x 2 floats.
/// `at_most` (if not 0) lowers it further; `tiles_as` as for flash_tiles_device.
std::uint32_t flash_chunk_keys(const device_info& info, const subgroup_control& control, std::uint32_t seq,
                               std::uint32_t d, std::uint32_t dv, std::uint32_t at_most = 0,
                               const device_info* tiles_as = nullptr);
/// The same for tiles already chosen (`t`, for `info` as flash_tiles_device sees it) over kv_len keys.
std::uint32_t flash_chunk_keys(const device_info& info, const flash_tiles& t, std::uint32_t kv_len,
                               std::uint32_t at_most = 0);

}  // namespace qkv::vulkan::detail
