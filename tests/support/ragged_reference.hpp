// The float64 attention of a batch of sequences, each its own block, for the ragged and the paged
// references of the tests (varlen_problems.hpp, paged_problems.hpp): they differ only in where a
// sequence's keys and values are read from. Written from FlashAttention's flash_attn_varlen_func and
// flash_attn_with_kvcache documentation and qkv/runtime/varlen.hpp's comment (the causal rule and the
// window aligned by each sequence's S_b - L_b, softcap, ALiBi by bias or by slopes, sinks, lse), as
// plainly as possible and without qkv's own code.
#pragma once

#include <qkv/runtime/options.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace qkv_test {

/// The packed output (total_q, Hq, Ev) and lse (Hq, total_q) of a batch, in float64.
struct ragged_ref_result {
    std::vector<double> output, lse;
};

/// One slope per query head: the given ones, or ALiBi's from the bias by the formula in
/// qkv/runtime/sdpa.hpp's comment, or zeros.
inline std::vector<double> reference_slopes(std::size_t Hq, std::span<const float> given, double max_bias) {
    std::vector<double> slope(Hq, 0.0);
    if (!given.empty()) {
        for (std::size_t h = 0; h < Hq; ++h) slope[h] = static_cast<double>(given[h]);
    } else if (max_bias > 0) {
        const double n = std::exp2(std::floor(std::log2(static_cast<double>(Hq))));
        for (std::size_t h = 0; h < Hq; ++h)
            slope[h] = static_cast<double>(h) < n
                           ? std::pow(std::exp2(-max_bias / n), static_cast<double>(h + 1))
                           : std::pow(std::exp2(-max_bias / (2 * n)), 2 * (static_cast<double>(h) - n) + 1);
    }
    return slope;
}

/// What the batch's sequences share, and where each one's queries stand in the packed q.
struct ragged_ref_batch {
    std::size_t q_heads = 0, kv_heads = 0, d_qk = 0, d_v = 0;
    std::vector<std::size_t> q_first;  ///< B + 1: sequence b's query rows are q_first[b] .. q_first[b + 1]
    std::vector<std::int64_t> kv_len;  ///< B: S_b
    std::span<const float> q;          ///< (total_q, Hq, E)
    qkv::sdpa_options options{};
    std::span<const float> sinks{}, alibi_slopes{};
};

/// `key(b, j, g, e)` and `value(b, j, g, e)`: element e of key (value) j of sequence b, K/V head g.
template <class Key, class Value>
ragged_ref_result ragged_reference(const ragged_ref_batch& p, Key key, Value value) {
    const std::size_t Hq = p.q_heads, Hkv = p.kv_heads, E = p.d_qk, Ev = p.d_v, B = p.kv_len.size();
    const std::size_t total_q = p.q_first[B];
    const double scale = p.options.scale ? *p.options.scale : 1.0 / std::sqrt(static_cast<double>(E));
    const std::vector<double> slope = reference_slopes(Hq, p.alibi_slopes, p.options.alibi_max_bias);
    ragged_ref_result r;
    r.output.assign(total_q * Hq * Ev, 0.0);
    if (p.options.return_lse) r.lse.assign(Hq * total_q, -std::numeric_limits<double>::infinity());
    for (std::size_t b = 0; b < B; ++b) {
        const auto L = static_cast<std::int64_t>(p.q_first[b + 1] - p.q_first[b]);
        const std::int64_t S = p.kv_len[b];
        const std::int64_t off = p.options.alignment == qkv::causal_alignment::bottom_right ? S - L : 0;
        for (std::size_t h = 0; h < Hq; ++h) {
            const std::size_t g = h / (Hq / Hkv);
            for (std::int64_t i = 0; i < L; ++i) {
                const std::size_t row = p.q_first[b] + static_cast<std::size_t>(i);
                const std::int64_t pos = i + off;
                std::vector<double> s;
                std::vector<std::int64_t> keys;
                for (std::int64_t j = 0; j < S; ++j) {
                    if (p.options.causal && j > pos) continue;
                    if (p.options.window_left >= 0 && j < pos - p.options.window_left) continue;
                    if (p.options.window_right >= 0 && j > pos + p.options.window_right) continue;
                    double dot = 0;
                    for (std::size_t e = 0; e < E; ++e)
                        dot += static_cast<double>(p.q[(row * Hq + h) * E + e]) * key(b, j, g, e);
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
                double* out = &r.output[(row * Hq + h) * Ev];
                for (std::size_t n = 0; n < s.size(); ++n) {
                    const double w = std::exp(s[n] - top) / denominator;
                    for (std::size_t e = 0; e < Ev; ++e) out[e] += w * value(b, keys[n], g, e);
                }
                if (p.options.return_lse) r.lse[h * total_q + row] = m + std::log(sum);
            }
        }
    }
    return r;
}

}  // namespace qkv_test
