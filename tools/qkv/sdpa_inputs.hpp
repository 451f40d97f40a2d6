// The .npy files of `qkv sdpa`, read and checked against each other before the library sees them:
// every shape mismatch is a usage_error naming the files and their shapes. No Vulkan here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numeric_input.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::cli {

/// Paths given on the command line; mask and sinks empty = not given.
struct sdpa_files {
    std::string q, k, v, mask, sinks;
};

struct sdpa_inputs {
    qkv::sdpa_shape shape{};
    numeric_input q, k, v;
    std::vector<std::uint8_t> mask;  ///< from a bool .npy
    numeric_input additive_mask;     ///< from a float .npy
    std::vector<std::size_t> mask_shape;
    numeric_input sinks;  ///< (Hq,): one logit per query head, when given

    /// Some numeric input is float64.
    [[nodiscard]] bool any_float64() const;
    /// Fills every f32, narrowing float64 inputs; a finite value beyond the float32 range is a
    /// usage_error naming the file and the element.
    void to_float32();
    /// Fills every f64, widening float32 inputs exactly.
    void to_float64();

    /// Problems viewing the float32 (after to_float32) or float64 (after to_float64) arrays.
    [[nodiscard]] qkv::sdpa_problem problem(const qkv::sdpa_options& options) const;
    [[nodiscard]] qkv::sdpa_problem_f64 problem_f64(const qkv::sdpa_options& options) const;

    /// OUT: q's leading dimensions and d_v columns. W: q's leading dimensions and kv_len columns.
    /// LSE: q's leading dimensions.
    [[nodiscard]] std::vector<std::size_t> out_shape() const;
    [[nodiscard]] std::vector<std::size_t> weights_shape() const;
    [[nodiscard]] std::vector<std::size_t> lse_shape() const;
};

/// Reads q, k, v (2-, 3- or 4-D, the same rank: (L, E), (H, L, E), (B, H, L, E)), the optional
/// mask (bool or float, broadcasting NumPy-style to (B, Hq, L, S)) and the optional sinks (float,
/// (Hq,)), and checks they fit together.
sdpa_inputs load_sdpa_inputs(const sdpa_files& files);

}  // namespace qkv::cli
