#include "vk/memory.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "vk/check.hpp"

namespace qkv::vulkan::detail {

buffer& buffer::operator=(buffer&& other) noexcept {
    if (this != &other) {
        reset();
        owner_ = std::exchange(other.owner_, nullptr);
        handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
        memory_ = std::exchange(other.memory_, VK_NULL_HANDLE);
        size_ = std::exchange(other.size_, 0);
        allocation_ = std::exchange(other.allocation_, 0);
        mapped_ = std::exchange(other.mapped_, nullptr);
        coherent_ = other.coherent_;
    }
    return *this;
}

void buffer::reset() noexcept {
    if (owner_) owner_->release(*this);
    owner_ = nullptr;
}

void buffer::flush() const {
    if (!mapped_ || coherent_) return;
    auto range = vk_struct<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
    range.memory = memory_;
    range.size = VK_WHOLE_SIZE;
    check(owner_->dev_.fn().vkFlushMappedMemoryRanges(owner_->dev_.handle(), 1, &range), "vkFlushMappedMemoryRanges");
}

void buffer::invalidate() const {
    if (!mapped_ || coherent_) return;
    auto range = vk_struct<VkMappedMemoryRange>(VK_STRUCTURE_TYPE_MAPPED_MEMORY_RANGE);
    range.memory = memory_;
    range.size = VK_WHOLE_SIZE;
    check(owner_->dev_.fn().vkInvalidateMappedMemoryRanges(owner_->dev_.handle(), 1, &range),
          "vkInvalidateMappedMemoryRanges");
}

void allocator::ensure(buffer& b, VkDeviceSize need, memory_use use, const char* what, VkBufferUsageFlags extra_usage) {
    need = std::max<VkDeviceSize>(need, 16);
    if (b && b.size() >= need && b.size() <= 2 * need + 4096) return;
    b.reset();
    b = create((need + 4095) / 4096 * 4096, use, what, extra_usage);
}

buffer_view::buffer_view(const device& dev, const buffer& b, VkFormat format, VkDeviceSize offset, VkDeviceSize range)
    : buffer_view(dev, b.handle(), format, offset, range) {}

buffer_view::buffer_view(const device& dev, VkBuffer b, VkFormat format, VkDeviceSize offset, VkDeviceSize range) {
    auto info = vk_struct<VkBufferViewCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO);
    info.buffer = b;
    info.format = format;
    info.offset = offset;
    info.range = range;
    check(dev.fn().vkCreateBufferView(dev.handle(), &info, nullptr, &handle_), "vkCreateBufferView");
    dev_ = &dev;
}

buffer_view& buffer_view::operator=(buffer_view&& other) noexcept {
    if (this != &other) {
        reset();
        dev_ = std::exchange(other.dev_, nullptr);
        handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
    }
    return *this;
}

void buffer_view::reset() noexcept {
    if (dev_ && handle_) dev_->fn().vkDestroyBufferView(dev_->handle(), handle_, nullptr);
    dev_ = nullptr;
    handle_ = VK_NULL_HANDLE;
}

allocator::allocator(const device& dev, std::uint64_t limit, bool poison) : dev_(dev), limit_(limit), poison_(poison) {}

std::uint32_t allocator::pick_type(std::uint32_t allowed, memory_use use, const char* what) const {
    const auto& mem = dev_.memory();
    VkMemoryPropertyFlags required = 0, preferred = 0;
    switch (use) {
        case memory_use::device:
            preferred = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
            break;
        case memory_use::upload:
            required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
            break;
        case memory_use::readback:
            required = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
            preferred = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
            break;
    }
    std::uint32_t fallback = UINT32_MAX;
    for (std::uint32_t i = 0; i < mem.memoryTypeCount; ++i) {
        if (!(allowed & (1u << i))) continue;
        const auto flags = mem.memoryTypes[i].propertyFlags;
        if ((flags & required) != required) continue;
        if ((flags & preferred) == preferred) return i;
        if (fallback == UINT32_MAX) fallback = i;
    }
    if (fallback == UINT32_MAX) throw error(std::string("no suitable Vulkan memory type for the ") + what + " buffer");
    return fallback;
}

buffer allocator::create(VkDeviceSize size, memory_use use, const char* what, VkBufferUsageFlags extra_usage) {
    const auto& fn = dev_.fn();
    const VkDevice d = dev_.handle();
    buffer b;
    b.owner_ = this;
    b.size_ = size;

    auto info = vk_struct<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
    info.size = size;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT | extra_usage;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(fn.vkCreateBuffer(d, &info, nullptr, &b.handle_), std::string("vkCreateBuffer (") + what + ")");

    VkMemoryRequirements req{};
    fn.vkGetBufferMemoryRequirements(d, b.handle_, &req);
    const std::uint32_t type = pick_type(req.memoryTypeBits, use, what);
    if (limit_ && allocated_.load() + req.size > limit_)
        throw out_of_memory(std::string("vkAllocateMemory (") + what + ", " + std::to_string(req.size) +
                            " bytes) failed: VK_ERROR_OUT_OF_DEVICE_MEMORY (the context's device memory limit is " +
                            std::to_string(limit_) + " bytes, " + std::to_string(allocated_.load()) + " in use)");
    auto alloc = vk_struct<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = type;
    check(fn.vkAllocateMemory(d, &alloc, nullptr, &b.memory_),
          std::string("vkAllocateMemory (") + what + ", " + std::to_string(req.size) + " bytes)");
    b.allocation_ = req.size;
    const auto total = allocated_.fetch_add(req.size) + req.size;
    for (auto p = peak_.load(); total > p && !peak_.compare_exchange_weak(p, total);) {
    }
    check(fn.vkBindBufferMemory(d, b.handle_, b.memory_, 0), "vkBindBufferMemory");

    const auto flags = dev_.memory().memoryTypes[type].propertyFlags;
    b.coherent_ = (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) != 0;
    if (flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        void* p = nullptr;
        check(fn.vkMapMemory(d, b.memory_, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");
        b.mapped_ = static_cast<std::byte*>(p);
        if (poison_) {
            std::memset(b.mapped_, 0xFF, static_cast<std::size_t>(size));
            b.flush();
        }
    }
    return b;
}

void allocator::release(buffer& b) noexcept {
    const auto& fn = dev_.fn();
    if (b.mapped_) fn.vkUnmapMemory(dev_.handle(), b.memory_);
    if (b.handle_) fn.vkDestroyBuffer(dev_.handle(), b.handle_, nullptr);
    if (b.memory_) {
        fn.vkFreeMemory(dev_.handle(), b.memory_, nullptr);
        allocated_ -= b.allocation_;
    }
    b.handle_ = VK_NULL_HANDLE;
    b.memory_ = VK_NULL_HANDLE;
    b.mapped_ = nullptr;
    b.size_ = b.allocation_ = 0;
}

}  // namespace qkv::vulkan::detail
