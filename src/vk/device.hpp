// The logical device of a context: one compute queue, the features qkv enables, memory types.
#pragma once

#include <memory>

#include "vk/device_desc.hpp"
#include "vk/instance.hpp"
#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

/// A device the caller created (context from an external_device): its handles and what it was
/// created with, as far as qkv needs to know.
struct external_handles {
    VkDevice device = VK_NULL_HANDLE;
    std::uint32_t queue_family = 0;
    VkQueue queue = VK_NULL_HANDLE;
    bool storage_16bit = false;           ///< storageBuffer16BitAccess enabled
    bool shader_int64 = false;            ///< shaderInt64 enabled
    bool subgroup_size_control = false;   ///< subgroupSizeControl enabled (and the extension, or Vulkan 1.3)
    bool compute_full_subgroups = false;  ///< computeFullSubgroups enabled
};

class device {
public:
    device(std::shared_ptr<const instance> inst, std::size_t index);
    /// The caller's device (never destroyed here), on `inst`'s only physical device. Throws
    /// unavailable naming what qkv needs that the device lacks (Vulkan 1.1, a compute queue).
    device(std::shared_ptr<const instance> inst, const external_handles& handles);
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
    bool owned_ = true;

    void describe_for_planners();
};

}  // namespace qkv::vulkan::detail
