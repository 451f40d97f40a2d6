// The .npy files of `qkv attention`, read and checked against each other before the library sees
// them: every shape mismatch is reported naming the files involved, as a usage_error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/vulkan/problem.hpp"

namespace qkv::cli {

/// Paths given on the command line; empty = not given.
struct attention_files {
    std::string x, wq, wk, wv;
    std::string bq, bk, bv;
    std::string wo, bo;
    std::string mask;
};

/// The arrays of one problem, as float32 (and the boolean mask as 0/1 bytes).
struct attention_inputs {
    qkv::attention_shape shape{};
    bool batched = false;  ///< x was 3-D: (B, N, d_in)
    std::vector<float> x, wq, wk, wv, bq, bk, bv, wo, bo;
    std::vector<std::uint8_t> mask;    ///< from a bool .npy
    std::vector<float> additive_mask;  ///< from a float .npy

    /// A problem viewing these arrays (valid while *this lives and is not modified).
    [[nodiscard]] qkv::attention_problem problem(const qkv::run_options& options) const;
};

/// Reads every given file and checks the shapes fit together for `heads` heads. Throws
/// usage_error naming the file (and the one it disagrees with) on any problem.
attention_inputs load_attention_inputs(const attention_files& files, std::size_t heads);

}  // namespace qkv::cli
