// qkv_wine_vulkan.dll: Wine's vulkan-1.dll, plus the Khronos validation layer of the Linux host.
//
// qkv's tests create every context with the validation layer on and fail on any message. Under
// Wine there is no Windows layer to load: Wine's vulkan-1.dll lists no layers and refuses
// explicit ones, because it hands Vulkan to the host's loader (winevulkan). But the host's loader
// does run the host's validation layer below winevulkan when VK_INSTANCE_LAYERS names it, and the
// layer's messages reach the program's VK_EXT_debug_utils messenger through winevulkan.
//
// So .ci/windows.sh runs the tests with VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation (and
// VK_LAYER_ENABLES for synchronisation validation, which qkv asks for through
// VK_EXT_validation_features, an extension winevulkan does not carry) and points qkv at this DLL
// with QKV_VULKAN_LIBRARY. It forwards everything to Wine's vulkan-1.dll, except that
//   * vkEnumerateInstanceLayerProperties lists VK_LAYER_KHRONOS_validation when
//     VK_INSTANCE_LAYERS enables it on the host (and nothing otherwise, like Wine); Wine hides
//     the VK_* variables from Windows programs, so the emulator script passes a copy,
//     QKV_HOST_VK_INSTANCE_LAYERS,
//   * vkEnumerateInstanceExtensionProperties for that layer lists the extensions Wine itself has
//     of the layer's (VK_EXT_debug_utils, VK_EXT_debug_report),
//   * vkCreateInstance drops the layer from the enabled layers: the host's loader enabled it.
// Build: x86_64-w64-mingw32-g++-posix -std=c++20 -shared -static -I<Vulkan headers>
//        validation_shim.cpp -o qkv_wine_vulkan.dll
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <windows.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr const char* layer_name = "VK_LAYER_KHRONOS_validation";

PFN_vkGetInstanceProcAddr wine_gipa = nullptr;
PFN_vkEnumerateInstanceExtensionProperties wine_enumerate_extensions = nullptr;
PFN_vkCreateInstance wine_create_instance = nullptr;

bool load_wine_vulkan() {
    if (wine_gipa) return true;
    HMODULE lib = LoadLibraryA("vulkan-1.dll");
    if (!lib) return false;
    FARPROC p = GetProcAddress(lib, "vkGetInstanceProcAddr");
    if (!p) return false;
    std::memcpy(&wine_gipa, &p, sizeof p);
    wine_enumerate_extensions = reinterpret_cast<PFN_vkEnumerateInstanceExtensionProperties>(
        wine_gipa(nullptr, "vkEnumerateInstanceExtensionProperties"));
    wine_create_instance = reinterpret_cast<PFN_vkCreateInstance>(wine_gipa(nullptr, "vkCreateInstance"));
    return wine_enumerate_extensions && wine_create_instance;
}

/// True when VK_INSTANCE_LAYERS (read by the host's loader; the emulator script copies it into
/// QKV_HOST_VK_INSTANCE_LAYERS, as Wine hides VK_* from Windows programs) enables the layer.
bool host_layer_enabled() {
    const char* v = std::getenv("QKV_HOST_VK_INSTANCE_LAYERS");
    return v && std::strstr(v, layer_name) != nullptr;
}

template <class T>
VkResult fill(const std::vector<T>& items, std::uint32_t* count, T* out) {
    if (!out) {
        *count = static_cast<std::uint32_t>(items.size());
        return VK_SUCCESS;
    }
    const std::uint32_t n = *count < items.size() ? *count : static_cast<std::uint32_t>(items.size());
    for (std::uint32_t i = 0; i < n; ++i) out[i] = items[i];
    *count = n;
    return n < items.size() ? VK_INCOMPLETE : VK_SUCCESS;
}

VKAPI_ATTR VkResult VKAPI_CALL enumerate_layers(std::uint32_t* count, VkLayerProperties* out) {
    std::vector<VkLayerProperties> layers;
    if (host_layer_enabled()) {
        VkLayerProperties p{};
        std::strcpy(p.layerName, layer_name);
        p.specVersion = VK_HEADER_VERSION_COMPLETE;
        p.implementationVersion = 1;
        std::strcpy(p.description, "Khronos validation layer of the host, run by its loader below Wine");
        layers.push_back(p);
    }
    return fill(layers, count, out);
}

VKAPI_ATTR VkResult VKAPI_CALL enumerate_extensions(const char* layer, std::uint32_t* count,
                                                    VkExtensionProperties* out) {
    if (!layer || std::strcmp(layer, layer_name) != 0 || !host_layer_enabled())
        return wine_enumerate_extensions(layer, count, out);
    // The layer's instance extensions that Wine carries too: Wine's own list, filtered.
    std::uint32_t n = 0;
    if (VkResult r = wine_enumerate_extensions(nullptr, &n, nullptr); r != VK_SUCCESS) return r;
    std::vector<VkExtensionProperties> all(n), mine;
    if (VkResult r = wine_enumerate_extensions(nullptr, &n, all.data()); r < 0) return r;
    all.resize(n);
    for (const auto& e : all)
        if (std::strcmp(e.extensionName, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) == 0 ||
            std::strcmp(e.extensionName, VK_EXT_DEBUG_REPORT_EXTENSION_NAME) == 0)
            mine.push_back(e);
    return fill(mine, count, out);
}

VKAPI_ATTR VkResult VKAPI_CALL create_instance(const VkInstanceCreateInfo* info, const VkAllocationCallbacks* alloc,
                                               VkInstance* instance) {
    VkInstanceCreateInfo copy = *info;
    std::vector<const char*> layers;
    for (std::uint32_t i = 0; i < info->enabledLayerCount; ++i) {
        if (std::strcmp(info->ppEnabledLayerNames[i], layer_name) == 0 && host_layer_enabled()) continue;
        layers.push_back(info->ppEnabledLayerNames[i]);
    }
    copy.enabledLayerCount = static_cast<std::uint32_t>(layers.size());
    copy.ppEnabledLayerNames = layers.empty() ? nullptr : layers.data();
    return wine_create_instance(&copy, alloc, instance);
}

template <class F>
PFN_vkVoidFunction as_void_function(F f) {
    return reinterpret_cast<PFN_vkVoidFunction>(f);
}

}  // namespace

extern "C" __declspec(dllexport) VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL
    vkGetInstanceProcAddr(VkInstance instance, const char* name) {
    if (!load_wine_vulkan()) return nullptr;
    if (!instance && name) {
        if (std::strcmp(name, "vkEnumerateInstanceLayerProperties") == 0) return as_void_function(&enumerate_layers);
        if (std::strcmp(name, "vkEnumerateInstanceExtensionProperties") == 0)
            return as_void_function(&enumerate_extensions);
        if (std::strcmp(name, "vkCreateInstance") == 0) return as_void_function(&create_instance);
    }
    return wine_gipa(instance, name);
}
