// qkv::vulkan::paged_call: the batched decode against a paged K/V pool on the device
// (qkv/runtime/paged.hpp, context::sdpa(paged_problem, kv_cache)) over device tensors: run, recorded
// into a sequence (qkv/vulkan/sequence.hpp), or into a caller's command buffer
// (qkv/vulkan/interop.hpp), so that a server records a whole batched step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "qkv/runtime/paged.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

class kv_cache;

/// The tensors and the batch of one paged_call run or recording. q (B, L, Hq, E), or with
/// cu_seqlens_q (total_q, Hq, E); out of the same layout with Ev; lse (Hq, total_q) where the
/// options return it (and only then); all f32. Where the description appends (new_rows > 0):
/// k_new (B, new_rows, Hkv, E) and v_new (B, new_rows, Hkv, Ev) of the pool's type (f32, f16, or
/// q8_0 / q4_0: ggml's blocks of 32 values along E, as kv_cache::append takes them, copied into
/// the pages as they are), written into the pool's pages first (append, then attend: paged.hpp).
/// A q8_0 / q4_0 pool takes no rotary embedding with appends (its keys would have to be turned
/// before they were quantized): refused when the call is made. The batch: this step's
/// block table (B x max_pages), cache_seqlens (B), cu_seqlens_q (empty: L = the description's
/// q_len), cache_batch_idx and cache_leftpad (B each, or empty), host data read (copied) when the
/// call is recorded or run; all five empty: the description's.
///
/// The block table may instead be a device tensor, block_table_tensor: i32 (qkv::element_type::i32)
/// of shape (B, max_pages), or (rows, max_pages) with cache_batch_idx, so that a server updates its
/// table on the device with no host round trip (the step's other spans as above; the host span
/// block_table must then be empty: both are refused). Its entries are read when the commands run
/// (a table written before them, on the device or by tensor::upload, takes effect), not when they
/// are recorded, so they cannot be checked before: the device checks every entry a sequence reads
/// or writes, the kernels clamp every page index into the pool (nothing is read outside it), an
/// append writes no row at all once an entry is bad, and the run (or the recording's check()) then
/// fails with qkv::invalid_argument naming the block table ("a page index past the pool"); the
/// output is then undefined. The host's refusal of two appends into one pool row has its device
/// counterpart: one table row and key twice is refused when the call is made, as ever, and two
/// table rows that name one page and send new rows to the same row of it are found when the
/// commands run (after the new rows are mapped to pool rows, each claims its row before any is
/// written, shaders/paged_claim.comp): no row is appended and the run (or check()) fails with
/// invalid_argument naming the block table, the page and the row ("the same row of the pool").
/// New rows at other rows of a shared page, and appends into a page that another sequence reads
/// (it then reads the new rows: append, then attend), are allowed, as on the host. Shared prefixes
/// are found in a host table, so a description with cascade is refused with a device table (set
/// cascade = false).
///
/// The lengths may likewise be a device tensor, cache_seqlens_tensor: i32 of shape (B), B the
/// step's sequences (the host span cache_seqlens must then be empty: both are refused), so that a
/// server advances its lengths on the device with no host round trip (the table, as a span or a
/// tensor, and the other spans as above; without them, the description's). Its values are read
/// when the commands run. The plan cannot depend on them: it is made for each sequence's bound,
/// its table row's keys less the new rows (max_pages x page_size - new_rows, its cache_leftpad as
/// given), and the device writes each sequence's keys, causal offset and rotary positions from its
/// length; the chunks past a length hold no keys and merge as nothing. What is lost is the
/// balance by length: the split-K plan cuts every sequence as if it ran to its bound (the chunk
/// size chosen for B bounds, the short sequences' chunks empty), so a batch of very unequal lengths
/// under large tables is slower than with host lengths (bench/RESULTS.md, the serving step's
/// "tensor lengths" form). The device checks every length (at least its cache_leftpad, at most the
/// bound) and the table entries the lengths reach, whether the table is a span or a tensor (a host
/// table's entries past a length are not checked before the run either); a bad length writes no
/// row at all and fails the run (or the recording's check()) with qkv::invalid_argument naming the
/// cache_seqlens tensor, a bad entry as above, two new rows into one pool row as above (found on the
/// device whether the table is a span or a tensor); the output is then undefined. Refused before the run
/// with device lengths: cascade (set cascade = false: shared prefixes are found from the lengths),
/// appends into a q8_0 / q4_0 pool, appends with a cache_batch_idx naming one table row twice, a
/// cache_leftpad past the bound, table rows of more than 2^30 keys, and rotary tables without a row
/// for every position a length up to the bound reaches (as the host call refuses them for its
/// lengths).
struct paged_tensors {
    const tensor* q = nullptr;
    tensor* out = nullptr;
    tensor* lse = nullptr;  ///< options.return_lse: each row's log-sum-exp
    const tensor* k_new = nullptr;
    const tensor* v_new = nullptr;
    std::span<const std::int32_t> block_table{};
    const tensor* block_table_tensor = nullptr;  ///< or the table on the device (i32): see above
    std::span<const std::int32_t> cache_seqlens{};
    const tensor* cache_seqlens_tensor = nullptr;  ///< or the lengths on the device (i32): see above
    std::span<const std::int32_t> cu_seqlens_q{};
    std::span<const std::int32_t> cache_batch_idx{};
    std::span<const std::int32_t> cache_leftpad{};
};

/// The batched paged decode against `pool` (a kv_cache of batch 1, as for
/// context::sdpa(paged_problem, kv_cache)), planned for a description and then run (or recorded)
/// many times over tensors: the same plan, kernels and bits as that host call.
class QKV_VULKAN_API paged_call {
public:
    /// `description`: the batch's shapes and options (q_heads, kv_heads, d_qk, d_v, page_size,
    /// max_pages, q_len, options, sinks, alibi_slopes, cascade, new_rows, rotary_dim, rotary_cos,
    /// rotary_sin, rotary_interleaved; num_pages 0: the pool's pages at each call), its q, k_pages,
    /// v_pages, k_new and v_new empty. Its block_table, cache_seqlens, cu_seqlens_q, cache_batch_idx
    /// and cache_leftpad may be empty, or a step the tensors may leave empty: then validated now
    /// against the pool, planned once and kept (copied). Its sinks, slopes and rotary tables are
    /// copied (the tables onto the device: q and the new keys are turned there). The pipelines of
    /// that step (if any) are built now. Throws
    /// qkv::invalid_argument and limit_exceeded as the host call would. The pool is kept by
    /// reference: it must outlive the call.
    ///
    /// A call that appends writes the pool when its commands run: recorded into a sequence, the
    /// pool is the sequence's until it runs (or is abandoned: nothing written); recorded into a
    /// caller's command buffer, the caller's until the recording's check() after its fence (or
    /// its destruction), as for record_append. Every other use of the pool meanwhile is refused.
    paged_call(context& ctx, const paged_problem& description, kv_cache& pool);
    ~paged_call();
    paged_call(paged_call&&) noexcept;
    paged_call& operator=(paged_call&&) noexcept;
    paged_call(const paged_call&) = delete;
    paged_call& operator=(const paged_call&) = delete;

    /// Runs over `tensors` on the context's queue and waits. Every refusal comes before anything is
    /// recorded (but a bad entry of a block table tensor: after the run, see paged_tensors): the
    /// batch validated against the pool's pages (qkv::invalid_argument: a page index
    /// past the pool, a table too short, ...; nothing written), the tensors' shapes and types and
    /// their aliasing (invalid_argument; q8_0 / q4_0 new rows are copied by transfer commands, so a
    /// wrapped k_new or v_new needs VK_BUFFER_USAGE_TRANSFER_SRC_BIT), the device's limits
    /// (limit_exceeded). The overflow rule
    /// as for sdpa_call: q's norms checked on the device, K's and V's from the pool's statistics
    /// (numeric_overflow, after the run).
    void run(const paged_tensors& tensors);

    struct impl;

private:
    friend struct paged_call_access;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
