// Every Vulkan entry point qkv uses, loaded at run time (see loader.cpp).
// QKV_VK_GLOBAL: from vkGetInstanceProcAddr(nullptr, ...); QKV_VK_INSTANCE: per instance;
// QKV_VK_DEVICE: per device, through vkGetDeviceProcAddr.
// The second argument: `required` (loading fails with unavailable, naming it, when it is missing)
// or `optional` (may be null; the code that calls it checks first).
#ifndef QKV_VK_GLOBAL
#define QKV_VK_GLOBAL(name, need)
#endif
#ifndef QKV_VK_INSTANCE
#define QKV_VK_INSTANCE(name, need)
#endif
#ifndef QKV_VK_DEVICE
#define QKV_VK_DEVICE(name, need)
#endif

QKV_VK_GLOBAL(vkCreateInstance, required)
QKV_VK_GLOBAL(vkEnumerateInstanceLayerProperties, required)
QKV_VK_GLOBAL(vkEnumerateInstanceExtensionProperties, required)
QKV_VK_GLOBAL(vkEnumerateInstanceVersion, optional)  // Vulkan 1.0 loaders

QKV_VK_INSTANCE(vkDestroyInstance, required)
QKV_VK_INSTANCE(vkEnumeratePhysicalDevices, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceProperties, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceProperties2, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceFeatures2, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceMemoryProperties, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceFormatProperties, required)
QKV_VK_INSTANCE(vkGetPhysicalDeviceQueueFamilyProperties, required)
QKV_VK_INSTANCE(vkEnumerateDeviceExtensionProperties, required)
QKV_VK_INSTANCE(vkCreateDevice, required)
QKV_VK_INSTANCE(vkGetDeviceProcAddr, required)
QKV_VK_INSTANCE(vkCreateDebugUtilsMessengerEXT, optional)  // with the validation layer only
QKV_VK_INSTANCE(vkDestroyDebugUtilsMessengerEXT, optional)
QKV_VK_INSTANCE(vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR, optional)  // VK_KHR_cooperative_matrix

QKV_VK_DEVICE(vkDestroyDevice, required)
QKV_VK_DEVICE(vkGetDeviceQueue, required)
QKV_VK_DEVICE(vkDeviceWaitIdle, required)
QKV_VK_DEVICE(vkCreateBuffer, required)
QKV_VK_DEVICE(vkDestroyBuffer, required)
QKV_VK_DEVICE(vkCreateBufferView, required)
QKV_VK_DEVICE(vkDestroyBufferView, required)
QKV_VK_DEVICE(vkGetBufferMemoryRequirements, required)
QKV_VK_DEVICE(vkAllocateMemory, required)
QKV_VK_DEVICE(vkFreeMemory, required)
QKV_VK_DEVICE(vkBindBufferMemory, required)
QKV_VK_DEVICE(vkMapMemory, required)
QKV_VK_DEVICE(vkUnmapMemory, required)
QKV_VK_DEVICE(vkFlushMappedMemoryRanges, required)
QKV_VK_DEVICE(vkInvalidateMappedMemoryRanges, required)
QKV_VK_DEVICE(vkCreateShaderModule, required)
QKV_VK_DEVICE(vkDestroyShaderModule, required)
QKV_VK_DEVICE(vkCreatePipelineCache, required)
QKV_VK_DEVICE(vkDestroyPipelineCache, required)
QKV_VK_DEVICE(vkCreateDescriptorSetLayout, required)
QKV_VK_DEVICE(vkDestroyDescriptorSetLayout, required)
QKV_VK_DEVICE(vkCreatePipelineLayout, required)
QKV_VK_DEVICE(vkDestroyPipelineLayout, required)
QKV_VK_DEVICE(vkCreateComputePipelines, required)
QKV_VK_DEVICE(vkDestroyPipeline, required)
QKV_VK_DEVICE(vkCreateDescriptorPool, required)
QKV_VK_DEVICE(vkDestroyDescriptorPool, required)
QKV_VK_DEVICE(vkResetDescriptorPool, required)
QKV_VK_DEVICE(vkAllocateDescriptorSets, required)
QKV_VK_DEVICE(vkUpdateDescriptorSets, required)
QKV_VK_DEVICE(vkCreateCommandPool, required)
QKV_VK_DEVICE(vkDestroyCommandPool, required)
QKV_VK_DEVICE(vkResetCommandPool, required)
QKV_VK_DEVICE(vkAllocateCommandBuffers, required)
QKV_VK_DEVICE(vkBeginCommandBuffer, required)
QKV_VK_DEVICE(vkEndCommandBuffer, required)
QKV_VK_DEVICE(vkCmdBindPipeline, required)
QKV_VK_DEVICE(vkCmdBindDescriptorSets, required)
QKV_VK_DEVICE(vkCmdPushConstants, required)
QKV_VK_DEVICE(vkCmdDispatch, required)
QKV_VK_DEVICE(vkCmdPipelineBarrier, required)
QKV_VK_DEVICE(vkCmdCopyBuffer, required)
QKV_VK_DEVICE(vkCmdFillBuffer, required)
QKV_VK_DEVICE(vkCmdResetQueryPool, required)
QKV_VK_DEVICE(vkCmdWriteTimestamp, required)
QKV_VK_DEVICE(vkCreateQueryPool, required)
QKV_VK_DEVICE(vkDestroyQueryPool, required)
QKV_VK_DEVICE(vkGetQueryPoolResults, required)
QKV_VK_DEVICE(vkCreateFence, required)
QKV_VK_DEVICE(vkDestroyFence, required)
QKV_VK_DEVICE(vkResetFences, required)
QKV_VK_DEVICE(vkWaitForFences, required)
QKV_VK_DEVICE(vkGetFenceStatus, required)
QKV_VK_DEVICE(vkQueueSubmit, required)

#undef QKV_VK_GLOBAL
#undef QKV_VK_INSTANCE
#undef QKV_VK_DEVICE
