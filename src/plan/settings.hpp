// The settings of a context that the planners read: tuning overrides (from the environment) and
// the test hooks (testing::hooks, qkv/vulkan/testing.hpp). One value, made once when a context is
// created (read_settings, the one place that reads the tuning variables), and passed to every
// plan, so that every plan stays a pure function of the problem, a device description and these
// settings.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/vulkan/device_info.hpp"
#include "qkv/vulkan/testing.hpp"

namespace qkv::vulkan::detail {

/// settings::coop_isolate: which of the cooperative-matrix kernel's steps leave the matrix units.
enum class coop_isolate_mode : std::uint32_t { none, pv, rescale };

struct settings {
    // ---- tuning, from the environment (for measurements; each refuses a value it cannot use) ----
    /// QKV_CPU_SHUFFLE=0: the cpu family's kernels never share rows by subgroupShuffle (1, the
    /// default: where the device allows it, cpu_shuffle in gemm_tiles.hpp).
    bool cpu_shuffle = true;
    /// QKV_FLASH_CPU_TILES=rows,keys: the fused cpu family's rows per invocation and keys per step
    /// (0: chosen by plan_flash_cpu).
    std::uint32_t flash_cpu_rows = 0, flash_cpu_keys = 0;
    /// QKV_PROJECT_TILES=rows,cols: the projection's texel variant's tile (0: chosen).
    std::uint32_t project_rows = 0, project_cols = 0;
    /// QKV_PROJECT_TEXELS=0: the projection keeps its storage-buffer variant.
    bool project_texels = true;
    /// QKV_BACKWARD_TILES=rows,keys,keys,rows: the backward's dq rows per invocation and keys per
    /// step, dk/dv keys per invocation and rows per step (0: chosen by plan_flash_backward).
    std::uint32_t backward_rows = 0, backward_keys = 0, backward_own_keys = 0, backward_rows_step = 0;
    /// QKV_BACKWARD_FUSED=0: the backward keeps its two-kernel order (dq, then dk/dv, each
    /// recomputing P) where the plan would take the fused one (flash_bwd_plan::fused; for
    /// before/after measurements and the tests of both orders).
    bool backward_fused = true;
    /// QKV_BACKWARD_COOP=1: dk and dv by the cooperative-matrix family's kernel
    /// (flash_coop_bwd_dkdv.comp; refused where its plan refuses), dq by the other family's.
    bool backward_coop = false;
    /// QKV_DECODE_CPU_TILES=rows,keys: the cpu decode kernel's rows per lane and keys per step
    /// (0: chosen by try_plan_decode).
    std::uint32_t decode_cpu_rows = 0, decode_cpu_keys = 0;
    /// QKV_COOP_TILES=subgroups,keys: the cooperative-matrix family's subgroups per workgroup and
    /// keys per K/V tile (0: chosen by choose_coop_tiles).
    std::uint32_t coop_subgroups = 0, coop_keys = 0;
    /// QKV_COOP_UNVERIFIED=1: the cooperative-matrix family runs where asked for on a device whose
    /// gate says it has not been seen right there (coop_gate_effect::unverified), to measure a fix;
    /// never chosen automatically there.
    bool coop_unverified = false;
    /// QKV_COOP_ISOLATE=pv|rescale: a fault-finding knob for a device where the family is wrong
    /// (bench/gpu/check.sh's probe). `pv`: every K/V tile takes the careful path (P·V and O's rescale
    /// per element in float32; Q·Kᵀ and O's loads and stores stay on the matrix units); `rescale`:
    /// only O's rescale by α goes per element through the staging tile, P·V stays on the matrix
    /// units. The results are the same numbers either way (within float16 rounding of P).
    coop_isolate_mode coop_isolate = coop_isolate_mode::none;

    // ---- test hooks (testing::hooks) ----
    std::uint32_t max_fused_keys = 0;           ///< testing::hooks::max_fused_keys_per_dispatch
    std::uint32_t max_fused_heads = 0;          ///< testing::hooks::max_fused_backward_heads
    std::optional<device_info> fused_tiles_as;  ///< testing::hooks::fused_tiles_as
    std::uint32_t max_decode_chunks = 0;        ///< testing::hooks::max_decode_chunks
    std::uint32_t decode_unrolled_texels = 0;   ///< testing::hooks::decode_unrolled_texels
    bool decode_vote = false;                   ///< testing::hooks::decode_vote
    bool force_staging = false;                 ///< testing::hooks::force_staging
    std::uint64_t kv_storage_range = 0;         ///< testing::hooks::kv_storage_range

    /// The device description the gpu family's tiles are chosen for (nullptr: the real one).
    [[nodiscard]] const device_info* tiles_as() const { return fused_tiles_as ? &*fused_tiles_as : nullptr; }
    /// Whether a hook of the fused kernels is set: such a call is meant for them, not for decode.
    [[nodiscard]] bool fused_hooks() const { return max_fused_keys != 0 || fused_tiles_as.has_value(); }
};

/// The tuning variables and `hooks`, once. Throws qkv::invalid_argument naming a variable whose
/// value cannot be used (e.g. "QKV_CPU_SHUFFLE=on: expected 0 (never) or 1 ...").
settings read_settings(const testing::hooks& hooks);

}  // namespace qkv::vulkan::detail
