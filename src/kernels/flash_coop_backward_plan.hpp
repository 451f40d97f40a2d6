// The cooperative-matrix family's backward kernels: their plan for one call on one device, a pure
// function of the forward's layout (flash_layout), what the call asks for (flash_bwd_request), a
// device description and the settings (part of qkv_plan: no Vulkan; tests/coop_backward_plan_test.cpp
// runs it against the fake devices with and without cooperative-matrix shapes).
//
// FlashAttention-2's backward as matrix products of the device's own shape (the forward's:
// choose_coop_tiles reads it from the device's VkCooperativeMatrixPropertiesKHR list, f16 A and B,
// f32 accumulators), with the row-wise work between them done element by element in shared memory:
//   dk/dv kernel, one workgroup per block of keys of one (batch, K/V head), over the group's query
//   heads and their rows in steps of `dkdv_rows`:
//     Sᵀ = K·Qᵀ (keys x rows, f32) -> Pᵀ = e^(rule(Sᵀ) - lse') in f16 (the score rules, the masks)
//     dPᵀ = V·dOᵀ (f32) -> dSᵀ = Pᵀ ∘ (dPᵀ - D) (softcap's 1 - tanh² as well) in f16
//     dV += Pᵀ·dO, dK += (scale·dSᵀ)·Q (f32 accumulators held by each subgroup);
//   dq kernel, one workgroup per block of query rows of one (batch, query head), over the keys in
//   steps of `dq_keys`:
//     S = Q·Kᵀ -> P, dP = dO·Vᵀ -> dS as above (row-major), dQ += dS·K, scaled at the end.
// lse' and D = rowsum(dO ∘ O) (with the sink's term) come from flash_bwd_prep.comp, the sinks'
// gradient from its row terms and flash_bwd_fold.comp, as in the other family's backward.
// Deterministic: each key block's dK and dV, each row block's dQ, is accumulated by one workgroup
// over its steps in order, with no atomics.
//
// Refused, naming why: what check_coop refuses for the forward (no shaders or extension, a gated
// driver, float32 storage, dropout, head widths above 256), the additive mask's gradient (its dS
// scratch is the other family's), and tiles that do not fit the device's shared memory.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/flash_coop_plan.hpp"

namespace qkv::vulkan::detail {

struct flash_bwd_request;  // kernels/flash_backward_plan.hpp

/// The backward kernels' tiles on one device, in the device's matrix shape m x n x k.
struct coop_bwd_tiles {
    std::uint32_t lanes = 0, required_subgroup = 0;
    std::uint32_t m = 0, n = 0, k = 0;
    std::uint32_t d_pad = 0, dv_pad = 0;  ///< head widths rounded up to lcm(k, n, 8): both a product's K and N
    std::uint32_t subgroups = 1;          ///< per workgroup, in both kernels
    /// dk/dv: m keys per subgroup (the rows of A in dV += Pᵀ·dO), query rows per step (N of Sᵀ, K
    /// of the accumulating products: a multiple of lcm(n, k)).
    std::uint32_t dkdv_rows = 0;
    /// dq: m query rows per subgroup, keys per step (N of S, K of dQ += dS·K: a multiple of lcm(n, k)).
    std::uint32_t dq_keys = 0;

    [[nodiscard]] std::uint32_t wg() const { return subgroups * lanes; }
    [[nodiscard]] std::uint32_t dkdv_keys() const { return subgroups * m; }  ///< keys per dk/dv workgroup
    [[nodiscard]] std::uint32_t dq_rows() const { return subgroups * m; }    ///< rows per dq workgroup
    /// Shared memory of the dk/dv kernel (its declarations, in bytes): K and V of the block, a
    /// step's Q and dO (f16), Sᵀ and dPᵀ (f32), Pᵀ and dSᵀ (f16), the step's lse' and D, and a
    /// staging matrix per subgroup for the accumulators' loads and stores.
    [[nodiscard]] std::uint32_t dkdv_shared_bytes() const;
    /// Shared memory of the dq kernel, likewise: Q and dO of the block, a step's K and V, S and dP,
    /// dS, the block's lse' and D and the check's sums, the staging.
    [[nodiscard]] std::uint32_t dq_shared_bytes() const;
};

struct flash_coop_bwd_plan {
    coop_bwd_tiles tiles;
    bool automatic = false;        ///< the automatic choice may take the family (no gate keeps it manual)
    std::uint32_t npad_q = 0;      ///< query rows per (batch, query head), padded to both kernels' blocks
    std::uint32_t npad_kv = 0;     ///< keys per (batch, K/V head), likewise
    std::uint32_t dq_chunk = 0;    ///< keys per dq dispatch (a multiple of dq_keys)
    std::uint32_t dkdv_chunk = 0;  ///< row slots (the group's heads' padded rows) per dk/dv dispatch
    std::uint32_t extras = 0;      ///< BWD_CHECK
    bool half = true;              ///< float16 Q, K, V and dO (the family takes no other)

    /// Dispatches of the dq and the dk/dv kernel for `layout`.
    [[nodiscard]] std::uint32_t dispatches(const flash_layout& layout) const;
};

/// Whether the family's backward can run `layout` with `request` on `desc`, and its plan if so
/// (the verdict's `why` empty). A pure function; settings::max_fused_keys (if not 0, a test hook)
/// caps the keys of a dq dispatch and the row slots of a dk/dv dispatch.
coop_verdict check_coop_backward(const device_desc& desc, const flash_layout& layout, const flash_bwd_request& request,
                                 const settings& set, flash_coop_bwd_plan& plan);

/// check_coop_backward's plan, or throws limit_exceeded / unavailable with its reason.
flash_coop_bwd_plan plan_flash_coop_backward(const device_desc& desc, const flash_layout& layout,
                                             const flash_bwd_request& request, const settings& set);

}  // namespace qkv::vulkan::detail
