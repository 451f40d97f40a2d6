// Reading a context's settings (kernels/settings.hpp) and the device request: the one place in
// src/api that reads the environment (QKV_DEVICE, QKV_VALIDATION and the tuning variables
// QKV_CPU_SHUFFLE, QKV_FLASH_CPU_TILES, QKV_PROJECT_TILES, QKV_PROJECT_TEXELS). src/vk/loader.cpp
// reads QKV_VULKAN_LIBRARY, the only other.
#pragma once

#include <optional>
#include <string>

#include "kernels/settings.hpp"
#include "qkv/vulkan/testing.hpp"

namespace qkv::vulkan::detail {

/// The tuning variables and `hooks`, once. Throws qkv::invalid_argument naming a variable whose
/// value cannot be used (e.g. "QKV_CPU_SHUFFLE=on: expected 0 (never) or 1 ...").
settings read_settings(const testing::hooks& hooks);

/// Whether the validation layer is asked for: `requested`, or QKV_VALIDATION set to other than 0.
bool validation_requested(bool requested);

/// The device a context should use: `requested`, else QKV_DEVICE where set (`from_environment`
/// says which), else none (the best device).
std::optional<std::string> device_selector(const std::optional<std::string>& requested, bool& from_environment);

}  // namespace qkv::vulkan::detail
