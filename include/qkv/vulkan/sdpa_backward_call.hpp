// qkv::vulkan::sdpa_backward_call: the backward pass of scaled_dot_product_attention
// (qkv/runtime/sdpa_backward.hpp) planned once and run many times over device tensors, with
// nothing crossing to the host: the training step's half that context::sdpa_backward does over host
// data. qkv/vulkan/interop.hpp records it into a caller's command buffer, qkv/vulkan/sequence.hpp
// into a sequence of qkv's, beside the forward's sdpa_call:
//
//   qkv::vulkan::sdpa_call forward(ctx, description);          // options.return_lse = true
//   qkv::vulkan::sdpa_backward_call backward(ctx, {.forward = description});
//   forward.run({.q = &q, .k = &k, .v = &v, .out = &out, .lse = &lse});
//   ... the loss's gradient d_out on the device ...
//   backward.run({.q = &q, .k = &k, .v = &v, .out = &out, .lse = &lse, .d_out = &d_out,
//                 .dq = &dq, .dk = &dk, .dv = &dv});
#pragma once

#include <memory>

#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

/// The tensors of one sdpa_backward_call run or recording, shapes as sdpa_backward_problem's:
/// q (B, Hq, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev) and d_out (B, Hq, L, Ev) of the
/// description's precision (f32 with fp32, f16 with fp16); out (B, Hq, L, Ev) and lse (B, Hq, L),
/// f32, the forward's (an sdpa_call's with return_lse); the gradients f32: dq, dk, dv of q's, k's
/// and v's shapes, d_sinks (Hq) where the description has sinks, d_additive_mask (mask_shape; L x S
/// where that is empty) where it asks for it (and only then). Shapes are checked dimension by
/// dimension up to dimensions of 1; a gradient may not overlap another tensor of the call in one
/// VkBuffer (nothing is computed in place).
struct sdpa_backward_tensors {
    const tensor* q = nullptr;
    const tensor* k = nullptr;
    const tensor* v = nullptr;
    const tensor* out = nullptr;
    const tensor* lse = nullptr;
    const tensor* d_out = nullptr;
    tensor* dq = nullptr;
    tensor* dk = nullptr;
    tensor* dv = nullptr;
    tensor* d_sinks = nullptr;
    tensor* d_additive_mask = nullptr;
};

/// The backward pass planned once for a shape, options and masks, then run (or recorded) many
/// times over tensors: the same kernels and bits as context::sdpa_backward.
class QKV_VULKAN_API sdpa_backward_call {
public:
    /// `description` as for context::sdpa_backward, with every data span empty (q, k and v of the
    /// forward, out, lse and d_out: they come as tensors) but the masks and sinks (host data, read
    /// now and kept on the device with the plan). Dropout's seed and offset are the description's,
    /// so every run draws the forward's mask of a call planned with the same ones. Its pipelines
    /// are built now, not at the first run or record. Throws as context::sdpa_backward would
    /// before any work.
    sdpa_backward_call(context& ctx, const sdpa_backward_problem& description);
    ~sdpa_backward_call();
    sdpa_backward_call(sdpa_backward_call&&) noexcept;
    sdpa_backward_call& operator=(sdpa_backward_call&&) noexcept;
    sdpa_backward_call(const sdpa_backward_call&) = delete;
    sdpa_backward_call& operator=(const sdpa_backward_call&) = delete;

    /// Runs over `tensors` on the context's queue and waits: nothing crosses to the host. Checked
    /// on the device and reported here as on the host path: qkv::invalid_argument where out and lse
    /// are not this problem's forward results (naming a row), numeric_overflow where the scores
    /// or a gradient left float32's range though every input was finite. Throws
    /// qkv::invalid_argument for tensors whose shapes or types do not match, or where a gradient
    /// overlaps another of its tensors. Thread-safe, as sdpa_call::run.
    void run(const sdpa_backward_tensors& tensors);

    struct impl;

private:
    friend struct sdpa_backward_call_access;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
