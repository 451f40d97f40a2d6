// Row-wise, numerically stable softmax with an optional "may attend" mask.
//
// Policy (shared by every qkv backend):
//  * each row's maximum over the allowed entries is subtracted before exponentiation, so large
//    scores never overflow;
//  * masked entries get weight exactly 0;
//  * a row with no allowed entry (fully masked) gets all-zero weights, so its attention output is
//    zero (PyTorch returns NaN there; a zero row is the safer value to feed onwards);
//  * a NaN among a row's allowed scores makes that whole row NaN, as in PyTorch.
// The row kernel also returns the row's log-sum-exp and takes an optional attention sink (an
// extra logit in the denominator), for scaled_dot_product_attention (sdpa.hpp).
#pragma once

#include <cstddef>
#include <limits>
#include <optional>

#include "qkv/math.hpp"
#include "qkv/matrix.hpp"

namespace qkv {

namespace detail {

/// Softmax of one row over the entries where `allowed` is true (the policy above), into `out`;
/// returns the row's log-sum-exp log Σ e^(s_j) over the allowed entries (-inf for a row with none,
/// NaN for a NaN row). An attention sink σ (optional) joins the denominator and nothing else:
/// out_j = e^(s_j - m) / (Σ e^(s_j - m) + e^(σ - m)) with m = max(max_j s_j, σ), so the weights
/// sum to less than 1; the log-sum-exp does not include it. Without a sink every step is the
/// plain softmax's.
template <class T, std::size_t C>
requires std::is_floating_point_v<T>
constexpr T masked_softmax_row(const T (&scores)[C], const bool (&allowed)[C], T (&out)[C],
                               const std::optional<T>& sink = std::nullopt) {
    bool any = false;
    bool has_nan = false;
    T max{};
    for (std::size_t c = 0; c < C; ++c) {
        if (!allowed[c]) continue;
        const T s = scores[c];
        if (qkv::isnan(s)) has_nan = true;
        if (!any || s > max) max = s;
        any = true;
    }
    if (!any) {  // fully masked row: zeros (see the policy above)
        for (std::size_t c = 0; c < C; ++c) out[c] = T{};
        return -std::numeric_limits<T>::infinity();
    }
    if (has_nan) {
        for (std::size_t c = 0; c < C; ++c) out[c] = std::numeric_limits<T>::quiet_NaN();
        return std::numeric_limits<T>::quiet_NaN();
    }
    const T m = sink && *sink > max ? *sink : max;
    T sum{};
    for (std::size_t c = 0; c < C; ++c) {
        const T e = allowed[c] ? qkv::exp(scores[c] - m) : T{};
        out[c] = e;
        sum += e;
    }
    const T denominator = sink ? sum + qkv::exp(*sink - m) : sum;
    for (std::size_t c = 0; c < C; ++c) out[c] /= denominator;
    if (m == max) return max + qkv::log(sum);  // sum >= 1: the maximum's own term is 1
    // The sink is above every score: sum again relative to the scores' own maximum, so that the
    // log-sum-exp does not underflow.
    T keys{};
    for (std::size_t c = 0; c < C; ++c)
        if (allowed[c]) keys += qkv::exp(scores[c] - max);
    return max + qkv::log(keys);
}

}  // namespace detail

/// Softmax of each row of `scores` over the entries where `allowed` is true.
template <class T, std::size_t R, std::size_t C>
requires std::is_floating_point_v<T>
constexpr matrix<T, R, C> masked_softmax_rows(const matrix<T, R, C>& scores, const matrix<bool, R, C>& allowed) {
    matrix<T, R, C> out{};
    for (std::size_t r = 0; r < R; ++r) detail::masked_softmax_row(scores.elems[r], allowed.elems[r], out.elems[r]);
    return out;
}

/// Softmax of each row, every entry allowed.
template <class T, std::size_t R, std::size_t C>
requires std::is_floating_point_v<T>
constexpr matrix<T, R, C> softmax_rows(const matrix<T, R, C>& scores) {
    return masked_softmax_rows(scores, filled<bool, R, C>(true));
}

}  // namespace qkv
