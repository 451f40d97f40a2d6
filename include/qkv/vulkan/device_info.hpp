// qkv::vulkan::device_info — what qkv knows about one Vulkan device: its kind, limits and
// features. Its own header, so the parts of the library that only read a device description (the
// plan, the tile choices) need not include the whole run-time API (context.hpp includes this).
#pragma once

#include <cstdint>
#include <string>

#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

enum class device_type { other, integrated_gpu, discrete_gpu, virtual_gpu, cpu };

/// "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other".
QKV_VULKAN_API const char* to_string(device_type type);

struct device_info {
    std::uint32_t index = 0;  ///< position in vkEnumeratePhysicalDevices
    std::string name;
    device_type type = device_type::other;
    std::string driver;  ///< driver name and version string (VkPhysicalDeviceDriverProperties)
    std::uint32_t api_version = 0;
    std::string api_version_string;
    std::uint32_t vendor_id = 0;
    std::uint32_t subgroup_size = 0;
    bool subgroup_arithmetic = false;     ///< subgroupAdd/Max usable in compute shaders
    bool subgroup_shuffle = false;        ///< subgroupShuffle usable in compute shaders
    std::uint32_t max_shared_memory = 0;  ///< maxComputeSharedMemorySize, bytes
    std::uint32_t max_workgroup_invocations = 0;
    std::uint32_t max_workgroup_count[3] = {0, 0, 0};
    std::uint64_t max_storage_buffer_range = 0;
    std::uint64_t device_local_memory = 0;  ///< size of the largest device-local heap
    bool fp16_storage = false;              ///< storageBuffer16BitAccess
    bool fp16_arithmetic = false;           ///< shaderFloat16
    bool shader_int64 = false;              ///< shaderInt64: 64-bit integers in shaders
    bool timestamps = false;                ///< timestampComputeAndGraphics
    double timestamp_period_ns = 0;
    bool has_compute_queue = false;
    /// A caller's device (interop.hpp's make_context): the optional features above are the ones it
    /// was created with, not all the hardware offers.
    bool caller_device = false;
};

}  // namespace qkv::vulkan
