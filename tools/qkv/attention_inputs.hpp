// The .npy files of `qkv attention`, read and checked against each other before the library sees
// them: every shape mismatch is reported naming the files involved, as a usage_error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "npy/npy.hpp"
#include "numeric_input.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv::cli {

/// Paths given on the command line; empty = not given.
struct attention_files {
    std::string x, wq, wk, wv;
    std::string bq, bk, bv;
    std::string wo, bo;
    std::string mask;
};

/// The arrays of one problem. Numeric inputs keep the type of their file until the backend is
/// known: the CPU backend computes float64 inputs as float64 (to_float64 widens the float32 ones,
/// exactly); the Vulkan backend takes float32 (to_float32 narrows the float64 ones, refusing a
/// finite value beyond the float32 range rather than turning it into infinity).
struct attention_inputs {
    qkv::attention_shape shape{};
    bool batched = false;  ///< x was 3-D: (B, N, d_in)
    numeric_input x, wq, wk, wv, bq, bk, bv, wo, bo;
    std::vector<std::uint8_t> mask;  ///< from a bool .npy
    numeric_input additive_mask;     ///< from a float .npy

    /// Some numeric input is float64.
    [[nodiscard]] bool any_float64() const;
    /// Fills every f32 (narrowing float64 inputs); throws usage_error naming the file and the
    /// element when a finite float64 value is beyond the float32 range.
    void to_float32();
    /// Fills every f64 (widening float32 inputs, exactly).
    void to_float64();

    /// A problem viewing the float32 arrays (after to_float32; valid while *this lives unmodified).
    [[nodiscard]] qkv::attention_problem problem(const qkv::run_options& options) const;
    /// A problem viewing the float64 arrays (after to_float64).
    [[nodiscard]] qkv::cpu::attention_problem_f64 problem_f64(const qkv::run_options& options) const;
};

/// Reads one input by its path (UTF-8); throws qkv::npy::error. Unset: qkv::npy::read.
using npy_reader = std::function<qkv::npy::array(const std::string& path)>;

/// Reads every given file and checks the shapes fit together for `heads` heads. Throws
/// usage_error naming the file (and the one it disagrees with) on any problem.
attention_inputs load_attention_inputs(const attention_files& files, std::size_t heads, const npy_reader& reader = {});

}  // namespace qkv::cli
