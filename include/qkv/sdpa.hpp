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
//
// The attention of today's models (options after the masks; every default means "off"). With
// s = scale·q·k and query i at key position i + off (off = 0 top-left, S - L bottom-right: the
// causal mode's alignment, or .alignment without one):
//   .softcap C > 0      s <- C·tanh(s / C), first;
//   .alibi_slope m      s <- s - m·|i + off - j| (single head; every head in the multi-head form);
//   .alibi_max_bias b   the same with ggml's slope of each query head (qkv::alibi_slope);
//   .additive_mask      then added, as before;
//   .window {l, r}      key j is allowed only when i + off - l <= j <= i + off + r, -1 = unbounded;
//                       a key must pass the window, the causal mode and the masks (AND);
//   .sinks              one logit σ per query head joins the denominator and nothing else:
//                       out = Σ e^(s_j - m) v_j / (Σ e^(s_j - m) + e^(σ - m)), m = max(max s_j, σ);
//                       the weights e^(s_j - m) / (...) no longer sum to 1; a row with no key
//                       left is still zero.
//   .dropout {p, seed, offset}  each weight kept with probability 1 - p and scaled by 1 / (1 - p) in
//                       the output, or dropped; the mask is qkv/dropout.hpp's (Philox4x32-10, row
//                       h·L + i); the weights returned are the probabilities, a dropped one negated.
// Every result has lse: log Σ e^(s_j) over the keys the query may attend (the sink not included),
// -inf for a query with none (dropout does not change it). An option out of range (a window side
// below -1, a negative or non-finite softcap, slope or max_bias, both ALiBi forms at once, a NaN or
// +inf sink, an alignment that contradicts the causal mode, a dropout p outside [0, 1)) throws
// qkv::option_error, which at compile time makes the call not a constant expression.
// The gradients are qkv::sdpa_backward's (qkv/sdpa_backward.hpp).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <type_traits>

#include "qkv/causal.hpp"
#include "qkv/dropout.hpp"
#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/softmax.hpp"

namespace qkv {

/// What scaled_dot_product_attention and alibi_slope throw for an option or argument out of range
/// (at compile time the throw makes the call not a constant expression, and the diagnostic shows
/// the throw and its message). A std::exception whose what() names the option; light, so that the
/// core's headers need not include <stdexcept> and <string>.
class option_error : public std::exception {
public:
    explicit option_error(const char* what) noexcept : what_(what) {}
    [[nodiscard]] const char* what() const noexcept override { return what_; }

private:
    const char* what_;
};

/// Options of scaled_dot_product_attention for L queries and S keys of element type T. Every
/// member has a default, and the defaults mean "off", so designated initialisers read naturally:
/// `{.scale = 1.f}`, `{.causal = qkv::causal_mode::top_left, .mask = m}`,
/// `{.softcap = 30.f, .window = {4, 0}}`. H is the number of query heads the options serve (the
/// length of `sinks`): 1 for the single-head form, HQ (or 1, one sink for every head) for the
/// multi-head form.
template <class T, std::size_t L, std::size_t S, std::size_t H = 1>
struct sdpa_matrix_options {
    /// FlashAttention's window_size: query i may attend key j only when
    /// i + off - left <= j <= i + off + right; -1 leaves that side unbounded.
    struct window_size {
        std::ptrdiff_t left = -1;   ///< keys before query i's position; -1 = all
        std::ptrdiff_t right = -1;  ///< keys after it; -1 = all
    };

    std::optional<T> scale{};                        ///< multiplies q·kᵀ; default 1/sqrt(E per head)
    causal_mode causal = causal_mode::none;          ///< combined with the masks
    std::optional<matrix<bool, L, S>> mask{};        ///< true = may attend
    std::optional<matrix<T, L, S>> additive_mask{};  ///< added to the scaled scores; -inf masks
    T softcap{};           ///< C > 0: each scaled score s becomes C·tanh(s / C), first; 0 = off
    T alibi_slope{};       ///< ALiBi: s -= slope·|i + off - j| (every head); 0 = off
    T alibi_max_bias{};    ///< ALiBi with ggml's slopes over the query heads (qkv::alibi_slope); 0 = off
    window_size window{};  ///< sliding window; the default {-1, -1} is none
    /// Where query i sits among the keys (off = 0 top-left, S - L bottom-right) for the window and
    /// the ALiBi distance: by default the causal mode's alignment (top-left without one); given
    /// with a causal mode, it must be that mode's.
    std::optional<position_alignment> alignment{};
    std::optional<row_vector<T, H>> sinks{};  ///< one logit per query head (or one for all) in the denominator
    /// Attention dropout (qkv/dropout.hpp): each weight kept with probability 1 - p and scaled by
    /// 1 / (1 - p), or dropped; the mask is Philox4x32-10's under `seed` and `offset`, for query row
    /// h·L + i of query head h. p = 0 (the default) is off.
    struct dropout_options {
        T p{};                     ///< the probability of dropping a weight, 0 <= p < 1
        std::uint64_t seed = 0;    ///< the Philox key
        std::uint64_t offset = 0;  ///< added to every counter (units of four keys)
    };
    dropout_options dropout{};
};

/// Whether Opt is an sdpa_matrix_options.
template <class Opt>
struct is_sdpa_options : std::false_type {};
template <class T, std::size_t L, std::size_t S, std::size_t H>
struct is_sdpa_options<sdpa_matrix_options<T, L, S, H>> : std::true_type {};

/// The options type for queries Q (L x ·) and keys K (S x ·), serving H query heads.
template <class Q, class K, std::size_t H = 1>
using sdpa_options_for = sdpa_matrix_options<typename Q::value_type, Q::rows, K::rows, H>;

/// Every intermediate of one scaled dot-product attention.
template <class T, std::size_t L, std::size_t S, std::size_t EV>
struct sdpa_result {
    matrix<T, L, S> scores;   ///< q·kᵀ·scale, softcapped, minus the ALiBi bias, plus additive_mask: the
                              ///< logits, before the bool, causal and window masks
    matrix<T, L, S> weights;  ///< softmax of the allowed scores (and the sink); masked entries are 0;
                              ///< with dropout, a dropped weight negated (FlashAttention's encoding)
    matrix<T, L, EV> output;  ///< weights · v (with dropout: the kept weights / (1 - p) · v)
    row_vector<T, L> lse;     ///< log Σ e^(scores) over each query's allowed keys; -inf for none

    friend constexpr bool operator==(const sdpa_result&, const sdpa_result&) = default;
};

/// Every intermediate of multi-head (grouped-query) scaled dot-product attention.
template <class T, std::size_t H, std::size_t L, std::size_t S, std::size_t DV>
struct multi_head_sdpa_result {
    std::array<matrix<T, L, S>, H> scores;   ///< per query head, as sdpa_result::scores
    std::array<matrix<T, L, S>, H> weights;  ///< per query head
    matrix<T, L, DV> output;                 ///< head outputs side by side
    matrix<T, H, L> lse;                     ///< row h: query head h's log-sum-exp per query

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

/// Opt is an options object for HQ query heads of queries Q and keys K: sdpa_options_for<Q, K, HQ>
/// (one sink per head) or sdpa_options_for<Q, K> (one sink, if any, for every head).
template <class Opt, std::size_t HQ, class Q, class K>
concept sdpa_options_for_heads =
    std::is_same_v<Opt, sdpa_options_for<Q, K, HQ>> || std::is_same_v<Opt, sdpa_options_for<Q, K>>;

/// ALiBi's slope for query head h of `heads` with maximum bias b, ggml's: n = 2^⌊log2 heads⌋,
/// m0 = 2^(-b/n), m1 = 2^(-b/(2n)); m0^(h+1) for h < n, else m1^(2(h-n)+1). Computed as one
/// power of two in double (its exponent is exact for float b) and rounded once to T. Throws
/// qkv::option_error (at compile time: not a constant expression) unless h < heads and b is
/// finite and >= 0.
template <std::floating_point T>
constexpr T alibi_slope(T max_bias, std::size_t h, std::size_t heads) {
    if (h >= heads) throw option_error("qkv::alibi_slope: head h must be below the head count");
    if (!(max_bias >= T{}) || !qkv::isfinite(max_bias))
        throw option_error("qkv::alibi_slope: max_bias must be finite and >= 0");
    std::size_t n = 1;
    while (n <= heads / 2) n *= 2;  // 2^floor(log2 heads), without overflow
    const double b = static_cast<double>(max_bias), nd = static_cast<double>(n);
    const double exponent =
        h < n ? -(b / nd) * static_cast<double>(h + 1) : -(b / (2.0 * nd)) * static_cast<double>(2 * (h - n) + 1);
    return static_cast<T>(qkv::exp2(exponent));
}

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

/// What one query head applies to its scores beyond the masks, resolved from the options: the
/// one-evaluation and the staged forms run the same row kernel (attend_row) on the same rules.
template <class T>
struct head_rules {
    T scale{};
    causal_mode causal = causal_mode::none;
    std::ptrdiff_t offset = 0;  ///< query i sits at key position i + offset (window, ALiBi)
    std::ptrdiff_t left = -1;   ///< window, -1 = unbounded
    std::ptrdiff_t right = -1;
    T softcap{};  ///< 0 = none
    T slope{};    ///< ALiBi slope, 0 = none
    std::optional<T> sink{};
    bool drops = false;              ///< attention dropout (qkv/dropout.hpp) on
    dropout_stream dropout{};        ///< its seed, offset and threshold
    T keep_scale{1};                 ///< 1 / (1 - p): what a kept weight is multiplied by
    std::uint64_t dropout_row0 = 0;  ///< the dropout row of query 0: h·L for query head h
};

/// The rules of a plain head: a scale and a causal mode (self_attention, multi_head_attention).
template <class T>
constexpr head_rules<T> plain_rules(T scale, causal_mode causal) {
    head_rules<T> r{};
    r.scale = scale;
    r.causal = causal;
    return r;
}

/// The alignment a causal mode implies (top-left without one).
constexpr position_alignment alignment_of(causal_mode causal) {
    return causal == causal_mode::bottom_right ? position_alignment::bottom_right : position_alignment::top_left;
}

/// Every option value in range, or qkv::option_error naming the option (at compile time the throw
/// makes the call not a constant expression, and the diagnostic shows this line).
template <class T, std::size_t L, std::size_t S, std::size_t H>
constexpr void check_options(const sdpa_matrix_options<T, L, S, H>& opt) {
    if (!(opt.softcap >= T{}) || !qkv::isfinite(opt.softcap))
        throw option_error("qkv::scaled_dot_product_attention: softcap must be finite and >= 0 (0 = off)");
    if (!(opt.alibi_slope >= T{}) || !qkv::isfinite(opt.alibi_slope))
        throw option_error("qkv::scaled_dot_product_attention: alibi_slope must be finite and >= 0");
    if (!(opt.alibi_max_bias >= T{}) || !qkv::isfinite(opt.alibi_max_bias))
        throw option_error("qkv::scaled_dot_product_attention: alibi_max_bias must be finite and >= 0");
    if (opt.alibi_slope != T{} && opt.alibi_max_bias != T{})
        throw option_error("qkv::scaled_dot_product_attention: give alibi_slope or alibi_max_bias, not both");
    if (opt.window.left < -1 || opt.window.right < -1)
        throw option_error("qkv::scaled_dot_product_attention: window sides must be >= -1 (-1 = unbounded)");
    if (opt.alignment && *opt.alignment != position_alignment::top_left &&
        *opt.alignment != position_alignment::bottom_right)
        throw option_error("qkv::scaled_dot_product_attention: alignment must be top_left or bottom_right");
    if (opt.alignment && opt.causal != causal_mode::none && *opt.alignment != alignment_of(opt.causal))
        throw option_error("qkv::scaled_dot_product_attention: alignment differs from the causal mode's");
    if (opt.sinks)
        for (std::size_t h = 0; h < H; ++h)
            if (qkv::isnan(opt.sinks->elems[0][h]) || opt.sinks->elems[0][h] == infinity<T>())
                throw option_error("qkv::scaled_dot_product_attention: sinks must be finite or -inf");
    if (!(opt.dropout.p >= T{} && opt.dropout.p < T{1}))
        throw option_error("qkv::scaled_dot_product_attention: dropout.p must be at least 0 and below 1");
}

/// The rules of query head h of HQ under opt (checked by check_options), with the scale used
/// when opt has none.
template <std::size_t HQ, class T, std::size_t L, std::size_t S, std::size_t H>
constexpr head_rules<T> head_rules_of(const sdpa_matrix_options<T, L, S, H>& opt, std::size_t h, T default_scale) {
    head_rules<T> r = plain_rules(opt.scale ? *opt.scale : default_scale, opt.causal);
    const position_alignment align = opt.alignment ? *opt.alignment : alignment_of(opt.causal);
    r.offset =
        align == position_alignment::bottom_right ? static_cast<std::ptrdiff_t>(S) - static_cast<std::ptrdiff_t>(L) : 0;
    r.left = opt.window.left;
    r.right = opt.window.right;
    r.softcap = opt.softcap;
    r.slope = opt.alibi_max_bias != T{} ? alibi_slope(opt.alibi_max_bias, h, HQ) : opt.alibi_slope;
    if (opt.sinks) r.sink = opt.sinks->elems[0][H == 1 ? 0 : h];
    if (opt.dropout.p != T{}) {
        r.drops = true;
        r.dropout = {opt.dropout.seed, opt.dropout.offset, dropout_threshold(static_cast<double>(opt.dropout.p))};
        r.keep_scale = T{1} / (T{1} - opt.dropout.p);
        r.dropout_row0 = static_cast<std::uint64_t>(h) * L;
    }
    return r;
}

/// Clear allowed[j] for the keys outside query i's sliding window.
template <class T, std::size_t S>
constexpr void window_row(const head_rules<T>& rules, std::size_t i, bool (&allowed)[S]) {
    if (rules.left < 0 && rules.right < 0) return;
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(i) + rules.offset;
    for (std::size_t j = 0; j < S; ++j) {
        const std::ptrdiff_t d = static_cast<std::ptrdiff_t>(j) - at;  // j - (i + off)
        if ((rules.left >= 0 && d < -rules.left) || (rules.right >= 0 && d > rules.right)) allowed[j] = false;
    }
}

/// scores[j] = C·tanh(scores[j] / C).
template <class T, std::size_t S>
constexpr void softcap_row(T cap, T (&scores)[S]) {
    for (std::size_t j = 0; j < S; ++j) scores[j] = cap * qkv::tanh(scores[j] / cap);
}

/// scores[j] -= slope·|i + off - j|.
template <class T, std::size_t S>
constexpr void alibi_row(const head_rules<T>& rules, std::size_t i, T (&scores)[S]) {
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(i) + rules.offset;
    for (std::size_t j = 0; j < S; ++j) {
        const std::ptrdiff_t d = static_cast<std::ptrdiff_t>(j) - at;
        scores[j] = scores[j] - rules.slope * static_cast<T>(d < 0 ? -d : d);
    }
}

/// Query row i of one head: the "may attend" booleans (bool mask, causal mode, window; an additive
/// -inf) and the scores (scaled, softcapped, ALiBi, additive mask), as every form, forward and
/// backward, computes them. `capped`, when given, receives the scores after the softcap, before
/// ALiBi and the additive mask (the backward's chain rule through tanh).
template <class T, std::size_t L, std::size_t S, std::size_t E>
constexpr void score_row(const head_rules<T>& rules, std::size_t i, const T (&q)[E], const T (&k)[S][E],
                         const std::optional<matrix<bool, L, S>>& mask, const std::optional<matrix<T, L, S>>& additive,
                         T (&scores)[S], bool (&allowed)[S], T (*capped)[S] = nullptr) {
    allowed_row(mask, rules.causal, i, allowed);
    window_row(rules, i, allowed);
    scores_row(q, k, rules.scale, scores);
    if (rules.softcap != T{}) softcap_row(rules.softcap, scores);
    if (capped)
        for (std::size_t j = 0; j < S; ++j) (*capped)[j] = scores[j];
    if (rules.slope != T{}) alibi_row(rules, i, scores);
    if (additive) add_mask_row(additive->elems[i], scores, allowed);
}

/// Query row i of one head: the scores and "may attend" booleans (score_row), the weights (softmax
/// with the sink), dropout (a dropped weight's sign flipped, a kept one scaled by 1 / (1 - p) in the
/// sum) and the output row; returns the row's log-sum-exp. The one forward row kernel of every form.
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr T attend_row(const head_rules<T>& rules, std::size_t i, const T (&q)[E], const T (&k)[S][E],
                       const T (&v)[S][EV], const std::optional<matrix<bool, L, S>>& mask,
                       const std::optional<matrix<T, L, S>>& additive, T (&scores)[S], T (&weights)[S], T (&out)[EV]) {
    bool allowed[S]{};
    score_row(rules, i, q, k, mask, additive, scores, allowed);
    const T lse = masked_softmax_row(scores, allowed, weights, rules.sink);
    if (!rules.drops) {
        matmul_row(weights, v, out);
        return lse;
    }
    T kept[S]{};
    rules.dropout.for_each_key(rules.dropout_row0 + i, 0, S, [&](std::uint64_t j, bool keep) {
        if (!allowed[j]) return;
        if (keep)
            kept[j] = weights[j] * rules.keep_scale;
        else
            weights[j] = -weights[j];
    });
    matmul_row(kept, v, out);
    return lse;
}

/// Scaled dot-product attention of one head into scores, weights, out and lse under the rules
/// and the masks (either may be empty).
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr void sdpa_into(const matrix<T, L, E>& q, const matrix<T, S, E>& k, const matrix<T, S, EV>& v,
                         const head_rules<T>& rules, const std::optional<matrix<bool, L, S>>& mask,
                         const std::optional<matrix<T, L, S>>& additive, matrix<T, L, S>& scores,
                         matrix<T, L, S>& weights, matrix<T, L, EV>& out, T (&lse)[L]) {
    for (std::size_t i = 0; i < L; ++i)
        lse[i] = attend_row(rules, i, q.elems[i], k.elems, v.elems, mask, additive, scores.elems[i], weights.elems[i],
                            out.elems[i]);
}

/// HQ query heads over HKV K/V heads (columns side by side), into per-head scores and weights,
/// the concatenated output and the per-head lse; `rules_of(h)` gives head h's rules.
template <std::size_t HQ, std::size_t HKV, class T, std::size_t L, std::size_t S, std::size_t DQ, std::size_t DK,
          std::size_t DV, std::size_t DO, class Rules>
constexpr void multi_head_sdpa_into(const matrix<T, L, DQ>& q, const matrix<T, S, DK>& k, const matrix<T, S, DV>& v,
                                    const Rules& rules_of, const std::optional<matrix<bool, L, S>>& mask,
                                    const std::optional<matrix<T, L, S>>& additive,
                                    std::array<matrix<T, L, S>, HQ>& scores, std::array<matrix<T, L, S>, HQ>& weights,
                                    matrix<T, L, DO>& out, matrix<T, HQ, L>& lse) {
    constexpr std::size_t E = DQ / HQ, EV = DV / HKV, group = HQ / HKV;
    for (std::size_t g = 0; g < HKV; ++g) {
        const matrix<T, S, E> kg = columns<E>(k, g * E);
        const matrix<T, S, EV> vg = columns<EV>(v, g * EV);
        for (std::size_t h = g * group; h < (g + 1) * group; ++h) {
            matrix<T, L, EV> head_out{};
            sdpa_into(columns<E>(q, h * E), kg, vg, rules_of(h), mask, additive, scores[h], weights[h], head_out,
                      lse.elems[h]);
            set_columns(out, h * EV, head_out);
        }
    }
}

template <class T, std::size_t E>
constexpr T default_scale() {
    return T{1} / qkv::sqrt(static_cast<T>(E));
}

}  // namespace detail

/// Scaled dot-product attention of q (L x E) over keys k (S x E) and values v (S x Ev). Throws
/// qkv::option_error for an option out of range (at compile time: not a constant expression).
template <any_matrix Q, any_matrix K, any_matrix V>
requires sdpa_operands<Q, K, V> && query_key_widths_match<Q, K> && key_value_lengths_match<K, V>
constexpr auto scaled_dot_product_attention(const Q& q, const K& k, const V& v,
                                            const sdpa_options_for<Q, K>& opt = {}) {
    using T = typename Q::value_type;
    detail::check_options(opt);
    sdpa_result<T, Q::rows, K::rows, V::cols> r{};
    detail::sdpa_into(q, k, v, detail::head_rules_of<1>(opt, 0, detail::default_scale<T, Q::cols>()), opt.mask,
                      opt.additive_mask, r.scores, r.weights, r.output, r.lse.elems[0]);
    return r;
}

/// Multi-head, grouped-query scaled dot-product attention: HQ query heads side by side in q's
/// columns (L x HQ·E), HKV K/V heads in k's (S x HKV·E) and v's (S x HKV·Ev); query head h uses
/// K/V head h / (HQ/HKV). HKV = HQ is plain multi-head attention. The masks, the causal mode, the
/// window, the softcap and alibi_slope apply to every head; alibi_max_bias gives head h the slope
/// qkv::alibi_slope(b, h, HQ); sinks has one logit per query head (options for HQ heads) or one
/// for all (options for one head). The default scale is 1/sqrt(E), E the width of one head.
template <std::size_t HQ, std::size_t HKV, any_matrix Q, any_matrix K, any_matrix V,
          class Opt = sdpa_options_for<Q, K, HQ>>
requires sdpa_operands<Q, K, V> && kv_heads_divide<HQ, HKV> && head_widths_match<HQ, HKV, Q, K, V> &&
    key_value_lengths_match<K, V> && sdpa_options_for_heads<Opt, HQ, Q, K>
constexpr auto scaled_dot_product_attention(const Q& q, const K& k, const V& v, const Opt& opt = {}) {
    using T = typename Q::value_type;
    constexpr std::size_t EV = V::cols / HKV;
    detail::check_options(opt);
    multi_head_sdpa_result<T, HQ, Q::rows, K::rows, HQ * EV> r{};
    const T scale = detail::default_scale<T, Q::cols / HQ>();
    detail::multi_head_sdpa_into<HQ, HKV>(
        q, k, v, [&](std::size_t h) { return detail::head_rules_of<HQ>(opt, h, scale); }, opt.mask, opt.additive_mask,
        r.scores, r.weights, r.output, r.lse);
    return r;
}

}  // namespace qkv
