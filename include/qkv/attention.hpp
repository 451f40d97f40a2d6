// Single-head scaled dot-product self-attention, every step kept so each can be static_assert'ed.
//
//   constexpr auto r = qkv::self_attention(x, wq, wk, wv, {.scale = 1.f});
//   static_assert(r.scores(0, 1) == 4.f);
//
// Convention of the tutorial (and of every qkv backend): rows are sequence positions,
//   Q = X·Wq (+ bq),  K = X·Wk (+ bk),  V = X·Wv (+ bv),
//   scores  = Q·Kᵀ · scale             (scale defaults to 1/sqrt(d_k))
//   weights = softmax over each row of the allowed scores (see softmax.hpp for the mask policy)
//   output  = weights · V
// The attention itself is qkv::scaled_dot_product_attention (sdpa.hpp) of the projections Q, K, V.
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>

#include "qkv/mask.hpp"
#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"
#include "qkv/softmax.hpp"

namespace qkv {

/// Options of self_attention (and, with the per-head default scale, of multi_head_attention).
/// Every member has a default, so designated initialisers read naturally:
/// `{.scale = 1.f}`, `{.causal = true}`, `{.mask = m, .bias_q = bq}`.
template <class T, std::size_t N, std::size_t DK, std::size_t DV>
struct attention_options {
    std::optional<T> scale{};                   ///< multiplies Q·Kᵀ; default 1/sqrt(d_k per head)
    bool causal = false;                        ///< position i attends to j <= i
    std::optional<matrix<bool, N, N>> mask{};   ///< true = may attend; combined with `causal`
    std::optional<row_vector<T, DK>> bias_q{};  ///< added to every row of Q
    std::optional<row_vector<T, DK>> bias_k{};  ///< added to every row of K
    std::optional<row_vector<T, DV>> bias_v{};  ///< added to every row of V
};

/// Every intermediate of one attention evaluation.
template <class T, std::size_t N, std::size_t DK, std::size_t DV>
struct attention_result {
    matrix<T, N, DK> queries;
    matrix<T, N, DK> keys;
    matrix<T, N, DV> values;
    matrix<T, N, N> scores;   ///< Q·Kᵀ·scale, before masking
    matrix<T, N, N> weights;  ///< softmax of the allowed scores; masked entries are 0
    matrix<T, N, DV> output;  ///< weights · V

    friend constexpr bool operator==(const attention_result&, const attention_result&) = default;
};

// ---------------------------------------------------------------------------------------------
// Shape rules, as named concepts so a violation is reported by name.

/// X (N x d_in) can be multiplied by the projection W (d_in x d).
template <class X, class W>
concept projects = inner_dimensions_match<X, W> && std::is_floating_point_v<typename X::value_type>;

// query_key_widths_match (queries and keys have the same width) is in sdpa.hpp.

/// H heads split d_k and d_v evenly.
template <std::size_t H, std::size_t DK, std::size_t DV>
concept heads_divide = H >
0 && DK % H == 0 && DV % H == 0;

/// The options type that matches the inputs (X: N x d_in, WK: d_in x d_k, WV: d_in x d_v).
template <class X, class WK, class WV>
using attention_options_for = attention_options<typename X::value_type, X::rows, WK::cols, WV::cols>;

namespace detail {

/// The causal mode of self-attention's options: N x N, so both alignments are j <= i.
template <class T, std::size_t N, std::size_t DK, std::size_t DV>
constexpr causal_mode causal_of(const attention_options<T, N, DK, DV>& opt) {
    return opt.causal ? causal_mode::top_left : causal_mode::none;
}

template <class T, std::size_t N, std::size_t DK, std::size_t DV>
constexpr T scale_of(const attention_options<T, N, DK, DV>& opt, std::size_t head_width) {
    return opt.scale ? *opt.scale : T{1} / qkv::sqrt(static_cast<T>(head_width));
}

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> with_bias(const matrix<T, R, C>& m, const std::optional<row_vector<T, C>>& bias) {
    return bias ? add_row(m, *bias) : m;
}

}  // namespace detail

/// Scaled dot-product self-attention of x with projections wq, wk, wv.
/// Shapes: x N x d_in, wq and wk d_in x d_k, wv d_in x d_v; the output is N x d_v.
template <any_matrix X, any_matrix WQ, any_matrix WK, any_matrix WV>
requires projects<X, WQ> && projects<X, WK> && projects<X, WV> && query_key_widths_match<WQ, WK>
constexpr auto self_attention(const X& x, const WQ& wq, const WK& wk, const WV& wv,
                              const attention_options_for<X, WK, WV>& opt = {}) {
    using T = typename X::value_type;
    constexpr std::size_t N = X::rows, DK = WK::cols, DV = WV::cols;
    attention_result<T, N, DK, DV> r{};
    r.queries = detail::with_bias(matmul(x, wq), opt.bias_q);
    r.keys = detail::with_bias(matmul(x, wk), opt.bias_k);
    r.values = detail::with_bias(matmul(x, wv), opt.bias_v);
    // scaled_dot_product_attention(Q, K, V), computed in place into r (no copies of its result).
    T lse[N]{};  // not part of attention_result
    detail::sdpa_into(r.queries, r.keys, r.values,
                      detail::plain_rules(detail::scale_of(opt, DK), detail::causal_of(opt)), opt.mask,
                      std::optional<matrix<T, N, N>>{}, r.scores, r.weights, r.output, lse);
    return r;
}

/// The tutorial's "weighted values" for one query: row j is weights(query, j) · values row j.
/// Summing its rows gives output row `query`.
template <class T, std::size_t N, std::size_t DK, std::size_t DV>
constexpr matrix<T, N, DV> weighted_values(const attention_result<T, N, DK, DV>& r, std::size_t query) {
    matrix<T, N, DV> out{};
    for (std::size_t j = 0; j < N; ++j)
        for (std::size_t c = 0; c < DV; ++c) out.elems[j][c] = r.weights.elems[query][j] * r.values.elems[j][c];
    return out;
}

}  // namespace qkv
