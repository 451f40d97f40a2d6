#include "api/device_request.hpp"

#include <cstdlib>
#include <string>
#include <string_view>

namespace qkv::vulkan::detail {
namespace {

/// The value of an environment variable, or empty.
std::string environment(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

}  // namespace

bool validation_requested(bool requested) {
    const std::string v = environment("QKV_VALIDATION");
    return requested || (!v.empty() && v != "0");
}

std::optional<std::string> device_selector(const std::optional<std::string>& requested, bool& from_environment) {
    from_environment = false;
    if (requested) return requested;
    if (std::string v = environment("QKV_DEVICE"); !v.empty()) {
        from_environment = true;
        return v;
    }
    return std::nullopt;
}

}  // namespace qkv::vulkan::detail
