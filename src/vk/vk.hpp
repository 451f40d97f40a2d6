// Vulkan for qkv's sources: the C headers without prototypes (nothing links libvulkan) and the
// tables of entry points loaded at run time. Private to src/.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace qkv::vulkan::detail {

/// The Vulkan loader library, opened at run time, and its global entry points.
struct loader {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
#define QKV_VK_GLOBAL(name, need) PFN_##name name = nullptr;
#include "vk/vk_functions.inl"

    /// Opens libvulkan.so.1 / vulkan-1.dll / libvulkan.1.dylib (or QKV_VULKAN_LIBRARY), once per
    /// process. Throws unavailable("no Vulkan loader found: ...") when there is none.
    static const loader& get();

private:
    void* library_ = nullptr;
};

struct instance_table {
#define QKV_VK_INSTANCE(name, need) PFN_##name name = nullptr;
#include "vk/vk_functions.inl"
    void load(PFN_vkGetInstanceProcAddr get, VkInstance instance);
};

struct device_table {
#define QKV_VK_DEVICE(name, need) PFN_##name name = nullptr;
#include "vk/vk_functions.inl"
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

/// The count-then-data pattern of vkEnumerate* and vkGet*Properties: asks `fn(args..., &count,
/// nullptr)` for the count, then fills `out` (resized to what the second call reports). Returns
/// the first error (a negative VkResult), else the second call's result (VK_INCOMPLETE where the
/// list grew in between); VK_SUCCESS for the functions that return nothing.
template <class T, class F, class... Args>
VkResult enumerate(std::vector<T>& out, F fn, Args... args) {
    std::uint32_t count = 0;
    if constexpr (std::is_void_v<std::invoke_result_t<F, Args..., std::uint32_t*, T*>>) {
        fn(args..., &count, static_cast<T*>(nullptr));
        out.resize(count);
        fn(args..., &count, out.data());
        out.resize(count);
        return VK_SUCCESS;
    } else {
        const VkResult first = fn(args..., &count, static_cast<T*>(nullptr));
        if (first < 0) {
            out.clear();
            return first;
        }
        out.resize(count);
        const VkResult second = fn(args..., &count, out.data());
        out.resize(count);
        return second;
    }
}

}  // namespace qkv::vulkan::detail
