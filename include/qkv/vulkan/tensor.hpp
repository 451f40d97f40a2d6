// qkv::vulkan::tensor: data that stays on the device between calls, in qkv's memory or (with
// qkv/vulkan/interop.hpp's wrap) a caller's VkBuffer. The planned calls over tensors are
// qkv/vulkan/sdpa_call.hpp and attention_call.hpp; several of them in one submit, sequence.hpp.
//
//   qkv::vulkan::context ctx;
//   qkv::vulkan::tensor q(ctx, {1, 8, 1, 64}), k(ctx, {1, 2, 4096, 64}), v(ctx, {1, 2, 4096, 64}),
//       out(ctx, {1, 8, 1, 64});
//   q.upload(host_q);  k.upload(host_k);  v.upload(host_v);
//   qkv::vulkan::sdpa_call call(ctx, description);     // shape, options, masks: planned once
//   call.run({.q = &q, .k = &k, .v = &v, .out = &out}); // on the device; throws as the host calls do
//   std::vector<float> o = out.download();
//
// A tensor is row-major and contiguous: `shape` outermost first, of element type f32, f16, or
// q8_0 / q4_0 (ggml's blocks of 32 values along the last dimension, as a kv_cache stores them: K
// and V tensors of a quantized kv_type, and the rows appended to a quantized cache), or i32 (int32
// indices: a paged_call's block table, paged_call.hpp; written and read as int32 only). It keeps its
// device alive, like a kv_cache: destroying the context first is safe. A moved-from tensor is
// empty: using it throws qkv::error. Member functions are thread-safe (the device's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "qkv/runtime/element_type.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

class QKV_VULKAN_API tensor {
public:
    /// An empty tensor (no memory; using it throws qkv::error).
    tensor() noexcept;
    /// New device memory of `shape` and `type` on ctx's device, counted towards
    /// context_options::device_memory_limit; its contents are undefined until written. Throws
    /// qkv::invalid_argument (a zero dimension, a size that overflows, an unknown type, a q8_0 /
    /// q4_0 last dimension that is not a multiple of 32),
    /// limit_exceeded (beyond maxStorageBufferRange), out_of_memory, unavailable (f16 on a
    /// device without 16-bit storage).
    tensor(context& ctx, std::vector<std::size_t> shape, element_type type = element_type::f32);
    ~tensor();
    tensor(tensor&&) noexcept;
    tensor& operator=(tensor&&) noexcept;
    tensor(const tensor&) = delete;
    tensor& operator=(const tensor&) = delete;

    /// Host values into the tensor (elements() of them, row-major), converted to its type: f16
    /// rounds to nearest even and refuses a finite value beyond float16's range
    /// (numeric_overflow; nothing is written); q8_0 / q4_0 quantize (qkv::quantize). Waits until
    /// the device has them. An i32 tensor is refused (qkv::invalid_argument): it takes int32 values.
    void upload(std::span<const float> values);
    /// int32 values into an i32 tensor (elements() of them, row-major), as they are. Throws
    /// qkv::invalid_argument for a tensor of another type (floats are uploaded as floats). Waits
    /// until the device has them.
    void upload(std::span<const std::int32_t> values);
    /// The tensor's values, as float32 (a quantized tensor's dequantized). Waits for the device. An
    /// i32 tensor is refused (qkv::invalid_argument: download_int32).
    [[nodiscard]] std::vector<float> download() const;
    /// An i32 tensor's values, as they are (qkv::invalid_argument for another type). Waits for the
    /// device.
    [[nodiscard]] std::vector<std::int32_t> download_int32() const;

    [[nodiscard]] const std::vector<std::size_t>& shape() const;
    [[nodiscard]] element_type type() const;
    [[nodiscard]] std::size_t elements() const;
    [[nodiscard]] std::uint64_t bytes() const;
    /// True for a tensor over a caller's VkBuffer (interop.hpp: wrap), which qkv never frees.
    [[nodiscard]] bool wraps_caller_memory() const;
    [[nodiscard]] explicit operator bool() const noexcept { return impl_ != nullptr; }

    struct impl;

private:
    friend struct tensor_access;
    explicit tensor(std::unique_ptr<impl> i) noexcept;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
