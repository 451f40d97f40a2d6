// The backward pass's kernels (shaders/contract/backward.h): their recording. Their plan (tiles,
// padding, chunks, scratch): flash_backward_plan.hpp.
#pragma once

#include "kernels/flash_backward_plan.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// The buffers the kernels read and write. Q, K and V as `layout` addresses them in `qkv` (its
/// element type: layout.fp16); dO (B, Hq, L, Ev) contiguous, of the same element type, from element
/// `d_out_element` of `d_out`; out (B, Hq, L, Ev) and lse (B, Hq, L) float32. The outputs, float32:
/// dq (B, Hq, L, E), dk (B, Hkv, S, E), dv (B, Hkv, S, Ev), and where asked d_sinks (Hq) and d_mask
/// (the mask's dimensions). `verdict`: BWD_VERDICT_WORDS words, host-readable, set here.
struct flash_bwd_io {
    binding qkv, d_out, out, lse;
    std::uint32_t d_out_element = 0;
    binding mask_bits, additive, params;
    binding dq, dk, dv, d_sinks, d_mask;
    binding verdict;
    VkBuffer texels = VK_NULL_HANDLE;   ///< plan.texel_bytes_total, with VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
    VkBuffer scratch = VK_NULL_HANDLE;  ///< plan.scratch_bytes
    binding ds;                         ///< plan.ds_bytes, where the mask's gradient is asked
    binding dr;                         ///< plan.fused_scratch_bytes(), in the fused order
};

/// The texel views of the plan's texel buffer: they must live until the commands have run.
struct flash_bwd_views {
    buffer_view q, k, v, d_out, stats;
    buffer_view q_d_out;  ///< Q and dO together, where plan.paired()
};
/// The views of Q, K, V and dO over `texels`, and of the row statistics over `scratch`.
flash_bwd_views make_flash_bwd_views(const device& dev, VkBuffer texels, VkBuffer scratch, const flash_bwd_plan& plan);

/// Records the whole backward pass: the verdict and scratch set, Q, K, V and dO packed into texels,
/// the row statistics, dq, dk and dv, and the folds. `inputs_finite`: the caller knows every
/// input finite (a host call's scan), so the careful pipelines are neither built nor dispatched.
/// `mark_kernels`: three timestamp marks (recorder::mark), before the two main kernels, between
/// them and after them (dq first, or dk and dv first in the fused order: plan.fused), so that a
/// host call can report each kernel's device time.
void record_flash_backward(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const flash_bwd_plan& plan,
                           const flash_bwd_io& io, const flash_bwd_views& views, bool inputs_finite,
                           bool mark_kernels = false);

}  // namespace qkv::vulkan::detail
