// Ragged batches for the tests: a packed problem over data it owns, and a float64 reference over
// the packed layout (FlashAttention's flash_attn_varlen_func: sequence b's keys are rows
// cu_seqlens_k[b] .. cu_seqlens_k[b + 1]), its attention that of support/ragged_reference.hpp, written
// without qkv's own code.
#pragma once

#include <qkv/runtime/varlen.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "support/ragged_reference.hpp"

namespace qkv_test {

/// A ragged batch over data it owns; `problem` views it (valid while this lives, moves included).
struct owned_varlen {
    std::vector<std::int32_t> cu_q, cu_k;
    std::vector<float> q, k, v, sinks, slopes;
    qkv::varlen_problem problem;
};

/// N(0, 1) q, k and v for sequences of query lengths `lq` and key lengths `lk`.
inline owned_varlen random_varlen(const std::vector<std::size_t>& lq, const std::vector<std::size_t>& lk,
                                  std::size_t q_heads, std::size_t kv_heads, std::size_t d_qk, std::size_t d_v,
                                  std::uint64_t seed) {
    owned_varlen o;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    o.cu_q = {0};
    o.cu_k = {0};
    std::size_t max_q = 0, max_k = 0;
    for (std::size_t b = 0; b < lq.size(); ++b) {
        o.cu_q.push_back(o.cu_q.back() + static_cast<std::int32_t>(lq[b]));
        o.cu_k.push_back(o.cu_k.back() + static_cast<std::int32_t>(lk[b]));
        max_q = std::max(max_q, lq[b]);
        max_k = std::max(max_k, lk[b]);
    }
    const auto fill = [&](std::vector<float>& x, std::size_t n) {
        x.resize(n);
        for (float& e : x) e = normal(rng);
    };
    fill(o.q, static_cast<std::size_t>(o.cu_q.back()) * q_heads * d_qk);
    fill(o.k, static_cast<std::size_t>(o.cu_k.back()) * kv_heads * d_qk);
    fill(o.v, static_cast<std::size_t>(o.cu_k.back()) * kv_heads * d_v);
    o.problem = {.q_heads = q_heads,
                 .kv_heads = kv_heads,
                 .d_qk = d_qk,
                 .d_v = d_v,
                 .cu_seqlens_q = o.cu_q,
                 .cu_seqlens_k = o.cu_k,
                 .max_seqlen_q = max_q,
                 .max_seqlen_k = max_k,
                 .q = o.q,
                 .k = o.k,
                 .v = o.v};
    return o;
}

using varlen_ref_result = ragged_ref_result;

/// `k` and `v` as the device stores them (already rounded by the caller, where it must be).
inline varlen_ref_result varlen_reference(const qkv::varlen_problem& p, const std::vector<float>& k,
                                          const std::vector<float>& v) {
    const std::size_t Hkv = p.kv_heads, E = p.d_qk, Ev = p.d_v, B = p.cu_seqlens_q.size() - 1;
    ragged_ref_batch batch{.q_heads = p.q_heads,
                           .kv_heads = Hkv,
                           .d_qk = E,
                           .d_v = Ev,
                           .q_first = {},
                           .kv_len = {},
                           .q = p.q,
                           .options = p.options,
                           .sinks = p.sinks,
                           .alibi_slopes = p.alibi_slopes};
    for (std::size_t b = 0; b <= B; ++b) batch.q_first.push_back(static_cast<std::size_t>(p.cu_seqlens_q[b]));
    for (std::size_t b = 0; b < B; ++b) batch.kv_len.push_back(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]);
    // Key j of sequence b is packed row cu_seqlens_k[b] + j.
    const auto row = [&](std::size_t b, std::int64_t j) { return static_cast<std::size_t>(p.cu_seqlens_k[b] + j); };
    return ragged_reference(
        batch,
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return static_cast<double>(k[(row(b, j) * Hkv + g) * E + e]);
        },
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return static_cast<double>(v[(row(b, j) * Hkv + g) * Ev + e]);
        });
}

inline varlen_ref_result varlen_reference(const owned_varlen& o) { return varlen_reference(o.problem, o.k, o.v); }

}  // namespace qkv_test
