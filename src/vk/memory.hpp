// Buffers and device memory: one allocation per buffer, counted, with an optional cap
// (context_options::device_memory_limit) that fails like VK_ERROR_OUT_OF_DEVICE_MEMORY.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "vk/device.hpp"
#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

enum class memory_use {
    device,    ///< device-local storage buffer (mapped too, when that memory is host-visible)
    upload,    ///< host-visible, coherent: staging for uploads
    readback,  ///< host-visible, cached if possible: staging for downloads
};

class allocator;

/// A storage/transfer buffer with its own memory. Move-only; frees itself.
class buffer {
public:
    buffer() = default;
    buffer(buffer&& other) noexcept { *this = std::move(other); }
    buffer& operator=(buffer&& other) noexcept;
    ~buffer() { reset(); }
    void reset() noexcept;

    [[nodiscard]] VkBuffer handle() const { return handle_; }
    [[nodiscard]] VkDeviceSize size() const { return size_; }
    /// Host pointer when the memory is host-visible (kept mapped), else nullptr.
    [[nodiscard]] std::byte* mapped() const { return mapped_; }
    [[nodiscard]] explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }
    /// Make host writes visible to the device / device writes visible to the host (no-ops on
    /// coherent memory).
    void flush() const;
    void invalidate() const;

private:
    friend class allocator;
    allocator* owner_ = nullptr;
    VkBuffer handle_ = VK_NULL_HANDLE;
    VkDeviceMemory memory_ = VK_NULL_HANDLE;
    VkDeviceSize size_ = 0, allocation_ = 0;
    std::byte* mapped_ = nullptr;
    bool coherent_ = true;
};

/// The texel format qkv's views read: four float32, or (`half`) four float16, a texel.
inline VkFormat texel_format(bool half) { return half ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT; }

/// A typed view of part of a buffer, for a texel-buffer descriptor. Move-only; destroys itself.
/// The buffer must outlive it and have been created with a texel-buffer usage bit.
class buffer_view {
public:
    buffer_view() = default;
    /// `range` bytes from `offset` (a multiple of minTexelBufferOffsetAlignment) seen as `format`.
    buffer_view(const device& dev, const buffer& b, VkFormat format, VkDeviceSize offset, VkDeviceSize range);
    /// The same over any buffer (a caller's), which must have a texel-buffer usage bit.
    buffer_view(const device& dev, VkBuffer b, VkFormat format, VkDeviceSize offset, VkDeviceSize range);
    buffer_view(buffer_view&& other) noexcept { *this = std::move(other); }
    buffer_view& operator=(buffer_view&& other) noexcept;
    ~buffer_view() { reset(); }
    void reset() noexcept;
    [[nodiscard]] VkBufferView handle() const { return handle_; }
    [[nodiscard]] explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

private:
    const device* dev_ = nullptr;
    VkBufferView handle_ = VK_NULL_HANDLE;
};

class allocator {
public:
    /// `poison`: fill every new host-visible buffer with 0xFF bytes (testing::hooks::poison_new_memory).
    allocator(const device& dev, std::uint64_t limit, bool poison = false);

    /// A buffer of `size` bytes (storage + transfer usage). Throws out_of_memory (cap reached or
    /// the driver's VK_ERROR_OUT_OF_*_MEMORY), leaving nothing allocated.
    /// `extra_usage` adds usage bits (e.g. VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT).
    [[nodiscard]] buffer create(VkDeviceSize size, memory_use use, const char* what,
                                VkBufferUsageFlags extra_usage = 0);

    /// The one reuse policy of buffers kept between calls: `b` stays while it holds at least
    /// `need` bytes and at most twice that (plus a page), so memory follows the calls' sizes in
    /// both directions; otherwise it is freed first (its memory is then free for the new one) and
    /// created anew, rounded up to 4 KiB. `need` 0 counts as 16 bytes. Throws out_of_memory (`b`
    /// is then empty).
    void ensure(buffer& b, VkDeviceSize need, memory_use use, const char* what, VkBufferUsageFlags extra_usage = 0);

    [[nodiscard]] std::uint64_t allocated() const { return allocated_.load(); }
    [[nodiscard]] std::uint64_t peak() const { return peak_.load(); }
    void reset_peak() { peak_ = allocated_.load(); }
    [[nodiscard]] const device& dev() const { return dev_; }

private:
    friend class buffer;
    void release(buffer& b) noexcept;
    std::uint32_t pick_type(std::uint32_t allowed, memory_use use, const char* what) const;

    const device& dev_;
    std::uint64_t limit_;
    bool poison_ = false;
    std::atomic<std::uint64_t> allocated_{0}, peak_{0};
};

}  // namespace qkv::vulkan::detail
