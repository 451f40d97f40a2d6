// Paged batches (qkv/runtime/paged.hpp): their validation, the gather of each sequence's rows from
// its pages into the ragged batch of its sequences, and the float64 CPU reference over them, which
// runs that ragged batch (each sequence through qkv::cpu::sdpa, the one reference).
#include "qkv/runtime/paged.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "runtime/ragged_checks.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using shape_checks::checked_product;
using shape_checks::expect_size;
using shape_checks::fail;

std::string str(std::size_t n) { return std::to_string(n); }

constexpr auto int32_limit = static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max());

/// Pages that `keys` rows fill.
std::size_t pages_for(std::size_t keys, std::size_t page_size) { return (keys + page_size - 1) / page_size; }

template <class T>
void check_paged(const basic_paged_problem<T>& p, bool pool = true, bool data = true, bool table = true) {
    const std::size_t ps = p.page_size;
    if (ps == 0 || ps > max_page_size || (ps & (ps - 1)) != 0)
        fail("page_size is " + str(ps) + ": it must be a power of two from 1 to " + str(max_page_size));
    if (p.num_pages == 0) fail("num_pages is 0: the pool needs at least one page");
    if (p.max_pages == 0) fail("max_pages is 0: the block table needs at least one column");
    if (p.q_heads == 0 || p.kv_heads == 0 || p.d_qk == 0 || p.d_v == 0)
        fail("q_heads, kv_heads, d_qk and d_v must be at least 1 (they are " + str(p.q_heads) + ", " + str(p.kv_heads) +
             ", " + str(p.d_qk) + ", " + str(p.d_v) + ")");
    if (pool) {
        expect_size("k_pages", p.k_pages,
                    {{"num_pages", p.num_pages}, {"page_size", ps}, {"kv_heads", p.kv_heads}, {"d_qk", p.d_qk}});
        expect_size("v_pages", p.v_pages,
                    {{"num_pages", p.num_pages}, {"page_size", ps}, {"kv_heads", p.kv_heads}, {"d_v", p.d_v}});
    } else if (!p.k_pages.empty() || !p.v_pages.empty()) {
        fail("k_pages and v_pages must be empty: the pool is the device's");
    }
    const std::size_t B = p.cache_seqlens.size();
    if (B == 0) fail("cache_seqlens is empty: a batch has at least one sequence");
    if (p.cache_batch_idx.empty()) {
        expect_size("block_table", p.block_table, {{"B = cache_seqlens.size()", B}, {"max_pages", p.max_pages}});
    } else {
        if (p.cache_batch_idx.size() != B)
            fail("cache_batch_idx has " + str(p.cache_batch_idx.size()) + " entries: one per sequence, B = " + str(B));
        if (p.block_table.empty() || p.block_table.size() % p.max_pages != 0)
            fail("block_table has " + str(p.block_table.size()) +
                 " entries: with cache_batch_idx, rows of max_pages = " + str(p.max_pages) + ", at least one");
        const std::size_t table_rows = p.block_table.size() / p.max_pages;
        for (std::size_t b = 0; b < B; ++b)
            if (p.cache_batch_idx[b] < 0 || static_cast<std::size_t>(p.cache_batch_idx[b]) >= table_rows)
                fail("cache_batch_idx[" + str(b) + "] = " + std::to_string(p.cache_batch_idx[b]) +
                     " is not a row of the block table (it has " + str(table_rows) + ")");
    }
    if (!p.cache_leftpad.empty() && p.cache_leftpad.size() != B)
        fail("cache_leftpad has " + str(p.cache_leftpad.size()) + " entries: one per sequence, B = " + str(B));
    if (p.new_rows > int32_limit) fail("new_rows is " + str(p.new_rows) + ": at most 2^31 - 1");
    if (p.new_rows == 0) {
        if (!p.k_new.empty() || !p.v_new.empty()) fail("k_new and v_new must be empty when new_rows is 0");
    } else if (!data) {
        if (!p.k_new.empty() || !p.v_new.empty()) fail("k_new and v_new must be empty: they come as tensors");
    } else {
        expect_size("k_new", p.k_new, {{"B", B}, {"new_rows", p.new_rows}, {"kv_heads", p.kv_heads}, {"d_qk", p.d_qk}});
        expect_size("v_new", p.v_new, {{"B", B}, {"new_rows", p.new_rows}, {"kv_heads", p.kv_heads}, {"d_v", p.d_v}});
    }
    for (std::size_t b = 0; b < B; ++b) {
        const std::int32_t len = p.cache_seqlens[b];
        if (len < 0) fail("cache_seqlens[" + str(b) + "] is " + std::to_string(len) + ": a length is at least 0");
        if (static_cast<std::size_t>(len) > int32_limit - p.new_rows)
            fail("cache_seqlens[" + str(b) + "] + new_rows = " + std::to_string(len) + " + " + str(p.new_rows) +
                 " passes 2^31 - 1 keys");
        const std::size_t end = static_cast<std::size_t>(len) + p.new_rows;
        std::size_t first = 0;
        if (!p.cache_leftpad.empty()) {
            if (p.cache_leftpad[b] < 0 || p.cache_leftpad[b] > len)
                fail("cache_leftpad[" + str(b) + "] = " + std::to_string(p.cache_leftpad[b]) +
                     ": it must lie in [0, cache_seqlens[" + str(b) + "] = " + std::to_string(len) + "]");
            first = static_cast<std::size_t>(p.cache_leftpad[b]);
        }
        const std::size_t row = p.cache_batch_idx.empty() ? b : static_cast<std::size_t>(p.cache_batch_idx[b]);
        const std::size_t need = pages_for(end, ps);
        if (need > p.max_pages)
            fail("block_table is too short for sequence " + str(b) + ": cache_seqlens[" + str(b) +
                 "] = " + std::to_string(len) +
                 (p.new_rows ? " and " + str(p.new_rows) + " new rows: " + str(end) + " keys" : std::string(" keys")) +
                 " need " + str(need) + " pages of " + str(ps) + " rows, and a row has " + str(p.max_pages) +
                 " (max_pages)");
        for (std::size_t i = first / ps; table && i < need; ++i) {
            const std::int32_t page = p.block_table[row * p.max_pages + i];
            if (page < 0 || static_cast<std::size_t>(page) >= p.num_pages)
                fail("block_table[" + str(row) + "][" + str(i) + "] = " + std::to_string(page) +
                     " is not a page of the pool (num_pages = " + str(p.num_pages) + "): sequence " + str(b) +
                     (i * ps + ps > static_cast<std::size_t>(len) ? " writes or reads" : " reads") +
                     " it for its keys " + str(i * ps) + " onwards");
        }
    }
    if (!data && !p.q.empty()) fail("q must be empty: it comes as a tensor");
    if (p.cu_seqlens_q.empty()) {
        if (data) expect_size("q", p.q, {{"B", B}, {"q_len", p.q_len}, {"q_heads", p.q_heads}, {"d_qk", p.d_qk}});
    } else {
        if (p.cu_seqlens_q.size() != B + 1)
            fail("cu_seqlens_q has " + str(p.cu_seqlens_q.size()) + " entries: B + 1 = " + str(B + 1) +
                 " offsets for the " + str(B) + " sequences of cache_seqlens");
        if (p.cu_seqlens_q[0] != 0)
            fail("cu_seqlens_q[0] is " + std::to_string(p.cu_seqlens_q[0]) + ": the offsets must start at 0");
        for (std::size_t b = 1; b <= B; ++b)
            if (p.cu_seqlens_q[b] < p.cu_seqlens_q[b - 1])
                fail("cu_seqlens_q must be nondecreasing: cu_seqlens_q[" + str(b) +
                     "] = " + std::to_string(p.cu_seqlens_q[b]) + " is below cu_seqlens_q[" + str(b - 1) +
                     "] = " + std::to_string(p.cu_seqlens_q[b - 1]));
        if (data)
            expect_size("q", p.q,
                        {{"total_q = cu_seqlens_q[B]", static_cast<std::size_t>(p.cu_seqlens_q[B])},
                         {"q_heads", p.q_heads},
                         {"d_qk", p.d_qk}});
    }
    if (p.rotary_dim == 0) {
        if (!p.rotary_cos.empty() || !p.rotary_sin.empty())
            fail("rotary_cos and rotary_sin must be empty when rotary_dim is 0");
    } else {
        if (p.new_rows == 0)
            fail("a rotary embedding (rotary_dim " + str(p.rotary_dim) +
                 ") goes with new rows (k_new, v_new), as in FlashAttention");
        if (p.rotary_dim % 2 != 0 || p.rotary_dim > p.d_qk)
            fail("rotary_dim is " + str(p.rotary_dim) + ": it must be even and at most d_qk = " + str(p.d_qk));
        const std::size_t half = p.rotary_dim / 2;
        if (p.rotary_cos.size() != p.rotary_sin.size() || p.rotary_cos.empty() || p.rotary_cos.size() % half != 0)
            fail("rotary_cos and rotary_sin have " + str(p.rotary_cos.size()) + " and " + str(p.rotary_sin.size()) +
                 " values: they must both be (rotary_rows, rotary_dim / 2 = " + str(half) + "), rotary_rows >= 1");
        const std::size_t rows = p.rotary_cos.size() / half;
        for (std::size_t b = 0; b < B; ++b) {
            const std::size_t L =
                p.cu_seqlens_q.empty() ? p.q_len : static_cast<std::size_t>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]);
            std::size_t last = paged_rotary_position(p, b, p.new_rows - 1, false);
            if (L > 0) last = std::max(last, paged_rotary_position(p, b, L - 1, true));
            if (last >= rows)
                fail("rotary_cos and rotary_sin have " + str(rows) + " positions (rows); sequence " + str(b) +
                     " reaches position " + str(last));
        }
    }
    if (!data) {  // q's rows counted as its tensor will hold them: within int32 offsets, no overflow
        const std::size_t total_q = p.cu_seqlens_q.empty() ? checked_product({{"B", B}, {"q_len", p.q_len}})
                                                           : static_cast<std::size_t>(p.cu_seqlens_q[B]);
        if (total_q > int32_limit) fail("the batch's " + str(total_q) + " query rows exceed int32 offsets");
        (void)checked_product({{"query rows", total_q}, {"q_heads", p.q_heads}, {"d_qk", p.d_qk}});
        (void)checked_product({{"query rows", total_q}, {"q_heads", p.q_heads}, {"d_v", p.d_v}});
    }
    validate_per_sequence_rules<T>(p);
}

template <class T>
basic_resolved_pages<T> resolve(const basic_paged_problem<T>& p, bool with_pool, bool data = true, bool table = true) {
    check_paged(p, with_pool, data, table);
    const std::size_t B = p.cache_seqlens.size(), H = p.kv_heads, E = p.d_qk, Ev = p.d_v, n = p.new_rows;
    basic_resolved_pages<T> r;
    r.problem = p;
    // The block table row by row (cache_batch_idx resolved), the lengths after the append.
    r.block_table.resize(checked_product({{"B", B}, {"max_pages", p.max_pages}}));
    r.cache_seqlens.resize(B);
    for (std::size_t b = 0; b < B; ++b) {
        std::copy_n(p.block_table.begin() + static_cast<std::ptrdiff_t>(paged_table_row(p, b) * p.max_pages),
                    p.max_pages, r.block_table.begin() + static_cast<std::ptrdiff_t>(b * p.max_pages));
        r.cache_seqlens[b] = static_cast<std::int32_t>(paged_end_key(p, b));
    }
    r.problem.block_table = r.block_table, r.problem.cache_seqlens = r.cache_seqlens;
    r.problem.cache_batch_idx = {};
    r.problem.new_rows = 0, r.problem.k_new = {}, r.problem.v_new = {};
    r.problem.rotary_dim = 0, r.problem.rotary_cos = {}, r.problem.rotary_sin = {};
    if (n == 0) return r;
    // The new rows' pool rows: two bound for one row are refused (the order of the writes would
    // decide the row).
    // A table on the device: each new row's key in the table (its row's slot · page_size + row in
    // page) stands for its pool row, which the device finds through the table: two new rows of one
    // table row and key are refused here, and rows_at holds the key in the resolved table (row b).
    const std::size_t ps = p.page_size;
    const auto table_key = [&](std::size_t b, std::size_t j) { return paged_table_row(p, b) * p.max_pages * ps + j; };
    r.rows_at.resize(B * n);
    std::vector<std::size_t> where(B * n);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t j = static_cast<std::size_t>(p.cache_seqlens[b]) + i;
            where[b * n + i] = table ? paged_pool_row(p, b, j) : table_key(b, j);
            r.rows_at[b * n + i] = table ? where[b * n + i] : b * p.max_pages * ps + j;
        }
    std::vector<std::size_t> sorted = where;
    std::sort(sorted.begin(), sorted.end());
    if (const auto dup = std::adjacent_find(sorted.begin(), sorted.end()); dup != sorted.end()) {
        std::size_t first = 0, second = 0;
        bool one = false;
        for (std::size_t x = 0; x < where.size(); ++x)
            if (where[x] == *dup) (one ? second : first) = x, one = true;
        fail("new row " + str(first % n) + " of sequence " + str(first / n) + " and new row " + str(second % n) +
             " of sequence " + str(second / n) + " go to the same row of the pool (" +
             (table ? "page " + str(*dup / ps) + ", row " + str(*dup % ps)
                    : "block table row " + str(*dup / ps / p.max_pages) + ", key " + str(*dup % (ps * p.max_pages))) +
             "): appends must not share a row");
    }
    if (!data) return r;  // the rows are tensors: the device rotates and places them
    // q and the new keys rotated at their positions; the new rows per K/V head.
    std::vector<T> k(p.k_new.begin(), p.k_new.end());
    if (p.rotary_dim != 0) {
        std::vector<std::size_t> at;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < n; ++i) at.push_back(paged_rotary_position(p, b, i, false));
        rotate_rows<T>(p, k, B * n, H, E, at);
        r.q.assign(p.q.begin(), p.q.end());
        at.clear();
        for (std::size_t b = 0; b < B; ++b) {
            const std::size_t L =
                p.cu_seqlens_q.empty() ? p.q_len : static_cast<std::size_t>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]);
            for (std::size_t i = 0; i < L; ++i) at.push_back(paged_rotary_position(p, b, i, true));
        }
        rotate_rows<T>(p, r.q, at.size(), p.q_heads, E, at);
        r.problem.q = r.q;
    }
    r.k_rows.resize(k.size());
    r.v_rows.resize(p.v_new.size());
    for (std::size_t x = 0; x < B * n; ++x)
        for (std::size_t h = 0; h < H; ++h) {
            std::copy_n(k.begin() + static_cast<std::ptrdiff_t>((x * H + h) * E), E,
                        r.k_rows.begin() + static_cast<std::ptrdiff_t>((h * B * n + x) * E));
            std::copy_n(p.v_new.begin() + static_cast<std::ptrdiff_t>((x * H + h) * Ev), Ev,
                        r.v_rows.begin() + static_cast<std::ptrdiff_t>((h * B * n + x) * Ev));
        }
    return r;
}

template <class T>
basic_gathered_pages<T> gather(const basic_paged_problem<T>& given) {
    basic_resolved_pages<T> resolved = resolve(given, true);
    basic_paged_problem<T>& p = resolved.problem;
    const std::size_t B = p.cache_seqlens.size(), H = p.kv_heads, E = p.d_qk, Ev = p.d_v;
    basic_gathered_pages<T> g;
    // With appends: a copy of the pool with every new row written, before any is read.
    std::vector<T> k_pool, v_pool;
    if (!resolved.rows_at.empty()) {
        k_pool.assign(p.k_pages.begin(), p.k_pages.end());
        v_pool.assign(p.v_pages.begin(), p.v_pages.end());
        const std::size_t n = resolved.rows_at.size();
        for (std::size_t x = 0; x < n; ++x)
            for (std::size_t h = 0; h < H; ++h) {
                const std::size_t at = resolved.rows_at[x];
                std::copy_n(resolved.k_rows.begin() + static_cast<std::ptrdiff_t>((h * n + x) * E), E,
                            k_pool.begin() + static_cast<std::ptrdiff_t>((at * H + h) * E));
                std::copy_n(resolved.v_rows.begin() + static_cast<std::ptrdiff_t>((h * n + x) * Ev), Ev,
                            v_pool.begin() + static_cast<std::ptrdiff_t>((at * H + h) * Ev));
            }
        p.k_pages = k_pool, p.v_pages = v_pool;
    }
    g.q = std::move(resolved.q);
    if (!g.q.empty()) p.q = g.q;
    if (p.cu_seqlens_q.empty()) {
        if (p.q_len > 0 && B > int32_limit / p.q_len)
            fail("B x q_len = " + str(B) + " x " + str(p.q_len) + " queries do not fit int32 offsets");
        for (std::size_t b = 0; b <= B; ++b) g.cu_seqlens_q.push_back(static_cast<std::int32_t>(b * p.q_len));
    } else {
        g.cu_seqlens_q.assign(p.cu_seqlens_q.begin(), p.cu_seqlens_q.end());
    }
    g.cu_seqlens_k = {0};
    std::size_t total_k = 0, longest_q = 0, longest_k = 0;
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t len = paged_end_key(p, b) - paged_first_key(p, b);
        total_k += len;
        if (total_k > int32_limit) fail("the sequences' keys (the sum of cache_seqlens) exceed int32 offsets");
        g.cu_seqlens_k.push_back(static_cast<std::int32_t>(total_k));
        longest_k = std::max(longest_k, len);
        longest_q = std::max(longest_q, static_cast<std::size_t>(g.cu_seqlens_q[b + 1] - g.cu_seqlens_q[b]));
    }
    g.k.resize(checked_product({{"total keys", total_k}, {"kv_heads", H}, {"d_qk", E}}));
    g.v.resize(checked_product({{"total keys", total_k}, {"kv_heads", H}, {"d_v", Ev}}));
    // Key j of sequence b: row j % page_size of page block_table[b][j / page_size], all heads, from
    // its first key (cache_leftpad) on.
    std::size_t row = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t j = paged_first_key(p, b); j < paged_end_key(p, b); ++j, ++row) {
            const std::size_t at = paged_pool_row(p, b, j);
            std::copy_n(p.k_pages.begin() + static_cast<std::ptrdiff_t>(at * H * E), H * E,
                        g.k.begin() + static_cast<std::ptrdiff_t>(row * H * E));
            std::copy_n(p.v_pages.begin() + static_cast<std::ptrdiff_t>(at * H * Ev), H * Ev,
                        g.v.begin() + static_cast<std::ptrdiff_t>(row * H * Ev));
        }
    g.problem = {.q_heads = p.q_heads,
                 .kv_heads = p.kv_heads,
                 .d_qk = E,
                 .d_v = Ev,
                 .cu_seqlens_q = g.cu_seqlens_q,
                 .cu_seqlens_k = g.cu_seqlens_k,
                 .max_seqlen_q = longest_q,
                 .max_seqlen_k = longest_k,
                 .q = g.q.empty() ? given.q : std::span<const T>(g.q),
                 .k = g.k,
                 .v = g.v,
                 .options = p.options,
                 .sinks = p.sinks,
                 .alibi_slopes = p.alibi_slopes};
    return g;
}

}  // namespace

void validate(const paged_problem& problem) { check_paged(problem); }
void validate(const paged_problem_f64& problem) { check_paged(problem); }
void validate_without_pool(const paged_problem& problem) { check_paged(problem, false); }
void validate_without_data(const paged_problem& problem) { check_paged(problem, false, false); }

std::size_t batch_of(const paged_problem& problem) { return problem.cache_seqlens.size(); }
std::size_t batch_of(const paged_problem_f64& problem) { return problem.cache_seqlens.size(); }

basic_gathered_pages<float> gather_pages(const paged_problem& problem) { return gather(problem); }
basic_resolved_pages<float> resolve_pages(const paged_problem& problem, bool with_pool) {
    return resolve(problem, with_pool);
}
basic_resolved_pages<double> resolve_pages(const paged_problem_f64& problem, bool with_pool) {
    return resolve(problem, with_pool);
}
basic_resolved_pages<float> resolve_pages_without_data(const paged_problem& problem, bool table_here) {
    return resolve(problem, false, false, table_here);
}
basic_gathered_pages<double> gather_pages(const paged_problem_f64& problem) { return gather(problem); }

}  // namespace qkv

namespace qkv::cpu {

varlen_output_f64 sdpa(const paged_problem_f64& problem) {
    require_supported(entry_point::cpu_paged, problem);
    const basic_gathered_pages<double> g = gather_pages(problem);
    return sdpa(g.problem);
}

varlen_output_f64 sdpa_f64(const paged_problem& problem) {
    require_supported(entry_point::cpu_paged, problem);
    const basic_gathered_pages<float> g = gather_pages(problem);
    return sdpa_f64(g.problem);
}

varlen_output sdpa(const paged_problem& problem) {
    require_supported(entry_point::cpu_paged, problem);
    const basic_gathered_pages<float> g = gather_pages(problem);
    return sdpa(g.problem);
}

}  // namespace qkv::cpu
