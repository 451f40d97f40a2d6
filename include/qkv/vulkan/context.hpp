// qkv::vulkan — attention on any Vulkan GPU (or Mesa's lavapipe on a CPU).
//
//   qkv::vulkan::context ctx;                  // loads Vulkan, picks the best device
//   qkv::attention_output r = ctx.attention(problem);
//
// The library does not link against libvulkan: it loads the Vulkan loader when the first context
// (or list_devices) needs it, and throws qkv::vulkan::unavailable if there is none.
//
// Thread safety: a context may be shared by any number of threads. Calls on one context are
// serialised (one queue, one set of reusable buffers); use one context per thread to overlap
// host work. Different contexts are independent.
//
// Lifetime: a moved-from context holds nothing; every call on it throws qkv::error ("used after
// move"), and destroying it is safe. The device itself is shared by the context and the kv_caches
// made from it, and lives until the last of them is gone.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/runtime/paged.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/runtime/varlen.hpp"
#include "qkv/vulkan/device_info.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

class kv_cache;

struct instance_options {
    /// Enable the Khronos validation layer (with synchronisation validation) and collect its
    /// messages; throws unavailable if the layer is not installed. Also on with QKV_VALIDATION=1.
    bool validation = false;
};

/// The Vulkan devices of this machine, in vkEnumeratePhysicalDevices order.
/// Throws unavailable when there is no Vulkan loader or no driver.
QKV_VULKAN_API std::vector<device_info> list_devices(const instance_options& options = {});

/// Index into `devices` of the one a context would pick with `selector` (see context_options::device);
/// throws unavailable when none matches or none can compute.
QKV_VULKAN_API std::size_t select_device(const std::vector<device_info>& devices,
                                         const std::optional<std::string>& selector);

struct context_options {
    /// Which device: a decimal index, or a case-insensitive substring of the device name.
    /// Unset: the QKV_DEVICE environment variable, else the best device (discrete > integrated >
    /// virtual > CPU > other; ties by memory, then enumeration order).
    std::optional<std::string> device{};
    bool validation = false;  ///< see instance_options::validation

    /// Caps the device memory this context may hold (bytes; 0 = the device heap). An allocation
    /// beyond it fails with out_of_memory as VK_ERROR_OUT_OF_DEVICE_MEMORY would. For tests and
    /// for sharing a GPU politely.
    std::uint64_t device_memory_limit = 0;
};

/// Per-call timing of a host call (context::attention, context::sdpa).
struct call_stats {
    double host_ms = 0;    ///< host call to result, whole call
    double device_ms = 0;  ///< GPU time of the whole command buffer (timestamps), 0 if unsupported
    /// GPU time of each phase (0 without timestamps): the Q|K|V projection; the attention itself
    /// (scores, softmax and aggregation, or the fused kernel); the output projection (0 if none).
    double projection_ms = 0, attention_ms = 0, output_projection_ms = 0;
    /// context::sdpa_backward: the parts of attention_ms spent in the dq kernel and in the dk/dv
    /// kernel (the rest packs the inputs, computes the row statistics and folds broadcast
    /// gradients); 0 for other calls, without timestamps, and where the fused order runs in
    /// several chunks of heads (its two kernels take turns chunk by chunk).
    double backward_dq_ms = 0, backward_dkdv_ms = 0;
    std::uint64_t device_bytes = 0;  ///< device memory held by the context after the call
    /// Whether the range check of the projected Q, K, V ran on the device (README, Guarantees):
    /// false where the host proved from the inputs alone that nothing can overflow.
    bool device_range_check = false;
};

class QKV_VULKAN_API context {
public:
    explicit context(const context_options& options = {});
    ~context();
    context(context&&) noexcept;
    context& operator=(context&&) noexcept;
    context(const context&) = delete;
    context& operator=(const context&) = delete;

    /// Throws qkv::error on a moved-from context (as every call below does).
    [[nodiscard]] const device_info& device() const;

    /// Runs the attention. Validates first (qkv::invalid_argument), then checks device limits
    /// (limit_exceeded), then records every stage of every batch element and head into one
    /// command buffer and submits it once.
    [[nodiscard]] attention_output attention(const attention_problem& problem);

    /// scaled_dot_product_attention over Q, K and V the caller holds (qkv/runtime/sdpa.hpp):
    /// cross-attention (q_len != kv_len), grouped-query heads, broadcast masks, both causal
    /// alignments. Validates first (qkv::invalid_argument), then checks device limits
    /// (limit_exceeded); records everything into one command buffer and submits it once.
    [[nodiscard]] sdpa_output sdpa(const sdpa_problem& problem);

    /// scaled_dot_product_attention of host q against the keys and values held in `cache`
    /// (qkv/vulkan/kv_cache.hpp), created from this context: problem.k and problem.v stay empty;
    /// problem.shape.kv_len is 0 (then it is cache.size()) or equal to cache.size(); batch,
    /// kv_heads, d_qk and d_v must match the cache's. K and V are stored in the cache's precision
    /// (options.precision is not used). Runs the split-S decode kernels (flash-decoding: the keys
    /// are cut into chunks that run in parallel, and the partial results are merged in a fixed
    /// order, so equal inputs give identical bits); causal (both alignments) and masks are
    /// supported; return_weights is not (qkv::invalid_argument).
    [[nodiscard]] sdpa_output sdpa(const sdpa_problem& problem, const kv_cache& cache);

    /// The backward pass of sdpa(problem.forward) (qkv/runtime/sdpa_backward.hpp): the gradients
    /// of q, k, v (and of the sinks and, with return_d_additive_mask, the additive mask) from the
    /// loss's gradient d_out and the forward's saved out and lse (empty: the forward runs first,
    /// here), FlashAttention-2's algorithm in float32 on the device, deterministic (the same inputs
    /// give the same bits). Validates first (qkv::invalid_argument), then checks device limits
    /// (limit_exceeded); throws qkv::invalid_argument where out and lse are not this problem's
    /// forward results (within 1 %, as qkv::cpu::sdpa_backward), and numeric_overflow where a
    /// gradient left float32's range though every input was finite.
    [[nodiscard]] sdpa_gradients sdpa_backward(const sdpa_backward_problem& problem);
    /// scaled_dot_product_attention over a ragged batch the caller holds (qkv/runtime/varlen.hpp:
    /// FlashAttention's flash_attn_varlen_func). Validates first (qkv::invalid_argument), then
    /// asks the capability table; each sequence is planned as its own sdpa problem (the route and
    /// family of its shape: split-S decode for a few queries against many keys, else the fused
    /// kernels) and checked before anything is recorded; they are recorded into one command buffer
    /// (up to 64 sequences per command buffer), each over its own buffers (kept by the context
    /// between calls, released by trim()), with one submit per command buffer.
    /// A sequence with no queries runs nothing; one with no keys none either (zeros, lse -inf).
    [[nodiscard]] varlen_output sdpa(const varlen_problem& problem);
    /// A batch decoding against a paged K/V pool the caller holds on the host
    /// (qkv/runtime/paged.hpp: flash_attn_with_kvcache with a block_table). Validates first
    /// (qkv::invalid_argument: page sizes, page indices past the pool, tables too short), then asks
    /// the capability table; each sequence's rows are gathered from its pages on the host
    /// (gather_pages) and the ragged batch of the sequences runs as sdpa(varlen_problem) above. The
    /// output and lse are laid out as that ragged batch's.
    [[nodiscard]] varlen_output sdpa(const paged_problem& problem);
    /// The same batch against a pool kept on the device: `pool`, a kv_cache created from this
    /// context of batch 1, the problem's kv_heads, d_qk and d_v, of any type (f32, f16, q8_0, q4_0:
    /// a quantized pool's blocks are dequantized as the decode against a cache does), whose rows are the
    /// pages' rows in page order (page p is rows p·page_size .. p·page_size + page_size - 1 of each
    /// K/V head; append them with kv_cache::append as (1, Hkv, rows, E)). problem.k_pages and
    /// v_pages stay empty; problem.num_pages is 0 (then it is pool.size() / page_size) or at most
    /// that. Validates first (qkv::invalid_argument: as above, and page indices past the pages the
    /// pool holds, nothing run), then asks the capability table. Runs the batched paged decode in
    /// one command buffer: one plan balances the split-K work by length over every sequence
    /// (a long sequence is cut into chunks that run in parallel beside the short ones), one dispatch
    /// reads each sequence's keys through the block table, and the partial results of each row are
    /// merged in a fixed order, so equal inputs give identical bits. K and V are the pool's type
    /// (options.precision and options.kv_type are not used; q is read in float32). Head widths up
    /// to 128; limit_exceeded past the device's limits. A problem with new rows (new_rows > 0) needs
    /// the overload below (qkv::invalid_argument here: this pool is const); cache_batch_idx and
    /// cache_leftpad are taken as there.
    [[nodiscard]] varlen_output sdpa(const paged_problem& problem, const kv_cache& pool);
    /// The same, appending first, as flash_attn_with_kvcache(k=, v=) does: problem.k_new and v_new
    /// (B, new_rows, Hkv, E / Ev) are written into `pool` at each sequence's keys cache_seqlens[b]
    /// onwards, through its pages (rotated by rotary_cos / rotary_sin first, as q is), then every
    /// sequence attends its keys cache_leftpad[b] .. cache_seqlens[b] + new_rows - 1, all in one
    /// command buffer. Everything is checked before anything is written: qkv::invalid_argument for a
    /// table running past the pool, an append overflowing a sequence's pages, two appends into one
    /// row; numeric_overflow for an f16 pool and a new value beyond float16's range;
    /// qkv::invalid_argument for a q8_0 / q4_0 pool and a new value qkv::quantize refuses (NaN,
    /// infinite, a block whose scale does not fit float16), as kv_cache::append refuses it; and
    /// limit_exceeded for an f32 / f16 pool past maxStorageBufferRange (its rows are written as a
    /// storage buffer). A q8_0 / q4_0 pool's new rows are quantized on the host by qkv::quantize
    /// (after the rotary embedding), the same blocks kv_cache::append writes for those rows. The pool's
    /// size() does not change: the new rows go into pages it holds. The caller keeps the problem's
    /// cache_seqlens (FlashAttention's caller adds new_rows after the call).
    [[nodiscard]] varlen_output sdpa(const paged_problem& problem, kv_cache& pool);

    /// Statistics of the last successful attention() or sdpa() call on this context.
    [[nodiscard]] call_stats last_call() const;

    /// Device memory currently allocated by this context, and the most it held at once since
    /// creation or reset_peak(), in bytes.
    [[nodiscard]] std::uint64_t device_memory_allocated() const;
    [[nodiscard]] std::uint64_t peak_device_memory() const;
    void reset_peak();

    /// Releases the cached buffers (they are reallocated on demand).
    void trim();

    /// Validation-layer messages collected since the last call (then cleared). Empty unless
    /// validation is on.
    [[nodiscard]] std::vector<std::string> take_validation_messages();

    struct impl;

private:
    friend class kv_cache;
    friend class tensor;
    friend class sdpa_call;
    friend struct context_access;  // the library's inside (qkv/vulkan/testing.hpp's contexts too)
    explicit context(std::unique_ptr<impl> i) noexcept;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
