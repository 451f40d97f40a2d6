// Running an attention problem on the backend chosen on the command line: a Vulkan device, or
// the CPU reference backend.
#pragma once

#include <optional>
#include <string>

#include "qkv/vulkan/problem.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace qkv::cli {

enum class backend { vulkan, cpu };

/// Adds `--backend vulkan|cpu` (default vulkan) to `command`, stored in `choice`.
CLI::Option* add_backend_option(CLI::App& command, backend& choice, const std::string& description);

struct backend_result {
    qkv::attention_output result;
    /// Where it ran, for people: "llvmpipe (LLVM 15.0.6, 256 bits) — CPU, Vulkan 1.3.230, driver
    /// llvmpipe (Mesa 22.3.6 (LLVM 15.0.6))", or the CPU reference backend.
    std::string ran_on;
};

/// Runs `problem` on `choice`. For Vulkan, `device` picks the device (a decimal index or a part of
/// its name; unset: QKV_DEVICE, else the best device). When Vulkan itself is unavailable the
/// qkv::vulkan::unavailable thrown says so and suggests --backend cpu.
backend_result run_attention(const qkv::attention_problem& problem, backend choice,
                             const std::optional<std::string>& device = std::nullopt);

}  // namespace qkv::cli
