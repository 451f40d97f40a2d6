// The tutorial's worked example, step by step (`qkv example`, and `python3 -m qkv example`, which
// prints the same walkthrough from the Python package): computed now on the chosen backend and
// checked against the values the compiler computed when qkv was built (qkv::tutorial).
#pragma once

#include <iosfwd>

#include "backend.hpp"

namespace qkv::cli {

struct example_verdict {
    int checks = 0;         ///< matrices compared with their compile-time values (13)
    int disagreements = 0;  ///< of them, those that differ (marked ✗)
};

/// Prints the walkthrough to `os`: the attention on `choice` (a Vulkan device: the default one, or
/// QKV_DEVICE), scores scaled by 1/sqrt(3) when `scale_scores`, else by 1. Throws what the backend
/// throws (qkv::vulkan::unavailable without Vulkan, suggesting the CPU backend).
example_verdict print_example(std::ostream& os, backend choice, bool scale_scores);

}  // namespace qkv::cli
