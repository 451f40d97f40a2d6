// qkv::vulkan::device_info — what qkv knows about one Vulkan device: its kind, limits and
// features. Its own header, so the parts of the library that only read a device description (the
// plan, the tile choices) need not include the whole run-time API (context.hpp includes this).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

enum class device_type { other, integrated_gpu, discrete_gpu, virtual_gpu, cpu };

/// "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other".
QKV_VULKAN_API const char* to_string(device_type type);

/// The element types of a cooperative matrix (VkComponentTypeKHR), as far as qkv names them.
enum class matrix_component { f16, f32, f64, s8, s16, s32, s64, u8, u16, u32, u64, other };

/// "f16", "f32", ..., "other".
QKV_VULKAN_API const char* to_string(matrix_component component);

/// One entry of a device's VkCooperativeMatrixPropertiesKHR list (VK_KHR_cooperative_matrix): the
/// matrix units compute Result (m x n) = A (m x k) · B (k x n) + C (m x n) for one subgroup (or a
/// wider scope) at a time, with these element types.
struct cooperative_matrix_shape {
    std::uint32_t m = 0, n = 0, k = 0;
    matrix_component a = matrix_component::f16, b = matrix_component::f16;
    matrix_component c = matrix_component::f32, result = matrix_component::f32;
    bool saturating = false;     ///< saturatingAccumulation (integer types)
    bool subgroup_scope = true;  ///< VK_SCOPE_SUBGROUP_KHR; false: a workgroup, device or queue-family scope
};

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
    bool subgroup_vote = false;           ///< subgroupAny/All usable in compute shaders
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
    std::uint32_t driver_id = 0;  ///< VkDriverId (VkPhysicalDeviceDriverProperties::driverID); 0: not reported
    std::uint32_t driver_version =
        0;  ///< VkPhysicalDeviceProperties::driverVersion (each vendor encodes it its own way)
    /// VK_KHR_cooperative_matrix: the device's list of matrix shapes and types (empty without the
    /// extension), and whether it offers everything qkv's cooperative-matrix kernels need with it
    /// (the cooperativeMatrix feature in compute shaders, vulkanMemoryModel with its device scope,
    /// shaderFloat16 and 16-bit storage buffers), which a context then enables.
    std::vector<cooperative_matrix_shape> cooperative_matrices;
    bool cooperative_matrix = false;
};

}  // namespace qkv::vulkan
