// Device listing and selection (discrete > integrated > virtual > CPU > other, QKV_DEVICE override).
#include <algorithm>
#include <cctype>
#include <charconv>

#include "api/device_request.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "vk/instance.hpp"

namespace qkv::vulkan {

const char* to_string(device_type type) {
    switch (type) {
        case device_type::discrete_gpu:
            return "discrete GPU";
        case device_type::integrated_gpu:
            return "integrated GPU";
        case device_type::virtual_gpu:
            return "virtual GPU";
        case device_type::cpu:
            return "CPU";
        case device_type::other:
            break;
    }
    return "other";
}

const char* to_string(matrix_component component) {
    switch (component) {
        case matrix_component::f16:
            return "f16";
        case matrix_component::f32:
            return "f32";
        case matrix_component::f64:
            return "f64";
        case matrix_component::s8:
            return "s8";
        case matrix_component::s16:
            return "s16";
        case matrix_component::s32:
            return "s32";
        case matrix_component::s64:
            return "s64";
        case matrix_component::u8:
            return "u8";
        case matrix_component::u16:
            return "u16";
        case matrix_component::u32:
            return "u32";
        case matrix_component::u64:
            return "u64";
        case matrix_component::other:
            break;
    }
    return "other";
}

std::vector<device_info> list_devices(const instance_options& options) {
    const detail::instance inst(detail::validation_requested(options.validation));
    return inst.devices();
}

namespace {

int type_rank(device_type t) {
    switch (t) {
        case device_type::discrete_gpu:
            return 4;
        case device_type::integrated_gpu:
            return 3;
        case device_type::virtual_gpu:
            return 2;
        case device_type::cpu:
            return 1;
        case device_type::other:
            break;
    }
    return 0;
}

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}

std::string names(const std::vector<device_info>& devices) {
    std::string out;
    for (const auto& d : devices) out += (out.empty() ? "" : ", ") + std::to_string(d.index) + ": " + d.name;
    return out;
}

}  // namespace

std::size_t select_device(const std::vector<device_info>& devices, const std::optional<std::string>& selector) {
    if (devices.empty()) throw unavailable("no Vulkan device found");
    if (selector && !selector->empty()) {
        const std::string& s = *selector;
        std::size_t index = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), index);
        std::size_t found = devices.size();
        if (ec == std::errc() && end == s.data() + s.size()) {
            if (index >= devices.size())
                throw no_matching_device("no Vulkan device with index " + s + " (devices: " + names(devices) + ")");
            found = index;
        } else {
            for (std::size_t i = 0; i < devices.size() && found == devices.size(); ++i)
                if (lower(devices[i].name).find(lower(s)) != std::string::npos) found = i;
            if (found == devices.size())
                throw no_matching_device("no Vulkan device whose name contains \"" + s +
                                         "\" (devices: " + names(devices) + ")");
        }
        if (!devices[found].has_compute_queue)
            throw no_matching_device("Vulkan device " + std::to_string(found) + " (" + devices[found].name +
                                     ") cannot run qkv: it needs Vulkan 1.1 and a compute queue");
        return found;
    }
    std::size_t best = devices.size();
    for (std::size_t i = 0; i < devices.size(); ++i) {
        if (!devices[i].has_compute_queue) continue;
        if (best == devices.size()) {
            best = i;
            continue;
        }
        const auto& a = devices[i];
        const auto& b = devices[best];
        if (type_rank(a.type) > type_rank(b.type) ||
            (type_rank(a.type) == type_rank(b.type) && a.device_local_memory > b.device_local_memory))
            best = i;
    }
    if (best == devices.size())
        throw unavailable("no Vulkan device supports compute with Vulkan 1.1 (devices: " + names(devices) + ")");
    return best;
}

}  // namespace qkv::vulkan
