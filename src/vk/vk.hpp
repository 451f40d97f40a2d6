// Vulkan for qkv's sources: the C headers without prototypes (nothing links libvulkan) and the
// tables of entry points loaded at run time. Private to src/.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan_core.h>

// VK_KHR_cooperative_matrix (Vulkan headers 1.3.255 and later): the declarations qkv uses, written
// out where the headers predate it (Debian 12's are 1.3.239), with the registry's names and values.
#ifndef VK_KHR_cooperative_matrix
#define VK_KHR_cooperative_matrix 1
#define VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME "VK_KHR_cooperative_matrix"
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR static_cast<VkStructureType>(1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR static_cast<VkStructureType>(1000506001)
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR static_cast<VkStructureType>(1000506002)
typedef enum VkComponentTypeKHR {
    VK_COMPONENT_TYPE_FLOAT16_KHR = 0,
    VK_COMPONENT_TYPE_FLOAT32_KHR = 1,
    VK_COMPONENT_TYPE_FLOAT64_KHR = 2,
    VK_COMPONENT_TYPE_SINT8_KHR = 3,
    VK_COMPONENT_TYPE_SINT16_KHR = 4,
    VK_COMPONENT_TYPE_SINT32_KHR = 5,
    VK_COMPONENT_TYPE_SINT64_KHR = 6,
    VK_COMPONENT_TYPE_UINT8_KHR = 7,
    VK_COMPONENT_TYPE_UINT16_KHR = 8,
    VK_COMPONENT_TYPE_UINT32_KHR = 9,
    VK_COMPONENT_TYPE_UINT64_KHR = 10,
    VK_COMPONENT_TYPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkComponentTypeKHR;
typedef enum VkScopeKHR {
    VK_SCOPE_DEVICE_KHR = 1,
    VK_SCOPE_WORKGROUP_KHR = 2,
    VK_SCOPE_SUBGROUP_KHR = 3,
    VK_SCOPE_QUEUE_FAMILY_KHR = 5,
    VK_SCOPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkScopeKHR;
typedef struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void* pNext;
    uint32_t MSize;
    uint32_t NSize;
    uint32_t KSize;
    VkComponentTypeKHR AType;
    VkComponentTypeKHR BType;
    VkComponentTypeKHR CType;
    VkComponentTypeKHR ResultType;
    VkBool32 saturatingAccumulation;
    VkScopeKHR scope;
} VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void* pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void* pNext;
    VkShaderStageFlags cooperativeMatrixSupportedStages;
} VkPhysicalDeviceCooperativeMatrixPropertiesKHR;
typedef VkResult(VKAPI_PTR* PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice physicalDevice, uint32_t* pPropertyCount, VkCooperativeMatrixPropertiesKHR* pProperties);
#endif

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

/// The features the cooperative-matrix kernels need, chained cooperative matrix -> Vulkan memory
/// model -> float16 arithmetic: one list that instance.cpp queries and device.cpp enables. Not
/// copyable (the chain points into itself).
struct coopmat_features {
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR coop = vk_struct<VkPhysicalDeviceCooperativeMatrixFeaturesKHR>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR);
    VkPhysicalDeviceVulkanMemoryModelFeatures model = vk_struct<VkPhysicalDeviceVulkanMemoryModelFeatures>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES);
    VkPhysicalDeviceShaderFloat16Int8Features f16 = vk_struct<VkPhysicalDeviceShaderFloat16Int8Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);

    coopmat_features() {
        coop.pNext = &model;
        model.pNext = &f16;
    }
    coopmat_features(const coopmat_features&) = delete;
    coopmat_features& operator=(const coopmat_features&) = delete;

    /// Puts the chain in front of `next`; returns its head, for a pNext.
    void* chain(void* next) {
        f16.pNext = next;
        return &coop;
    }
};

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
