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
void check_paged(const basic_paged_problem<T>& p, bool pool = true) {
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
    expect_size("block_table", p.block_table, {{"B = cache_seqlens.size()", B}, {"max_pages", p.max_pages}});
    for (std::size_t b = 0; b < B; ++b) {
        const std::int32_t len = p.cache_seqlens[b];
        if (len < 0) fail("cache_seqlens[" + str(b) + "] is " + std::to_string(len) + ": a length is at least 0");
        const std::size_t need = pages_for(static_cast<std::size_t>(len), ps);
        if (need > p.max_pages)
            fail("block_table is too short for sequence " + str(b) + ": cache_seqlens[" + str(b) +
                 "] = " + std::to_string(len) + " keys need " + str(need) + " pages of " + str(ps) +
                 " rows, and a row has " + str(p.max_pages) + " (max_pages)");
        for (std::size_t i = 0; i < need; ++i) {
            const std::int32_t page = p.block_table[b * p.max_pages + i];
            if (page < 0 || static_cast<std::size_t>(page) >= p.num_pages)
                fail("block_table[" + str(b) + "][" + str(i) + "] = " + std::to_string(page) +
                     " is not a page of the pool (num_pages = " + str(p.num_pages) + "): sequence " + str(b) +
                     " reads it for its keys " + str(i * ps) + " onwards");
        }
    }
    if (p.cu_seqlens_q.empty()) {
        expect_size("q", p.q, {{"B", B}, {"q_len", p.q_len}, {"q_heads", p.q_heads}, {"d_qk", p.d_qk}});
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
        expect_size("q", p.q,
                    {{"total_q = cu_seqlens_q[B]", static_cast<std::size_t>(p.cu_seqlens_q[B])},
                     {"q_heads", p.q_heads},
                     {"d_qk", p.d_qk}});
    }
    validate_per_sequence_rules<T>(p);
}

template <class T>
basic_gathered_pages<T> gather(const basic_paged_problem<T>& p) {
    check_paged(p);
    const std::size_t B = p.cache_seqlens.size(), H = p.kv_heads, E = p.d_qk, Ev = p.d_v, ps = p.page_size;
    basic_gathered_pages<T> g;
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
        const auto len = static_cast<std::size_t>(p.cache_seqlens[b]);
        total_k += len;
        if (total_k > int32_limit) fail("the sequences' keys (the sum of cache_seqlens) exceed int32 offsets");
        g.cu_seqlens_k.push_back(static_cast<std::int32_t>(total_k));
        longest_k = std::max(longest_k, len);
        longest_q = std::max(longest_q, static_cast<std::size_t>(g.cu_seqlens_q[b + 1] - g.cu_seqlens_q[b]));
    }
    g.k.resize(checked_product({{"total keys", total_k}, {"kv_heads", H}, {"d_qk", E}}));
    g.v.resize(checked_product({{"total keys", total_k}, {"kv_heads", H}, {"d_v", Ev}}));
    // Key j of sequence b: row j % page_size of page block_table[b][j / page_size], all heads.
    std::size_t row = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t j = 0; j < static_cast<std::size_t>(p.cache_seqlens[b]); ++j, ++row) {
            const auto page = static_cast<std::size_t>(p.block_table[b * p.max_pages + j / ps]);
            const std::size_t at = page * ps + j % ps;
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
                 .q = p.q,
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

std::size_t batch_of(const paged_problem& problem) { return problem.cache_seqlens.size(); }
std::size_t batch_of(const paged_problem_f64& problem) { return problem.cache_seqlens.size(); }

basic_gathered_pages<float> gather_pages(const paged_problem& problem) { return gather(problem); }
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
