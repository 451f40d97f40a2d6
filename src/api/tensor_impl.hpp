// The inside of qkv::vulkan::tensor (tensor.cpp), for the calls that bind tensors (sdpa_call.cpp,
// kv_cache.cpp). Private to src/.
#pragma once

#include <cstdint>
#include <initializer_list>
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
    /// Bytes from `offset` that bind() reaches: `bytes`, rounded up so that the binding ends on a
    /// whole 32-bit word where the buffer has those bytes (qkv's own tensors always do; a caller's
    /// where wrap()'s size reaches them). Shaders that read f16 values or q8_0 / q4_0 blocks as
    /// words (tensor_widen.comp) read the word holding the last bytes, which must lie inside the
    /// binding: f16 tensors of an odd number of values and quantized ones of an odd number of
    /// rows (34- and 18-byte rows of 32 values) end mid-word.
    std::uint64_t reach = 0;
    bool wrapped = false;
    /// Larger than maxStorageBufferRange: read only through texel views (a kv_cache's storage,
    /// texels_only_tensor); bind() refuses it.
    bool texels_only = false;
    /// What the buffer was created with: qkv's own tensors have every usage qkv needs; a caller's
    /// what wrap() was told.
    VkBufferUsageFlags usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                               VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT;

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

/// Refuses (qkv::invalid_argument) a tensor whose buffer lacks `needed` usage, naming `op`, `what`
/// the tensor is to it, and the flag's name.
void require_usage(const tensor::impl& t, VkBufferUsageFlags needed, const char* flag, const char* op,
                   const char* what);

/// qkv's own f32 / f16 tensor of `shape` and `type` that may pass maxStorageBufferRange (up to
/// the memory the device gives one buffer): the storage of a kv_cache that is read only through
/// texel views. Its bind() throws limit_exceeded naming `what` and the limit.
tensor texels_only_tensor(const std::shared_ptr<detail::device_core>& core, std::vector<std::size_t> shape,
                          element_type type, const char* what);

/// A tensor of `shape` and `type` without memory (no buffer), on core's device: what a planned
/// call is recorded over once, dry (dry_recorder), when it is made.
tensor stand_in(const std::shared_ptr<detail::device_core>& core, std::vector<std::size_t> shape, element_type type);

/// "(1, 8, 1, 64)".
std::string shape_string(const std::vector<std::size_t>& shape);

/// The tensor `t` that `op` takes as `what` (k, wq, ...), checked: on the device of `core`, of
/// `type`, and of `shape` as a shape, dimension by dimension, up to dimensions of 1 (which move no
/// element: (1, 8, 1, 64) and (8, 1, 64) lay out alike, while (B, L, H, E) is not (B, H, L, E)).
/// Throws qkv::invalid_argument naming op, what and both shapes.
const tensor::impl& expect_tensor(const tensor& t, const char* op, const char* what,
                                  const std::shared_ptr<detail::device_core>& core,
                                  const std::vector<std::size_t>& shape, element_type type);

/// One tensor a call touches, for the aliasing rule: what it is to the call, and whether the call
/// writes it. `bytes` 0: the tensor's own.
struct tensor_use {
    const tensor::impl* t = nullptr;  // null: absent (skipped)
    const char* what = "";
    bool written = false;
    VkBuffer handle = VK_NULL_HANDLE;  // a range that is no tensor (a cache's rows) where t is null
    VkDeviceSize offset = 0, bytes = 0;
};
/// Refuses (qkv::invalid_argument naming both) a tensor `op` writes whose bytes overlap another's
/// in the same VkBuffer: nothing is computed in place.
void refuse_overlap(const char* op, std::initializer_list<tensor_use> uses);

}  // namespace qkv::vulkan
