// qkv::cpu — the CPU reference backend: dynamic shapes, the same problem and options as the
// Vulkan backend, every sum accumulated in double. The oracle of the tests, and a fallback for
// users without a GPU. Thread-safe: attention() keeps no state.
#pragma once

#include "qkv/vulkan/problem.hpp"

namespace qkv::cpu {

/// Computes the attention described by `problem` (validated first: throws qkv::invalid_argument).
/// precision and implementation are accepted and ignored: the CPU backend always runs float64.
/// Results are rounded to float32 once, at the end.
[[nodiscard]] QKV_VULKAN_API attention_output attention(const attention_problem& problem);

/// The same computation with float64 results, for tests that need the unrounded reference.
struct attention_output_f64 {
    std::vector<double> output;
    std::vector<double> weights;
};
[[nodiscard]] QKV_VULKAN_API attention_output_f64 attention_f64(const attention_problem& problem);

}  // namespace qkv::cpu
