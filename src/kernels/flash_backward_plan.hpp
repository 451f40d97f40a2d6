// The backward pass's kernels (shaders/contract/backward.h): their plan for one call on one device
// (tiles, padding, key and row chunks, the scratch they need), a pure function of the layout
// (flash_layout, the forward's view of the call), what the call asks for (mask and sink gradients,
// dropout), a device description and the settings (part of qkv_plan: no Vulkan). Their recording:
// flash_backward.hpp.
//
// Deterministic: dq is accumulated by one invocation per row over the keys in order, dk and dv by
// one invocation per key over the query heads and their rows in order, the sinks' and the mask's
// gradients by one invocation per output in (b, h, i, j) order; nothing is accumulated by atomics.
// The tiles depend on the device description only, so one device gives the same bits on every run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "contract/backward.h"
#include "kernels/flash_coop_backward_plan.hpp"
#include "kernels/flash_layout.hpp"
#include "plan/settings.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// What a backward call asks for beyond dq, dk and dv.
struct flash_bwd_request {
    bool d_sinks = false;  ///< the sinks' gradient (the problem has sinks)
    bool d_mask = false;   ///< the additive mask's gradient, folded onto the mask's own dimensions
    /// The additive mask's dimensions (b, h, l, s), each 1 or the problem's (with d_mask).
    std::uint32_t mask_dims[4] = {1, 1, 1, 1};
    bool check = true;  ///< check that out and lse are the problem's forward results (BWD_CHECK)
    /// dk and dv by the cooperative-matrix family's kernel (settings::backward_coop).
    bool coop = false;
};

/// A fold (flash_bwd_fold.comp): a (b, h, l, s) tensor summed onto (mb, mh, ml, ms).
struct bwd_fold {
    bool used = false;
    std::uint32_t dims[4] = {1, 1, 1, 1}, onto[4] = {1, 1, 1, 1};
    [[nodiscard]] std::uint32_t outputs() const { return onto[0] * onto[1] * onto[2] * onto[3]; }
    [[nodiscard]] std::uint64_t terms() const;  ///< terms per output
};

struct flash_bwd_plan {
    // Tiles (bwd_spec): invocations per workgroup (one subgroup), dq's rows per invocation and
    // keys per step, dk/dv's keys per invocation and rows per step, the widths in texels.
    std::uint32_t wg = 8, rpi = 2, kps = 8, kpi = 2, rps = 8, d4 = 1, dv4 = 1;
    bool shuffle = false;  ///< the shuffle variants (gemm_tiles.hpp: cpu_shuffle)
    /// dk/dv fetches a step's Q rows and dO rows in one gather (flash_bwd_dkdv.comp: PAIRED): with
    /// shuffles, equal widths and a subgroup of at least twice the step's rows.
    [[nodiscard]] bool paired() const { return shuffle && d4 == dv4 && 2 * rps <= wg; }
    std::uint32_t npad_q = 0;      ///< Q and dO texel rows per (batch, query head)
    std::uint32_t npad_kv = 0;     ///< K and V texel rows per (batch, K/V head)
    std::uint32_t dq_chunk = 0;    ///< keys per dq dispatch (a multiple of kps)
    std::uint32_t dkdv_chunk = 0;  ///< row slots per dk/dv dispatch (a multiple of rps)
    std::uint32_t fold_chunk = 0;  ///< terms per fold dispatch
    bool half = false;             ///< RGBA16F texels (Q, K, V and dO stored as float16)
    std::uint32_t extras = 0;      ///< BWD_WRITE_DS | BWD_CHECK
    bwd_fold sinks, mask;          ///< the folds of the sinks' and the mask's gradients, where used

    // The texel buffer: K's flags (per (batch, K/V head)), Q's and dO's (per (batch, query head)),
    // then Q, dO, K, V, each region aligned for a view (Q and dO side by side: one view over both
    // where dk/dv fetches a step's Q and dO rows in one gather, paired()).
    std::uint64_t k_flags_at = 0, q_flags_at = 0, flags_bytes = 0;
    std::uint64_t q_at = 0, k_at = 0, v_at = 0, do_at = 0, texel_bytes_total = 0;
    std::uint64_t q_texels = 0, k_texels = 0, v_texels = 0, do_texels = 0;
    std::uint64_t stats_texels = 0;  ///< one RGBA32F texel per padded query row
    // The scratch buffer: the row statistics, the check's sums, the sinks' row terms.
    std::uint64_t stats_at = 0, sums_at = 0, sink_terms_at = 0, scratch_bytes = 0;
    std::uint64_t ds_bytes = 0;  ///< the (B, Hq, L, S) dS scratch of the mask's gradient (0: none)
    /// The fused order (contract/backward.h): dk/dv first, storing every dR (BWD_STORE_DR), then dq
    /// from them (flash_bwd_dq_dr.comp): five N²·d products instead of seven. Taken where the
    /// shuffle variants run (a CPU device: the order measured, bench/RESULTS.md), without the
    /// mask's gradient (its dS scratch is the two-kernel order's) and with the key blocks below
    /// the loop limit; otherwise the two-kernel order.
    bool fused = false;
    std::uint32_t key_blocks = 0;  ///< dk/dv's key blocks per (batch, K/V head): ceil(max(S, 1) / dkdv_block())
    /// The fused order's chunks: the dR scratch (and its check sums) holds fused_heads (batch,
    /// query head)s, within fused_budget and the device's storage range; dk/dv over a chunk's
    /// heads, then dq over them, chunk after chunk over the one scratch. fused_heads is a multiple
    /// of the group (whole (batch, K/V head)s) or, where one K/V head's group does not fit, a part
    /// of a group (dk/dv then resumes its accumulators from the outputs, as its row chunks do).
    /// The chunks change no bit: each output has the same writer and order of accumulation.
    std::uint32_t fused_heads = 0;
    std::uint64_t dr_bytes = 0, dr_sums_at = 0, dr_sums_bytes = 0;
    /// dq, dk and dv by flash_coop_bwd_dq.comp and flash_coop_bwd_dkdv.comp
    /// (flash_bwd_request::coop): their tiles, their row blocks per (batch, query head) and key
    /// blocks per (batch, K/V head) (the scalar kernels' careful pipelines keep theirs).
    bool coop = false;
    coop_bwd_tiles coop_tiles;
    std::uint32_t coop_row_blocks = 0, coop_key_blocks = 0;  ///< the dR scratch and its check sums
    [[nodiscard]] std::uint64_t fused_scratch_bytes() const { return fused ? dr_sums_at + dr_sums_bytes : 0; }

    [[nodiscard]] std::uint64_t texel_bytes() const { return half ? 8 : 16; }
    [[nodiscard]] std::uint32_t dq_block() const { return wg * rpi; }
    [[nodiscard]] std::uint32_t dkdv_block() const { return wg * kpi; }
    /// Dispatches of the dq and dk/dv kernels (one pipeline each; twice that with careful ones).
    [[nodiscard]] std::uint32_t dispatches(const flash_layout& l) const;
    /// The fused order's chunks of (batch, query head)s, in order (fused_heads each, the last of a
    /// K/V head's group or of the batch fewer): [first, first + count).
    struct head_chunk {
        std::uint32_t first = 0, count = 0;
    };
    [[nodiscard]] std::vector<head_chunk> fused_chunks(const flash_layout& l) const;
};

/// The largest dR scratch (with its check sums) of one chunk of the fused order: 512 MiB, six
/// (batch, head)s at N = 4096 (flash_bwd_plan::fused_heads).
inline constexpr std::uint64_t fused_budget = std::uint64_t{512} << 20;

/// Plans the kernels for `layout` (its fp16 flag: RGBA16F texels) on the device `desc`
/// describes. settings::max_fused_keys (if not 0) caps the keys of a dq dispatch and the row
/// slots of a dk/dv dispatch, settings::max_fused_heads the fused order's heads per chunk
/// (test hooks: the chunked paths at small sizes). A pure function.
flash_bwd_plan plan_flash_backward(const device_desc& desc, const flash_layout& layout, const flash_bwd_request& r,
                                   const settings& set);

/// Why this device cannot run the plan (empty: it can), with `limit` as flash_cpu_refusal's.
struct flash_bwd_refusal {
    std::string why;
    bool limit = false;
};
flash_bwd_refusal check_flash_backward(const device_desc& desc, const flash_bwd_plan& plan);

}  // namespace qkv::vulkan::detail
