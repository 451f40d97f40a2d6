// The options of `qkv attention` and their checks, apart from running it: no Vulkan here, so the
// argument fuzzer (tests/fuzz/cli_args_fuzz.cpp) can parse command lines with exactly these.
#pragma once

#include <cstddef>
#include <string>

#include "attention_inputs.hpp"
#include "backend.hpp"
#include "cli_fwd.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv::cli {

struct attention_options {
    attention_files files;
    std::string out, weights;
    std::string heads = "1";  // parsed by parse_heads: CLI11 saturates 99999999999999999999 silently
    std::string scale;        // parsed by parse_scale: CLI11's float conversion accepts "" as 0 and 1e39 as inf
    bool causal = false;
    backend choice = backend::vulkan;
    qkv::precision precision = qkv::precision::fp32;
    qkv::implementation implementation = qkv::implementation::automatic;
    qkv::kernel_family kernel = qkv::kernel_family::automatic;
    std::string device;
    const CLI::Option* scale_option = nullptr;    // to tell "--scale not given" from a value
    const CLI::Option* weights_option = nullptr;  // to tell "--weights not given" from --weights ""
    const CLI::App* command = nullptr;            // its file flags: "" is refused (flag_args.hpp)
};

/// Adds every option of `qkv attention` to `cmd`, stored in `o` (which must outlive `cmd`).
void add_attention_options(CLI::App& cmd, attention_options& o);

/// --scale as a float32: a decimal or hexadecimal number, finite as a float32 (1e39 is not: it
/// would be infinite), and not a nonzero value that rounds to 0. Throws usage_error naming --scale.
float parse_scale(const std::string& text);

/// --heads: a decimal count of at least 1 that fits a std::size_t (parse_count). Throws usage_error
/// naming --heads.
std::size_t parse_heads(const std::string& text);

/// Flag combinations and values that make no sense, and file flags given as "", before any file
/// is read (usage_error).
void check_usage(const attention_options& o);

}  // namespace qkv::cli
