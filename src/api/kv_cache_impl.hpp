// The inside of qkv::vulkan::kv_cache (kv_cache.cpp), for the planned calls that decode against a
// cache or append to it (sdpa_call.cpp). Private to src/.
#pragma once

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "api/device_core.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/sdpa_decode.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/runtime/paged.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

struct kv_cache::impl {
    std::shared_ptr<detail::device_core> core;  // declared first: outlives the buffers below
    kv_layout layout{};
    std::uint32_t e4 = 0, ev4 = 0;
    VkFormat format = VK_FORMAT_R32G32B32A32_SFLOAT;
    std::uint64_t texel_bytes = 16;
    tensor k, v;  // the storage (qkv's, or a caller's) of an f32 / f16 cache
    detail::buffer_view k_view, v_view;
    element_type type = element_type::f32;           // layout.type
    detail::buffer k_blocks, v_blocks;               // the storage of a q8_0 / q4_0 cache: rows of ggml's blocks
    std::uint64_t k_row_bytes = 0, v_row_bytes = 0;  // bytes of one stored row of K and of V
    // Guarded by core->mutex:
    std::size_t size = 0;
    /// The overflow rule's facts of every row appended (sdpa_guard.hpp's guard_words with no q
    /// groups), host-visible: host appends fold theirs in, device appends (tensors) run the guard's
    /// rows pass into it.
    detail::buffer stats;
    detail::buffer staging;      // the upload staging where the storage is not mapped
    bool force_staging = false;  // testing::hooks::force_staging: host appends as if it were not
    /// The sequence (its sequence::impl), or the caller's command buffer (its VkCommandBuffer),
    /// holding a recorded append to this cache not known to have run: until it has, `size` counts
    /// rows not yet written, so every use of the rows from elsewhere waits (one rule for both).
    const void* pending_in = nullptr;
    /// For a command buffer: its append recordings not yet known complete, the size before the
    /// first, and a generation that tells them from an earlier command buffer's.
    std::size_t pending_count = 0;
    std::size_t pending_before = 0;
    std::uint64_t pending_generation = 0;

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl();

    [[nodiscard]] std::size_t groups() const { return layout.batch * layout.kv_heads; }
    [[nodiscard]] bool half() const { return type == element_type::f16; }
    [[nodiscard]] bool blocks() const { return is_quantized(type); }
    /// Storage past maxStorageBufferRange (tensor::impl::texels_only): read only through the
    /// texel views; keys(), values() and appends of device tensors refuse it.
    [[nodiscard]] bool texels_only() const { return !blocks() && tensor_access::of(k, "kv_cache").texels_only; }
    [[nodiscard]] detail::cache_desc desc() const {
        return {static_cast<std::uint32_t>(layout.capacity), type, texels_only()};
    }
    /// An f16 cache's K and V as float16 rows in storage (the cooperative-matrix decode; none for a
    /// texels-only cache, whose plan does not take that family); q unset.
    [[nodiscard]] detail::decode_rows rows() const;
    /// The statistics as the host reads them (call with the lock held, the device idle).
    [[nodiscard]] detail::kv_stats read_stats() const;
    /// Whether every K and V element of the rows appended is finite, from the statistics' flags
    /// word (the lock held; final only where no append is pending: pending_in null).
    [[nodiscard]] bool rows_finite() const;
    /// Refuses (qkv::invalid_argument; the lock held) a use of the rows by `what` while a sequence
    /// other than `by` (null: none) holds a recorded append to this cache that has not run.
    void check_ready(const char* what, const void* by) const;
    /// check_ready, then refuses (limit_exceeded) `rows` more than the room left: nothing done.
    void check_room(std::size_t rows, const char* what, const void* by) const;
    /// The start of every append: the device's lock taken, the device alive, check_room. Every
    /// check against the size and every write happen under the lock, so concurrent appends both
    /// fit or one is refused with nothing appended.
    [[nodiscard]] std::unique_lock<std::mutex> lock_for_append(std::size_t rows, const char* what,
                                                               const void* by) const;
    /// The checks of an append of device tensors (the lock held), before anything is recorded:
    /// k and v of the cache's type and shapes, on its device, not over its storage.
    [[nodiscard]] std::pair<const tensor::impl*, const tensor::impl*> check_append(const tensor& k, const tensor& v,
                                                                                   std::size_t rows) const;
    /// Records an append of device tensors of the cache's type (the lock held, `rows` checked): the
    /// guard's rows pass into `stats`, then K and V packed into their rows (texels), or their blocks
    /// copied (q8_0, q4_0: their values read as float32 into `scratch` for the guard first, which
    /// must live until the commands have run). Grows `size`.
    void record_append(detail::recorder& rec, const tensor& k, const tensor& v, std::size_t rows,
                       detail::buffer& scratch);
    /// The one check of a paged batch against this cache as its pool (the lock held, with the rows
    /// it holds now): batch 1 and the batch's kv_heads, d_qk and d_v (invalid_argument), a type
    /// the paged kernel reads (limit_exceeded), num_pages at most the whole pages held (0: those),
    /// then the batch validated (validate_without_pool, or with `data` false
    /// validate_without_data). Returns the batch with its num_pages.
    [[nodiscard]] paged_problem check_pool(const paged_problem& given, bool data) const;
    /// The pool as the paged kernels bind it (the lock held); `stats` as the caller read them.
    [[nodiscard]] detail::paged_pool pool(const detail::kv_stats* stats) const;
    /// The pool's K and V storage as the paged append writes it (an f32 / f16 pool within
    /// maxStorageBufferRange; the lock held): 32-bit words from an aligned offset, and the word of
    /// row 0 of each, into `p`.
    void bind_stores(detail::paged_pool& p) const;
};

struct kv_cache_access {
    static std::shared_ptr<kv_cache::impl> of(const kv_cache& c);
};

}  // namespace qkv::vulkan
