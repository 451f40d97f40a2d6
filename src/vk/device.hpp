// The logical device of a context: one compute queue, the features qkv enables, memory types.
#pragma once

#include <memory>

#include "vk/device_desc.hpp"
#include "vk/instance.hpp"
#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

class device {
public:
    device(std::shared_ptr<const instance> inst, std::size_t index);
    ~device();
    device(const device&) = delete;
    device& operator=(const device&) = delete;

    [[nodiscard]] const device_table& fn() const { return fn_; }
    [[nodiscard]] VkDevice handle() const { return handle_; }
    [[nodiscard]] VkQueue queue() const { return queue_; }
    [[nodiscard]] std::uint32_t queue_family() const { return family_; }
    [[nodiscard]] VkPhysicalDevice physical() const { return physical_; }
    [[nodiscard]] const device_info& info() const { return info_; }
    [[nodiscard]] const VkPhysicalDeviceMemoryProperties& memory() const { return memory_; }
    [[nodiscard]] const VkPhysicalDeviceLimits& limits() const { return limits_; }
    [[nodiscard]] const instance& inst() const { return *instance_; }
    /// storageBuffer16BitAccess was available and is enabled: fp16 storage shaders may run.
    [[nodiscard]] bool fp16_storage() const { return fp16_storage_; }
    /// Subgroup size control, where offered and enabled (all zero / false otherwise).
    [[nodiscard]] const subgroup_control& subgroups() const { return subgroups_; }
    /// The format can back a uniform texel buffer (VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT).
    [[nodiscard]] bool uniform_texel_format(VkFormat format) const;
    /// Everything the planners read, as a value (device_desc.hpp).
    [[nodiscard]] const device_desc& desc() const { return desc_; }

private:
    std::shared_ptr<const instance> instance_;
    device_table fn_{};
    VkPhysicalDevice physical_ = VK_NULL_HANDLE;
    VkDevice handle_ = VK_NULL_HANDLE;
    VkQueue queue_ = VK_NULL_HANDLE;
    std::uint32_t family_ = 0;
    device_info info_;
    VkPhysicalDeviceMemoryProperties memory_{};
    VkPhysicalDeviceLimits limits_{};
    bool fp16_storage_ = false;
    subgroup_control subgroups_;
    device_desc desc_;
};

}  // namespace qkv::vulkan::detail
