// The backward pass of self-attention at compile time: the gradients with respect to the inputs X,
// the projection weights Wq, Wk, Wv and their biases, through qkv::sdpa_backward.
//
//   constexpr auto g = qkv::self_attention_backward(x, wq, wk, wv, d_out, {.scale = 1.f});
//   // g.dwq = Xᵀ·dQ, g.dx = dQ·Wqᵀ + dK·Wkᵀ + dV·Wvᵀ, ...
//
// With Q = X·Wq (+ bq), K = X·Wk (+ bk), V = X·Wv (+ bv) and the attention's gradients dQ, dK, dV
// (qkv/sdpa_backward.hpp) for the loss gradient d_out of the output:
//   dWq = Xᵀ·dQ,  dWk = Xᵀ·dK,  dWv = Xᵀ·dV
//   dbq = Σ_i dQ_i,  dbk = Σ_i dK_i,  dbv = Σ_i dV_i     (what a bias gets, given or not)
//   dX  = dQ·Wqᵀ + dK·Wkᵀ + dV·Wvᵀ
#pragma once

#include <cstddef>
#include <optional>

#include "qkv/attention.hpp"
#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"
#include "qkv/sdpa_backward.hpp"

namespace qkv {

/// The gradients of self_attention with respect to everything it was given, and to its
/// projections Q, K, V and scores.
template <class T, std::size_t N, std::size_t DIN, std::size_t DK, std::size_t DV>
struct attention_backward_result {
    matrix<T, N, DIN> dx;
    matrix<T, DIN, DK> dwq;
    matrix<T, DIN, DK> dwk;
    matrix<T, DIN, DV> dwv;
    row_vector<T, DK> dbq;
    row_vector<T, DK> dbk;
    row_vector<T, DV> dbv;
    matrix<T, N, DK> dq;       ///< the gradient of Q = X·Wq (+ bq)
    matrix<T, N, DK> dk;       ///< of K
    matrix<T, N, DV> dv;       ///< of V
    matrix<T, N, N> d_scores;  ///< of the scores Q·Kᵀ·scale (0 where masked)

    friend constexpr bool operator==(const attention_backward_result&, const attention_backward_result&) = default;
};

namespace detail {

/// Σ_i m_i, rows ascending.
template <class T, std::size_t R, std::size_t C>
constexpr row_vector<T, C> column_sums(const matrix<T, R, C>& m) {
    row_vector<T, C> s{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) s.elems[0][c] += m.elems[r][c];
    return s;
}

}  // namespace detail

/// The gradients of self_attention(x, wq, wk, wv, opt) for the loss gradient d_out (N x d_v). The
/// forward pass is recomputed (as self_attention computes it), then sdpa_backward's rules and the
/// projections' chain rule.
template <any_matrix X, any_matrix WQ, any_matrix WK, any_matrix WV>
requires projects<X, WQ> && projects<X, WK> && projects<X, WV> && query_key_widths_match<WQ, WK>
constexpr auto self_attention_backward(const X& x, const WQ& wq, const WK& wk, const WV& wv,
                                       const matrix<typename X::value_type, X::rows, WV::cols>& d_out,
                                       const attention_options_for<X, WK, WV>& opt = {}) {
    using T = typename X::value_type;
    constexpr std::size_t N = X::rows, DIN = X::cols, DK = WK::cols, DV = WV::cols;
    const matrix<T, N, DK> q = detail::with_bias(matmul(x, wq), opt.bias_q);
    const matrix<T, N, DK> k = detail::with_bias(matmul(x, wk), opt.bias_k);
    const matrix<T, N, DV> v = detail::with_bias(matmul(x, wv), opt.bias_v);
    const detail::head_rules<T> rules = detail::plain_rules(detail::scale_of(opt, DK), detail::causal_of(opt));
    const std::optional<matrix<T, N, N>> no_additive{};
    matrix<T, N, N> scores{}, weights{};
    matrix<T, N, DV> out{};
    T lse[N]{};
    detail::sdpa_into(q, k, v, rules, opt.mask, no_additive, scores, weights, out, lse);
    attention_backward_result<T, N, DIN, DK, DV> g{};
    detail::sdpa_backward_into(q, k, v, rules, opt.mask, no_additive, out, lse, d_out, g.dq, g.dk, g.dv, g.d_scores);
    const matrix<T, DIN, N> xt = transpose(x);
    g.dwq = matmul(xt, g.dq);
    g.dwk = matmul(xt, g.dk);
    g.dwv = matmul(xt, g.dv);
    g.dbq = detail::column_sums(g.dq);
    g.dbk = detail::column_sums(g.dk);
    g.dbv = detail::column_sums(g.dv);
    g.dx = matmul(g.dq, transpose(wq)) + matmul(g.dk, transpose(wk)) + matmul(g.dv, transpose(wv));
    return g;
}

}  // namespace qkv
