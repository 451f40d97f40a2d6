// The two kinds of failure the qkv tool reports, and the exit status of each.
//
//   2  bad input or usage: a file that cannot be read or does not fit, a flag combination that
//      makes no sense, a --device or QKV_DEVICE that names no usable device, finite inputs too
//      large for the chosen precision (also: CLI11 parse errors, qkv::invalid_argument,
//      qkv::vulkan::no_matching_device, qkv::vulkan::numeric_overflow)
//   1  everything else: Vulkan unavailable or failing, an output file that cannot be written, a
//      walkthrough step that disagrees with the compile-time value
#pragma once

#include <stdexcept>

namespace qkv::cli {

inline constexpr int exit_success = 0;
inline constexpr int exit_failure = 1;
inline constexpr int exit_usage = 2;

/// Bad input or usage (exit status 2). The message names the file or flag at fault.
class usage_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace qkv::cli
