// Multi-head self-attention, the math of torch.nn.MultiheadAttention in the tutorial's convention.
//
//   Q = X·Wq + bq, K = X·Wk + bk, V = X·Wv + bv           (full width d_k, d_k, d_v)
//   head h uses columns [h·d_k/H, (h+1)·d_k/H) of Q and K and [h·d_v/H, (h+1)·d_v/H) of V,
//   attends with scale 1/sqrt(d_k/H) by default,
//   the H head outputs are concatenated (N x d_v) and, optionally, projected: concat·Wo + bo.
// The attention of the heads is qkv::scaled_dot_product_attention<H, H> (sdpa.hpp) of Q, K, V.
//
// torch stores its projection weights transposed (it computes X·Wᵀ); pass Wq = in_proj_weight[:d].T
// and so on. Its boolean attn_mask means "may NOT attend"; qkv's means "may attend".
#pragma once

#include <array>
#include <cstddef>
#include <optional>

#include "qkv/attention.hpp"
#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"

namespace qkv {

/// The optional final projection of multi-head attention: output = concat·wo (+ bo).
template <class T, std::size_t DV, std::size_t DO>
struct output_projection {
    matrix<T, DV, DO> weight;
    std::optional<row_vector<T, DO>> bias{};
};
template <class T, std::size_t DV, std::size_t DO>
output_projection(const matrix<T, DV, DO>&) -> output_projection<T, DV, DO>;
template <class T, std::size_t DV, std::size_t DO>
output_projection(const matrix<T, DV, DO>&, const row_vector<T, DO>&) -> output_projection<T, DV, DO>;

/// Every intermediate of multi-head attention. Per-head matrices are indexed by head.
template <class T, std::size_t H, std::size_t N, std::size_t DK, std::size_t DV, std::size_t DO>
struct multi_head_result {
    matrix<T, N, DK> queries;  ///< all heads side by side
    matrix<T, N, DK> keys;
    matrix<T, N, DV> values;
    std::array<matrix<T, N, N>, H> scores;   ///< per head, Q_h·K_hᵀ·scale, before masking
    std::array<matrix<T, N, N>, H> weights;  ///< per head, softmax
    matrix<T, N, DV> concat;                 ///< head outputs side by side
    matrix<T, N, DO> output;                 ///< concat, or concat·wo + bo with a projection

    friend constexpr bool operator==(const multi_head_result&, const multi_head_result&) = default;
};

namespace detail {

/// The attention of the projected heads: scaled_dot_product_attention<H, H> (sdpa.hpp), in place.
template <std::size_t H, class T, std::size_t N, std::size_t DK, std::size_t DV, std::size_t DO>
constexpr void multi_head_core(multi_head_result<T, H, N, DK, DV, DO>& r, const attention_options<T, N, DK, DV>& opt) {
    const head_rules<T> rules = plain_rules(scale_of(opt, DK / H), causal_of(opt));
    matrix<T, H, N> lse{};  // not part of multi_head_result
    multi_head_sdpa_into<H, H>(
        r.queries, r.keys, r.values, [&](std::size_t) { return rules; }, opt.mask, std::optional<matrix<T, N, N>>{},
        r.scores, r.weights, r.concat, lse);
}

template <std::size_t H, class X, class WQ, class WK, class WV, std::size_t DO>
constexpr auto multi_head_projected(const X& x, const WQ& wq, const WK& wk, const WV& wv,
                                    const attention_options_for<X, WK, WV>& opt) {
    using T = typename X::value_type;
    multi_head_result<T, H, X::rows, WK::cols, WV::cols, DO> r{};
    r.queries = with_bias(matmul(x, wq), opt.bias_q);
    r.keys = with_bias(matmul(x, wk), opt.bias_k);
    r.values = with_bias(matmul(x, wv), opt.bias_v);
    multi_head_core<H>(r, opt);
    return r;
}

}  // namespace detail

/// H-head self-attention without an output projection: output is the concatenation (N x d_v).
template <std::size_t H, any_matrix X, any_matrix WQ, any_matrix WK, any_matrix WV>
requires projects<X, WQ> && projects<X, WK> && projects<X, WV> && query_key_widths_match<WQ, WK> &&
    heads_divide<H, WK::cols, WV::cols>
constexpr auto multi_head_attention(const X& x, const WQ& wq, const WK& wk, const WV& wv,
                                    const attention_options_for<X, WK, WV>& opt = {}) {
    auto r = detail::multi_head_projected<H, X, WQ, WK, WV, WV::cols>(x, wq, wk, wv, opt);
    r.output = r.concat;
    return r;
}

/// H-head self-attention followed by the output projection `proj` (output N x d_out).
template <std::size_t H, any_matrix X, any_matrix WQ, any_matrix WK, any_matrix WV, std::size_t DO>
requires projects<X, WQ> && projects<X, WK> && projects<X, WV> && query_key_widths_match<WQ, WK> &&
    heads_divide<H, WK::cols, WV::cols>
constexpr auto multi_head_attention(const X& x, const WQ& wq, const WK& wk, const WV& wv,
                                    const output_projection<typename X::value_type, WV::cols, DO>& proj,
                                    const attention_options_for<X, WK, WV>& opt = {}) {
    auto r = detail::multi_head_projected<H, X, WQ, WK, WV, DO>(x, wq, wk, wv, opt);
    r.output = detail::with_bias(matmul(r.concat, proj.weight), proj.bias);
    return r;
}

}  // namespace qkv
