// Running an attention problem on the backend chosen on the command line: a Vulkan device, or
// the CPU reference backend.
#pragma once

#include <optional>
#include <string>

#include "qkv/runtime/problem.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/testing.hpp"

namespace qkv::cli {

enum class backend { vulkan, cpu };

struct backend_result {
    qkv::attention_output result;
    /// Where it ran, for people: "llvmpipe (LLVM 15.0.6, 256 bits) — CPU, Vulkan 1.3.230, driver
    /// llvmpipe (Mesa 22.3.6 (LLVM 15.0.6))", or the CPU reference backend.
    std::string ran_on;
};

/// The one way the tool opens a Vulkan context: on the device `device` names (the --device flag's
/// text: a decimal index or a part of the name; empty: QKV_DEVICE, else the best device), with
/// `hooks` (qkv bench's measurements). A device that matches nothing is no_matching_device naming
/// --device (or QKV_DEVICE); where Vulkan itself is missing and the command has a CPU backend
/// (`cpu_backend`), the error also points at --backend cpu.
qkv::vulkan::context open_context(const std::string& device, bool cpu_backend = true,
                                  const qkv::vulkan::testing::hooks& hooks = {});

/// Runs `problem` on `choice`. For Vulkan, `device` picks the device (a decimal index or a part of
/// its name; unset: QKV_DEVICE, else the best device). When Vulkan itself is unavailable the
/// qkv::vulkan::unavailable thrown says so and suggests --backend cpu.
backend_result run_attention(const qkv::attention_problem& problem, backend choice,
                             const std::optional<std::string>& device = std::nullopt);

}  // namespace qkv::cli
