// Positions as the attention kernels see them (contract/score.h, "Positions"): a call's offset off
// (|off| <= 2^62) and window sides (up to 2^63 - 1) reduced to 32-bit values that give every rule
// the same answer, a pure function of off and the sides alone (not of q_len or kv_len, so that a
// planned call against a growing cache writes its params once). It holds for q_len + kv_len <=
// SCORE_POSITION_LIMIT (2^30), which the plans require wherever a positional rule is used.
//
// Where |off| >= 2^30 every key lies on one side of every row: off >= 2^30 puts every row past
// the last key (the causal rule admits every key, a right side admits every key), off <= -2^30
// before the first (the causal rule admits none, a left side admits every key). The kernels then
// see off' = ±2^30 and the side that cuts, shifted by what off lost; ALiBi's distances to the
// row's nearest key shrink by the same amount for every row, which the kernels add back where
// it does not cancel (alibi_far: the lse and the sinks).
#pragma once

#include <cstdint>
#include <limits>

#include "contract/score.h"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::vulkan::detail {

struct score_positions {
    std::int32_t offset = 0;                           ///< off', in [-2^30, 2^30]
    std::int32_t window_left = -1, window_right = -1;  ///< -1, or in [0, 2^31 - 1]
    double alibi_far = 0;                              ///< |off - off'|, what ALiBi's distances lost
};

[[nodiscard]] constexpr score_positions reduce_positions(std::int64_t off, std::int64_t window_left,
                                                         std::int64_t window_right) {
    constexpr std::int64_t limit = contract::SCORE_POSITION_LIMIT;
    constexpr std::int64_t widest = std::numeric_limits<std::int32_t>::max();  // admits every key
    // A side as the kernels take it: -1 stays unbounded; below 0 after a shift it admits no key
    // (0 does the same, from a position beyond every key); a side past 2^31 - 1 admits every key
    // as 2^31 - 1 does (|p| + kv_len < 2^31).
    const auto side = [](std::int64_t v) { return static_cast<std::int32_t>(v < 0 ? 0 : v > widest ? widest : v); };
    // side - by, where side >= 0 and |by| <= 2^62 (saturated above: a side past widest stays so).
    const auto shifted = [&](std::int64_t original, std::int64_t by) {
        if (original < 0) return std::int32_t{-1};
        return side(by < 0 && original > widest ? widest : original - by);
    };
    score_positions r;
    std::int64_t shift = 0;  // off - off'
    if (off >= limit)
        shift = off - limit;
    else if (off <= -limit)
        shift = off + limit;
    r.offset = static_cast<std::int32_t>(off - shift);
    r.alibi_far = static_cast<double>(shift < 0 ? -shift : shift);
    // Key j is admitted when i + off - left <= j <= i + off + right, that is
    // i + off' - (left - shift) <= j <= i + off' + (right + shift).
    r.window_left = shifted(window_left, shift);
    r.window_right = shifted(window_right, -shift);
    return r;
}

/// The reduced positions of a problem: its causal_offset and window sides.
[[nodiscard]] constexpr score_positions positions_of(const sdpa_problem& problem) {
    const sdpa_options& o = problem.options;
    return reduce_positions(causal_offset(problem.shape, o), o.window_left, o.window_right);
}

}  // namespace qkv::vulkan::detail
