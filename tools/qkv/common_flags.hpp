// The flags several commands share, declared once: --backend, --device and --out. Header-only and
// Vulkan-free (the command-line fuzz target compiles the commands' flags alone).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "backend.hpp"
#include "choice_option.hpp"

namespace qkv::cli {

/// Adds `--backend vulkan|cpu` (default vulkan) to `command`, stored in `choice`.
inline CLI::Option* add_backend_option(CLI::App& command, backend& choice, const std::string& description) {
    return add_choice<backend>(command, "--backend", choice, {{"vulkan", backend::vulkan}, {"cpu", backend::cpu}},
                               description);
}

/// Adds `--device INDEX|NAME` (the Vulkan device: see open_context) to `command`, stored in `device`.
inline CLI::Option* add_device_option(CLI::App& command, std::string& device) {
    return command
        .add_option("--device", device,
                    "Vulkan device: an index or a part of its name (see `qkv devices`); default: QKV_DEVICE, "
                    "else the best device")
        ->type_name("INDEX|NAME");
}

/// Adds `--mask M.npy` to `command`: bool (true = may attend) or float (added to the scaled scores);
/// `shape` ("" or "broadcasting to (B, Hq, L, S)") says what shapes it takes.
inline CLI::Option* add_mask_option(CLI::App& command, std::string& mask, const std::string& shape) {
    return command
        .add_option("--mask", mask,
                    "Mask" + (shape.empty() ? std::string() : " " + shape) +
                        ": bool (true = may attend) or float32/float64 (added to the scaled scores; -inf masks)")
        ->type_name("M.npy");
}

/// Adds the required `--out OUT.npy` (where a command writes the attention output) to `command`.
inline CLI::Option* add_out_option(CLI::App& command, std::string& out) {
    return command.add_option("--out", out, "Where to write the attention output")->required()->type_name("OUT.npy");
}

}  // namespace qkv::cli
