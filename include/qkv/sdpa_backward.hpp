// The backward pass of scaled dot-product attention at compile time: the gradients of a loss with
// respect to q, k, v, the logits (the additive mask's gradient) and the sinks, given the forward
// result (its output and log-sum-exp) and the loss's gradient dO with respect to the output.
//
//   constexpr auto fwd = qkv::scaled_dot_product_attention(q, k, v, opt);
//   constexpr auto g = qkv::sdpa_backward(q, k, v, fwd, d_out, opt);   // g.dq, g.dk, g.dv, ...
//
// FlashAttention-2's algorithm, for query row i of a head with scale c, allowed keys J_i (every
// mask, the causal mode and the window; see sdpa.hpp) and logits s_ij:
//   lse'_i = log(e^lse_i + e^σ)                 the denominator with the head's sink σ (lse without one)
//   P_ij   = e^(s_ij - lse'_i)                  the probabilities, recomputed from the saved lse
//   Z_ij   = z_ij / (1 - p)                     dropout's kept-and-scaled mask (1 without dropout)
//   dV_j   = Σ_i P_ij · Z_ij · dO_i
//   dP_ij  = Z_ij · dO_i · v_j
//   D_i    = dO_i · O_i  (= Σ_j P_ij · dP_ij)   from the saved output
//   dS_ij  = P_ij · (dP_ij - D_i)               the logit's gradient; the additive mask's gradient
//   dR_ij  = dS_ij · (1 - tanh²(r_ij / C))      through the softcap, r = c·q_i·k_j (dR = dS without)
//   dQ_i   = c · Σ_j dR_ij · k_j,   dK_j = c · Σ_i dR_ij · q_i
//   dσ     = -Σ_i P_σ,i · D_i,   P_σ,i = e^(σ - lse'_i)   (the sink's gradient, see below)
// Every sum runs over the allowed (i, j) only: a masked key (bool mask, causal, window, -inf) gets
// no gradient and passes none; ALiBi's bias is a constant (no gradient for the slopes); a row with
// no key gets zero gradients. The sink's gradient: P_ij = e^(s_ij) / (Σ_k e^(s_ik) + e^σ), so
// ∂P_ij/∂σ = -P_ij · P_σ,i and ∂L/∂σ = Σ_i Σ_j dP_ij · (-P_ij · P_σ,i) = -Σ_i P_σ,i · D_i.
// Grouped-query heads: dK and dV of a K/V head are the sums over its query heads (h ascending);
// the additive mask and a sink shared by every head get the sum over the heads.
//
// The forms follow scaled_dot_product_attention's: one head (q L x E, k S x E, v S x Ev, d_out
// L x Ev), and HQ query heads over HKV K/V heads side by side in the columns. They give
// sdpa_backward_result / multi_head_sdpa_backward_result. qkv::staged::sdpa_backward
// (staged_backward.hpp) is the one-head form, bit for bit, as many small constant evaluations.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"

namespace qkv {

/// The gradients of one head: H is the number of sinks the options carry (1 for the one-head form).
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV, std::size_t H = 1>
struct sdpa_backward_result {
    matrix<T, L, E> dq;
    matrix<T, S, E> dk;
    matrix<T, S, EV> dv;
    matrix<T, L, S> d_scores;  ///< dS: the gradient of each logit s_ij, and so of the additive mask; 0 where masked
    row_vector<T, H> d_sinks;  ///< the sinks' gradients (0 without sinks)

    friend constexpr bool operator==(const sdpa_backward_result&, const sdpa_backward_result&) = default;
};

/// The gradients of HQ query heads over HKV K/V heads, in the forward's column layout; H is the
/// number of sinks the options carry (HQ, or 1 for one sink shared by every head).
template <class T, std::size_t HQ, std::size_t H, std::size_t L, std::size_t S, std::size_t DQ, std::size_t DK,
          std::size_t DV>
struct multi_head_sdpa_backward_result {
    matrix<T, L, DQ> dq;                       ///< query heads side by side
    matrix<T, S, DK> dk;                       ///< K/V heads side by side, each summed over its query heads
    matrix<T, S, DV> dv;                       ///< likewise
    std::array<matrix<T, L, S>, HQ> d_scores;  ///< per query head, as sdpa_backward_result::d_scores
    matrix<T, L, S> d_additive_mask;           ///< Σ_h d_scores[h]: the additive mask serves every head
    row_vector<T, H> d_sinks;                  ///< per sink (a shared sink: the sum over the heads)

    friend constexpr bool operator==(const multi_head_sdpa_backward_result&,
                                     const multi_head_sdpa_backward_result&) = default;
};

namespace detail {

/// The backward pass of query row i of one head (the header's rules), from the forward's output
/// row and log-sum-exp and the row of dO: the logits' gradients d_scores (dS), the scaled dot
/// products' d_raw (dR, the softcap's chain rule applied), the weights dV is made of (kept:
/// P·z/(1 - p), P without dropout) and dq (c·Σ_j dR_j·k_j). Returns the row's term of the sink's
/// gradient, -P_σ·D. A row with no allowed key gets zeros; a row whose lse is NaN (a NaN poisoned
/// its forward) gets NaN. The one backward row kernel of every form.
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr T backward_row(const head_rules<T>& rules, std::size_t i, const T (&q)[E], const T (&k)[S][E],
                         const T (&v)[S][EV], const std::optional<matrix<bool, L, S>>& mask,
                         const std::optional<matrix<T, L, S>>& additive, const T (&out)[EV], T lse,
                         const T (&d_out)[EV], T (&d_scores)[S], T (&d_raw)[S], T (&kept)[S], T (&dq)[E]) {
    bool allowed[S]{};
    T scores[S]{};
    T capped[S]{};
    score_row(rules, i, q, k, mask, additive, scores, allowed, rules.softcap != T{} ? &capped : nullptr);
    for (std::size_t j = 0; j < S; ++j) d_scores[j] = d_raw[j] = kept[j] = T{};
    for (std::size_t c = 0; c < E; ++c) dq[c] = T{};
    bool any = false;
    for (std::size_t j = 0; j < S; ++j) any = any || allowed[j];
    if (!any) return T{};   // no key: no gradient
    if (qkv::isnan(lse)) {  // a poisoned row: NaN, as its forward
        for (std::size_t j = 0; j < S; ++j)
            if (allowed[j]) d_scores[j] = d_raw[j] = kept[j] = quiet_nan<T>();
        for (std::size_t c = 0; c < E; ++c) dq[c] = quiet_nan<T>();
        return quiet_nan<T>();
    }
    // The sink joins the denominator: lse' = log(e^lse + e^σ), P_σ = e^(σ - lse').
    T total = lse;
    T p_sink{};
    if (rules.sink && *rules.sink != -infinity<T>()) {
        const T sigma = *rules.sink;
        const T m = lse > sigma ? lse : sigma;
        total = m + qkv::log(qkv::exp(lse - m) + qkv::exp(sigma - m));
        p_sink = qkv::exp(sigma - total);
    }
    // P, dropout's Z, dP = Z·dO·v_j.
    T d_p[S]{};
    T p[S]{};
    for (std::size_t j = 0; j < S; ++j)
        if (allowed[j]) {
            p[j] = qkv::exp(scores[j] - total);
            kept[j] = p[j];
            d_p[j] = dot(d_out, v[j]);
        }
    if (rules.drops)
        rules.dropout.for_each_key(rules.dropout_row0 + i, 0, S, [&](std::uint64_t j, bool keep) {
            if (!allowed[j]) return;
            kept[j] = keep ? p[j] * rules.keep_scale : T{};
            d_p[j] = keep ? d_p[j] * rules.keep_scale : T{};
        });
    const T d = dot(d_out, out);  // D = dO·O
    for (std::size_t j = 0; j < S; ++j)
        if (allowed[j]) {
            d_scores[j] = p[j] * (d_p[j] - d);
            d_raw[j] = d_scores[j];
            if (rules.softcap != T{}) {
                const T t = capped[j] / rules.softcap;  // tanh(r / C)
                const T slope = T{1} - t * t;
                d_raw[j] = d_scores[j] * (slope > T{} ? slope : T{});
            }
        }
    matmul_row(d_raw, k, dq);
    for (std::size_t c = 0; c < E; ++c) dq[c] = dq[c] * rules.scale;
    return -(p_sink * d);
}

/// Key j's gradients from the rows of one head: dk_j = c·Σ_i dR_ij·q_i, dv_j = Σ_i kept_ij·dO_i
/// (i ascending). The one key kernel of every form.
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr void key_gradient_row(std::size_t j, T scale, const T (&d_raw)[L][S], const T (&kept)[L][S],
                                const T (&q)[L][E], const T (&d_out)[L][EV], T (&dk)[E], T (&dv)[EV]) {
    T column[L]{};
    for (std::size_t i = 0; i < L; ++i) column[i] = d_raw[i][j];
    matmul_row(column, q, dk);
    for (std::size_t c = 0; c < E; ++c) dk[c] = dk[c] * scale;
    for (std::size_t i = 0; i < L; ++i) column[i] = kept[i][j];
    matmul_row(column, d_out, dv);
}

/// Σ of the rows' sink terms, i ascending.
template <class T, std::size_t L>
constexpr T sum_in_order(const T (&terms)[L]) {
    T sum{};
    for (std::size_t i = 0; i < L; ++i) sum += terms[i];
    return sum;
}

/// The backward pass of one head into its gradients under the rules and masks; returns the
/// head's sink gradient.
template <class T, std::size_t L, std::size_t S, std::size_t E, std::size_t EV>
constexpr T sdpa_backward_into(const matrix<T, L, E>& q, const matrix<T, S, E>& k, const matrix<T, S, EV>& v,
                               const head_rules<T>& rules, const std::optional<matrix<bool, L, S>>& mask,
                               const std::optional<matrix<T, L, S>>& additive, const matrix<T, L, EV>& out,
                               const T (&lse)[L], const matrix<T, L, EV>& d_out, matrix<T, L, E>& dq,
                               matrix<T, S, E>& dk, matrix<T, S, EV>& dv, matrix<T, L, S>& d_scores) {
    matrix<T, L, S> d_raw{}, kept{};
    T sink_terms[L]{};
    for (std::size_t i = 0; i < L; ++i)
        sink_terms[i] = backward_row(rules, i, q.elems[i], k.elems, v.elems, mask, additive, out.elems[i], lse[i],
                                     d_out.elems[i], d_scores.elems[i], d_raw.elems[i], kept.elems[i], dq.elems[i]);
    for (std::size_t j = 0; j < S; ++j)
        key_gradient_row(j, rules.scale, d_raw.elems, kept.elems, q.elems, d_out.elems, dk.elems[j], dv.elems[j]);
    return sum_in_order(sink_terms);
}

}  // namespace detail

/// The gradients of scaled_dot_product_attention(q, k, v, opt) for the loss gradient d_out (L x
/// Ev), from the forward result `forward` (its output and lse are what is read: FlashAttention-2's
/// saved tensors). opt must be the forward's options. Throws qkv::option_error for an option out
/// of range (at compile time: not a constant expression).
template <any_matrix Q, any_matrix K, any_matrix V>
requires sdpa_operands<Q, K, V> && query_key_widths_match<Q, K> && key_value_lengths_match<K, V>
constexpr auto sdpa_backward(const Q& q, const K& k, const V& v,
                             const sdpa_result<typename Q::value_type, Q::rows, K::rows, V::cols>& forward,
                             const matrix<typename Q::value_type, Q::rows, V::cols>& d_out,
                             const sdpa_options_for<Q, K>& opt = {}) {
    using T = typename Q::value_type;
    detail::check_options(opt);
    sdpa_backward_result<T, Q::rows, K::rows, Q::cols, V::cols> g{};
    g.d_sinks.elems[0][0] = detail::sdpa_backward_into(
        q, k, v, detail::head_rules_of<1>(opt, 0, detail::default_scale<T, Q::cols>()), opt.mask, opt.additive_mask,
        forward.output, forward.lse.elems[0], d_out, g.dq, g.dk, g.dv, g.d_scores);
    if (!opt.sinks) g.d_sinks.elems[0][0] = T{};
    return g;
}

/// The gradients of the multi-head, grouped-query scaled_dot_product_attention<HQ, HKV>(q, k, v,
/// opt) for d_out (L x HQ·Ev), from its result `forward`. dk and dv of K/V head g sum the
/// gradients of its query heads h = g·HQ/HKV ... (g+1)·HQ/HKV - 1, in that order.
template <std::size_t HQ, std::size_t HKV, any_matrix Q, any_matrix K, any_matrix V,
          class Opt = sdpa_options_for<Q, K, HQ>>
requires sdpa_operands<Q, K, V> && kv_heads_divide<HQ, HKV> && head_widths_match<HQ, HKV, Q, K, V> &&
    key_value_lengths_match<K, V> && sdpa_options_for_heads<Opt, HQ, Q, K>
constexpr auto sdpa_backward(
    const Q& q, const K& k, const V& v,
    const multi_head_sdpa_result<typename Q::value_type, HQ, Q::rows, K::rows, HQ*(V::cols / HKV)>& forward,
    const matrix<typename Q::value_type, Q::rows, HQ*(V::cols / HKV)>& d_out, const Opt& opt = {}) {
    using T = typename Q::value_type;
    constexpr std::size_t L = Q::rows, S = K::rows, E = Q::cols / HQ, EV = V::cols / HKV, group = HQ / HKV;
    using sinks_t = typename std::remove_cvref_t<decltype(opt.sinks)>::value_type;  // row_vector<T, HQ or 1>
    detail::check_options(opt);
    multi_head_sdpa_backward_result<T, HQ, sinks_t::cols, L, S, Q::cols, K::cols, V::cols> g{};
    const T scale = detail::default_scale<T, E>();
    for (std::size_t kv = 0; kv < HKV; ++kv) {
        const matrix<T, S, E> kg = columns<E>(k, kv * E);
        const matrix<T, S, EV> vg = columns<EV>(v, kv * EV);
        matrix<T, S, E> dk_sum{};
        matrix<T, S, EV> dv_sum{};
        for (std::size_t h = kv * group; h < (kv + 1) * group; ++h) {
            matrix<T, L, E> dq{};
            matrix<T, S, E> dk{};
            matrix<T, S, EV> dv{};
            const T d_sink =
                detail::sdpa_backward_into(columns<E>(q, h * E), kg, vg, detail::head_rules_of<HQ>(opt, h, scale),
                                           opt.mask, opt.additive_mask, columns<EV>(forward.output, h * EV),
                                           forward.lse.elems[h], columns<EV>(d_out, h * EV), dq, dk, dv, g.d_scores[h]);
            set_columns(g.dq, h * E, dq);
            dk_sum = dk_sum + dk;
            dv_sum = dv_sum + dv;
            if (opt.sinks) g.d_sinks.elems[0][sinks_t::cols == 1 ? 0 : h] += d_sink;
            g.d_additive_mask = g.d_additive_mask + g.d_scores[h];
        }
        set_columns(g.dk, kv * E, dk_sum);
        set_columns(g.dv, kv * EV, dv_sum);
    }
    return g;
}

}  // namespace qkv
