// The plan of a backward call (context::sdpa_backward): the forward's fused layout (plan_sdpa_fused:
// Q, K and V as the forward stores them, the masks, the score params), the backward kernels' own
// plan (kernels/flash_backward.hpp), and where everything else lives in the call's buffers: dO, the
// saved out and lse after the forward's inputs; dq, dk, dv, the sinks' and the mask's gradients and
// the verdict in role::out; the kernels' texels (role::texels), scratch (role::state) and the
// mask gradient's dS or the fused order's dR (role::scores). A pure function of the problem's shapes and options, a
// device description and the settings (tests/sdpa_plan_test.cpp runs it against the fake devices).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/flash_backward_plan.hpp"
#include "plan/buffers.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/runtime/sdpa_backward.hpp"

namespace qkv::vulkan::detail {

struct sdpa_backward_plan {
    sdpa_plan forward;  ///< the fused layout: q, k, v, masks and params in role::inputs, how Q, K, V are stored
    flash_bwd_plan kernels;
    bool d_out_fp16 = false;  ///< dO stored as Q is: float16 with precision fp16
    region d_out, out, lse;   ///< in role::inputs, after the forward's inputs
    // In role::out: byte offsets and element counts of the results, then the verdict.
    std::uint64_t dq_at = 0, dk_at = 0, dv_at = 0, d_sinks_at = 0, d_mask_at = 0, verdict_at = 0;
    std::uint64_t dq_count = 0, dk_count = 0, dv_count = 0, d_sinks_count = 0, d_mask_count = 0;
    buffer_plan buffers;
    std::vector<download> downloads;  ///< dq, dk, dv, d_sinks, d_mask (each where it has elements), the verdict

    [[nodiscard]] const flash_layout& layout() const { return forward.layout; }
};

/// The plan of `problem` (out and lse given). Throws limit_exceeded / unavailable (naming the limit)
/// where the device cannot run it, as plan_sdpa.
sdpa_backward_plan plan_sdpa_backward(const sdpa_backward_problem& problem, const device_desc& desc,
                                      const settings& set);

}  // namespace qkv::vulkan::detail
