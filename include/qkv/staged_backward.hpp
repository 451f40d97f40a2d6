// The staged backward pass: qkv::sdpa_backward's gradients (sdpa_backward.hpp), bit for bit, as
// many small constant evaluations, for sizes one evaluation cannot reach (see staged.hpp for why).
//
//   constexpr auto fwd = qkv::staged::scaled_dot_product_attention<q, k, v, opt>;
//   constexpr auto g   = qkv::staged::sdpa_backward<q, k, v, fwd, d_out, opt>;
//   // g == qkv::sdpa_backward(q, k, v, fwd, d_out, opt)
//
// Two kinds of blocks, each a variable template specialisation initialised by its own evaluation:
//
//   backward_block<..., b>   query rows: the row kernel (qkv::detail::backward_row) gives each
//                            row's dS, dR, the weights dV is made of, dq and its sink term
//   backward_matrices<...>   the blocks' dR and weights side by side (L x S each, copies)
//   key_block<..., b>        key rows: dk and dv from those matrices (qkv::detail::key_gradient_row)
//   sdpa_backward<...>       the blocks assembled into a qkv::sdpa_backward_result
//
// The kernels are sdpa_backward's, on the same rows in the same order, so the results are identical.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"
#include "qkv/sdpa_backward.hpp"
#include "qkv/staged.hpp"

namespace qkv::staged {
namespace detail {

/// Whether Opt carries sinks (default_options carries none).
template <const auto& Opt>
constexpr bool has_sinks() {
    if constexpr (is_sdpa<type_of<Opt>>)
        return Opt.sinks.has_value();
    else
        return false;
}

/// Query rows of one backward block.
template <class T, std::size_t RB, std::size_t S, std::size_t E>
struct backward_rows {
    matrix<T, RB, S> d_scores;
    matrix<T, RB, S> d_raw;
    matrix<T, RB, S> kept;
    matrix<T, RB, E> dq;
    row_vector<T, RB> sink_terms;
};

/// Query rows per backward block: one row costs S·(E + 2·Ev) multiply-adds (the scores, dP and dq)
/// and S score entries; RowsPerBlock overrides the budgets (0 = from the budgets).
template <class Q, class K, class V, const auto& Opt, std::size_t RowsPerBlock>
inline constexpr std::size_t backward_rows_per_block = RowsPerBlock != 0
                                                           ? clamp_rows(RowsPerBlock, Q::rows)
                                                           : attend_block_rows(Q::rows, K::rows, K::cols, 2 * V::cols,
                                                                               entries_for(Opt));

template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t B>
constexpr auto make_backward_block() {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    using T = typename QT::value_type;
    constexpr std::size_t per = backward_rows_per_block<QT, KT, VT, Opt, RowsPerBlock>;
    constexpr std::size_t RB = block_rows(QT::rows, per, B);
    constexpr std::size_t NK = KT::rows;
    const qkv::detail::head_rules<T> rules = rules_of<T, KT::cols>(Opt);
    backward_rows<T, RB, NK, QT::cols> out{};
    for (std::size_t r = 0; r < RB; ++r) {
        const std::size_t i = B * per + r;
        out.sink_terms.elems[0][r] = qkv::detail::backward_row(
            rules, i, Q.elems[i], K.elems, V.elems, mask_of<QT::rows, NK>(Opt), additive_of<T, QT::rows, NK>(Opt),
            Fwd.output.elems[i], Fwd.lse.elems[0][i], DOut.elems[i], out.d_scores.elems[r], out.d_raw.elems[r],
            out.kept.elems[r], out.dq.elems[r]);
    }
    return out;
}

/// Query rows [B·h, B·h + h) of the backward pass, h = backward_rows_per_block.
template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t B>
inline constexpr auto backward_block = make_backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>();

template <class T, std::size_t L, std::size_t S>
struct key_inputs {
    matrix<T, L, S> d_raw;
    matrix<T, L, S> kept;
};

template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t... B>
constexpr auto assemble_key_inputs(std::index_sequence<B...>) {
    using QT = type_of<Q>;
    constexpr std::size_t per = backward_rows_per_block<QT, type_of<K>, type_of<V>, Opt, RowsPerBlock>;
    key_inputs<typename QT::value_type, QT::rows, type_of<K>::rows> m{};
    (copy_block(m.d_raw, B * per, backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>.d_raw), ...);
    (copy_block(m.kept, B * per, backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>.kept), ...);
    return m;
}

template <class Q, class K, class V, const auto& Opt, std::size_t RowsPerBlock>
inline constexpr std::size_t backward_blocks = block_count(Q::rows,
                                                           backward_rows_per_block<Q, K, V, Opt, RowsPerBlock>);

/// dR and the weights of dV for every (query, key), from the query blocks.
template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock>
inline constexpr auto backward_matrices = assemble_key_inputs<Q, K, V, Fwd, DOut, Opt, RowsPerBlock>(
    std::make_index_sequence<backward_blocks<type_of<Q>, type_of<K>, type_of<V>, Opt, RowsPerBlock>>{});

/// Key rows per block: one key costs L·(E + Ev) multiply-adds.
template <class Q, class K, class V, std::size_t RowsPerBlock>
inline constexpr std::size_t key_rows_per_block = RowsPerBlock != 0
                                                      ? clamp_rows(RowsPerBlock, K::rows)
                                                      : rows_per_block(Q::rows*(K::cols + V::cols), K::rows);

template <class T, std::size_t RB, std::size_t E, std::size_t EV>
struct key_rows {
    matrix<T, RB, E> dk;
    matrix<T, RB, EV> dv;
};

template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t B>
constexpr auto make_key_block() {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    using T = typename QT::value_type;
    constexpr std::size_t per = key_rows_per_block<QT, KT, VT, RowsPerBlock>;
    constexpr std::size_t RB = block_rows(KT::rows, per, B);
    const T scale = rules_of<T, KT::cols>(Opt).scale;
    const auto& m = backward_matrices<Q, K, V, Fwd, DOut, Opt, RowsPerBlock>;
    key_rows<T, RB, KT::cols, VT::cols> out{};
    for (std::size_t r = 0; r < RB; ++r)
        qkv::detail::key_gradient_row(B * per + r, scale, m.d_raw.elems, m.kept.elems, Q.elems, DOut.elems,
                                      out.dk.elems[r], out.dv.elems[r]);
    return out;
}

/// Key rows [B·h, B·h + h) of dk and dv, h = key_rows_per_block.
template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t B>
inline constexpr auto key_block = make_key_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>();

template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock, std::size_t... B, std::size_t... C>
constexpr auto assemble_backward(std::index_sequence<B...>, std::index_sequence<C...>) {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    using T = typename QT::value_type;
    constexpr std::size_t per = backward_rows_per_block<QT, KT, VT, Opt, RowsPerBlock>;
    constexpr std::size_t per_key = key_rows_per_block<QT, KT, VT, RowsPerBlock>;
    sdpa_backward_result<T, QT::rows, KT::rows, QT::cols, VT::cols> g{};
    (copy_block(g.dq, B * per, backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>.dq), ...);
    (copy_block(g.d_scores, B * per, backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>.d_scores), ...);
    (copy_block(g.dk, C * per_key, key_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, C>.dk), ...);
    (copy_block(g.dv, C * per_key, key_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, C>.dv), ...);
    if constexpr (has_sinks<Opt>()) {
        T terms[QT::rows]{};
        (copy_entries(terms, B * per, backward_block<Q, K, V, Fwd, DOut, Opt, RowsPerBlock, B>.sink_terms.elems[0]),
         ...);
        g.d_sinks.elems[0][0] = qkv::detail::sum_in_order(terms);
    }
    return g;
}

/// qkv::staged::sdpa_backward with a chosen number of rows per block, for the query and the key
/// blocks alike (0: from the budgets), for tests.
template <const auto& Q, const auto& K, const auto& V, const auto& Fwd, const auto& DOut, const auto& Opt,
          std::size_t RowsPerBlock>
inline constexpr auto sdpa_backward_blocked = assemble_backward<Q, K, V, Fwd, DOut, Opt, RowsPerBlock>(
    std::make_index_sequence<backward_blocks<type_of<Q>, type_of<K>, type_of<V>, Opt, RowsPerBlock>>{},
    std::make_index_sequence<block_count(type_of<K>::rows,
                                         key_rows_per_block<type_of<Q>, type_of<K>, type_of<V>, RowsPerBlock>)>{});

}  // namespace detail

/// Forward is the sdpa_result of Q, K, V, and DOut a matrix of the output's shape.
template <class Fwd, class DOut, class Q, class K, class V>
concept backward_inputs_for = std::is_same_v<Fwd, sdpa_result<typename Q::value_type, Q::rows, K::rows, V::cols>> &&
    std::is_same_v<DOut, matrix<typename Q::value_type, Q::rows, V::cols>>;

/// The gradients of scaled dot-product attention of given Q (L x E), K (S x E), V (S x Ev) for the
/// loss gradient DOut (L x Ev), from the forward result Forward (its output and lse): the same
/// qkv::sdpa_backward_result as qkv::sdpa_backward(q, k, v, forward, d_out, options), bit for bit,
/// computed as many small constant evaluations (blocks of query rows, then of key rows). Every
/// argument a constexpr object with static storage duration (Forward, e.g.,
/// qkv::staged::scaled_dot_product_attention<q, k, v, options>); Options: a constexpr
/// qkv::sdpa_options_for<Q, K>, or staged::default_options.
template <const auto& Q, const auto& K, const auto& V, const auto& Forward, const auto& DOut,
          const auto& Options = default_options>
requires sdpa_operands<detail::type_of<Q>, detail::type_of<K>, detail::type_of<V>> &&
    query_key_widths_match<detail::type_of<Q>, detail::type_of<K>> &&
    key_value_lengths_match<detail::type_of<K>, detail::type_of<V>> &&
    sdpa_options_for_qk<detail::type_of<Options>, detail::type_of<Q>, detail::type_of<K>> &&
    backward_inputs_for<detail::type_of<Forward>, detail::type_of<DOut>, detail::type_of<Q>, detail::type_of<K>,
                        detail::type_of<V>>
inline constexpr auto sdpa_backward = detail::sdpa_backward_blocked<Q, K, V, Forward, DOut, Options, 0>;

}  // namespace qkv::staged
