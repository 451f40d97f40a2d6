// What a ragged batch (varlen_problem) and a paged batch (paged_problem) check alike: every
// sequence's problem is an SDPA problem that differs from one query and one key by its lengths
// only. Internal to the library.
#pragma once

#include <vector>

#include "qkv/runtime/sdpa.hpp"

namespace qkv {

/// The head counts, the options, the sinks, the slopes and the storage's widths of a batch `p` of
/// element type T: validate() of the SDPA problem of one query and one key with them.
template <class T, class Batch>
void validate_per_sequence_rules(const Batch& p) {
    std::vector<T> q(p.q_heads * p.d_qk, T{1}), k(p.kv_heads * p.d_qk, T{1}), v(p.kv_heads * p.d_v, T{1});
    validate(basic_sdpa_problem<T>{.shape = {.batch = 1,
                                             .q_heads = p.q_heads,
                                             .kv_heads = p.kv_heads,
                                             .q_len = 1,
                                             .kv_len = 1,
                                             .d_qk = p.d_qk,
                                             .d_v = p.d_v},
                                   .q = q,
                                   .k = k,
                                   .v = v,
                                   .options = p.options,
                                   .sinks = p.sinks,
                                   .alibi_slopes = p.alibi_slopes});
}

}  // namespace qkv
