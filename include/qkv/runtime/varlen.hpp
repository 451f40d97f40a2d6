// Ragged (variable-length) batches: FlashAttention's flash_attn_varlen_func semantics. B sequences
// of different lengths are packed along one token axis, without padding:
//
//   q  total_q x q_heads  x d_qk      (total_q, Hq, E),  total_q = cu_seqlens_q[B]
//   k  total_k x kv_heads x d_qk      (total_k, Hkv, E), total_k = cu_seqlens_k[B]
//   v  total_k x kv_heads x d_v       (total_k, Hkv, Ev)
//   cu_seqlens_q, cu_seqlens_k        B + 1 offsets: sequence b's queries are the rows
//                                     [cu_seqlens_q[b], cu_seqlens_q[b+1]), its keys and values
//                                     [cu_seqlens_k[b], cu_seqlens_k[b+1])
//   sinks   q_heads                   (Hq,), optional
//   alibi_slopes q_heads              (Hq,), optional
//   output  total_q x q_heads x d_v   (total_q, Hq, Ev)
//   lse     q_heads x total_q         (Hq, total_q), on request (FlashAttention's softmax_lse)
//
// Sequence b is the SDPA problem of qkv/runtime/sdpa.hpp with shape (1, Hq, Hkv, L_b, S_b, E, Ev),
// L_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] and S_b likewise, its rows of q, k and v, the same
// options, sinks and ALiBi slopes: every score rule applies per sequence, the causal rule, the window and ALiBi's
// distances measured with that sequence's own offset (alignment bottom_right: S_b - L_b, as
// FlashAttention's varlen call, whose causal mask is aligned to the bottom right of each
// sequence's L_b x S_b block). No query attends a key of another sequence. A sequence with no
// queries contributes no rows; one with queries and no keys gets, as any row with no key to attend,
// a zero output and lse = -inf. There are no masks and no weights (a ragged batch has no
// (B, Hq, L, S) shape): the capability table refuses return_weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/export.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv {

/// A ragged batch over host data of element type T (float; double for the CPU backend's float64
/// path). Spans are read during the call only.
template <class T>
struct basic_varlen_problem {
    std::size_t q_heads = 1;   ///< Hq
    std::size_t kv_heads = 1;  ///< Hkv, divides q_heads
    std::size_t d_qk = 0;      ///< E
    std::size_t d_v = 0;       ///< Ev
    /// B + 1 nondecreasing offsets each, from 0 to total_q (total_k), B >= 1 (FlashAttention's int32).
    std::span<const std::int32_t> cu_seqlens_q{}, cu_seqlens_k{};
    /// At least the longest sequence's L_b (S_b): an upper bound a backend may plan its grid by.
    std::size_t max_seqlen_q = 0, max_seqlen_k = 0;
    std::span<const T> q{}, k{}, v{};
    sdpa_options options{};
    /// Empty, or one logit per query head, as basic_sdpa_problem's sinks.
    std::span<const T> sinks{};
    /// Empty, or one ALiBi slope per query head, as basic_sdpa_problem's alibi_slopes (every
    /// sequence's distances measured within it).
    std::span<const T> alibi_slopes{};
};
using varlen_problem = basic_varlen_problem<float>;
using varlen_problem_f64 = basic_varlen_problem<double>;

template <class T>
struct basic_varlen_output {
    std::vector<T> output;  ///< total_q x q_heads x d_v
    std::vector<T> lse;     ///< q_heads x total_q, when options.return_lse
    std::string device;     ///< which device (or "cpu reference") ran it
};
using varlen_output = basic_varlen_output<float>;
using varlen_output_f64 = basic_varlen_output<double>;

/// Throws qkv::invalid_argument naming the input when the problem is not well-formed: a zero head
/// count or width, kv_heads not dividing q_heads, cu_seqlens_q and cu_seqlens_k of different sizes
/// or fewer than 2 entries, an offset list not starting at 0, decreasing or negative, max_seqlen_q
/// or max_seqlen_k below the longest sequence, a span whose size does not fit total_q or total_k,
/// a size product that overflows; an option out of its range, or sinks, as validate(sdpa_problem).
QKV_RUNTIME_API void validate(const varlen_problem& problem);
QKV_RUNTIME_API void validate(const varlen_problem_f64& problem);

/// B, the number of sequences (cu_seqlens_q.size() - 1).
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const varlen_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const varlen_problem_f64& problem);

/// The shape of sequence b's problem: (1, Hq, Hkv, L_b, S_b, E, Ev) (zero lengths included).
[[nodiscard]] QKV_RUNTIME_API sdpa_shape sequence_shape(const varlen_problem& problem, std::size_t b);
[[nodiscard]] QKV_RUNTIME_API sdpa_shape sequence_shape(const varlen_problem_f64& problem, std::size_t b);

/// Sequence b as an SDPA problem that owns its q, k and v, gathered from the packed rows into
/// (1, H, L_b, ·) order: the one way every backend splits a ragged batch. Its lengths may be zero
/// (it is then not a valid sdpa_problem: scatter_sequence writes the rows such a sequence gets).
/// Not copyable (its problem's spans point into its own vectors); movable.
template <class T>
struct basic_varlen_sequence {
    std::vector<T> q, k, v;
    basic_sdpa_problem<T> problem;

    basic_varlen_sequence() = default;
    basic_varlen_sequence(const basic_varlen_sequence&) = delete;
    basic_varlen_sequence& operator=(const basic_varlen_sequence&) = delete;
    basic_varlen_sequence(basic_varlen_sequence&&) noexcept = default;
    basic_varlen_sequence& operator=(basic_varlen_sequence&&) noexcept = default;
};
[[nodiscard]] QKV_RUNTIME_API basic_varlen_sequence<float> sequence_of(const varlen_problem& problem, std::size_t b);
[[nodiscard]] QKV_RUNTIME_API basic_varlen_sequence<double> sequence_of(const varlen_problem_f64& problem,
                                                                        std::size_t b);

/// Writes sequence b's result into the packed output (and lse, when options.return_lse): `output`
/// (1, Hq, L_b, Ev) and `lse` (1, Hq, L_b) as an sdpa_output holds them; for a sequence with
/// queries and no keys pass empty spans: its rows get zeros and lse -inf. `into` must be sized
/// for the whole batch (empty_output).
template <class T>
void scatter_sequence(const basic_varlen_problem<T>& problem, std::size_t b, std::span<const T> output,
                      std::span<const T> lse, basic_varlen_output<T>& into);
/// A zero output (and lse, where asked) of the batch's sizes.
template <class T>
[[nodiscard]] basic_varlen_output<T> empty_output(const basic_varlen_problem<T>& problem);

extern template QKV_RUNTIME_API void scatter_sequence(const varlen_problem&, std::size_t, std::span<const float>,
                                                      std::span<const float>, varlen_output&);
extern template QKV_RUNTIME_API void scatter_sequence(const varlen_problem_f64&, std::size_t, std::span<const double>,
                                                      std::span<const double>, varlen_output_f64&);
extern template QKV_RUNTIME_API varlen_output empty_output(const varlen_problem&);
extern template QKV_RUNTIME_API varlen_output_f64 empty_output(const varlen_problem_f64&);

}  // namespace qkv
