// qkv::causal_mode: which causal mask, if any, for the constexpr core (qkv/sdpa.hpp); and
// qkv::position_alignment: where query i sits among the keys, for the causal rule, the window and
// ALiBi's distances (the core's `alignment`, the run-time API's qkv::causal_alignment).
//
// With L queries and S keys, query i may attend key j when
//   top_left:      j <= i          (PyTorch's is_causal=True, tril(ones(L, S)))
//   bottom_right:  j <= i + S - L  (tril(ones(L, S), S - L), the KV-cache convention: the last
//                                   query sees every key)
#pragma once

namespace qkv {

/// Which causal mask, if any: see the header comment.
enum class causal_mode {
    none,          ///< no causal mask
    top_left,      ///< query i sees keys j <= i (PyTorch's is_causal=True)
    bottom_right,  ///< query i sees keys j <= i + S - L (the last query sees every key)
};

/// Where query i sits among the S keys: at key position i + off, off = 0 (top_left) or S - L
/// (bottom_right, the last query at the last key). Two values only: "no causal mask" is said
/// elsewhere (causal_mode::none, or the run-time API's `causal = false`). Its values are those of
/// causal_mode's alike-named members.
enum class position_alignment {
    top_left = static_cast<int>(causal_mode::top_left),          ///< off = 0
    bottom_right = static_cast<int>(causal_mode::bottom_right),  ///< off = S - L
};

}  // namespace qkv
