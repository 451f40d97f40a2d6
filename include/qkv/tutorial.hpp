// The worked example of the self-attention tutorial that started qkv (see the top of the README):
// three inputs of width 4, key/query/value weights of 4x3. Used by `qkv example`, the tests and
// the README. Everything here is a constant expression.
#pragma once

#include "qkv/attention.hpp"
#include "qkv/matrix.hpp"

namespace qkv::tutorial {

inline constexpr auto inputs = matrix_of<float>({{1, 0, 1, 0},    // Input 1
                                                 {0, 2, 0, 2},    // Input 2
                                                 {1, 1, 1, 1}});  // Input 3

inline constexpr auto w_key = matrix_of<float>({{0, 0, 1}, {1, 1, 0}, {0, 1, 0}, {1, 1, 0}});
inline constexpr auto w_query = matrix_of<float>({{1, 0, 1}, {1, 0, 0}, {0, 0, 1}, {0, 1, 1}});
inline constexpr auto w_value = matrix_of<float>({{0, 2, 0}, {0, 3, 0}, {1, 0, 3}, {1, 1, 0}});

/// The tutorial's plain dot-product attention (scale 1).
inline constexpr auto plain = self_attention(inputs, w_query, w_key, w_value, {.scale = 1.f});

/// "Attention Is All You Need" scaling, 1/sqrt(d_k) = 1/sqrt(3).
inline constexpr auto scaled = self_attention(inputs, w_query, w_key, w_value);

}  // namespace qkv::tutorial
