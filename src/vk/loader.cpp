// Opens the Vulkan loader at run time, so a program using qkv starts (and gets a clear
// qkv::vulkan::unavailable) on a machine without Vulkan.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "vk/check.hpp"
#include "vk/vk.hpp"

#if defined(_WIN32)
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#endif

namespace qkv::vulkan::detail {
namespace {

#if defined(_WIN32)
const char* const default_names[] = {"vulkan-1.dll"};
void* open_library(const char* name) { return reinterpret_cast<void*>(LoadLibraryA(name)); }
void* find_symbol(void* lib, const char* name) {
    return reinterpret_cast<void*>(GetProcAddress(static_cast<HMODULE>(lib), name));
}
#elif defined(__APPLE__)
const char* const default_names[] = {"libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib"};
void* open_library(const char* name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }
void* find_symbol(void* lib, const char* name) { return dlsym(lib, name); }
#else
const char* const default_names[] = {"libvulkan.so.1", "libvulkan.so"};
void* open_library(const char* name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }
void* find_symbol(void* lib, const char* name) { return dlsym(lib, name); }
#endif

// The second argument of every entry in vk_functions.inl: QKV_VK_IF_REQUIRED(need, statement)
// expands to the statement for `required` entries and to nothing for `optional` ones.
#define QKV_VK_IF_REQUIRED(need, statement) QKV_VK_IF_REQUIRED_##need(statement)
#define QKV_VK_IF_REQUIRED_required(statement) statement
#define QKV_VK_IF_REQUIRED_optional(statement)

/// The first required global entry point `l` lacks, or nullptr.
const char* first_missing_global(const loader& l) {
#define QKV_VK_GLOBAL(name, need) QKV_VK_IF_REQUIRED(need, if (!l.name) return #name;)
#include "vk/vk_functions.inl"
    return nullptr;
}

template <class F>
F as_function(void* symbol) {
    F f;
    static_assert(sizeof(f) == sizeof(symbol));
    std::memcpy(&f, &symbol, sizeof(f));  // object pointer to function pointer, portably
    return f;
}

}  // namespace

const loader& loader::get() {
    // Loaded once; a failure is remembered too, so every later call reports the same reason.
    static std::once_flag once;
    static loader instance;
    static std::string failure;
    std::call_once(once, [] {
        std::string tried;
        if (const char* env = std::getenv("QKV_VULKAN_LIBRARY"); env && *env) {
            instance.library_ = open_library(env);
            tried = env;
        } else {
            for (const char* name : default_names) {
                instance.library_ = open_library(name);
                tried += (tried.empty() ? "" : ", ") + std::string(name);
                if (instance.library_) break;
            }
        }
        if (!instance.library_) {
            failure = "no Vulkan loader found (tried " + tried +
                      "); install your GPU's Vulkan driver, or Mesa's lavapipe (mesa-vulkan-drivers) for a CPU "
                      "device, or use the CPU backend";
            return;
        }
        instance.vkGetInstanceProcAddr =
            as_function<PFN_vkGetInstanceProcAddr>(find_symbol(instance.library_, "vkGetInstanceProcAddr"));
        if (!instance.vkGetInstanceProcAddr) {
            failure = "the Vulkan loader (" + tried + ") has no vkGetInstanceProcAddr";
            return;
        }
#define QKV_VK_GLOBAL(name, need) \
    instance.name = reinterpret_cast<PFN_##name>(instance.vkGetInstanceProcAddr(nullptr, #name));
#include "vk/vk_functions.inl"
        if (!instance.vkCreateInstance || !instance.vkEnumerateInstanceExtensionProperties)
            failure = "the Vulkan loader (" + tried + ") does not provide vkCreateInstance";
        else if (const char* name = first_missing_global(instance))
            failure = "the Vulkan loader (" + tried + ") does not provide " + name;
    });
    if (!failure.empty()) throw unavailable(failure);
    return instance;
}

void instance_table::load(PFN_vkGetInstanceProcAddr get, VkInstance instance) {
#define QKV_VK_INSTANCE(name, need) name = reinterpret_cast<PFN_##name>(get(instance, #name));
#include "vk/vk_functions.inl"
    if (!vkEnumeratePhysicalDevices || !vkCreateDevice || !vkGetDeviceProcAddr)
        throw unavailable("the Vulkan instance lacks core entry points (vkEnumeratePhysicalDevices, vkCreateDevice)");
    if (!vkGetPhysicalDeviceProperties2 || !vkGetPhysicalDeviceFeatures2)
        throw unavailable(
            "the Vulkan instance does not provide Vulkan 1.1 (vkGetPhysicalDeviceProperties2); "
            "qkv needs Vulkan 1.1 or newer");
#define QKV_VK_INSTANCE(name, need) \
    QKV_VK_IF_REQUIRED(need, if (!name) throw unavailable("the Vulkan instance does not provide " #name);)
#include "vk/vk_functions.inl"
}

void device_table::load(const instance_table& it, VkDevice device) {
#define QKV_VK_DEVICE(name, need) name = reinterpret_cast<PFN_##name>(it.vkGetDeviceProcAddr(device, #name));
#include "vk/vk_functions.inl"
#define QKV_VK_DEVICE(name, need) \
    QKV_VK_IF_REQUIRED(need, if (!name) throw unavailable("the Vulkan device does not provide " #name);)
#include "vk/vk_functions.inl"
}

}  // namespace qkv::vulkan::detail
