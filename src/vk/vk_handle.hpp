// One owner for every Vulkan object made from a VkDevice: the handle, the device and the table
// its destroy function comes from. Destroys the object once (on reset, reassignment or at the end
// of its life), so error paths need no hand-written cleanup. Private to src/.
#pragma once

#include <utility>

#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

/// Owns a `T` made from a VkDevice, destroyed with the device-table entry `Destroy`
/// (vkDestroyX(device, handle, nullptr)). Move-only. The entry, not the handle type, names the
/// destroy function: on 32-bit targets every non-dispatchable handle is the same integer type.
template <class T, auto device_table::*Destroy>
class device_handle {
public:
    device_handle() = default;
    device_handle(const device_table& fn, VkDevice device) : fn_(&fn), device_(device) {}
    device_handle(device_handle&& other) noexcept { *this = std::move(other); }
    device_handle& operator=(device_handle&& other) noexcept {
        if (this != &other) {
            reset();
            fn_ = std::exchange(other.fn_, nullptr);
            device_ = std::exchange(other.device_, VK_NULL_HANDLE);
            handle_ = std::exchange(other.handle_, VK_NULL_HANDLE);
        }
        return *this;
    }
    device_handle(const device_handle&) = delete;
    device_handle& operator=(const device_handle&) = delete;
    ~device_handle() { reset(); }

    /// Destroys the object, if there is one.
    void reset() noexcept {
        if (handle_ != VK_NULL_HANDLE && fn_) (fn_->*Destroy)(device_, handle_, nullptr);
        handle_ = VK_NULL_HANDLE;
    }
    /// Where a vkCreateX call writes the new handle (the old object is destroyed first).
    [[nodiscard]] T* put() {
        reset();
        return &handle_;
    }
    [[nodiscard]] T get() const { return handle_; }
    [[nodiscard]] explicit operator bool() const { return handle_ != VK_NULL_HANDLE; }

private:
    const device_table* fn_ = nullptr;
    VkDevice device_ = VK_NULL_HANDLE;
    T handle_ = VK_NULL_HANDLE;
};

using pipeline_cache_handle = device_handle<VkPipelineCache, &device_table::vkDestroyPipelineCache>;
using pipeline_handle = device_handle<VkPipeline, &device_table::vkDestroyPipeline>;
using pipeline_layout_handle = device_handle<VkPipelineLayout, &device_table::vkDestroyPipelineLayout>;
using set_layout_handle = device_handle<VkDescriptorSetLayout, &device_table::vkDestroyDescriptorSetLayout>;
using shader_module_handle = device_handle<VkShaderModule, &device_table::vkDestroyShaderModule>;
using command_pool_handle = device_handle<VkCommandPool, &device_table::vkDestroyCommandPool>;
using descriptor_pool_handle = device_handle<VkDescriptorPool, &device_table::vkDestroyDescriptorPool>;
using fence_handle = device_handle<VkFence, &device_table::vkDestroyFence>;
using query_pool_handle = device_handle<VkQueryPool, &device_table::vkDestroyQueryPool>;

}  // namespace qkv::vulkan::detail
