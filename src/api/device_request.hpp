// The device a context asks for: the one place in src/api that reads the environment (QKV_DEVICE,
// QKV_VALIDATION). plan/settings.cpp reads the tuning variables and src/vk/loader.cpp
// QKV_VULKAN_LIBRARY, the only others.
#pragma once

#include <optional>
#include <string>

namespace qkv::vulkan::detail {

/// Whether the validation layer is asked for: `requested`, or QKV_VALIDATION set to other than 0.
bool validation_requested(bool requested);

/// The device a context should use: `requested`, else QKV_DEVICE where set (`from_environment`
/// says which), else none (the best device).
std::optional<std::string> device_selector(const std::optional<std::string>& requested, bool& from_environment);

}  // namespace qkv::vulkan::detail
