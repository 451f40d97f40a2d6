// qkv::vulkan::attention_call: self-attention (context::attention) planned once and run many times
// over device tensors (qkv/vulkan/tensor.hpp); qkv/vulkan/interop.hpp records it into a caller's
// command buffer, qkv/vulkan/sequence.hpp into a sequence of qkv's.
#pragma once

#include <memory>

#include "qkv/runtime/problem.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

/// The tensors of one attention_call run or recording, float32, shapes as attention_problem's:
/// x (batch, seq, d_in); wq, wk (d_in, d_k); wv (d_in, d_v); biases bq, bk (d_k) and bv (d_v), each
/// optional (null: none); with an output projection (shape.d_out > 0) wo (d_v, d_out) and an
/// optional bo (d_out); out (batch, seq, out_width).
struct attention_tensors {
    const tensor* x = nullptr;
    const tensor* wq = nullptr;
    const tensor* wk = nullptr;
    const tensor* wv = nullptr;
    const tensor* bq = nullptr;
    const tensor* bk = nullptr;
    const tensor* bv = nullptr;
    const tensor* wo = nullptr;
    const tensor* bo = nullptr;
    tensor* out = nullptr;
};

/// Self-attention (context::attention) planned once and run or recorded many times over tensors.
class QKV_VULKAN_API attention_call {
public:
    /// `description` as for context::attention, its data spans empty but for the masks (host data,
    /// kept on the device with the plan); return_weights is not available over tensors.
    attention_call(context& ctx, const attention_problem& description);
    ~attention_call();
    attention_call(attention_call&&) noexcept;
    attention_call& operator=(attention_call&&) noexcept;
    attention_call(const attention_call&) = delete;
    attention_call& operator=(const attention_call&) = delete;

    /// Thread-safe: runs and recordings of one call from several threads are serialised by the
    /// device's lock, each run checked before the next begins.
    /// Runs over `tensors` on the context's queue and waits; the overflow rule holds as on the
    /// host path (the range guard runs on the device, its verdict reported here).
    void run(const attention_tensors& tensors);
    [[nodiscard]] implementation implementation_run() const;
    [[nodiscard]] kernel_family kernel() const;

    struct impl;

private:
    friend struct attention_call_access;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
