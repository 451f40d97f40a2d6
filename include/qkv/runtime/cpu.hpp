// qkv::cpu — the CPU reference backend: dynamic shapes, the same problem and options as the
// Vulkan backend, every sum accumulated in double. The oracle of the tests, and a fallback for
// users without a GPU. Thread-safe: attention() keeps no state.
//
// Input types: attention_problem holds float32 data (widened exactly to double); results are
// float32 (attention) or float64 (attention_f64). attention_problem_f64 holds float64 data, used
// as is: nothing is narrowed to float32 on the way, and the results are float64. The Vulkan
// backend takes float32 only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "qkv/runtime/paged.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/runtime/varlen.hpp"

namespace qkv::cpu {

/// Computes the attention described by `problem` (validated first: throws qkv::invalid_argument).
/// precision and implementation are accepted and ignored: the CPU backend always runs float64.
/// Results are rounded to float32 once, at the end.
[[nodiscard]] QKV_RUNTIME_API attention_output attention(const attention_problem& problem);

/// The same computation with float64 results, for tests that need the unrounded reference.
struct attention_output_f64 {
    std::vector<double> output;   ///< batch x seq x out_width()
    std::vector<double> weights;  ///< batch x heads x seq x seq, when options.return_weights
};
[[nodiscard]] QKV_RUNTIME_API attention_output_f64 attention_f64(const attention_problem& problem);

/// An attention problem over float64 data: the fields and conventions of attention_problem
/// (qkv/runtime/problem.hpp), with double in place of float. options.scale stays a float.
struct attention_problem_f64 {
    attention_shape shape{};
    std::span<const double> x{};
    std::span<const double> wq{}, wk{}, wv{};
    std::span<const double> bq{}, bk{}, bv{};
    std::span<const double> wo{}, bo{};
    std::span<const std::uint8_t> mask{};
    std::span<const double> additive_mask{};
    run_options options{};
};

/// The checks of qkv::validate, for a float64 problem (throws qkv::invalid_argument).
QKV_RUNTIME_API void validate(const attention_problem_f64& problem);

/// Computes a float64 problem in float64 throughout: no input is rounded to float32, and the
/// results are float64 (an additive mask of -1e300 stays -1e300, not -inf).
[[nodiscard]] QKV_RUNTIME_API attention_output_f64 attention(const attention_problem_f64& problem);

/// Scaled dot-product attention over caller-held Q, K, V (qkv/runtime/sdpa.hpp), validated first
/// (throws qkv::invalid_argument). Computed in float64; float32 inputs are widened exactly and the
/// results rounded to float32 once, at the end. precision and kernel are accepted and ignored.
/// Dropout (options.dropout_p) is computed here (qkv/dropout.hpp's mask).
[[nodiscard]] QKV_RUNTIME_API sdpa_output sdpa(const sdpa_problem& problem);

/// The same computation with float64 results, for tests that need the unrounded reference.
[[nodiscard]] QKV_RUNTIME_API sdpa_output_f64 sdpa_f64(const sdpa_problem& problem);

/// A float64 problem, computed in float64 throughout: nothing is narrowed to float32.
[[nodiscard]] QKV_RUNTIME_API sdpa_output_f64 sdpa(const sdpa_problem_f64& problem);

/// The gradients of sdpa(problem.forward) (qkv/runtime/sdpa_backward.hpp), validated first (throws
/// qkv::invalid_argument). Computed in float64, rounded to float32 once, at the end; deterministic
/// (the same inputs give the same bits, whatever the thread count). out and lse, when given, must
/// be the forward's results: a row whose probabilities recomputed from lse do not sum to 1 (with
/// the sink's) within 1 %, whose rowsum(d_out ∘ out) differs from Σ_j P_ij·dP_ij by more than 1 %
/// of Σ_j P_ij·|dP_ij| terms, or whose lse says "no key" (-inf) where it has keys or the reverse,
/// is refused (qkv::invalid_argument). Non-finite values: a NaN or infinite input (q, k, v, the
/// additive mask beyond its -inf entries, out, lse) poisons the gradients it reaches, as its
/// forward poisons the output (PyTorch's autograd does the same); where every input is finite, a
/// gradient that is not (in float64, or once rounded to float32) is refused
/// (qkv::invalid_argument), never returned. kv_type: the gradients are taken at K and V as stored
/// (straight through the rounding: dk and dv are the gradients of the stored values).
[[nodiscard]] QKV_RUNTIME_API sdpa_gradients sdpa_backward(const sdpa_backward_problem& problem);

/// The same computation with float64 results, for tests that need the unrounded reference.
[[nodiscard]] QKV_RUNTIME_API sdpa_gradients_f64 sdpa_backward_f64(const sdpa_backward_problem& problem);

/// A float64 problem, computed in float64 throughout: nothing is narrowed to float32.
[[nodiscard]] QKV_RUNTIME_API sdpa_gradients_f64 sdpa_backward(const sdpa_backward_problem_f64& problem);
/// A ragged batch (qkv/runtime/varlen.hpp), validated first: each sequence computed by sdpa above
/// (one reference), its rows scattered into the packed output. Float64 throughout; the float32
/// form's results are rounded once.
[[nodiscard]] QKV_RUNTIME_API varlen_output sdpa(const varlen_problem& problem);
[[nodiscard]] QKV_RUNTIME_API varlen_output_f64 sdpa_f64(const varlen_problem& problem);
[[nodiscard]] QKV_RUNTIME_API varlen_output_f64 sdpa(const varlen_problem_f64& problem);
/// A paged batch (qkv/runtime/paged.hpp), validated first: its sequences gathered from their pages
/// (gather_pages) and computed as that ragged batch above. The output and lse are the ragged
/// batch's: (total_q, Hq, Ev), for one q_len the same bytes as (B, L, Hq, Ev), and (Hq, total_q).
[[nodiscard]] QKV_RUNTIME_API varlen_output sdpa(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API varlen_output_f64 sdpa_f64(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API varlen_output_f64 sdpa(const paged_problem_f64& problem);

}  // namespace qkv::cpu
