// Paged batches for the tests: a problem over a pool of pages it owns, pages handed out in a
// shuffled order, with optional sharing of a prompt's pages, and a float64 reference over the paged
// layout from FlashAttention's flash_attn_with_kvcache documentation (block_table, cache_seqlens)
// and qkv/runtime/paged.hpp's comment, its attention that of support/ragged_reference.hpp, written
// without qkv's own code.
#pragma once

#include <qkv/runtime/paged.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "support/ragged_reference.hpp"

namespace qkv_test {

/// A paged batch over data it owns; `problem` views it (valid while this lives, moves included).
struct owned_paged {
    std::vector<std::int32_t> table, seqlens, cu_q;
    std::vector<float> q, k_pages, v_pages, sinks, slopes;
    qkv::paged_problem problem;
    // flash_attn_with_kvcache's appends, rotary embedding, cache_batch_idx and cache_leftpad
    std::vector<float> k_new, v_new, cos, sin;
    std::vector<std::int32_t> batch_idx, leftpad;
};

/// Turns o's last `rows` keys of every sequence into new rows (k_new, v_new: N(0, 1), drawn from
/// `seed`) appended by the call: its cache_seqlens drop by `rows` (each sequence needs that many
/// keys), its pages stay the ones the table lists.
inline void make_appends(owned_paged& o, std::size_t rows, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const qkv::paged_problem& p = o.problem;
    const std::size_t B = o.seqlens.size();
    for (std::int32_t& len : o.seqlens) len -= static_cast<std::int32_t>(rows);
    o.k_new.resize(B * rows * p.kv_heads * p.d_qk);
    o.v_new.resize(B * rows * p.kv_heads * p.d_v);
    for (float& x : o.k_new) x = normal(rng);
    for (float& x : o.v_new) x = normal(rng);
    o.problem.new_rows = rows;
    o.problem.k_new = o.k_new, o.problem.v_new = o.v_new;
}

/// A rotary table of `positions` rows of rotary_dim / 2 angles (RoPE's θ_j = 10000^(-2j/rotary_dim)
/// at each position), scaled by `gain` (1: a rotation) for o's problem.
inline void make_rotary(owned_paged& o, std::size_t rotary_dim, std::size_t positions, bool interleaved,
                        double gain = 1.0) {
    const std::size_t half = rotary_dim / 2;
    o.cos.resize(positions * half), o.sin.resize(positions * half);
    for (std::size_t t = 0; t < positions; ++t)
        for (std::size_t j = 0; j < half; ++j) {
            const double angle = static_cast<double>(t) *
                                 std::pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(rotary_dim));
            o.cos[t * half + j] = static_cast<float>(gain * std::cos(angle));
            o.sin[t * half + j] = static_cast<float>(gain * std::sin(angle));
        }
    o.problem.rotary_dim = rotary_dim;
    o.problem.rotary_cos = o.cos, o.problem.rotary_sin = o.sin;
    o.problem.rotary_interleaved = interleaved;
}

/// `o`'s block table with its rows permuted through cache_batch_idx = `perm` (sequence b reads
/// row perm[b]) into a table of `rows` rows (rows no sequence reads are all -1), and `leftpad` as
/// cache_leftpad.
inline void permute_table(owned_paged& o, const std::vector<std::int32_t>& perm, std::size_t rows,
                          const std::vector<std::int32_t>& leftpad) {
    const std::size_t cols = o.problem.max_pages;
    std::vector<std::int32_t> table(rows * cols, -1);
    for (std::size_t b = 0; b < perm.size(); ++b)
        std::copy_n(o.table.begin() + static_cast<std::ptrdiff_t>(b * cols), cols,
                    table.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(perm[b]) * cols));
    o.table = table, o.batch_idx = perm, o.leftpad = leftpad;
    o.problem.block_table = o.table, o.problem.cache_batch_idx = o.batch_idx;
    o.problem.cache_leftpad = o.leftpad;
}

struct paged_shape {
    std::vector<std::size_t> kv_lens{};  ///< S_b
    std::vector<std::size_t> q_lens{};   ///< L_b: empty for one q_len for all (then `q_len`)
    std::size_t q_len = 1;
    std::size_t q_heads = 4, kv_heads = 2, d_qk = 16, d_v = 16;
    std::size_t page_size = 16;
    std::size_t spare_pages = 2;    ///< pool pages no sequence uses (filled with large values)
    std::size_t extra_columns = 1;  ///< block-table columns past the longest sequence's (filled with -1)
    /// Sequence 1 reads sequence 0's first `shared` pages (its keys there equal sequence 0's).
    std::size_t shared = 0;
    /// Empty, or per sequence b {a, n}: b reads sequence a's (a < b) first n pages as its own first
    /// pages (a shared prompt; n = 0: none). Replaces `shared`.
    std::vector<std::pair<std::size_t, std::size_t>> shares{};
    std::uint64_t seed = 1;
};

/// N(0, 1) q and pool; each sequence's pages drawn from a shuffled list of the pool's pages.
inline owned_paged random_paged(const paged_shape& s) {
    owned_paged o;
    std::mt19937_64 rng(s.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::size_t B = s.kv_lens.size(), ps = s.page_size;
    std::vector<std::size_t> need(B);
    std::size_t pages = s.spare_pages, columns = 1;
    for (std::size_t b = 0; b < B; ++b) {
        need[b] = (s.kv_lens[b] + ps - 1) / ps;
        pages += need[b];
        columns = std::max(columns, need[b]);
    }
    const auto shared_of = [&](std::size_t b) -> std::pair<std::size_t, std::size_t> {
        if (!s.shares.empty()) return {s.shares[b].first, std::min(s.shares[b].second, need[b])};
        return {0, b == 1 ? std::min(s.shared, need[1]) : 0};
    };
    for (std::size_t b = 0; b < B; ++b) pages -= shared_of(b).second;  // shared pages are another's
    pages = std::max<std::size_t>(pages, 1);
    columns += s.extra_columns;
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    o.table.assign(B * columns, -1);
    std::size_t next = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < need[b]; ++i)
            o.table[b * columns + i] =
                i < shared_of(b).second ? o.table[shared_of(b).first * columns + i] : order[next++];
    const std::size_t per_page_k = ps * s.kv_heads * s.d_qk, per_page_v = ps * s.kv_heads * s.d_v;
    o.k_pages.resize(pages * per_page_k);
    o.v_pages.resize(pages * per_page_v);
    for (float& x : o.k_pages) x = normal(rng);
    for (float& x : o.v_pages) x = normal(rng);
    // The spare pages hold values that would show if a sequence read them.
    for (std::size_t n = next; n < pages; ++n) {
        const auto page = static_cast<std::size_t>(order[n]);
        std::fill_n(o.k_pages.begin() + static_cast<std::ptrdiff_t>(page * per_page_k), per_page_k, 50.0f);
        std::fill_n(o.v_pages.begin() + static_cast<std::ptrdiff_t>(page * per_page_v), per_page_v, 1000.0f);
    }
    for (const std::size_t len : s.kv_lens) o.seqlens.push_back(static_cast<std::int32_t>(len));
    std::size_t total_q = B * s.q_len;
    if (!s.q_lens.empty()) {
        o.cu_q = {0};
        for (const std::size_t l : s.q_lens) o.cu_q.push_back(o.cu_q.back() + static_cast<std::int32_t>(l));
        total_q = static_cast<std::size_t>(o.cu_q.back());
    }
    o.q.resize(total_q * s.q_heads * s.d_qk);
    for (float& x : o.q) x = normal(rng);
    o.problem = {.q_heads = s.q_heads,
                 .kv_heads = s.kv_heads,
                 .d_qk = s.d_qk,
                 .d_v = s.d_v,
                 .page_size = ps,
                 .num_pages = pages,
                 .k_pages = o.k_pages,
                 .v_pages = o.v_pages,
                 .max_pages = columns,
                 .block_table = o.table,
                 .cache_seqlens = o.seqlens,
                 .q_len = s.q_len,
                 .cu_seqlens_q = o.cu_q,
                 .q = o.q};
    return o;
}

using paged_ref_result = ragged_ref_result;

/// Straight from the definitions: key j of sequence b is row j % page_size of page
/// block_table[b][j / page_size]; each query row attends its sequence's visible keys.
inline paged_ref_result paged_reference(const qkv::paged_problem& p) {
    const std::size_t Hkv = p.kv_heads, E = p.d_qk, Ev = p.d_v, B = p.cache_seqlens.size(), ps = p.page_size;
    ragged_ref_batch batch{.q_heads = p.q_heads,
                           .kv_heads = Hkv,
                           .d_qk = E,
                           .d_v = Ev,
                           .q_first = std::vector<std::size_t>(B + 1, 0),
                           .kv_len = {},
                           .q = p.q,
                           .options = p.options,
                           .sinks = p.sinks,
                           .alibi_slopes = p.alibi_slopes};
    for (std::size_t b = 0; b <= B; ++b)
        batch.q_first[b] = p.cu_seqlens_q.empty() ? b * p.q_len : static_cast<std::size_t>(p.cu_seqlens_q[b]);
    for (std::size_t b = 0; b < B; ++b) batch.kv_len.push_back(p.cache_seqlens[b]);
    // Row j % page_size of the page the table names for key j of sequence b.
    const auto pool_row = [&](std::size_t b, std::int64_t j) {
        const auto page = static_cast<std::size_t>(p.block_table[b * p.max_pages + static_cast<std::size_t>(j) / ps]);
        return page * ps + static_cast<std::size_t>(j) % ps;
    };
    return ragged_reference(
        batch,
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return static_cast<double>(p.k_pages[(pool_row(b, j) * Hkv + g) * E + e]);
        },
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return static_cast<double>(p.v_pages[(pool_row(b, j) * Hkv + g) * Ev + e]);
        });
}

/// flash_attn_with_kvcache from FlashAttention's documentation, over the paged layout: new k and v
/// written into sequence b's pages (row cache_batch_idx[b] of the table, or b) at keys
/// cache_seqlens[b] onwards, every sequence's before any is read; with rotary_cos / rotary_sin, the
/// new keys and q rotated first (apply_rotary_emb: the first rotary_dim features, pairs (2j, 2j+1)
/// interleaved or (j, j + rotary_dim / 2), x1·cos − x2·sin and x1·sin + x2·cos), keys at positions
/// cache_seqlens[b] + i, queries at cache_seqlens[b] + i when causal or windowed, else
/// cache_seqlens[b]; sequence b then attends its keys cache_leftpad[b] .. cache_seqlens[b] +
/// new_rows - 1 as a sequence of its own. In float64 throughout.
inline paged_ref_result kvcache_reference(const qkv::paged_problem& p) {
    const std::size_t Hq = p.q_heads, Hkv = p.kv_heads, E = p.d_qk, Ev = p.d_v, B = p.cache_seqlens.size();
    const std::size_t ps = p.page_size, n = p.new_rows, half = p.rotary_dim / 2;
    const auto table_row = [&](std::size_t b) {
        return p.cache_batch_idx.empty() ? b : static_cast<std::size_t>(p.cache_batch_idx[b]);
    };
    const auto pool_row = [&](std::size_t b, std::size_t j) {
        return static_cast<std::size_t>(p.block_table[table_row(b) * p.max_pages + j / ps]) * ps + j % ps;
    };
    const bool moving = p.options.causal || p.options.window_left >= 0 || p.options.window_right >= 0;
    // Rotates `heads` rows of `width` values at x by the angles of position t.
    const auto rotate = [&](double* x, std::size_t heads, std::size_t width, std::size_t t) {
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t j = 0; j < half; ++j) {
                double* row = x + h * width;
                const std::size_t a = p.rotary_interleaved ? 2 * j : j, z = p.rotary_interleaved ? 2 * j + 1 : j + half;
                const double c = p.rotary_cos[t * half + j], s = p.rotary_sin[t * half + j];
                const double x1 = row[a], x2 = row[z];
                row[a] = x1 * c - x2 * s;
                row[z] = x1 * s + x2 * c;
            }
    };
    std::vector<double> k(p.k_pages.begin(), p.k_pages.end()), v(p.v_pages.begin(), p.v_pages.end());
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t t = static_cast<std::size_t>(p.cache_seqlens[b]) + i, at = pool_row(b, t);
            std::vector<double> kr(p.k_new.begin() + static_cast<std::ptrdiff_t>((b * n + i) * Hkv * E),
                                   p.k_new.begin() + static_cast<std::ptrdiff_t>((b * n + i + 1) * Hkv * E));
            if (half) rotate(kr.data(), Hkv, E, t);
            std::copy(kr.begin(), kr.end(), k.begin() + static_cast<std::ptrdiff_t>(at * Hkv * E));
            std::copy_n(p.v_new.begin() + static_cast<std::ptrdiff_t>((b * n + i) * Hkv * Ev), Hkv * Ev,
                        v.begin() + static_cast<std::ptrdiff_t>(at * Hkv * Ev));
        }
    std::vector<std::size_t> q_first(B + 1, 0);
    for (std::size_t b = 0; b <= B; ++b)
        q_first[b] = p.cu_seqlens_q.empty() ? b * p.q_len : static_cast<std::size_t>(p.cu_seqlens_q[b]);
    std::vector<double> q(p.q.begin(), p.q.end());
    if (half)
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < q_first[b + 1] - q_first[b]; ++i)
                rotate(q.data() + (q_first[b] + i) * Hq * E, Hq, E,
                       static_cast<std::size_t>(p.cache_seqlens[b]) + (moving ? i : 0));
    // ragged_reference reads q as float: the rotated queries are rounded to float once (a relative
    // 2^-24, far below the tests' tolerance); keys and values stay float64.
    const std::vector<float> qf(q.begin(), q.end());
    std::vector<std::size_t> first(B, 0);
    ragged_ref_batch batch{.q_heads = Hq,
                           .kv_heads = Hkv,
                           .d_qk = E,
                           .d_v = Ev,
                           .q_first = q_first,
                           .kv_len = {},
                           .q = qf,
                           .options = p.options,
                           .sinks = p.sinks,
                           .alibi_slopes = p.alibi_slopes};
    for (std::size_t b = 0; b < B; ++b) {
        first[b] = p.cache_leftpad.empty() ? 0 : static_cast<std::size_t>(p.cache_leftpad[b]);
        batch.kv_len.push_back(static_cast<std::int64_t>(static_cast<std::size_t>(p.cache_seqlens[b]) + n - first[b]));
    }
    return ragged_reference(
        batch,
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return k[(pool_row(b, first[b] + static_cast<std::size_t>(j)) * Hkv + g) * E + e];
        },
        [&](std::size_t b, std::int64_t j, std::size_t g, std::size_t e) {
            return v[(pool_row(b, first[b] + static_cast<std::size_t>(j)) * Hkv + g) * Ev + e];
        });
}

}  // namespace qkv_test
