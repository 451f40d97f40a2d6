// The cooperative-matrix family of the fused attention kernel (shaders/flash_coop.comp): its tiles
// (chosen from the device's own VkCooperativeMatrixPropertiesKHR list), the per-driver gates, the
// checks that decide whether it can run, and its plan for the fused route (the split-K decode
// route's tiles come from here too: kernels/decode_plan.hpp). Every choice is a pure function of a
// device description, the call's shape and the settings (part of qkv_plan: no Vulkan;
// tests/coop_plan_test.cpp runs them against fake NVIDIA, AMD, Intel and lavapipe devices). The
// recording: flash_coop.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "contract/coop.h"
#include "kernels/flash_layout.hpp"
#include "plan/settings.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// The family's tiles on one device: subgroups of `lanes` lanes, each owning row_tiles·m query
/// rows; K and V tiles of bc keys; the head widths rounded up to whole matrices.
struct coop_tiles {
    std::uint32_t lanes = 0, subgroups = 1;
    std::uint32_t m = 0, n = 0, k = 0;  ///< a row of the device's list: f16·f16 + f32 -> f32, subgroup scope
    std::uint32_t row_tiles = 1, bc = 0, d_pad = 0, dv_pad = 0;
    std::uint32_t required_subgroup = 0;  ///< requiredSubgroupSize of the pipeline (0: the device's is fixed)
    std::uint32_t vec4 = 0;               ///< 1: f16vec4 loads (set by the plans, from the strides)
    /// settings::coop_isolate (QKV_COOP_ISOLATE): steps taken off the matrix units, for fault finding.
    coop_isolate_mode isolate = coop_isolate_mode::none;

    [[nodiscard]] std::uint32_t wg() const { return subgroups * lanes; }
    /// Query rows per workgroup.
    [[nodiscard]] std::uint32_t rows() const { return subgroups * row_tiles * m; }
    /// Shared memory of flash_coop.comp for these tiles (its declarations, in bytes).
    [[nodiscard]] std::uint32_t shared_bytes() const;
    /// The kernel's constants for the call's score rules, route and values (`careful`: V may hold
    /// a NaN or Inf; a pipeline without the careful path compiles faster and skips the checks;
    /// `isolate` builds it always: contract/coop.h's COOP_CAREFUL_* values).
    [[nodiscard]] contract::coop_spec spec(std::uint32_t features, bool split, bool careful) const {
        const std::uint32_t values = isolate == coop_isolate_mode::pv        ? contract::COOP_CAREFUL_EVERY_TILE
                                     : isolate == coop_isolate_mode::rescale ? contract::COOP_CAREFUL_STAGED_RESCALE
                                     : careful                               ? contract::COOP_CAREFUL_NONFINITE
                                                                             : contract::COOP_CAREFUL_NONE;
        return {wg(), lanes, m, n, k, row_tiles, bc, d_pad, dv_pad, vec4, features, split ? 1u : 0u, values};
    }
};

/// What a driver gate does (coop_gates): keeps the family from the automatic choice (it still runs
/// where asked for); refuses it on that driver altogether; or refuses it there because it has not
/// been seen right there (or was seen wrong), unless QKV_COOP_UNVERIFIED=1 (settings::coop_unverified)
/// lets it run where asked for, for measuring a fix on such a device.
enum class coop_gate_effect { manual_only, refused, unverified };

/// One row of the per-driver gates: the drivers it matches (`applies`, a pure function of the
/// device description), what it does and why.
struct coop_gate {
    const char* name;
    bool (*applies)(const device_desc& desc);
    coop_gate_effect effect;
    const char* reason;
};

/// The table of per-driver gates, the one place they are written (docs/kernels.md lists them).
std::span<const coop_gate> coop_gates();

/// Whether and how the family may run on a device, for a call: `why` empty when it can;
/// `limit` when the refusal is a limit of the call's size (limit_exceeded) rather than something
/// the device or the build lacks (unavailable); `automatic` when the automatic choice may take it
/// (no gate keeps it manual).
struct coop_verdict {
    std::string why;
    bool limit = false;
    bool automatic = false;
};

/// The tiles for head widths d and dv on `desc` (split: the decode route's, one subgroup per
/// workgroup), or a verdict saying why there are none. Reads the device's list for the largest
/// f16·f16 + f32 -> f32 subgroup-scope shape whose lanes and rows fit the kernel's softmax step.
/// settings::coop_subgroups and coop_keys (QKV_COOP_TILES) override the subgroups and the keys per
/// tile (invalid_argument where the keys are not a multiple of the shape's).
coop_verdict choose_coop_tiles(const device_desc& desc, std::uint32_t d, std::uint32_t dv, bool split,
                               const settings& set, coop_tiles& tiles);

/// Whether the family can run a call with `layout` (its fp16 flag: Q, K and V stored as float16)
/// on `desc`, with the tiles in `tiles`: the build's shaders, the device's extension and shapes,
/// the gates, float16 storage, the head and head-count limits.
coop_verdict check_coop(const device_desc& desc, const flash_layout& layout, bool split, const settings& set,
                        coop_tiles& tiles);

/// The fused route's plan: the tiles and the keys per dispatch (all of them but on CPU devices,
/// whose loops end after 65,535 iterations: the state is carried between dispatches as
/// flash.comp's is).
struct flash_coop_plan {
    coop_tiles tiles;
    std::uint32_t chunk_keys = 0;
    [[nodiscard]] std::uint32_t dispatches(std::uint32_t kv_len) const {
        return kv_len == 0 ? 1 : (kv_len + chunk_keys - 1) / chunk_keys;
    }
};

/// The fused plan for `layout` on `desc`, or throws limit_exceeded / unavailable with check_coop's
/// reason. `set.max_fused_keys` (a test hook) caps the keys per dispatch. A pure function.
flash_coop_plan plan_flash_coop(const device_desc& desc, const flash_layout& layout, const settings& set);

/// An upper bound of the loop iterations one invocation of the kernel runs per K/V tile (every loop
/// counted as if it were not unrolled): the decode route sizes its chunks by it on CPU devices.
std::uint64_t coop_loops_per_tile(const coop_tiles& tiles);

/// The push block of the kernel for `layout` (all keys; no chunk flags; Q at element 0).
contract::coop_push coop_push_for(const flash_layout& layout);

}  // namespace qkv::vulkan::detail
