// The .npy files of `qkv sdpa`, read and checked against each other before the library sees them:
// every shape mismatch is a usage_error naming the files and their shapes. No Vulkan here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "numeric_input.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/runtime/varlen.hpp"

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

/// A ragged batch (`--cu-seqlens-q/--cu-seqlens-k`, FlashAttention's varlen layout): q (total_q,
/// Hq, E), k (total_k, Hkv, E), v (total_k, Hkv, Ev), the optional sinks (Hq,), and the offsets.
struct varlen_inputs {
    numeric_input q, k, v, sinks;
    std::vector<std::int32_t> cu_q, cu_k;
    std::size_t max_q = 0, max_k = 0;  ///< the longest sequence's queries and keys

    [[nodiscard]] bool any_float64() const;
    void to_float32();  ///< as sdpa_inputs::to_float32
    void to_float64();  ///< as sdpa_inputs::to_float64
    [[nodiscard]] qkv::varlen_problem problem(const qkv::sdpa_options& options) const;
    [[nodiscard]] qkv::varlen_problem_f64 problem_f64(const qkv::sdpa_options& options) const;
    /// OUT (total_q, Hq, Ev); LSE (Hq, total_q), FlashAttention's softmax_lse.
    [[nodiscard]] std::vector<std::size_t> out_shape() const;
    [[nodiscard]] std::vector<std::size_t> lse_shape() const;
};

/// Whether an offsets flag's value names a file (it ends in ".npy") rather than a comma list.
[[nodiscard]] bool is_offsets_file(const std::string& value);

/// Reads q, k, v (each 3-D) and the optional sinks of a ragged batch, and the offsets: each a
/// comma list of integers ("0,3,20") or an int32 .npy file of shape (B + 1,) (FlashAttention's
/// cu_seqlens saved with np.save). usage_error for another rank, k and v disagreeing, a list
/// entry that is not an integer, a file of another dtype or shape, or an offset outside
/// [0, 2^31); the rest (offsets from 0, nondecreasing, ending at total_q and total_k) is the
/// library's validation (qkv::validate(varlen_problem)).
varlen_inputs load_varlen_inputs(const sdpa_files& files, const std::string& cu_q, const std::string& cu_k);

}  // namespace qkv::cli
