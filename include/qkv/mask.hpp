// Attention masks as matrix<bool, N, N>: true means "query row i may attend to key column j".
#pragma once

#include <cstddef>

#include "qkv/matrix.hpp"

namespace qkv {

/// Causal (autoregressive) mask: position i attends to j <= i.
template <std::size_t N>
constexpr matrix<bool, N, N> causal_mask() {
    matrix<bool, N, N> m{};
    for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) m.elems[i][j] = j <= i;
    return m;
}

/// Element-wise AND of two masks: an entry is allowed only when both allow it.
template <std::size_t R, std::size_t C>
constexpr matrix<bool, R, C> mask_and(const matrix<bool, R, C>& a, const matrix<bool, R, C>& b) {
    matrix<bool, R, C> m{};
    for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < C; ++j) m.elems[i][j] = a.elems[i][j] && b.elems[i][j];
    return m;
}

}  // namespace qkv
