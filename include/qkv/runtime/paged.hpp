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
};
using paged_problem = basic_paged_problem<float>;
using paged_problem_f64 = basic_paged_problem<double>;

/// Throws qkv::invalid_argument naming the input when the problem is not well-formed: a page size
/// that is not a power of two from 1 to max_page_size, no pages or no table columns, pools whose
/// sizes do not fit (num_pages, page_size, Hkv, E / Ev), no sequences, a block table of other than
/// B x max_pages entries, a negative length or one that needs more pages than a row has, a page
/// index a sequence reads that is negative or past the pool, a q that does not fit its layout,
/// cu_seqlens_q not B + 1 offsets from 0 nondecreasing, a size product that overflows; the head
/// counts, widths, options, sinks and slopes as validate(varlen_problem).
QKV_RUNTIME_API void validate(const paged_problem& problem);
QKV_RUNTIME_API void validate(const paged_problem_f64& problem);
/// The checks of validate() for a pool kept elsewhere (a device's: context::sdpa with a kv_cache
/// pool): k_pages and v_pages empty, num_pages the pages that pool holds; the rest as validate().
QKV_RUNTIME_API void validate_without_pool(const paged_problem& problem);

/// B, the number of sequences (cache_seqlens.size()).
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::size_t batch_of(const paged_problem_f64& problem);

/// A paged batch as the ragged batch (varlen.hpp) of its sequences: each sequence's keys and values
/// gathered from its pages into packed k and v, its queries as given. Owns what its problem views;
/// not copyable, movable.
template <class T>
struct basic_gathered_pages {
    std::vector<std::int32_t> cu_seqlens_q, cu_seqlens_k;
    std::vector<T> k, v;
    basic_varlen_problem<T> problem;

    basic_gathered_pages() = default;
    basic_gathered_pages(const basic_gathered_pages&) = delete;
    basic_gathered_pages& operator=(const basic_gathered_pages&) = delete;
    basic_gathered_pages(basic_gathered_pages&&) noexcept = default;
    basic_gathered_pages& operator=(basic_gathered_pages&&) noexcept = default;
};
/// Validates the problem, then gathers it. The result views the problem's q, sinks and slopes.
[[nodiscard]] QKV_RUNTIME_API basic_gathered_pages<float> gather_pages(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API basic_gathered_pages<double> gather_pages(const paged_problem_f64& problem);

}  // namespace qkv
