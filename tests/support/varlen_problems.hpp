// Ragged batches for the tests: a packed problem over data it owns, and a float64 reference over
// the packed layout written from FlashAttention's flash_attn_varlen_func documentation and
// qkv/runtime/varlen.hpp's comment (each sequence's block on its own, the causal rule and the
// window aligned by that sequence's S_b - L_b, softcap, ALiBi by bias or by slopes, sinks, lse), as plainly as possible
// and without qkv's own code.
#pragma once

#include <qkv/runtime/varlen.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

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

/// The packed output (total_q, Hq, Ev) and lse (Hq, total_q) of a ragged batch, in float64.
struct varlen_ref_result {
    std::vector<double> output, lse;
};

/// `k` and `v` as the device stores them (already rounded by the caller, where it must be).
inline varlen_ref_result varlen_reference(const qkv::varlen_problem& p, const std::vector<float>& k,
                                          const std::vector<float>& v) {
    const std::size_t Hq = p.q_heads, Hkv = p.kv_heads, E = p.d_qk, Ev = p.d_v, B = p.cu_seqlens_q.size() - 1;
    const auto total_q = static_cast<std::size_t>(p.cu_seqlens_q[B]);
    const double scale = p.options.scale ? *p.options.scale : 1.0 / std::sqrt(static_cast<double>(E));
    const double neg_inf = -std::numeric_limits<double>::infinity();
    // ALiBi's slopes, from the formula in qkv/runtime/sdpa.hpp's comment.
    std::vector<double> slope(Hq, 0.0);
    if (!p.alibi_slopes.empty()) {
        for (std::size_t h = 0; h < Hq; ++h) slope[h] = static_cast<double>(p.alibi_slopes[h]);
    } else if (p.options.alibi_max_bias > 0) {
        const double n = std::exp2(std::floor(std::log2(static_cast<double>(Hq))));
        const double bias = p.options.alibi_max_bias;
        for (std::size_t h = 0; h < Hq; ++h)
            slope[h] = static_cast<double>(h) < n
                           ? std::pow(std::exp2(-bias / n), static_cast<double>(h + 1))
                           : std::pow(std::exp2(-bias / (2 * n)), 2 * (static_cast<double>(h) - n) + 1);
    }
    varlen_ref_result r;
    r.output.assign(total_q * Hq * Ev, 0.0);
    if (p.options.return_lse) r.lse.assign(Hq * total_q, neg_inf);
    for (std::size_t b = 0; b < B; ++b) {
        const auto q0 = static_cast<std::int64_t>(p.cu_seqlens_q[b]), k0 = static_cast<std::int64_t>(p.cu_seqlens_k[b]);
        const std::int64_t L = p.cu_seqlens_q[b + 1] - q0, S = p.cu_seqlens_k[b + 1] - k0;
        const std::int64_t off = p.options.alignment == qkv::causal_alignment::bottom_right ? S - L : 0;
        for (std::size_t h = 0; h < Hq; ++h) {
            const std::size_t g = h / (Hq / Hkv);
            for (std::int64_t i = 0; i < L; ++i) {
                const std::int64_t pos = i + off;
                std::vector<double> s;
                std::vector<std::int64_t> keys;
                for (std::int64_t j = 0; j < S; ++j) {
                    if (p.options.causal && j > pos) continue;
                    if (p.options.window_left >= 0 && j < pos - p.options.window_left) continue;
                    if (p.options.window_right >= 0 && j > pos + p.options.window_right) continue;
                    double dot = 0;
                    for (std::size_t e = 0; e < E; ++e)
                        dot += static_cast<double>(p.q[(static_cast<std::size_t>(q0 + i) * Hq + h) * E + e]) *
                               static_cast<double>(k[(static_cast<std::size_t>(k0 + j) * Hkv + g) * E + e]);
                    double score = scale * dot;
                    if (p.options.softcap > 0) score = p.options.softcap * std::tanh(score / p.options.softcap);
                    score -= slope[h] * static_cast<double>(std::abs(pos - j));
                    s.push_back(score);
                    keys.push_back(j);
                }
                if (s.empty()) continue;  // zeros, lse -inf
                const double m = *std::max_element(s.begin(), s.end());
                double sum = 0;
                for (const double x : s) sum += std::exp(x - m);
                double top = m, denominator = sum;
                if (!p.sinks.empty()) {
                    top = std::max(m, static_cast<double>(p.sinks[h]));
                    denominator = sum * std::exp(m - top) + std::exp(static_cast<double>(p.sinks[h]) - top);
                }
                double* out = &r.output[(static_cast<std::size_t>(q0 + i) * Hq + h) * Ev];
                for (std::size_t n = 0; n < s.size(); ++n) {
                    const double w = std::exp(s[n] - top) / denominator;
                    for (std::size_t e = 0; e < Ev; ++e)
                        out[e] +=
                            w * static_cast<double>(v[(static_cast<std::size_t>(k0 + keys[n]) * Hkv + g) * Ev + e]);
                }
                if (p.options.return_lse) r.lse[h * total_q + static_cast<std::size_t>(q0 + i)] = m + std::log(sum);
            }
        }
    }
    return r;
}

inline varlen_ref_result varlen_reference(const owned_varlen& o) { return varlen_reference(o.problem, o.k, o.v); }

}  // namespace qkv_test
