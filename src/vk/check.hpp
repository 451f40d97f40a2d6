// VkResult to qkv's typed errors.
#pragma once

#include <string_view>

#include "qkv/vulkan/error.hpp"
#include "vk/vk.hpp"

namespace qkv::vulkan::detail {

/// "VK_ERROR_OUT_OF_DEVICE_MEMORY" and so on.
const char* result_name(VkResult result);

/// Throws the error type that matches `result` (device_lost, out_of_memory, unavailable for a
/// missing driver/feature/extension, error otherwise), with `what` naming the failed call.
[[noreturn]] void throw_result(VkResult result, std::string_view what);

/// Throws unless result is VK_SUCCESS (or another non-error code such as VK_INCOMPLETE).
inline void check(VkResult result, std::string_view what) {
    if (result < 0) throw_result(result, what);
}

}  // namespace qkv::vulkan::detail
