#include "vk/instance.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "qkv/runtime/error.hpp"
#include "vk/check.hpp"

namespace qkv::vulkan::detail {
namespace {

constexpr const char* validation_layer = "VK_LAYER_KHRONOS_validation";

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data, void* user) {
    const char* level = (severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) ? "error" : "warning";
    std::string text = std::string("[") + level + "] ";
    if (data && data->pMessageIdName) text += std::string(data->pMessageIdName) + ": ";
    if (data && data->pMessage) text += data->pMessage;
    static_cast<message_sink*>(user)->add(std::move(text));
    return VK_FALSE;
}

bool has_layer(const loader& l, const char* name) {
    std::vector<VkLayerProperties> layers;
    if (enumerate(layers, l.vkEnumerateInstanceLayerProperties) < 0) return false;
    return std::any_of(layers.begin(), layers.end(),
                       [&](const auto& p) { return std::strcmp(p.layerName, name) == 0; });
}

std::vector<std::string> instance_extensions(const loader& l, const char* layer) {
    std::vector<VkExtensionProperties> props;
    if (enumerate(props, l.vkEnumerateInstanceExtensionProperties, layer) < 0) return {};
    std::vector<std::string> names;
    for (const auto& p : props) names.emplace_back(p.extensionName);
    return names;
}

bool contains(const std::vector<std::string>& v, std::string_view s) {
    return std::find(v.begin(), v.end(), s) != v.end();
}

std::string version_string(std::uint32_t v) {
    return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
           std::to_string(VK_API_VERSION_PATCH(v));
}

device_type to_type(VkPhysicalDeviceType t) {
    switch (t) {
        case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
            return device_type::discrete_gpu;
        case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
            return device_type::integrated_gpu;
        case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
            return device_type::virtual_gpu;
        case VK_PHYSICAL_DEVICE_TYPE_CPU:
            return device_type::cpu;
        default:
            return device_type::other;
    }
}

bool device_has_extension(const instance_table& fn, VkPhysicalDevice pd, const char* name) {
    std::vector<VkExtensionProperties> props;
    if (enumerate(props, fn.vkEnumerateDeviceExtensionProperties, pd, static_cast<const char*>(nullptr)) < 0)
        return false;
    return std::any_of(props.begin(), props.end(),
                       [&](const auto& p) { return std::strcmp(p.extensionName, name) == 0; });
}

matrix_component to_component(VkComponentTypeKHR t) {
    switch (t) {
        case VK_COMPONENT_TYPE_FLOAT16_KHR:
            return matrix_component::f16;
        case VK_COMPONENT_TYPE_FLOAT32_KHR:
            return matrix_component::f32;
        case VK_COMPONENT_TYPE_FLOAT64_KHR:
            return matrix_component::f64;
        case VK_COMPONENT_TYPE_SINT8_KHR:
            return matrix_component::s8;
        case VK_COMPONENT_TYPE_SINT16_KHR:
            return matrix_component::s16;
        case VK_COMPONENT_TYPE_SINT32_KHR:
            return matrix_component::s32;
        case VK_COMPONENT_TYPE_SINT64_KHR:
            return matrix_component::s64;
        case VK_COMPONENT_TYPE_UINT8_KHR:
            return matrix_component::u8;
        case VK_COMPONENT_TYPE_UINT16_KHR:
            return matrix_component::u16;
        case VK_COMPONENT_TYPE_UINT32_KHR:
            return matrix_component::u32;
        case VK_COMPONENT_TYPE_UINT64_KHR:
            return matrix_component::u64;
        default:
            return matrix_component::other;
    }
}

/// VK_KHR_cooperative_matrix on `pd`: its list of shapes (where the extension is there), and whether
/// everything qkv's cooperative-matrix kernels need comes with it (device.cpp enables exactly that).
void describe_cooperative_matrix(const instance_table& fn, VkPhysicalDevice pd, const VkPhysicalDeviceProperties& base,
                                 bool storage16, device_info& d) {
    if (!fn.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR ||
        !device_has_extension(fn, pd, VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME))
        return;
    std::vector<VkCooperativeMatrixPropertiesKHR> list;
    std::uint32_t count = 0;
    if (fn.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR(pd, &count, nullptr) < 0) return;
    list.assign(count,
                vk_struct<VkCooperativeMatrixPropertiesKHR>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR));
    if (fn.vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR(pd, &count, list.data()) < 0) return;
    list.resize(count);
    for (const auto& p : list)
        d.cooperative_matrices.push_back({p.MSize, p.NSize, p.KSize, to_component(p.AType), to_component(p.BType),
                                          to_component(p.CType), to_component(p.ResultType),
                                          p.saturatingAccumulation == VK_TRUE, p.scope == VK_SCOPE_SUBGROUP_KHR});

    // What the kernels need with it: the feature, in compute shaders; the Vulkan memory model (the
    // GLSL extension's SPIR-V declares it) at device scope; float16 arithmetic, 16-bit storage buffers.
    const bool v12 = base.apiVersion >= VK_API_VERSION_1_2;
    if (!v12 && !device_has_extension(fn, pd, "VK_KHR_vulkan_memory_model")) return;
    if (!v12 && !device_has_extension(fn, pd, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME)) return;
    auto stages = vk_struct<VkPhysicalDeviceCooperativeMatrixPropertiesKHR>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR);
    auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props.pNext = &stages;
    fn.vkGetPhysicalDeviceProperties2(pd, &props);
    coopmat_features need;
    auto features = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    features.pNext = need.chain(nullptr);
    fn.vkGetPhysicalDeviceFeatures2(pd, &features);
    // (vulkanMemoryModelDeviceScope too: with the memory model on, qkv's other shaders' atomics at
    // device scope need it.)
    d.cooperative_matrix = need.coop.cooperativeMatrix == VK_TRUE && need.model.vulkanMemoryModel == VK_TRUE &&
                           need.model.vulkanMemoryModelDeviceScope == VK_TRUE && need.f16.shaderFloat16 == VK_TRUE &&
                           storage16 && (stages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
}

device_info describe(const instance_table& fn, VkPhysicalDevice pd, std::uint32_t index) {
    VkPhysicalDeviceProperties base{};
    fn.vkGetPhysicalDeviceProperties(pd, &base);
    const bool v12 = base.apiVersion >= VK_API_VERSION_1_2;

    auto driver = vk_struct<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
    auto subgroup =
        vk_struct<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
    subgroup.pNext = (v12 || device_has_extension(fn, pd, VK_KHR_DRIVER_PROPERTIES_EXTENSION_NAME)) ? &driver : nullptr;
    auto props = vk_struct<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props.pNext = &subgroup;
    fn.vkGetPhysicalDeviceProperties2(pd, &props);

    auto f16 = vk_struct<VkPhysicalDeviceShaderFloat16Int8Features>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES);
    auto storage16 =
        vk_struct<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
    storage16.pNext = (v12 || device_has_extension(fn, pd, VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME)) ? &f16 : nullptr;
    auto features = vk_struct<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    features.pNext = &storage16;
    fn.vkGetPhysicalDeviceFeatures2(pd, &features);

    VkPhysicalDeviceMemoryProperties mem{};
    fn.vkGetPhysicalDeviceMemoryProperties(pd, &mem);

    device_info d;
    d.index = index;
    d.name = base.deviceName;
    d.type = to_type(base.deviceType);
    d.vendor_id = base.vendorID;
    d.api_version = base.apiVersion;
    d.api_version_string = version_string(base.apiVersion);
    d.driver_version = base.driverVersion;
    if (subgroup.pNext) {
        d.driver_id = static_cast<std::uint32_t>(driver.driverID);
        d.driver = std::string(driver.driverName);
        if (driver.driverInfo[0]) d.driver += std::string(" (") + driver.driverInfo + ")";
    }
    if (d.driver.empty()) d.driver = "driver version " + std::to_string(base.driverVersion);
    d.subgroup_size = subgroup.subgroupSize;
    d.subgroup_arithmetic = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                            (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                            (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) && subgroup.subgroupSize > 0;
    d.subgroup_shuffle = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                         (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) &&
                         (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) && subgroup.subgroupSize > 0;
    d.subgroup_vote = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                      (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_VOTE_BIT) &&
                      (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BASIC_BIT) && subgroup.subgroupSize > 0;
    d.max_shared_memory = base.limits.maxComputeSharedMemorySize;
    d.max_workgroup_invocations = base.limits.maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; ++i) d.max_workgroup_count[i] = base.limits.maxComputeWorkGroupCount[i];
    d.max_storage_buffer_range = base.limits.maxStorageBufferRange;
    for (std::uint32_t h = 0; h < mem.memoryHeapCount; ++h)
        if (mem.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            d.device_local_memory = std::max<std::uint64_t>(d.device_local_memory, mem.memoryHeaps[h].size);
    d.fp16_storage = storage16.storageBuffer16BitAccess == VK_TRUE;
    d.fp16_arithmetic = f16.shaderFloat16 == VK_TRUE;
    d.shader_int64 = features.features.shaderInt64 == VK_TRUE;
    d.timestamp_period_ns = static_cast<double>(base.limits.timestampPeriod);
    describe_cooperative_matrix(fn, pd, base, d.fp16_storage, d);
    const std::uint32_t family = compute_queue_family(fn, pd);
    d.has_compute_queue = family != UINT32_MAX && base.apiVersion >= VK_API_VERSION_1_1;
    if (family != UINT32_MAX) {
        std::vector<VkQueueFamilyProperties> families;
        enumerate(families, fn.vkGetPhysicalDeviceQueueFamilyProperties, pd);
        d.timestamps = base.limits.timestampComputeAndGraphics == VK_TRUE && families[family].timestampValidBits > 0;
    }
    return d;
}

}  // namespace

void message_sink::add(std::string message) {
    std::lock_guard lock(mutex);
    messages.push_back(std::move(message));
}

std::vector<std::string> message_sink::take() {
    std::lock_guard lock(mutex);
    return std::exchange(messages, {});
}

std::uint32_t compute_queue_family(const instance_table& fn, VkPhysicalDevice device) {
    std::vector<VkQueueFamilyProperties> families;
    enumerate(families, fn.vkGetPhysicalDeviceQueueFamilyProperties, device);
    const auto count = static_cast<std::uint32_t>(families.size());
    std::uint32_t best = UINT32_MAX;
    for (std::uint32_t i = 0; i < count; ++i) {
        if (!(families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || families[i].queueCount == 0) continue;
        if (best == UINT32_MAX || (families[i].queueFlags & VK_QUEUE_GRAPHICS_BIT)) {
            best = i;
            if (families[i].queueFlags & VK_QUEUE_GRAPHICS_BIT) break;
        }
    }
    return best;
}

instance::instance(bool validation) : validation_(validation), sink_(std::make_unique<message_sink>()) {
    const loader& l = loader::get();
    std::uint32_t loader_version = VK_API_VERSION_1_0;
    if (l.vkEnumerateInstanceVersion)
        check(l.vkEnumerateInstanceVersion(&loader_version), "vkEnumerateInstanceVersion");
    if (loader_version < VK_API_VERSION_1_1)
        throw unavailable("the Vulkan loader supports only Vulkan " + version_string(loader_version) +
                          "; qkv needs Vulkan 1.1 or newer");

    std::vector<const char*> layers, extensions;
    const auto available = instance_extensions(l, nullptr);
    VkInstanceCreateFlags flags = 0;
    if (contains(available, VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME)) {  // MoltenVK lists itself only then
        extensions.push_back(VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME);
        flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
    }

    auto messenger_info =
        vk_struct<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
    messenger_info.messageSeverity =
        VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
    messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                                 VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
    messenger_info.pfnUserCallback = on_message;
    messenger_info.pUserData = sink_.get();
    const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    auto features = vk_struct<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
    features.enabledValidationFeatureCount = 1;
    features.pEnabledValidationFeatures = enables;
    const void* next = nullptr;

    if (validation_) {
        if (!has_layer(l, validation_layer))
            throw unavailable(
                "validation was requested but the Khronos validation layer (VK_LAYER_KHRONOS_validation) "
                "is not installed; on Debian/Ubuntu: apt-get install vulkan-validationlayers");
        layers.push_back(validation_layer);
        const auto layer_ext = instance_extensions(l, validation_layer);
        if (!contains(available, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) &&
            !contains(layer_ext, VK_EXT_DEBUG_UTILS_EXTENSION_NAME))
            throw unavailable("validation was requested but VK_EXT_debug_utils is not available");
        extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
        next = &messenger_info;  // also catches messages of vkCreateInstance / vkDestroyInstance
        if (contains(layer_ext, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME)) {
            extensions.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
            features.pNext = &messenger_info;
            next = &features;
        }
    }

    auto app = vk_struct<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
    app.pApplicationName = "qkv";
    app.pEngineName = "qkv";
    app.apiVersion = std::min<std::uint32_t>(loader_version, VK_API_VERSION_1_3);
    auto info = vk_struct<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
    info.pNext = next;
    info.flags = flags;
    info.pApplicationInfo = &app;
    info.enabledLayerCount = static_cast<std::uint32_t>(layers.size());
    info.ppEnabledLayerNames = layers.data();
    info.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
    info.ppEnabledExtensionNames = extensions.data();
    const VkResult created = l.vkCreateInstance(&info, nullptr, &handle_);
    if (created == VK_ERROR_INCOMPATIBLE_DRIVER)
        throw unavailable(
            "no Vulkan driver found (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER); install your "
            "GPU's Vulkan driver, or Mesa's lavapipe (mesa-vulkan-drivers) for a CPU device");
    check(created, "vkCreateInstance");

    try {
        fn_.load(l.vkGetInstanceProcAddr, handle_);
        if (validation_) {
            check(fn_.vkCreateDebugUtilsMessengerEXT(handle_, &messenger_info, nullptr, &messenger_),
                  "vkCreateDebugUtilsMessengerEXT");
        }
        check(enumerate(physical_, fn_.vkEnumeratePhysicalDevices, handle_), "vkEnumeratePhysicalDevices");
        const auto count = static_cast<std::uint32_t>(physical_.size());
        if (physical_.empty())
            throw unavailable(
                "no Vulkan device found: the loader works but no driver reports a device; install your "
                "GPU's Vulkan driver, or Mesa's lavapipe (mesa-vulkan-drivers) for a CPU device");
        for (std::uint32_t i = 0; i < count; ++i) infos_.push_back(describe(fn_, physical_[i], i));
    } catch (...) {
        if (messenger_) fn_.vkDestroyDebugUtilsMessengerEXT(handle_, messenger_, nullptr);
        if (fn_.vkDestroyInstance) fn_.vkDestroyInstance(handle_, nullptr);
        throw;
    }
}

instance::instance(VkInstance external, PFN_vkGetInstanceProcAddr get, VkPhysicalDevice physical)
    : handle_(external), owned_(false), sink_(std::make_unique<message_sink>()) {
    if (!external || !get || !physical)
        throw qkv::invalid_argument(
            "external_device: instance, physical_device and get_instance_proc_addr must all be given");
    fn_.load(get, handle_);
    physical_.push_back(physical);
    infos_.push_back(describe(fn_, physical, 0));
}

instance::~instance() {
    if (!owned_) return;  // the caller's: never destroyed here
    if (messenger_) fn_.vkDestroyDebugUtilsMessengerEXT(handle_, messenger_, nullptr);
    fn_.vkDestroyInstance(handle_, nullptr);
}

}  // namespace qkv::vulkan::detail
