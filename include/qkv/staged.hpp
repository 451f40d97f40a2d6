// Staged compile-time attention: the same attention_result as qkv::self_attention, bit for bit,
// computed as many small constant evaluations instead of one large one.
//
//   constexpr auto x  = ...;   // namespace-scope constexpr matrices (static storage: they are
//   constexpr auto wq = ...;   // passed by reference, as template arguments)
//   constexpr auto r  = qkv::staged::self_attention<x, wq, wk, wv>;
//
//   constexpr qkv::attention_options_for<decltype(x), decltype(wk), decltype(wv)> opt{.causal = true};
//   constexpr auto rc = qkv::staged::self_attention<x, wq, wk, wv, opt>;
//
// Why: GCC and Clang cap the work of ONE constant evaluation (each constexpr variable's
// initialiser, each static_assert condition), not of a translation unit. qkv::self_attention is
// one evaluation, so its size is capped (about N = 80 at d = 64 under the default limits, see
// docs/constexpr-limits.md). Here every block of rows of every step is a variable template
// specialisation of its own (in namespace detail), initialised by its own evaluation, and the
// next step reads the finished blocks by reference:
//
//   projection_block<X, W, Opt, which, rows, b>  rows of X·W (+ bias)    one evaluation per block
//   projection<X, W, Opt, which, rows>           the blocks side by side (copies)
//   attend_block<Q, K, V, Opt, rows, b>          query rows of scores, weights and output,
//                                                from the whole Q, K and V
//   self_attention<...>                          the blocks assembled into an attention_result
//
// Block heights keep each evaluation within `detail::block_budget` multiply-adds and (attention)
// `detail::entry_budget` score entries (half as many with a softcap): far under GCC's and
// Clang's default limits, and under 100,000 Clang steps. The row kernels are the ones
// qkv::self_attention runs (qkv::detail::dot, matmul_row, and the row kernel of
// qkv::scaled_dot_product_attention in sdpa.hpp, attend_row, under the same head_rules) on the
// same rows in the same order, so the results are identical, not just close.
//
// attend_block takes Q, K and V themselves (any static constexpr matrices, L queries and S keys),
// so scaled dot-product attention of given Q, K, V is the same chain without the projections:
//
//   constexpr qkv::sdpa_options_for<decltype(q), decltype(k)> o{.causal = qkv::causal_mode::bottom_right};
//   constexpr auto s = qkv::staged::scaled_dot_product_attention<q, k, v, o>;
//   // s == qkv::scaled_dot_product_attention(q, k, v, o), bit for bit
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

#include "qkv/attention.hpp"
#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/sdpa.hpp"
#include "qkv/softmax.hpp"

namespace qkv::staged {

/// The options argument that means "qkv::self_attention's defaults": scale 1/sqrt(d_k), no mask,
/// no causality, no biases. `self_attention<x, wq, wk, wv>` uses it.
struct default_options_t {
    friend constexpr bool operator==(default_options_t, default_options_t) = default;
};
inline constexpr default_options_t default_options{};

/// Opt is an options object for X, WK, WV: qkv::attention_options_for<X, WK, WV>, or
/// staged::default_options.
template <class Opt, class X, class WK, class WV>
concept options_for = std::is_same_v<std::remove_cvref_t<Opt>, default_options_t> ||
    std::is_same_v<std::remove_cvref_t<Opt>, attention_options_for<X, WK, WV>>;

namespace detail {

/// The type of a reference template argument's object.
template <const auto& M>
using type_of = std::remove_cvref_t<decltype(M)>;

/// Multiply-adds one stage evaluation may do. GCC 12 spends about 10-20 of its default 2^25
/// operations per multiply-add in the fold kernels (Clang 14 a few of its 2^20 steps per dot
/// product, whatever its length); 2^19 keeps every evaluation under a third of GCC's default.
inline constexpr std::size_t block_budget = std::size_t{1} << 19;

/// `fit` rows per block, at least 1 and at most `rows`.
constexpr std::size_t clamp_rows(std::size_t fit, std::size_t rows) { return fit == 0 ? 1 : (fit > rows ? rows : fit); }

/// Rows per block when one row costs `row_cost` multiply-adds.
constexpr std::size_t rows_per_block(std::size_t row_cost, std::size_t rows) {
    return clamp_rows(block_budget / (row_cost == 0 ? 1 : row_cost), rows);
}

constexpr std::size_t block_count(std::size_t rows, std::size_t per_block) {
    return (rows + per_block - 1) / per_block;
}

/// Rows in block b of `rows` rows cut into blocks of `per_block` (the last may be shorter).
constexpr std::size_t block_rows(std::size_t rows, std::size_t per_block, std::size_t b) {
    return rows - b * per_block < per_block ? rows - b * per_block : per_block;
}

/// Copy the `C` entries of one row (a fold: one expression per row, not one per entry).
template <class T, std::size_t C, std::size_t... K>
constexpr void copy_row(T (&dst)[C], const T (&src)[C], std::index_sequence<K...>) {
    ((dst[K] = src[K]), ...);
}

/// Copy all rows of `block` into `dst` from row `first` on.
template <class T, std::size_t R, std::size_t C, std::size_t RB>
constexpr void copy_block(matrix<T, R, C>& dst, std::size_t first, const matrix<T, RB, C>& block) {
    for (std::size_t r = 0; r < RB; ++r) copy_row(dst.elems[first + r], block.elems[r], std::make_index_sequence<C>{});
}

/// Copy the `C` entries of `src` into `dst` from entry `first` on.
template <class T, std::size_t N, std::size_t C>
constexpr void copy_entries(T (&dst)[N], std::size_t first, const T (&src)[C]) {
    for (std::size_t c = 0; c < C; ++c) dst[first + c] = src[c];
}

// ---- Options ------------------------------------------------------------------------------------

inline constexpr int which_q = 0, which_k = 1, which_v = 2;

template <class Opt>
inline constexpr bool is_default = std::is_same_v<std::remove_cvref_t<Opt>, default_options_t>;

/// The bias (a std::optional row vector) of projection `Which` (q, k or v) of opt.
template <int Which, class Opt>
constexpr const auto& bias_of(const Opt& opt) {
    if constexpr (Which == which_q)
        return opt.bias_q;
    else if constexpr (Which == which_k)
        return opt.bias_k;
    else
        return opt.bias_v;
}

/// Add the bias of projection `Which`, if opt has one, to a row of the projection (as
/// qkv::add_row does: entry + bias).
template <int Which, class T, std::size_t C, class Opt>
constexpr void add_bias(const Opt& opt, T (&row)[C]) {
    if constexpr (!is_default<Opt>) {
        const auto& bias = bias_of<Which>(opt);
        if (bias)
            for (std::size_t c = 0; c < C; ++c) row[c] = row[c] + bias->elems[0][c];
    }
}

/// The scale of Q·Kᵀ: Opt's, or 1/sqrt(d_k) (computed as qkv::self_attention computes it).
template <class T, std::size_t DK, class Opt>
constexpr T scale_of(const Opt& opt) {
    if constexpr (!is_default<Opt>) {
        if (opt.scale) return *opt.scale;
    }
    return T{1} / qkv::sqrt(static_cast<T>(DK));
}

template <class Opt>
inline constexpr bool is_sdpa = is_sdpa_options<std::remove_cvref_t<Opt>>::value;

/// The causal mode of Opt: an sdpa_options' own, top-left for attention_options' `causal`.
template <class Opt>
constexpr causal_mode causal_of(const Opt& opt) {
    if constexpr (is_default<Opt>)
        return causal_mode::none;
    else if constexpr (is_sdpa<Opt>)
        return opt.causal;
    else
        return opt.causal ? causal_mode::top_left : causal_mode::none;
}

/// An empty optional matrix, for options that have no such mask.
template <class T, std::size_t R, std::size_t C>
inline constexpr std::optional<matrix<T, R, C>> no_matrix{};

/// Opt's bool mask over NQ queries and NK keys (empty for the default options).
template <std::size_t NQ, std::size_t NK, class Opt>
constexpr const std::optional<matrix<bool, NQ, NK>>& mask_of(const Opt& opt) {
    if constexpr (is_default<Opt>)
        return no_matrix<bool, NQ, NK>;
    else
        return opt.mask;
}

/// Opt's additive mask (an sdpa_options' own; empty for the others).
template <class T, std::size_t NQ, std::size_t NK, class Opt>
constexpr const std::optional<matrix<T, NQ, NK>>& additive_of(const Opt& opt) {
    if constexpr (is_sdpa<Opt>)
        return opt.additive_mask;
    else
        return no_matrix<T, NQ, NK>;
}

/// The head rules of Opt, as qkv::scaled_dot_product_attention and qkv::self_attention resolve
/// them: an sdpa_options' (checked: an option out of range stops the evaluation), or the scale
/// and causal mode of the others.
template <class T, std::size_t DK, class Opt>
constexpr qkv::detail::head_rules<T> rules_of(const Opt& opt) {
    if constexpr (is_sdpa<Opt>) {
        qkv::detail::check_options(opt);
        return qkv::detail::head_rules_of<1>(opt, 0, scale_of<T, DK>(opt));
    } else {
        return qkv::detail::plain_rules(scale_of<T, DK>(opt), causal_of(opt));
    }
}

// ---- Projections: X·W (+ bias), by blocks of rows ------------------------------------------------

/// Rows per projection block (RowsPerBlock overrides the budget; 0 = from the budget). One row
/// costs d_in·d multiply-adds.
template <class X, class W, std::size_t RowsPerBlock>
inline constexpr std::size_t projection_rows = RowsPerBlock != 0 ? clamp_rows(RowsPerBlock, X::rows)
                                                                 : rows_per_block(X::cols* W::cols, X::rows);

template <const auto& X, const auto& W, const auto& Opt, int Which, std::size_t RowsPerBlock, std::size_t B>
constexpr auto make_projection_block() {
    using XT = type_of<X>;
    using WT = type_of<W>;
    using T = typename XT::value_type;
    constexpr std::size_t per = projection_rows<XT, WT, RowsPerBlock>;
    constexpr std::size_t RB = block_rows(XT::rows, per, B);
    matrix<T, RB, WT::cols> out{};
    for (std::size_t r = 0; r < RB; ++r) {
        qkv::detail::matmul_row(X.elems[B * per + r], W.elems, out.elems[r]);
        add_bias<Which>(Opt, out.elems[r]);
    }
    return out;
}

/// Rows [B·h, B·h + h) of X·W (+ the bias of projection Which), h = projection_rows.
template <const auto& X, const auto& W, const auto& Opt, int Which, std::size_t RowsPerBlock, std::size_t B>
inline constexpr auto projection_block = make_projection_block<X, W, Opt, Which, RowsPerBlock, B>();

template <const auto& X, const auto& W, const auto& Opt, int Which, std::size_t RowsPerBlock, std::size_t... B>
constexpr auto make_projection(std::index_sequence<B...>) {
    using XT = type_of<X>;
    using WT = type_of<W>;
    constexpr std::size_t per = projection_rows<XT, WT, RowsPerBlock>;
    matrix<typename XT::value_type, XT::rows, WT::cols> out{};
    (copy_block(out, B * per, projection_block<X, W, Opt, Which, RowsPerBlock, B>), ...);
    return out;
}

/// X·W (+ the bias of projection Which), assembled from its blocks.
template <const auto& X, const auto& W, const auto& Opt, int Which, std::size_t RowsPerBlock>
inline constexpr auto projection = make_projection<X, W, Opt, Which, RowsPerBlock>(
    std::make_index_sequence<block_count(type_of<X>::rows, projection_rows<type_of<X>, type_of<W>, RowsPerBlock>)>{});

// ---- Attention of Q, K, V: by blocks of query rows ------------------------------------------------

/// Rows of one block of query positions: scores (before masking), weights, output and lse.
template <class T, std::size_t RB, std::size_t NK, std::size_t DV>
struct attend_rows {
    matrix<T, RB, NK> scores;
    matrix<T, RB, NK> weights;
    matrix<T, RB, DV> output;
    row_vector<T, RB> lse;
};

/// Score entries (each an exp call and the softmax bookkeeping) one attention evaluation may
/// compute. Clang 14 spends about 35 steps per entry; 1536 entries stay near 55,000 steps, so an
/// evaluation also fits MSVC's default /constexpr:steps (100,000) if MSVC counts like Clang.
inline constexpr std::size_t entry_budget = 1536;

/// Score entries one attention evaluation under Opt may compute: entry_budget, halved with a
/// softcap, whose tanh per entry costs Clang 14 about as many steps again as the rest of the entry
/// (with every option of sdpa.hpp on, a block of entry_budget / 2 entries stays near 55,000 steps).
template <class Opt>
constexpr std::size_t entries_for(const Opt& opt) {
    if constexpr (is_sdpa<Opt>) {
        if (opt.softcap != 0) return entry_budget / 2;
    }
    return entry_budget;
}

/// Query rows per attention block: one row costs NK·(d_k + d_v) multiply-adds and NK score
/// entries, and a block stays within both budgets.
constexpr std::size_t attend_block_rows(std::size_t nq, std::size_t nk, std::size_t dk, std::size_t dv,
                                        std::size_t entries) {
    const std::size_t by_macs = block_budget / (nk * (dk + dv)), by_entries = entries / nk;
    return clamp_rows(by_macs < by_entries ? by_macs : by_entries, nq);
}

/// Query rows per attention block under Opt (RowsPerBlock overrides the budgets; 0 = from the
/// budgets).
template <class Q, class K, class V, const auto& Opt, std::size_t RowsPerBlock>
inline constexpr std::size_t attend_rows_per_block = RowsPerBlock != 0 ? clamp_rows(RowsPerBlock, Q::rows)
                                                                       : attend_block_rows(Q::rows, K::rows, K::cols,
                                                                                           V::cols, entries_for(Opt));

template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock, std::size_t B>
constexpr auto make_attend_block() {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    using T = typename QT::value_type;
    constexpr std::size_t per = attend_rows_per_block<QT, KT, VT, Opt, RowsPerBlock>;
    constexpr std::size_t RB = block_rows(QT::rows, per, B);
    constexpr std::size_t NK = KT::rows;
    const qkv::detail::head_rules<T> rules = rules_of<T, KT::cols>(Opt);
    attend_rows<T, RB, NK, VT::cols> out{};
    for (std::size_t r = 0; r < RB; ++r) {
        const std::size_t i = B * per + r;
        out.lse.elems[0][r] = qkv::detail::attend_row(rules, i, Q.elems[i], K.elems, V.elems,
                                                      mask_of<QT::rows, NK>(Opt), additive_of<T, QT::rows, NK>(Opt),
                                                      out.scores.elems[r], out.weights.elems[r], out.output.elems[r]);
    }
    return out;
}

/// Query rows [B·h, B·h + h) of scaled dot-product attention of Q, K, V under Opt's scale, masks,
/// causal mode and (sdpa options) softcap, ALiBi, window and sink (an attention_options' biases
/// are not used here), h = attend_rows_per_block.
template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock, std::size_t B>
inline constexpr auto attend_block = make_attend_block<Q, K, V, Opt, RowsPerBlock, B>();

// ---- Self-attention ---------------------------------------------------------------------------------

/// The three projections and the attention blocks, assembled into an attention_result.
template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock, std::size_t... B>
constexpr auto assemble_attention(std::index_sequence<B...>) {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    constexpr std::size_t per = attend_rows_per_block<QT, KT, VT, Opt, RowsPerBlock>;
    attention_result<typename QT::value_type, QT::rows, QT::cols, VT::cols> r{Q, K, V, {}, {}, {}};
    (copy_block(r.scores, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.scores), ...);
    (copy_block(r.weights, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.weights), ...);
    (copy_block(r.output, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.output), ...);
    return r;
}

template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock>
constexpr auto make_attention() {
    constexpr std::size_t per = attend_rows_per_block<type_of<Q>, type_of<K>, type_of<V>, Opt, RowsPerBlock>;
    return assemble_attention<Q, K, V, Opt, RowsPerBlock>(
        std::make_index_sequence<block_count(type_of<Q>::rows, per)>{});
}

// ---- Scaled dot-product attention of given Q, K, V ----------------------------------------------

template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock, std::size_t... B>
constexpr auto assemble_sdpa(std::index_sequence<B...>) {
    using QT = type_of<Q>;
    using KT = type_of<K>;
    using VT = type_of<V>;
    constexpr std::size_t per = attend_rows_per_block<QT, KT, VT, Opt, RowsPerBlock>;
    sdpa_result<typename QT::value_type, QT::rows, KT::rows, VT::cols> r{};
    (copy_block(r.scores, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.scores), ...);
    (copy_block(r.weights, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.weights), ...);
    (copy_block(r.output, B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.output), ...);
    (copy_entries(r.lse.elems[0], B * per, attend_block<Q, K, V, Opt, RowsPerBlock, B>.lse.elems[0]), ...);
    return r;
}

/// qkv::staged::scaled_dot_product_attention with a chosen number of query rows per block (0:
/// from the budgets), for tests.
template <const auto& Q, const auto& K, const auto& V, const auto& Opt, std::size_t RowsPerBlock>
inline constexpr auto sdpa_blocked = assemble_sdpa<Q, K, V, Opt, RowsPerBlock>(
    std::make_index_sequence<
        block_count(type_of<Q>::rows, attend_rows_per_block<type_of<Q>, type_of<K>, type_of<V>, Opt, RowsPerBlock>)>{});

/// qkv::staged::self_attention with a chosen number of rows per block, for the projections and
/// the attention alike (0: from the budget). For tests, which cut small problems into several
/// uneven blocks.
template <const auto& X, const auto& WQ, const auto& WK, const auto& WV, const auto& Opt, std::size_t RowsPerBlock>
inline constexpr auto self_attention_blocked =
    make_attention<projection<X, WQ, Opt, which_q, RowsPerBlock>, projection<X, WK, Opt, which_k, RowsPerBlock>,
                   projection<X, WV, Opt, which_v, RowsPerBlock>, Opt, RowsPerBlock>();

}  // namespace detail

/// Scaled dot-product self-attention of x with projections wq, wk, wv: the same
/// qkv::attention_result as qkv::self_attention(x, wq, wk, wv, options), bit for bit, computed as
/// many small constant evaluations so that it fits under the compilers' default limits at sizes
/// one evaluation cannot reach (N = 256, d = 64 and beyond).
/// X, WQ, WK, WV: constexpr qkv::matrix objects with static storage duration (namespace scope, or
/// static constexpr members), passed by reference. Shapes as qkv::self_attention: x N x d_in, wq
/// and wk d_in x d_k, wv d_in x d_v. Options: a constexpr qkv::attention_options_for<X, WK, WV>
/// object with static storage duration, or staged::default_options.
template <const auto& X, const auto& WQ, const auto& WK, const auto& WV, const auto& Options = default_options>
requires projects<detail::type_of<X>, detail::type_of<WQ>> && projects<detail::type_of<X>, detail::type_of<WK>> &&
    projects<detail::type_of<X>, detail::type_of<WV>> &&
    query_key_widths_match<detail::type_of<WQ>, detail::type_of<WK>> &&
    options_for<detail::type_of<Options>, detail::type_of<X>, detail::type_of<WK>, detail::type_of<WV>>
inline constexpr auto self_attention = detail::self_attention_blocked<X, WQ, WK, WV, Options, 0>;

/// Opt is an options object for queries Q and keys K: qkv::sdpa_options_for<Q, K>, or
/// staged::default_options.
template <class Opt, class Q, class K>
concept sdpa_options_for_qk = std::is_same_v<std::remove_cvref_t<Opt>, default_options_t> ||
    std::is_same_v<std::remove_cvref_t<Opt>, sdpa_options_for<Q, K>>;

/// Scaled dot-product attention of given Q (L x E), K (S x E), V (S x Ev): the same
/// qkv::sdpa_result as qkv::scaled_dot_product_attention(q, k, v, options), bit for bit, computed
/// as many small constant evaluations (blocks of query rows), so L and S can be far larger than
/// one evaluation allows. Q, K, V: constexpr qkv::matrix objects with static storage duration;
/// Options: a constexpr qkv::sdpa_options_for<Q, K> with static storage duration, or
/// staged::default_options.
template <const auto& Q, const auto& K, const auto& V, const auto& Options = default_options>
requires sdpa_operands<detail::type_of<Q>, detail::type_of<K>, detail::type_of<V>> &&
    query_key_widths_match<detail::type_of<Q>, detail::type_of<K>> &&
    key_value_lengths_match<detail::type_of<K>, detail::type_of<V>> &&
    sdpa_options_for_qk<detail::type_of<Options>, detail::type_of<Q>, detail::type_of<K>>
inline constexpr auto scaled_dot_product_attention = detail::sdpa_blocked<Q, K, V, Options, 0>;

}  // namespace qkv::staged
