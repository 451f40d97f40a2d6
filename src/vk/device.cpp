#include "vk/device.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "qkv/runtime/error.hpp"
#include "vk/check.hpp"
#include "vk/shaders.hpp"

namespace qkv::vulkan::detail {
namespace {

bool has_extension(const instance_table& fn, VkPhysicalDevice pd, const char* name) {
    std::vector<VkExtensionProperties> props;
    if (enumerate(props, fn.vkEnumerateDeviceExtensionProperties, pd, static_cast<const char*>(nullptr)) < 0)
        return false;
    for (const auto& p : props)
        if (std::strcmp(p.extensionName, name) == 0) return true;
    return false;
}

}  // namespace

device::device(std::shared_ptr<const instance> inst, std::size_t index)
    : instance_(std::move(inst)),
      physical_(instance_->physical_devices().at(index)),
      info_(instance_->devices().at(index)) {
    const instance_table& ifn = instance_->fn();
    if (!info_.has_compute_queue)
        throw unavailable("device " + std::to_string(index) + " (" + info_.name +
                          ") cannot run qkv: it needs Vulkan 1.1 and a compute queue");
    family_ = compute_queue_family(ifn, physical_);
    ifn.vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);
    VkPhysicalDeviceProperties props{};
    ifn.vkGetPhysicalDeviceProperties(physical_, &props);
    limits_ = props.limits;

    const float priority = 1.0f;
    auto queue_info = vk_struct<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    queue_info.queueFamilyIndex = family_;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;

    // Enable only what the device has: 16-bit storage for the fp16 precision path, 64-bit integers
    // for the projection's eight-column stores on CPU devices (project_cpu_tx_wide).
    auto storage16 =
        vk_struct<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
    storage16.storageBuffer16BitAccess = info_.fp16_storage ? VK_TRUE : VK_FALSE;
    auto features = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    features.pNext = &storage16;
    features.features.shaderInt64 = info_.shader_int64 ? VK_TRUE : VK_FALSE;

    std::vector<const char*> extensions;
    // A portability (MoltenVK) device must enable the subset extension.
    if (has_extension(ifn, physical_, "VK_KHR_portability_subset")) extensions.push_back("VK_KHR_portability_subset");

    // Subgroup size control (VK_EXT_subgroup_size_control; drivers keep listing it in 1.3), optional:
    // the fused kernel then requires its row-team size as the subgroup size, with full subgroups,
    // so its subgroup reductions apply. Enabled only where the device has it.
    const bool size_ext = has_extension(ifn, physical_, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    auto size_features = vk_struct<VkPhysicalDeviceSubgroupSizeControlFeatures>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
    if (size_ext) {
        auto size_props = vk_struct<VkPhysicalDeviceSubgroupSizeControlProperties>(
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES);
        auto props2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
        props2.pNext = &size_props;
        ifn.vkGetPhysicalDeviceProperties2(physical_, &props2);
        auto query = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
        query.pNext = &size_features;
        ifn.vkGetPhysicalDeviceFeatures2(physical_, &query);
        size_features.pNext = nullptr;
        if (size_features.subgroupSizeControl == VK_TRUE &&
            (size_props.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && size_props.minSubgroupSize > 0) {
            subgroups_.min_size = size_props.minSubgroupSize;
            subgroups_.max_size = size_props.maxSubgroupSize;
            subgroups_.required_size = true;
            subgroups_.full_subgroups = size_features.computeFullSubgroups == VK_TRUE;
            subgroups_.max_subgroups = size_props.maxComputeWorkgroupSubgroups;
            storage16.pNext = &size_features;
            extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
        } else {
            size_features.subgroupSizeControl = VK_FALSE;
            size_features.computeFullSubgroups = VK_FALSE;
        }
    }

    // VK_KHR_cooperative_matrix with what its kernels need (instance.cpp, describe_cooperative_matrix,
    // found them all): the feature, the Vulkan memory model and float16 arithmetic. Core in Vulkan
    // 1.2 but for the first; the extensions of the other two on a 1.1 device.
    coopmat_features wanted;
    if (info_.cooperative_matrix) {
        wanted.coop.cooperativeMatrix = VK_TRUE;
        wanted.model.vulkanMemoryModel = VK_TRUE;
        wanted.model.vulkanMemoryModelDeviceScope = VK_TRUE;
        wanted.f16.shaderFloat16 = VK_TRUE;
        features.pNext = wanted.chain(features.pNext);
        extensions.push_back(VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME);
        if (info_.api_version < VK_API_VERSION_1_2) {
            extensions.push_back("VK_KHR_vulkan_memory_model");
            extensions.push_back(VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME);
        }
    }

    auto info = vk_struct<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);
    info.pNext = &features;
    info.queueCreateInfoCount = 1;
    info.pQueueCreateInfos = &queue_info;
    info.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
    info.ppEnabledExtensionNames = extensions.data();
    check(ifn.vkCreateDevice(physical_, &info, nullptr, &handle_), "vkCreateDevice (" + info_.name + ")");
    try {
        fn_.load(ifn, handle_);
    } catch (...) {
        auto destroy = reinterpret_cast<PFN_vkDestroyDevice>(ifn.vkGetDeviceProcAddr(handle_, "vkDestroyDevice"));
        if (destroy) destroy(handle_, nullptr);
        throw;
    }
    fn_.vkGetDeviceQueue(handle_, family_, 0, &queue_);
    fp16_storage_ = info_.fp16_storage;
    describe_for_planners();
}

device::device(std::shared_ptr<const instance> inst, const external_handles& h)
    : instance_(std::move(inst)),
      physical_(instance_->physical_devices().at(0)),
      info_(instance_->devices().at(0)),
      owned_(false) {
    const instance_table& ifn = instance_->fn();
    if (!h.device || !h.queue) throw qkv::invalid_argument("external_device: device and queue must be given");
    if (info_.api_version < VK_API_VERSION_1_1)
        throw unavailable("external_device: " + info_.name + " reports Vulkan " + info_.api_version_string +
                          "; qkv needs Vulkan 1.1 or newer");
    std::vector<VkQueueFamilyProperties> families;
    enumerate(families, ifn.vkGetPhysicalDeviceQueueFamilyProperties, physical_);
    if (h.queue_family >= families.size() || !(families[h.queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT))
        throw unavailable("external_device: queue family " + std::to_string(h.queue_family) + " of " + info_.name +
                          " does not support compute; qkv needs a compute queue");
    handle_ = h.device;
    queue_ = h.queue;
    family_ = h.queue_family;
    ifn.vkGetPhysicalDeviceMemoryProperties(physical_, &memory_);
    VkPhysicalDeviceProperties props{};
    ifn.vkGetPhysicalDeviceProperties(physical_, &props);
    limits_ = props.limits;
    fn_.load(ifn, handle_);
    // Only what the caller enabled counts: a feature the device has but was not created with is
    // not there (fp16 precision is then refused, naming storageBuffer16BitAccess).
    info_.fp16_storage = info_.fp16_storage && h.storage_16bit;
    info_.caller_device = true;
    info_.shader_int64 = info_.shader_int64 && h.shader_int64;
    info_.timestamps = info_.timestamps && families[h.queue_family].timestampValidBits > 0;
    // qkv cannot see whether the caller enabled cooperative matrices (and the memory model and
    // float16 arithmetic with them): its cooperative-matrix kernels are not used on such a device.
    info_.cooperative_matrix = false;
    if (h.subgroup_size_control && has_extension(ifn, physical_, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME)) {
        auto size_props = vk_struct<VkPhysicalDeviceSubgroupSizeControlProperties>(
            VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES);
        auto props2 = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
        props2.pNext = &size_props;
        ifn.vkGetPhysicalDeviceProperties2(physical_, &props2);
        if ((size_props.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && size_props.minSubgroupSize > 0) {
            subgroups_.min_size = size_props.minSubgroupSize;
            subgroups_.max_size = size_props.maxSubgroupSize;
            subgroups_.required_size = true;
            subgroups_.full_subgroups = h.compute_full_subgroups;
            subgroups_.max_subgroups = size_props.maxComputeWorkgroupSubgroups;
        }
    }
    fp16_storage_ = info_.fp16_storage;
    describe_for_planners();
}

void device::describe_for_planners() {
    desc_.info = info_;
    desc_.subgroups = subgroups_;
    desc_.storage_alignment = std::max<std::uint64_t>(16, limits_.minStorageBufferOffsetAlignment);
    desc_.texel_alignment = std::max<std::uint64_t>(16, limits_.minTexelBufferOffsetAlignment);
    desc_.max_texel_elements = limits_.maxTexelBufferElements;
    desc_.max_push_bytes = limits_.maxPushConstantsSize;
    desc_.max_workgroup_size_x = limits_.maxComputeWorkGroupSize[0];
    desc_.texels_rgba32f = uniform_texel_format(VK_FORMAT_R32G32B32A32_SFLOAT);
    desc_.texels_rgba16f = uniform_texel_format(VK_FORMAT_R16G16B16A16_SFLOAT);
    desc_.coopmat_shaders = coopmat_shaders_built();
}

bool device::uniform_texel_format(VkFormat format) const {
    VkFormatProperties props{};
    instance_->fn().vkGetPhysicalDeviceFormatProperties(physical_, format, &props);
    return (props.bufferFeatures & VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT) != 0;
}

device::~device() {
    if (!owned_) return;  // the caller's: never waited on or destroyed here (each call waited for its own work)
    fn_.vkDeviceWaitIdle(handle_);
    fn_.vkDestroyDevice(handle_, nullptr);
}

}  // namespace qkv::vulkan::detail
