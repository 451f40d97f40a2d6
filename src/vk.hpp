// Vulkan for qkv's sources: the C headers without prototypes (nothing links libvulkan) and the
// tables of entry points loaded at run time. Private to src/.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan_core.h>

#include <memory>
#include <string>

namespace qkv::vulkan::detail {

/// The Vulkan loader library, opened at run time, and its global entry points.
struct loader {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define QKV_VK_GLOBAL(name) PFN_##name name = nullptr;
#include "vk_functions.inl"

    /// Opens libvulkan.so.1 / vulkan-1.dll / libvulkan.1.dylib (or QKV_VULKAN_LIBRARY), once per
    /// process. Throws unavailable("no Vulkan loader found: ...") when there is none.
    static const loader& get();

private:
    void* library_ = nullptr;
};

struct instance_table {
#define QKV_VK_INSTANCE(name) PFN_##name name = nullptr;
#include "vk_functions.inl"
    void load(const loader& l, VkInstance instance);
};

struct device_table {
#define QKV_VK_DEVICE(name) PFN_##name name = nullptr;
#include "vk_functions.inl"
    void load(const instance_table& it, VkDevice device);
};

}  // namespace qkv::vulkan::detail

namespace qkv::vulkan::detail {

/// A zero-initialised Vulkan structure with its sType set.
template <class T>
T vk_struct(VkStructureType type) {
    T value{};
    value.sType = type;
    return value;
}

}  // namespace qkv::vulkan::detail
