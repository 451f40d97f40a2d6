// Scaled dot-product attention of given Q, K and V at compile time: the math of PyTorch's
// F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa), every step
// kept so each can be static_assert'ed.
//
//   constexpr auto r = qkv::scaled_dot_product_attention(q, k, v, {.causal = qkv::causal_mode::bottom_right});
//   static_assert(r.weights(0, 4) == 0.f);
//
// Shapes: q L x E, k S x E, v S x Ev (L may differ from S, E from Ev); the output is L x Ev.
//   scores  = q·kᵀ·scale (+ additive_mask)       scale defaults to 1/sqrt(E)
//   weights = softmax over each row of the allowed scores (see softmax.hpp for the policy)
//   output  = weights · v
// Key j is allowed for query i when it passes every mask given:
//   .mask           bool L x S, true = may attend;
//   .additive_mask  float L x S, added to the scaled scores; an entry equal to -inf masks;
//   .causal         causal_mode::top_left:     j <= i          (PyTorch's is_causal, tril(ones(L, S)))
//                   causal_mode::bottom_right: j <= i + S - L  (tril(ones(L, S), S - L), the KV-cache
//                                                               convention: the last query sees every key)
// A query left with no key to attend to gets zero weights and a zero output row (PyTorch: NaN).
//
// Multi-head and grouped-query attention, in multi_head.hpp's layout (heads side by side in the
// columns): scaled_dot_product_attention<HQ, HKV>(q, k, v, options) with q L x (HQ·E),
// k S x (HKV·E), v S x (HKV·Ev); query head h uses K/V head h / (HQ/HKV) (PyTorch's enable_gqa),
// HKV must divide HQ; the output is L x (HQ·Ev), head h in columns [h·Ev, (h+1)·Ev).
//
// qkv::self_attention and qkv::multi_head_attention are the projections followed by this.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <type_traits>

#include "qkv/causal.hpp"
#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/softmax.hpp"

namespace qkv {

/// Options of scaled_dot_product_attention for L queries and S keys of element type T. Every
/// member has a default, so designated initialisers read naturally: `{.scale = 1.f}`,
/// `{.causal = qkv::causal_mode::top_left, .mask = m}`.
template <class T, std::size_t L, std::size_t S>
struct sdpa_matrix_options {
    std::optional<T> scale{};                        ///< multiplies q·kᵀ; default 1/sqrt(E per head)
    causal_mode causal = causal_mode::none;          ///< combined with the masks
    std::optional<matrix<bool, L, S>> mask{};        ///< true = may attend
    std::optional<matrix<T, L, S>> additive_mask{};  ///< added to the scaled scores; -inf masks
};

/// Whether Opt is an sdpa_matrix_options.
template <class Opt>
struct is_sdpa_options : std::false_type {};
template <class T, std::size_t L, std::size_t S>
struct is_sdpa_options<sdpa_matrix_options<T, L, S>> : std::true_type {};

/// The options type for queries Q (L x ·) and keys K (S x ·).
template <class Q, class K>
using sdpa_options_for = sdpa_matrix_options<typename Q::value_type, Q::rows, K::rows>;

/// Every intermediate of one scaled dot-product attention.
template <class T, std::size_t L, std::size_t S, std::size_t EV>
struct sdpa_result {
    matrix<T, L, S> scores;   ///< q·kᵀ·scale (+ additive_mask), before the bool and causal masks
    matrix<T, L, S> weights;  ///< softmax of the allowed scores; masked entries are 0
    matrix<T, L, EV> output;  ///< weights · v

    friend constexpr bool operator==(const sdpa_result&, const sdpa_result&) = default;
};

/// Every intermediate of multi-head (grouped-query) scaled dot-product attention.
template <class T, std::size_t H, std::size_t L, std::size_t S, std::size_t DV>
struct multi_head_sdpa_result {
    std::array<matrix<T, L, S>, H> scores;   ///< per query head, as sdpa_result::scores
    std::array<matrix<T, L, S>, H> weights;  ///< per query head
    matrix<T, L, DV> output;                 ///< head outputs side by side

    friend constexpr bool operator==(const multi_head_sdpa_result&, const multi_head_sdpa_result&) = default;
};

// ---------------------------------------------------------------------------------------------
// Shape rules, as named concepts so a violation is reported by name.

/// Q, K and V are matrices of one floating-point element type.
template <class Q, class K, class V>
concept sdpa_operands =
    any_matrix<Q> && any_matrix<K> && any_matrix<V> && std::is_floating_point_v<typename Q::value_type> &&
    std::is_same_v<typename Q::value_type, typename K::value_type> &&
    std::is_same_v<typename Q::value_type, typename V::value_type>;

/// Queries and keys have the same width (d_q == d_k): their dot product is defined.
template <class WQ, class WK>
concept query_key_widths_match = any_matrix<WQ> && any_matrix<WK> && WQ::cols == WK::cols;

/// Keys and values have the same length S: each key has its value.
template <class K, class V>
concept key_value_lengths_match = any_matrix<K> && any_matrix<V> && K::rows == V::rows;

/// HKV K/V heads serve HQ query heads: HKV divides HQ (each K/V head serves HQ / HKV query heads).
template <std::size_t HQ, std::size_t HKV>
concept kv_heads_divide = HQ != 0 && HKV != 0 && HQ % HKV == 0;

/// HQ query heads split Q's columns and HKV heads split K's and V's, with equal query and key
/// widths per head.
template <std::size_t HQ, std::size_t HKV, class Q, class K, class V>
concept head_widths_match =
    Q::cols % HQ == 0 && K::cols % HKV == 0 && V::cols % HKV == 0 && Q::cols / HQ == K::cols / HKV;

namespace detail {

/// How many keys, from key 0 on, `causal` lets query i of L see among S keys (all S for none).
constexpr std::size_t causal_visible(causal_mode causal, std::size_t i, std::size_t L, std::size_t S) {
    // top-left: j <= i; bottom-right: j <= i + S - L, so none when i + S < L.
    const std::size_t end = causal == causal_mode::top_left       ? i + 1
                            : causal == causal_mode::bottom_right ? (i + S < L ? 0 : i + S - L + 1)
                                                                  : S;
    return end < S ? end : S;
}

/// Row i of the "may attend" booleans of the bool mask (all true without one) and the causal mode.
template <std::size_t L, std::size_t S>
constexpr void allowed_row(const std::optional<matrix<bool, L, S>>& mask, causal_mode causal, std::size_t i,
                           bool (&allowed)[S]) {
    if (mask) {
        const bool(&row)[S] = mask->elems[i];
        for (std::size_t j = 0; j < S; ++j) allowed[j] = row[j];
    } else {
        for (std::size_t j = 0; j < S; ++j) allowed[j] = true;
    }
    for (std::size_t j = causal_visible(causal, i, L, S); j < S; ++j) allowed[j] = false;
}

/// scores[j] = q·k[j]·scale for one query row.
template <class T, std::size_t E, std::size_t S>
constexpr void scores_row(const T (&q)[E], const T (&k)[S][E], T scale, T (&scores)[S]) {
    for (std::size_t j = 0; j < S; ++j) scores[j] = dot(q, k[j]) * scale;
}

/// scores[j] += additive[j]; an additive entry of -inf also clears allowed[j].
template <class T, std::size_t S>
constexpr void add_mask_row(const T (&additive)[S], T (&scores)[S], bool (&allowed)[S]) {
    for (std::size_t j = 0; j < S; ++j) {
        scores[j] = scores[j] + additive[j];
        if (additive[j] == -infinity<T>()) allowed[j] = false;
    }
}

/// weights = masked softmax of scores over the allowed keys, out = weights · v.
template <class T, std::size_t S, std::size_t EV>
constexpr void weights_output_row(const T (&scores)[S], const bool (&allowed)[S], const T (&v)[S][EV], T (&weights)[S],
                                  T (&out)[EV]) {
    masked_softmax_row(scores, allowed, weights);
    matmul_row(weights, v, out);
}

/// Scaled dot-product attention of one head into scores, weights and out under the masks (either
/// may be empty) and the causal mode.
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr void sdpa_into(const matrix<T, L, E>& q, const matrix<T, S, E>& k, const matrix<T, S, EV>& v, T scale,
                         causal_mode causal, const std::optional<matrix<bool, L, S>>& mask,
                         const std::optional<matrix<T, L, S>>& additive, matrix<T, L, S>& scores,
                         matrix<T, L, S>& weights, matrix<T, L, EV>& out) {
    for (std::size_t i = 0; i < L; ++i) {
        bool allowed[S]{};
        allowed_row(mask, causal, i, allowed);
        scores_row(q.elems[i], k.elems, scale, scores.elems[i]);
        if (additive) add_mask_row(additive->elems[i], scores.elems[i], allowed);
        weights_output_row(scores.elems[i], allowed, v.elems, weights.elems[i], out.elems[i]);
    }
}

/// HQ query heads over HKV K/V heads (columns side by side), into per-head scores and weights
/// and the concatenated output.
template <std::size_t HQ, std::size_t HKV, class T, std::size_t L, std::size_t S, std::size_t DQ, std::size_t DK,
          std::size_t DV, std::size_t DO>
constexpr void multi_head_sdpa_into(const matrix<T, L, DQ>& q, const matrix<T, S, DK>& k, const matrix<T, S, DV>& v,
                                    T scale, causal_mode causal, const std::optional<matrix<bool, L, S>>& mask,
                                    const std::optional<matrix<T, L, S>>& additive,
                                    std::array<matrix<T, L, S>, HQ>& scores, std::array<matrix<T, L, S>, HQ>& weights,
                                    matrix<T, L, DO>& out) {
    constexpr std::size_t E = DQ / HQ, EV = DV / HKV, group = HQ / HKV;
    for (std::size_t g = 0; g < HKV; ++g) {
        const matrix<T, S, E> kg = columns<E>(k, g * E);
        const matrix<T, S, EV> vg = columns<EV>(v, g * EV);
        for (std::size_t h = g * group; h < (g + 1) * group; ++h) {
            matrix<T, L, EV> head_out{};
            sdpa_into(columns<E>(q, h * E), kg, vg, scale, causal, mask, additive, scores[h], weights[h], head_out);
            set_columns(out, h * EV, head_out);
        }
    }
}

template <class T, std::size_t E>
constexpr T default_scale() {
    return T{1} / qkv::sqrt(static_cast<T>(E));
}

}  // namespace detail

/// Scaled dot-product attention of q (L x E) over keys k (S x E) and values v (S x Ev).
template <any_matrix Q, any_matrix K, any_matrix V>
requires sdpa_operands<Q, K, V> && query_key_widths_match<Q, K> && key_value_lengths_match<K, V>
constexpr auto scaled_dot_product_attention(const Q& q, const K& k, const V& v,
                                            const sdpa_options_for<Q, K>& opt = {}) {
    using T = typename Q::value_type;
    sdpa_result<T, Q::rows, K::rows, V::cols> r{};
    const T scale = opt.scale ? *opt.scale : detail::default_scale<T, Q::cols>();
    detail::sdpa_into(q, k, v, scale, opt.causal, opt.mask, opt.additive_mask, r.scores, r.weights, r.output);
    return r;
}

/// Multi-head, grouped-query scaled dot-product attention: HQ query heads side by side in q's
/// columns (L x HQ·E), HKV K/V heads in k's (S x HKV·E) and v's (S x HKV·Ev); query head h uses
/// K/V head h / (HQ/HKV). HKV = HQ is plain multi-head attention. The masks and the causal mode
/// apply to every head; the default scale is 1/sqrt(E), E the width of one head.
template <std::size_t HQ, std::size_t HKV, any_matrix Q, any_matrix K, any_matrix V>
requires sdpa_operands<Q, K, V> && kv_heads_divide<HQ, HKV> && head_widths_match<HQ, HKV, Q, K, V> &&
    key_value_lengths_match<K, V>
constexpr auto scaled_dot_product_attention(const Q& q, const K& k, const V& v,
                                            const sdpa_options_for<Q, K>& opt = {}) {
    using T = typename Q::value_type;
    constexpr std::size_t EV = V::cols / HKV;
    multi_head_sdpa_result<T, HQ, Q::rows, K::rows, HQ * EV> r{};
    const T scale = opt.scale ? *opt.scale : detail::default_scale<T, Q::cols / HQ>();
    detail::multi_head_sdpa_into<HQ, HKV>(q, k, v, scale, opt.causal, opt.mask, opt.additive_mask, r.scores, r.weights,
                                          r.output);
    return r;
}

}  // namespace qkv
