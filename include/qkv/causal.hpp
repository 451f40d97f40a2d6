// qkv::causal_mode: which causal mask, if any, one enum for the constexpr core (qkv/sdpa.hpp) and
// the run-time API (qkv/runtime/sdpa.hpp, where it is also spelled qkv::causal_alignment).
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

}  // namespace qkv
