// The inside of qkv::vulkan::tensor (tensor.cpp), for the calls that bind tensors (sdpa_call.cpp,
// kv_cache.cpp). Private to src/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/device_core.hpp"
#include "qkv/vulkan/tensor.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

struct tensor::impl {
    std::shared_ptr<detail::device_core> core;  // declared first: outlives `owned`
    std::vector<std::size_t> shape;
    element_type type = element_type::f32;
    std::size_t elements = 0;
    std::uint64_t bytes = 0;
    detail::buffer owned;              // qkv's memory; empty for a caller's buffer
    VkBuffer handle = VK_NULL_HANDLE;  // owned's, or the caller's
    VkDeviceSize offset = 0;           // of the first element in `handle`
    bool wrapped = false;

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl();

    /// Bytes of one element (f32, f16); 0 for the quantized types, whose elements are in blocks.
    [[nodiscard]] std::uint32_t element_bytes() const {
        return type == element_type::f16 ? 2 : type == element_type::f32 ? 4 : 0;
    }
    [[nodiscard]] bool quantized() const { return is_quantized(type); }
    /// A storage binding that reaches the whole tensor from an offset the device accepts
    /// (minStorageBufferOffsetAlignment), and where the tensor starts within it: the element (f32,
    /// f16) and the byte.
    struct bound {
        detail::binding b;
        std::uint32_t element = 0;
        std::uint64_t byte = 0;
    };
    [[nodiscard]] bound bind() const;
};

/// The checks a tensor's shape and type pass, for `what` (a new tensor, or wrap()), on the device
/// `info` describes: fills t's shape, type, elements and bytes. Types f32 and f16 (16-bit storage),
/// and the quantized q8_0 and q4_0 (rows of ggml's blocks: the last dimension a multiple of 32).
void describe(tensor::impl& t, std::vector<std::size_t> shape, element_type type, const device_info& info,
              const char* what);

struct tensor_access {
    static tensor::impl& of(const tensor& t, const char* what);
    static tensor make(std::unique_ptr<tensor::impl> i) { return tensor(std::move(i)); }
};

/// "(1, 8, 1, 64)".
std::string shape_string(const std::vector<std::size_t>& shape);

/// The tensor `t` that `op` takes as `what` (k, wq, ...), checked: on the device of `core`, `count`
/// elements of `type`. Throws qkv::invalid_argument naming op, what and the difference.
const tensor::impl& expect_tensor(const tensor& t, const char* op, const char* what,
                                  const std::shared_ptr<detail::device_core>& core, std::size_t count,
                                  element_type type);

}  // namespace qkv::vulkan
