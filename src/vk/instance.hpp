// A Vulkan instance (optionally with the validation layer and a messenger collecting its
// messages) and what qkv needs to know about each physical device.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "qkv/vulkan/device_info.hpp"
#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

/// Validation messages (warnings and errors), appended by the messenger, taken by tests.
struct message_sink {
    std::mutex mutex;
    std::vector<std::string> messages;
    void add(std::string message);
    std::vector<std::string> take();
};

class instance {
public:
    explicit instance(bool validation);
    /// The caller's instance (never destroyed here), seen through `get`, with `physical` as its
    /// only device. No validation messages are collected: the caller's messenger has them.
    instance(VkInstance external, PFN_vkGetInstanceProcAddr get, VkPhysicalDevice physical);
    ~instance();
    instance(const instance&) = delete;
    instance& operator=(const instance&) = delete;

    [[nodiscard]] const instance_table& fn() const { return fn_; }
    [[nodiscard]] VkInstance handle() const { return handle_; }
    [[nodiscard]] bool validation() const { return validation_; }
    [[nodiscard]] message_sink& messages() const { return *sink_; }

    [[nodiscard]] const std::vector<VkPhysicalDevice>& physical_devices() const { return physical_; }
    [[nodiscard]] const std::vector<device_info>& devices() const { return infos_; }

private:
    instance_table fn_{};
    VkInstance handle_ = VK_NULL_HANDLE;
    VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
    bool validation_ = false;
    bool owned_ = true;
    std::unique_ptr<message_sink> sink_;
    std::vector<VkPhysicalDevice> physical_;
    std::vector<device_info> infos_;
};

/// The queue family qkv uses on `device`: one with compute, preferring one that also does
/// graphics (the universal family); UINT32_MAX if none.
std::uint32_t compute_queue_family(const instance_table& fn, VkPhysicalDevice device);

}  // namespace qkv::vulkan::detail
