// `qkv devices`: the Vulkan devices of this machine, and the one qkv would pick.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "printing.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::cli {
namespace {

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string kibibytes(std::uint32_t bytes) { return std::to_string(bytes / 1024) + " KiB"; }

/// "8x8x8 f16*f16+f32->f32, ..." (a scope other than the subgroup's is named).
std::string matrices(const qkv::vulkan::device_info& d) {
    std::string out;
    for (const auto& m : d.cooperative_matrices) {
        if (!out.empty()) out += ", ";
        out += std::to_string(m.m) + "x" + std::to_string(m.n) + "x" + std::to_string(m.k) + " " +
               qkv::vulkan::to_string(m.a) + "*" + qkv::vulkan::to_string(m.b) + "+" + qkv::vulkan::to_string(m.c) +
               "->" + qkv::vulkan::to_string(m.result) + (m.saturating ? " (saturating)" : "") +
               (m.subgroup_scope ? "" : " (not subgroup scope)");
    }
    return out;
}

/// The selector a context would use: QKV_DEVICE when set (context_options::device is unset here).
std::optional<std::string> selector_from_environment() {
    const char* env = std::getenv("QKV_DEVICE");
    if (env && *env) return std::string(env);
    return std::nullopt;
}

void list() {
    std::vector<qkv::vulkan::device_info> devices;
    try {
        devices = qkv::vulkan::list_devices();
    } catch (const qkv::vulkan::unavailable& e) {
        throw qkv::vulkan::unavailable(std::string("no Vulkan devices to list: ") + e.what());
    }

    const std::optional<std::string> selector = selector_from_environment();
    std::optional<std::size_t> chosen;
    std::string why_none;
    try {
        chosen = qkv::vulkan::select_device(devices, selector);
    } catch (const qkv::vulkan::unavailable& e) {
        why_none = e.what();
    }

    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < devices.size(); ++i) {
        const auto& d = devices[i];
        rows.push_back({chosen == i ? "*" : "", std::to_string(d.index), d.name, qkv::vulkan::to_string(d.type),
                        d.driver, d.api_version_string, std::to_string(d.subgroup_size), kibibytes(d.max_shared_memory),
                        yes_no(d.fp16_storage) + "/" + yes_no(d.fp16_arithmetic)});
    }
    print_table(std::cout,
                {"", "index", "name", "type", "driver", "Vulkan", "subgroup", "shared mem", "fp16 storage/arith"},
                rows);
    for (const auto& d : devices)
        if (!d.cooperative_matrices.empty())
            std::cout << "\ndevice " << d.index << ": cooperative matrices (VK_KHR_cooperative_matrix"
                      << (d.cooperative_matrix ? "" : "; not usable by qkv: a feature it needs is missing")
                      << "): " << matrices(d) << "\n";
    if (!chosen) {
        std::cout.flush();
        if (selector)  // a bad QKV_DEVICE is bad input (exit 2); no usable device at all is not
            throw qkv::vulkan::no_matching_device("QKV_DEVICE=" + *selector +
                                                  " (environment variable) picks no usable device: " + why_none);
        throw qkv::vulkan::unavailable("none of these devices can run qkv: " + why_none);
    }
    std::cout << "\n* the device qkv uses by default"
              << (selector ? " (chosen by QKV_DEVICE=" + *selector + ")"
                           : std::string(" (set QKV_DEVICE to an index or "
                                         "a part of a name to choose another)"))
              << "\n";
}

}  // namespace

void add_devices(CLI::App& app) {
    CLI::App* cmd = app.add_subcommand("devices", "List the Vulkan devices and mark the one qkv would use");
    cmd->callback(list);
}

}  // namespace qkv::cli
