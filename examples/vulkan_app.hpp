// A minimal Vulkan application of its own, for the interop example and tests: its instance (the
// Khronos validation layer with synchronisation validation, and a messenger that counts every
// warning and error), its device and queue, its buffers and its compute pipelines, all through
// volk (the loader opened at run time). Nothing here belongs to qkv: it is what a renderer or an
// inference engine already has when it reaches for qkv/vulkan/interop.hpp.
#pragma once

#include <volk.h>

#ifdef _WIN32
#include <windows.h>
#else
#include <dlfcn.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace app {

/// A zero-initialised Vulkan structure with its sType.
template <class T>
T make(VkStructureType type) {
    T value{};
    value.sType = type;
    return value;
}

inline void check(VkResult r, const char* what) {
    if (r != VK_SUCCESS) throw std::runtime_error(std::string(what) + " failed: VkResult " + std::to_string(r));
}

/// Validation messages, counted and printed.
struct messages {
    std::mutex mutex;
    std::vector<std::string> seen;
    static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT,
                                                     VkDebugUtilsMessageTypeFlagsEXT,
                                                     const VkDebugUtilsMessengerCallbackDataEXT* data, void* self) {
        auto* m = static_cast<messages*>(self);
        std::lock_guard lock(m->mutex);
        m->seen.emplace_back(data && data->pMessage ? data->pMessage : "(no message)");
        std::fprintf(stderr, "validation: %s\n", m->seen.back().c_str());
        return VK_FALSE;
    }
    std::size_t count() {
        std::lock_guard lock(mutex);
        return seen.size();
    }
};

/// A buffer with its own host-visible memory (the usage a compute application gives its tensors).
struct buffer {
    VkDevice device = VK_NULL_HANDLE;
    VkBuffer handle = VK_NULL_HANDLE;
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkDeviceSize size = 0;
    void* mapped = nullptr;
    buffer() = default;
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    buffer(buffer&& o) noexcept { *this = std::move(o); }
    buffer& operator=(buffer&& o) noexcept {
        std::swap(device, o.device), std::swap(handle, o.handle), std::swap(memory, o.memory);
        std::swap(size, o.size), std::swap(mapped, o.mapped);
        return *this;
    }
    ~buffer() {
        if (handle) vkDestroyBuffer(device, handle, nullptr);
        if (memory) vkFreeMemory(device, memory, nullptr);
    }
    template <class T>
    T* data() const {
        return static_cast<T*>(mapped);
    }
};

/// The application: one instance, one device with one compute queue, a command pool.
class vulkan_app {
public:
    /// `fp16`: enable storageBuffer16BitAccess where the device has it (false: leave it off, as
    /// an application that never needed it would).
    explicit vulkan_app(bool fp16 = true) {
        load_vulkan();
        const char* layer = "VK_LAYER_KHRONOS_validation";
        std::uint32_t count = 0;
        vkEnumerateInstanceLayerProperties(&count, nullptr);
        std::vector<VkLayerProperties> layers(count);
        vkEnumerateInstanceLayerProperties(&count, layers.data());
        bool have_layer = false;
        for (const auto& l : layers) have_layer = have_layer || std::strcmp(l.layerName, layer) == 0;
        if (!have_layer)
            throw std::runtime_error(
                "the Khronos validation layer is not installed (apt-get install vulkan-validationlayers)");
        // VK_EXT_validation_features turns synchronisation validation on; where the layer does not
        // offer it (Wine's winevulkan), VK_LAYER_ENABLES in the environment does.
        vkEnumerateInstanceExtensionProperties(layer, &count, nullptr);
        std::vector<VkExtensionProperties> layer_extensions(count);
        vkEnumerateInstanceExtensionProperties(layer, &count, layer_extensions.data());
        bool have_features = false;
        for (const auto& e : layer_extensions)
            have_features =
                have_features || std::strcmp(e.extensionName, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME) == 0;
        const char* extensions[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
        VkDebugUtilsMessengerCreateInfoEXT messenger_info =
            make<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
        messenger_info.messageSeverity =
            VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
        messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                                     VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
        messenger_info.pfnUserCallback = messages::on_message;
        messenger_info.pUserData = &log;
        const VkValidationFeatureEnableEXT sync = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
        VkValidationFeaturesEXT features = make<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
        features.pNext = &messenger_info;
        features.enabledValidationFeatureCount = 1;
        features.pEnabledValidationFeatures = &sync;
        VkApplicationInfo app_info = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
        app_info.pApplicationName = "qkv interop example";
        app_info.apiVersion = VK_API_VERSION_1_2;
        VkInstanceCreateInfo info = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
        info.pNext = have_features ? static_cast<const void*>(&features) : &messenger_info;
        info.pApplicationInfo = &app_info;
        info.enabledLayerCount = 1;
        info.ppEnabledLayerNames = &layer;
        info.enabledExtensionCount = have_features ? 2 : 1;
        info.ppEnabledExtensionNames = extensions;
        check(vkCreateInstance(&info, nullptr, &instance), "vkCreateInstance (is vulkan-validationlayers installed?)");
        volkLoadInstance(instance);
        check(vkCreateDebugUtilsMessengerEXT(instance, &messenger_info, nullptr, &messenger),
              "vkCreateDebugUtilsMessengerEXT");

        vkEnumeratePhysicalDevices(instance, &count, nullptr);
        std::vector<VkPhysicalDevice> devices(count);
        vkEnumeratePhysicalDevices(instance, &count, devices.data());
        if (devices.empty()) throw std::runtime_error("no Vulkan device");
        physical = devices[0];
        std::uint32_t families = 0;
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &families, nullptr);
        std::vector<VkQueueFamilyProperties> props(families);
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &families, props.data());
        for (std::uint32_t i = 0; i < families; ++i)
            if (props[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
                family = i;
                break;
            }
        VkPhysicalDevice16BitStorageFeatures has16 =
            make<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
        VkPhysicalDeviceFeatures2 query = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
        query.pNext = &has16;
        vkGetPhysicalDeviceFeatures2(physical, &query);
        storage16.storageBuffer16BitAccess = fp16 ? has16.storageBuffer16BitAccess : VK_FALSE;
        features2.pNext = &storage16;
        queue_info.queueFamilyIndex = family;
        queue_info.queueCount = 1;
        queue_info.pQueuePriorities = &priority_;
        device_info.pNext = &features2;
        device_info.queueCreateInfoCount = 1;
        device_info.pQueueCreateInfos = &queue_info;
        check(vkCreateDevice(physical, &device_info, nullptr, &device), "vkCreateDevice");
        volkLoadDevice(device);
        vkGetDeviceQueue(device, family, 0, &queue);
        VkCommandPoolCreateInfo pool_info = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
        pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
        pool_info.queueFamilyIndex = family;
        check(vkCreateCommandPool(device, &pool_info, nullptr, &pool), "vkCreateCommandPool");
    }

    ~vulkan_app() {
        if (device) {
            vkDeviceWaitIdle(device);
            vkDestroyCommandPool(device, pool, nullptr);
            for (auto& p : pipelines) {
                vkDestroyPipeline(device, p.pipeline, nullptr);
                vkDestroyPipelineLayout(device, p.layout, nullptr);
                vkDestroyDescriptorSetLayout(device, p.set_layout, nullptr);
                vkDestroyDescriptorPool(device, p.descriptors, nullptr);
            }
            vkDestroyDevice(device, nullptr);
        }
        if (messenger) vkDestroyDebugUtilsMessengerEXT(instance, messenger, nullptr);
        if (instance) vkDestroyInstance(instance, nullptr);
    }
    vulkan_app(const vulkan_app&) = delete;
    vulkan_app& operator=(const vulkan_app&) = delete;

    [[nodiscard]] bool fp16_enabled() const { return storage16.storageBuffer16BitAccess == VK_TRUE; }

    /// What make_buffer's buffers are created with unless told: storage, texel source and copy
    /// source/target.
    static constexpr VkBufferUsageFlags all_usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                                    VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT |
                                                    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

    /// A host-visible, coherent buffer of `usage`.
    buffer make_buffer(VkDeviceSize size, VkBufferUsageFlags usage = all_usage) {
        buffer b;
        b.device = device;
        b.size = size;
        VkBufferCreateInfo info = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
        info.size = size;
        info.usage = usage;
        check(vkCreateBuffer(device, &info, nullptr, &b.handle), "vkCreateBuffer");
        VkMemoryRequirements req;
        vkGetBufferMemoryRequirements(device, b.handle, &req);
        VkPhysicalDeviceMemoryProperties mem;
        vkGetPhysicalDeviceMemoryProperties(physical, &mem);
        std::uint32_t type = UINT32_MAX;
        const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
        for (std::uint32_t i = 0; i < mem.memoryTypeCount; ++i)
            if ((req.memoryTypeBits & (1u << i)) && (mem.memoryTypes[i].propertyFlags & want) == want) {
                type = i;
                break;
            }
        if (type == UINT32_MAX) throw std::runtime_error("no host-visible coherent memory");
        VkMemoryAllocateInfo alloc = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
        alloc.allocationSize = req.size;
        alloc.memoryTypeIndex = type;
        check(vkAllocateMemory(device, &alloc, nullptr, &b.memory), "vkAllocateMemory");
        check(vkBindBufferMemory(device, b.handle, b.memory, 0), "vkBindBufferMemory");
        check(vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory");
        return b;
    }

    /// A compute pipeline of `spirv` with `bindings` storage buffers and `push` bytes of constants;
    /// each dispatch takes a new descriptor set from its own pool.
    std::size_t make_pipeline(std::span<const std::uint32_t> spirv, std::uint32_t bindings, std::uint32_t push) {
        pipeline p;
        std::vector<VkDescriptorSetLayoutBinding> slots(bindings);
        for (std::uint32_t i = 0; i < bindings; ++i)
            slots[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
        VkDescriptorSetLayoutCreateInfo set_info =
            make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
        set_info.bindingCount = bindings;
        set_info.pBindings = slots.data();
        check(vkCreateDescriptorSetLayout(device, &set_info, nullptr, &p.set_layout), "vkCreateDescriptorSetLayout");
        const VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push};
        VkPipelineLayoutCreateInfo layout_info =
            make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
        layout_info.setLayoutCount = 1;
        layout_info.pSetLayouts = &p.set_layout;
        layout_info.pushConstantRangeCount = push ? 1u : 0u;
        layout_info.pPushConstantRanges = &range;
        check(vkCreatePipelineLayout(device, &layout_info, nullptr, &p.layout), "vkCreatePipelineLayout");
        VkShaderModuleCreateInfo module_info =
            make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
        module_info.codeSize = spirv.size_bytes();
        module_info.pCode = spirv.data();
        VkShaderModule module = VK_NULL_HANDLE;
        check(vkCreateShaderModule(device, &module_info, nullptr, &module), "vkCreateShaderModule");
        VkComputePipelineCreateInfo info =
            make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
        info.stage = make<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
        info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
        info.stage.module = module;
        info.stage.pName = "main";
        info.layout = p.layout;
        const VkResult made = vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &info, nullptr, &p.pipeline);
        vkDestroyShaderModule(device, module, nullptr);
        check(made, "vkCreateComputePipelines");
        const VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 64 * bindings};
        VkDescriptorPoolCreateInfo pool_info =
            make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
        pool_info.maxSets = 64;
        pool_info.poolSizeCount = 1;
        pool_info.pPoolSizes = &size;
        check(vkCreateDescriptorPool(device, &pool_info, nullptr, &p.descriptors), "vkCreateDescriptorPool");
        pipelines.push_back(p);
        return pipelines.size() - 1;
    }

    /// Records a dispatch of pipeline `id` over whole buffers.
    void dispatch(VkCommandBuffer cmd, std::size_t id, std::span<const VkBuffer> buffers, const void* push,
                  std::uint32_t push_bytes, std::uint32_t groups) {
        const pipeline& p = pipelines[id];
        VkDescriptorSetAllocateInfo alloc =
            make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
        alloc.descriptorPool = p.descriptors;
        alloc.descriptorSetCount = 1;
        alloc.pSetLayouts = &p.set_layout;
        VkDescriptorSet set = VK_NULL_HANDLE;
        check(vkAllocateDescriptorSets(device, &alloc, &set), "vkAllocateDescriptorSets");
        std::vector<VkDescriptorBufferInfo> infos;
        for (VkBuffer b : buffers) infos.push_back({b, 0, VK_WHOLE_SIZE});
        std::vector<VkWriteDescriptorSet> writes;
        for (std::uint32_t i = 0; i < infos.size(); ++i) {
            VkWriteDescriptorSet w = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
            w.dstSet = set;
            w.dstBinding = i;
            w.descriptorCount = 1;
            w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w.pBufferInfo = &infos[i];
            writes.push_back(w);
        }
        vkUpdateDescriptorSets(device, static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
        vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
        vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
        if (push_bytes) vkCmdPushConstants(cmd, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
        vkCmdDispatch(cmd, groups, 1, 1);
    }

    /// A compute-to-compute barrier (the application's own, between its dispatches and qkv's).
    static void compute_barrier(VkCommandBuffer cmd) {
        VkMemoryBarrier b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &b,
                             0, nullptr, 0, nullptr);
    }
    /// Compute writes made visible to the host (before mapped reads after the fence).
    static void host_barrier(VkCommandBuffer cmd) {
        VkMemoryBarrier b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
        b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
        b.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
        vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &b, 0,
                             nullptr, 0, nullptr);
    }

    VkCommandBuffer begin() {
        VkCommandBufferAllocateInfo alloc =
            make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
        alloc.commandPool = pool;
        alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
        alloc.commandBufferCount = 1;
        VkCommandBuffer cmd = VK_NULL_HANDLE;
        check(vkAllocateCommandBuffers(device, &alloc, &cmd), "vkAllocateCommandBuffers");
        VkCommandBufferBeginInfo begin = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
        begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
        check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
        return cmd;
    }
    /// Ends and submits (once); returns the fence it signals.
    VkFence submit(VkCommandBuffer cmd) {
        check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
        VkFenceCreateInfo fence_info = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
        VkFence fence = VK_NULL_HANDLE;
        check(vkCreateFence(device, &fence_info, nullptr, &fence), "vkCreateFence");
        VkSubmitInfo info = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
        info.commandBufferCount = 1;
        info.pCommandBuffers = &cmd;
        check(vkQueueSubmit(queue, 1, &info, fence), "vkQueueSubmit");
        return fence;
    }
    /// Waits for a submit's fence, then frees it and its command buffer.
    void wait(VkFence fence, VkCommandBuffer cmd) {
        check(vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
        vkDestroyFence(device, fence, nullptr);
        vkFreeCommandBuffers(device, pool, 1, &cmd);
    }
    /// Ends, submits (once), waits, frees.
    void submit_and_wait(VkCommandBuffer cmd) { wait(submit(cmd), cmd); }
    /// Frees a command buffer never submitted.
    void discard(VkCommandBuffer cmd) { vkFreeCommandBuffers(device, pool, 1, &cmd); }

    VkInstance instance = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
    VkPhysicalDevice physical = VK_NULL_HANDLE;
    VkDevice device = VK_NULL_HANDLE;
    std::uint32_t family = 0;
    VkQueue queue = VK_NULL_HANDLE;
    VkCommandPool pool = VK_NULL_HANDLE;
    messages log;
    // What the device was created with (kept: qkv reads it in make_context).
    VkPhysicalDevice16BitStorageFeatures storage16 =
        make<VkPhysicalDevice16BitStorageFeatures>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES);
    VkPhysicalDeviceFeatures2 features2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    VkDeviceQueueCreateInfo queue_info = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
    VkDeviceCreateInfo device_info = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO);

private:
    /// The Vulkan loader: QKV_VULKAN_LIBRARY where set (as qkv itself honours it: the CI's Wine shim),
    /// else the system's, through volk.
    static void load_vulkan() {
        const char* custom = std::getenv("QKV_VULKAN_LIBRARY");
        if (!custom || !*custom) {
            check(volkInitialize(), "volkInitialize (no Vulkan loader?)");
            return;
        }
#ifdef _WIN32
        HMODULE library = LoadLibraryA(custom);
        auto get = library ? reinterpret_cast<PFN_vkGetInstanceProcAddr>(
                                 reinterpret_cast<void*>(GetProcAddress(library, "vkGetInstanceProcAddr")))
                           : nullptr;
#else
        void* library = dlopen(custom, RTLD_NOW | RTLD_LOCAL);
        auto get =
            library ? reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(library, "vkGetInstanceProcAddr")) : nullptr;
#endif
        if (!get) throw std::runtime_error(std::string("cannot load the Vulkan loader ") + custom);
        volkInitializeCustom(get);
    }

    float priority_ = 1.0f;
    struct pipeline {
        VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
        VkPipelineLayout layout = VK_NULL_HANDLE;
        VkPipeline pipeline = VK_NULL_HANDLE;
        VkDescriptorPool descriptors = VK_NULL_HANDLE;
    };
    std::vector<pipeline> pipelines;
};

}  // namespace app
