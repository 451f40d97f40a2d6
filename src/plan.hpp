// Where every tensor of one call lives on the device, and the limit checks that run before any
// work is submitted.
#pragma once

#include <cstdint>

#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::vulkan::detail {

/// A byte range inside a buffer.
struct range {
    std::uint64_t offset = 0, size = 0;
    [[nodiscard]] bool empty() const { return size == 0; }
};

struct plan {
    implementation impl = implementation::staged;
    bool fp16 = false;
    std::uint32_t batch = 0, seq = 0, d_in = 0, d_k = 0, d_v = 0, heads = 1, d_out = 0;
    std::uint32_t ld = 0;  ///< width of a projected Q|K|V row: 2·d_k + d_v
    bool bias = false, mask = false, additive = false, causal = false;
    bool mask_batched = false, additive_batched = false;
    float scale = 1.0f;

    // The inputs buffer: every host input, packed, each part aligned for a storage binding.
    range x, w, b, wo, bo, mask_bits, additive_mask;
    std::uint64_t inputs_bytes = 0;
    // Device-side tensors, one buffer each.
    std::uint64_t qkv_bytes = 0;     ///< batch x seq x ld, float32 or float16
    std::uint64_t scores_bytes = 0;  ///< batch x heads x seq x seq (staged only)
    std::uint64_t concat_bytes = 0;  ///< batch x seq x d_v (only with an output projection)
    std::uint64_t out_bytes = 0;     ///< batch x seq x out_width
    std::uint64_t readback_bytes = 0;
    std::uint64_t weights_bytes = 0;  ///< returned weights (0 unless requested)
};

/// Lays out a validated problem. Throws limit_exceeded when a tensor is larger than
/// maxStorageBufferRange or everything together larger than the device's memory, and
/// unavailable when fp16 is asked of a device without 16-bit storage.
plan make_plan(const attention_problem& problem, const device_info& info, std::uint64_t storage_alignment);

}  // namespace qkv::vulkan::detail
