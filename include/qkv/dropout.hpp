// Attention dropout: which weights a call drops, defined once for every qkv path (the constexpr
// core, the float64 CPU reference and, in GLSL, the Vulkan kernels through
// shaders/contract/philox.h), so the same (seed, offset) gives the same mask everywhere, and the
// backward pass drops exactly what the forward pass dropped.
//
// With probability p (PyTorch's dropout_p, 0 <= p < 1), each attention weight w_ij of query row i
// and key j is kept with probability 1 - p and then scaled by 1 / (1 - p), or dropped (0):
//   out_i = Σ_j z_ij · w_ij / (1 - p) · v_j,   z_ij ∈ {0, 1}
// The softmax itself is not changed: the log-sum-exp and the sinks see every allowed key, and a
// row's weights (returned on request) are the probabilities before dropout, each dropped one with
// its sign flipped (FlashAttention's return_attn_probs encoding: w_ij >= 0 kept, the sign bit set
// dropped; a dropped weight of 0 is -0).
//
// z_ij comes from Philox4x32-10 (qkv/philox.hpp), keyed by the 64-bit seed, with
//   row     r = (b · Hq + h) · L + i            (batch b, query head h, query i: the row's index in
//                                              the (B, Hq, L) layout of the output)
//   counter (lo(c), hi(c), lo(r), hi(r)),  c = offset + ⌊j / 4⌋ (mod 2^64)
//   key     (lo(seed), hi(seed))
//   x_ij    word j mod 4 of philox4x32(counter, key)
//   z_ij    1 when x_ij >= ⌈p · 2^32⌉ (x_ij / 2^32 >= p), else 0
// This is the layout of cuRAND's and FlashAttention's philox(seed, subsequence, offset): the
// counter's words 0-1 hold the offset, words 2-3 the subsequence (here the row). Calls with one
// seed draw disjoint counters when their offsets differ by at least ⌈S / 4⌉, the counters one row
// uses. The mask does not depend on the data, on the masks or on which keys a row may attend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qkv/philox.hpp"

namespace qkv {

/// Keys of one row that share one Philox counter (its four words).
inline constexpr std::uint64_t dropout_keys_per_counter = 4;

/// The threshold of the keep rule for dropout probability p (0 <= p < 1): ⌈p · 2^32⌉, at most
/// 2^32 (then nothing is kept: p within 2^-32 of 1). A float p gives at most 2^32 - 256, which fits
/// 32 bits. p · 2^32 is exact in double, so the rule is exact for float and double p.
[[nodiscard]] constexpr std::uint64_t dropout_threshold(double p) noexcept {
    const double x = p * 4294967296.0;  // exact: a power-of-two scaling
    if (!(x > 0.0)) return 0;           // p = 0 (or a refused negative / NaN p): keep everything
    if (x >= 4294967296.0) return std::uint64_t{1} << 32;
    const auto t = static_cast<std::uint64_t>(x);  // floor
    return static_cast<double>(t) < x ? t + 1 : t;
}

/// The Philox counter of key j's draw in row r (the layout above).
[[nodiscard]] constexpr philox_block dropout_counter(std::uint64_t offset, std::uint64_t row,
                                                     std::uint64_t j) noexcept {
    const std::uint64_t c = offset + j / dropout_keys_per_counter;
    return {static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32), static_cast<std::uint32_t>(row),
            static_cast<std::uint32_t>(row >> 32)};
}

/// The Philox key of a seed.
[[nodiscard]] constexpr philox_key dropout_key(std::uint64_t seed) noexcept {
    return {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
}

/// The row index r = (b · Hq + h) · L + i of query i of query head h of batch element b.
[[nodiscard]] constexpr std::uint64_t dropout_row(std::uint64_t b, std::uint64_t h, std::uint64_t i,
                                                  std::uint64_t q_heads, std::uint64_t q_len) noexcept {
    return (b * q_heads + h) * q_len + i;
}

/// One dropout stream: the seed, offset and threshold of a call. keeps(r, j) is z_rj.
struct dropout_stream {
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;
    std::uint64_t threshold = 0;  ///< dropout_threshold(p); 0 keeps everything

    /// x_rj, the 32-bit draw of key j in row r.
    [[nodiscard]] constexpr std::uint32_t draw(std::uint64_t row, std::uint64_t j) const noexcept {
        return philox4x32(dropout_counter(offset, row, j), dropout_key(seed))[j % dropout_keys_per_counter];
    }
    /// Whether key j of row r is kept.
    [[nodiscard]] constexpr bool keeps(std::uint64_t row, std::uint64_t j) const noexcept {
        return draw(row, j) >= threshold;
    }
    /// keep(j, kept) for every key j in [first, end) of row r, in order, one Philox evaluation per
    /// counter (four keys).
    template <class F>
    constexpr void for_each_key(std::uint64_t row, std::uint64_t first, std::uint64_t end, F&& keep) const {
        std::uint64_t j = first;
        while (j < end) {
            const philox_block x = philox4x32(dropout_counter(offset, row, j), dropout_key(seed));
            const std::uint64_t stop = (j / dropout_keys_per_counter + 1) * dropout_keys_per_counter;
            for (; j < end && j < stop; ++j) keep(j, x[j % dropout_keys_per_counter] >= threshold);
        }
    }
};

}  // namespace qkv
