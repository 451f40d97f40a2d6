// Batched decode against a paged K/V cache: FlashAttention's flash_attn_with_kvcache with a
// block_table (vLLM's paged attention). K and V live in one pool of pages of `page_size` rows;
// sequence b's keys are the first cache_seqlens[b] rows of the pages its row of the block table
// lists, in order:
//
//   k_pages  num_pages x page_size x kv_heads x d_qk   (num_pages, page_size, Hkv, E)
//   v_pages  num_pages x page_size x kv_heads x d_v    (num_pages, page_size, Hkv, Ev)
//   block_table  B x max_pages int32 page indices      key j of sequence b is row j % page_size of
//                                                      page block_table[b][j / page_size]
//   cache_seqlens  B int32                             S_b, sequence b's keys
//   q  B x q_len x q_heads x d_qk                      (B, L, Hq, E): one L for every sequence, as
//                                                      flash_attn_with_kvcache; or, with
//                                                      cu_seqlens_q (B + 1 offsets), the ragged
//                                                      form (total_q, Hq, E) of varlen.hpp
//   sinks, alibi_slopes  q_heads                       optional, as varlen.hpp's
//   output  total_q x q_heads x d_v                    (B, L, Hq, Ev) for one L (total_q = B·L)
//   lse     q_heads x total_q                          on request, as varlen.hpp's
//
// Sequence b is the SDPA problem of qkv/runtime/sdpa.hpp with shape (1, Hq, Hkv, L_b, S_b, E, Ev),
// its queries and its keys and values gathered from its pages, with the same options, sinks and
// slopes: exactly sequence b of the ragged batch (varlen.hpp) whose k and v are the gathered rows,
// which is how the float64 reference computes it (gather_pages, then qkv::cpu::sdpa of each
// sequence). The causal rule, the window and ALiBi's distances are each sequence's own: with
// alignment bottom_right (flash_attn_with_kvcache's) the L_b queries are the last L_b positions of
// the S_b keys. Pages may be shared between sequences (a common prompt) and listed in any order;
// entries of a row past the pages its length needs are not read. A sequence with no queries adds
// no rows; one with queries and no keys gets zeros and lse = -inf. No masks, no weights, no dropout
// (the capability table's rows for these entry points say why).
//
// flash_attn_with_kvcache's appends, rotary embedding, cache_batch_idx and cache_leftpad:
//
//   k_new, v_new  B x new_rows x kv_heads x d_qk / d_v   written first, row i of sequence b as its key
//                                                      cache_seqlens[b] + i (through its pages); then
//                                                      every sequence attends (append, then attend)
//   rotary_cos, rotary_sin  rotary_rows x rotary_dim/2   optional (with new rows): the new keys and q
//                                                      turned at their positions (rotate_rows below)
//   cache_batch_idx  B int32                           optional: sequence b's row of the block table
//                                                      (the table then has any number of rows)
//   cache_leftpad  B int32                             optional: sequence b's keys start at key
//                                                      cache_leftpad[b] <= cache_seqlens[b]
//
// Sequence b's keys are then keys cache_leftpad[b] .. cache_seqlens[b] + new_rows - 1 of its pages
// (its S_b is their count, its positions count from the first of them), every append of the batch
// written before any sequence reads: where pages are shared, a sequence reads the rows another one
// appended. Two appends into the same row of the pool are refused. With options.kv_type, every key
// and value a sequence reads, the new ones included (each key after its rotary embedding), is
// stored as kv_type row by row (qkv::round_trip): what a q8_0 / q4_0 device pool holds after the
// append, whose new rows are quantized by qkv::quantize as kv_cache::append quantizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "qkv/runtime/export.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/runtime/varlen.hpp"

namespace qkv {

/// The largest page size: pages of 1 to this many rows, any power of two.
inline constexpr std::size_t max_page_size = 1024;

/// A batch of sequences decoding against one pool of K/V pages, over host data of element type T
/// (float; double for the CPU backend's float64 path). Spans are read during the call only.
template <class T>
struct basic_paged_problem {
    std::size_t q_heads = 1;                        ///< Hq
    std::size_t kv_heads = 1;                       ///< Hkv, divides q_heads
    std::size_t d_qk = 0;                           ///< E
    std::size_t d_v = 0;                            ///< Ev
    std::size_t page_size = 16;                     ///< rows per page: a power of two from 1 to max_page_size
    std::size_t num_pages = 0;                      ///< pages in the pool, at least 1
    std::span<const T> k_pages{}, v_pages{};        ///< the pool (num_pages, page_size, Hkv, E / Ev)
    std::size_t max_pages = 0;                      ///< columns of the block table, at least 1
    std::span<const std::int32_t> block_table{};    ///< B x max_pages page indices (row-major)
    std::span<const std::int32_t> cache_seqlens{};  ///< B keys per sequence, each >= 0
    /// L, every sequence's queries, when cu_seqlens_q is empty (q is then (B, L, Hq, E)).
    std::size_t q_len = 1;
    /// Empty, or B + 1 nondecreasing offsets from 0 (q is then (total_q, Hq, E)): the ragged form.
    std::span<const std::int32_t> cu_seqlens_q{};
    std::span<const T> q{};
    sdpa_options options{};
    std::span<const T> sinks{};         ///< empty, or one logit per query head
    std::span<const T> alibi_slopes{};  ///< empty, or one ALiBi slope per query head
    /// Shared prefixes (cascade attention), an execution strategy of the Vulkan backend's call
    /// against a device pool: sequences whose block tables begin with the same whole pages, every
    /// key of which all their query rows see, attend those pages once per group and merge with
    /// their own keys by log-sum-exp. The result is the same up to rounding (and equal inputs give
    /// equal bits either way); false attends each sequence over all its keys (for measurements).
    bool cascade = true;

    // ---- appends and FlashAttention's rotary embedding, cache_batch_idx, cache_leftpad ----
    std::size_t new_rows = 0;                         ///< rows appended to every sequence before the attention
    std::span<const T> k_new{}, v_new{};              ///< (B, new_rows, Hkv, E) and (B, new_rows, Hkv, Ev)
    std::size_t rotary_dim = 0;                       ///< 0: no rotary embedding; else even, at most d_qk
    std::span<const T> rotary_cos{}, rotary_sin{};    ///< (rotary_rows, rotary_dim / 2) each
    bool rotary_interleaved = true;                   ///< pairs (0, 1), (2, 3), ...; false: (j, j + rotary_dim / 2)
    std::span<const std::int32_t> cache_batch_idx{};  ///< empty, or B rows of the block table
    std::span<const std::int32_t> cache_leftpad{};    ///< empty, or B first keys
};
using paged_problem = basic_paged_problem<float>;
using paged_problem_f64 = basic_paged_problem<double>;

/// Throws qkv::invalid_argument naming the input when the problem is not well-formed: a page size
/// that is not a power of two from 1 to max_page_size, no pages or no table columns, pools whose
/// sizes do not fit (num_pages, page_size, Hkv, E / Ev), no sequences, a block table of other than
/// B x max_pages entries, a negative length or one that needs more pages than a row has, a page
/// index a sequence reads that is negative or past the pool, a q that does not fit its layout,
/// cu_seqlens_q not B + 1 offsets from 0 nondecreasing, a size product that overflows; new rows
/// whose k_new / v_new do not fit (B, new_rows, Hkv, E / Ev), or that need pages past a row's
/// columns or the pool (every page a sequence reads or writes is checked); a rotary_dim that is odd
/// or past d_qk, or without new rows, rotary_cos / rotary_sin not (rows, rotary_dim / 2) alike or
/// too short for the positions the call reaches; a cache_batch_idx not B rows of the table; a
/// cache_leftpad not B values in [0, cache_seqlens[b]]; the head counts, widths, options, sinks and
/// slopes as validate(varlen_problem). (Two new rows bound for one pool row: resolve_pages.)
QKV_RUNTIME_API void validate(const paged_problem& problem);
QKV_RUNTIME_API void validate(const paged_problem_f64& problem);
/// The checks of validate() for a pool kept elsewhere (a device's: context::sdpa with a kv_cache
/// pool): k_pages and v_pages empty, num_pages the pages that pool holds; the rest as validate().
QKV_RUNTIME_API void validate_without_pool(const paged_problem& problem);
/// The same for a batch whose q, k_new and v_new are device tensors too (a paged_call's step):
/// they are empty, their shapes the call's to check; the rest as validate_without_pool().
QKV_RUNTIME_API void validate_without_data(const paged_problem& problem);

/// The one definition of where things are, shared by the float64 reference and the device: the
/// block table row of sequence b (cache_batch_idx[b], or b), its first key (cache_leftpad[b], or 0),
/// its keys after the append (cache_seqlens[b] + new_rows), the pool row (page x page_size + row in
/// page) of its key j, and the rotary positions of its new key i (cache_seqlens[b] + i) and of its
/// query row i (cache_seqlens[b] + i when the problem is causal or has a window, else
/// cache_seqlens[b]: FlashAttention's rule). For a validated problem.
template <class T>
[[nodiscard]] std::size_t paged_table_row(const basic_paged_problem<T>& p, std::size_t b) {
    return p.cache_batch_idx.empty() ? b : static_cast<std::size_t>(p.cache_batch_idx[b]);
}
template <class T>
[[nodiscard]] std::size_t paged_first_key(const basic_paged_problem<T>& p, std::size_t b) {
    return p.cache_leftpad.empty() ? 0 : static_cast<std::size_t>(p.cache_leftpad[b]);
}
template <class T>
[[nodiscard]] std::size_t paged_end_key(const basic_paged_problem<T>& p, std::size_t b) {
    return static_cast<std::size_t>(p.cache_seqlens[b]) + p.new_rows;
}
template <class T>
[[nodiscard]] std::size_t paged_pool_row(const basic_paged_problem<T>& p, std::size_t b, std::size_t j) {
    const auto page = static_cast<std::size_t>(p.block_table[paged_table_row(p, b) * p.max_pages + j / p.page_size]);
    return page * p.page_size + j % p.page_size;
}
template <class T>
[[nodiscard]] std::size_t paged_rotary_position(const basic_paged_problem<T>& p, std::size_t b, std::size_t i,
                                                bool query) {
    const bool moving = p.options.causal || p.options.window_left >= 0 || p.options.window_right >= 0;
    return static_cast<std::size_t>(p.cache_seqlens[b]) + (!query || moving ? i : 0);
}

/// FlashAttention's rotary embedding of `rows` rows of `heads` x `width` values at `positions`
/// (one per row): the first rotary_dim values of each head's row turned by the angles of row
/// positions[r] of rotary_cos and rotary_sin, pairs (x[2j], x[2j+1]) when interleaved, else
/// (x[j], x[j + rotary_dim / 2]); x' = x1·cos − x2·sin, y' = x1·sin + x2·cos in T's precision.
template <class T>
void rotate_rows(const basic_paged_problem<T>& p, std::span<T> x, std::size_t rows, std::size_t heads,
                 std::size_t width, std::span<const std::size_t> positions) {
    const std::size_t half = p.rotary_dim / 2;
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t h = 0; h < heads; ++h) {
            T* row = x.data() + (r * heads + h) * width;
            const T* c = p.rotary_cos.data() + positions[r] * half;
            const T* s = p.rotary_sin.data() + positions[r] * half;
            for (std::size_t j = 0; j < half; ++j) {
                const std::size_t a = p.rotary_interleaved ? 2 * j : j, z = p.rotary_interleaved ? 2 * j + 1 : j + half;
                const T x1 = row[a], x2 = row[z];
                row[a] = x1 * c[j] - x2 * s[j];
                row[z] = x1 * s[j] + x2 * c[j];
            }
        }
}

/// A paged problem with its appends resolved, for a pool kept elsewhere or gathered here: q (and
/// the new keys) rotated, the new rows per K/V head (Hkv, B·new_rows, E / Ev) with the pool row
/// each goes to, and `problem`, the same attention without appends, rotary or cache_batch_idx (its
/// block table B x max_pages, its lengths the ones after the append, cache_leftpad kept). Owns what
/// its problem views but the pool, sinks and slopes; not copyable, movable.
template <class T>
struct basic_resolved_pages {
    std::vector<std::int32_t> block_table, cache_seqlens;
    std::vector<T> q, k_rows, v_rows;
    std::vector<std::size_t> rows_at;  ///< the pool row of each new row (B·new_rows, sequence-major)
    basic_paged_problem<T> problem;

    basic_resolved_pages() = default;
    basic_resolved_pages(const basic_resolved_pages&) = delete;
    basic_resolved_pages& operator=(const basic_resolved_pages&) = delete;
    basic_resolved_pages(basic_resolved_pages&&) noexcept = default;
    basic_resolved_pages& operator=(basic_resolved_pages&&) noexcept = default;
};
/// Validates the problem (with its pool, or, `with_pool` false, as validate_without_pool), then
/// resolves it. Refuses (qkv::invalid_argument) two new rows bound for one row of the pool.
[[nodiscard]] QKV_RUNTIME_API basic_resolved_pages<float> resolve_pages(const paged_problem& problem,
                                                                        bool with_pool = true);
[[nodiscard]] QKV_RUNTIME_API basic_resolved_pages<double> resolve_pages(const paged_problem_f64& problem,
                                                                         bool with_pool = true);
/// The same for a batch whose q and new rows are device tensors (a paged_call's step, validated as
/// validate_without_data: q, k_new and v_new empty): the table, the lengths and the new rows' pool
/// rows (rows_at) resolved, no rows copied or rotated (q, k_rows and v_rows empty: the device's).
/// `table_here` false: the block table is on the device too (a paged_call's table tensor), its
/// entries neither checked nor read here (problem.block_table gives its size: any entries); the
/// resolved table's entries are then those placeholders, and each rows_at is the new row's key in
/// the resolved table instead (b · max_pages · page_size + key), which the device maps through its
/// table. Two new rows of one table row and key are refused as ever.
[[nodiscard]] QKV_RUNTIME_API basic_resolved_pages<float> resolve_pages_without_data(const paged_problem& problem,
                                                                                     bool table_here = true);

/// B, the number of sequences (cache_seqlens.size()).
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const paged_problem_f64& problem);

/// A paged batch as the ragged batch (varlen.hpp) of its sequences: each sequence's keys and values
/// gathered from its pages into packed k and v, its queries as given. Owns what its problem views;
/// not copyable, movable.
template <class T>
struct basic_gathered_pages {
    std::vector<std::int32_t> cu_seqlens_q, cu_seqlens_k;
    std::vector<T> k, v, q;  ///< q: the rotated queries (empty: the problem's q, as given)
    basic_varlen_problem<T> problem;

    basic_gathered_pages() = default;
    basic_gathered_pages(const basic_gathered_pages&) = delete;
    basic_gathered_pages& operator=(const basic_gathered_pages&) = delete;
    basic_gathered_pages(basic_gathered_pages&&) noexcept = default;
    basic_gathered_pages& operator=(basic_gathered_pages&&) noexcept = default;
};
/// Validates the problem, then gathers it: with appends, from a copy of the pool with every new row
/// written (the caller's pool is not written: it is const). The result views the problem's q (its
/// own rotated copy with a rotary embedding), sinks and slopes.
[[nodiscard]] QKV_RUNTIME_API basic_gathered_pages<float> gather_pages(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API basic_gathered_pages<double> gather_pages(const paged_problem_f64& problem);

}  // namespace qkv
