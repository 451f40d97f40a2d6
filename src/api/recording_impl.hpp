// The inside of qkv::vulkan::recording: what one recorded (or run) call owns until its commands
// have completed, and what its check() needs. Private to src/.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "api/device_core.hpp"
#include "api/kv_cache_impl.hpp"
#include "kernels/flash_backward.hpp"
#include "kernels/flash_cpu.hpp"
#include "plan/attention_plan.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/vulkan/interop.hpp"
#include "run/io.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

struct recording::impl : detail::retired {
    /// The word the recorded commands write last into `marker`; anything else: not completed.
    static constexpr std::uint32_t done_word = 0x51c0d0e5u;

    std::shared_ptr<detail::device_core> core;       // declared first: outlives the rest
    std::unique_ptr<detail::external_recorder> rec;  // its descriptor sets (a caller's command buffer)
    detail::run_buffers buffers;                     // the call's scratch
    detail::buffer guard;                            // the overflow rule's device words (host-visible)
    detail::buffer scratch;                          // a quantized append's rows as float32
    /// A recording into a caller's command buffer: one word, done_word once every command recorded
    /// has completed (written last, by the device), whatever else before.
    detail::buffer marker;
    /// An append recording: the command buffer it is in (the key of the cache's pending_in) and the
    /// cache's pending generation it belongs to; settled once its completion or undoing is known.
    VkCommandBuffer appended_in = VK_NULL_HANDLE;
    std::uint64_t append_generation = 0;
    bool settled = false;
    /// check() has seen the word say done (after the caller's fence, as its contract says): the
    /// recording may be released at once when it goes.
    mutable bool seen_complete = false;
    /// The caller's fence of the submit (recording::completes_with): completed only once it is
    /// signalled too. Forgotten when the recording is retired (the caller may destroy it then).
    VkFence fence = VK_NULL_HANDLE;
    std::vector<detail::buffer_view> views;
    detail::flash_cpu_views flash_views;
    // What check() needs:
    bool checks = false;
    sdpa_shape shape{};
    float scale = 1.0f;
    bool fp16 = false;
    detail::additive_facts additive;  // the call's additive mask's (attention calls' too)
    std::shared_ptr<kv_cache::impl> cache;
    /// A decode over `cache` recorded with the kernel for finite values, the cache's rows being
    /// finite when it was recorded: its check holds them to that (below).
    bool read_finite = false;
    std::size_t q_groups = 0, kv_groups = 0;
    /// A paged call's: its q's norms are per (token, head) row, this many tokens of shape.q_heads
    /// rows, folded to one per head for the rule (0: per group of the shape, as read).
    std::size_t q_rows_per_head = 0;
    mutable detail::guard_words words;
    // An attention call's check (attention_call.cpp): its plan, the flags of its inputs' passes.
    std::unique_ptr<detail::plan> attention;
    detail::attention_views attention_views;
    std::uint64_t output_flags_at = 0;  // byte offset of the output projection inputs' flags in `guard`
    // A backward call's check (sdpa_backward_call.cpp): the kernels' verdict words in `guard`, after
    // the overflow rule's, and the texel views its kernels read.
    bool backward = false;
    std::uint64_t backward_verdict_at = 0;  // byte offset of the BWD_VERDICT_WORDS words in `guard`
    // A paged call over a block table tensor: the device's flags of a bad entry and of two appends
    // into one pool row (contract/paged.h).
    bool table_check = false;
    std::uint64_t table_flag_at = 0;    // byte offset of the flag words in `guard` (contract/paged.h)
    std::uint64_t table_page_size = 1;  // a shared pool row named as page and row in the refusal
    detail::flash_bwd_views backward_views;
    detail::live_count<impl> counted;

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl() override;

    /// A recording into a caller's command buffer: `marker` made, its word set to "not done" (the
    /// lock held, before anything is recorded), then the commands that reset it on the device.
    void begin_marker(detail::recorder& rec);
    /// After everything recorded: the commands that write done_word once all of it has completed.
    void end_marker(detail::recorder& rec);
    /// A call's verdict words (the first `bytes` of `guard`) zeroed before its kernels write them.
    /// In qkv's own command buffer (a sequence's, or run()'s), submitted once after this record, the
    /// last submit of this scratch having completed: by the host (the submit makes the write
    /// visible). A caller's command buffer may be submitted again: there by the device. Then one
    /// barrier: earlier compute writes (the caller's, or another recording's) and the zeroed words
    /// before the call's reads and writes.
    void zero_verdict(detail::recorder& rec, std::uint64_t bytes);
    /// After a call's last write of its verdict words: in a caller's command buffer, the barrier
    /// that makes them readable by the host after the fence. qkv's own submits end with that
    /// barrier once (sequence::run, run_call), not once per call.
    void verdict_to_host(detail::recorder& rec) const;
    /// Whether its commands have completed: true for a call run by qkv (no marker); else the word,
    /// and the caller's fence where it was given (the lock held).
    [[nodiscard]] bool finished() const override;
    [[nodiscard]] std::shared_ptr<void> after_lock() override { return std::move(cache); }
    /// An append recording's effect on its cache, once known (the lock held): completed, the rows
    /// are the cache's for every use; not completed, they are taken back (the cache's size as
    /// before the command buffer's appends). Idempotent.
    void settle_append(bool completed) noexcept;
    /// Marks this recording in `cmd` as one that appends to `c` (its `cache`; the lock held), `before`
    /// the cache's size before it: until it is known to have run, only `cmd` may use the cache's rows
    /// (check_ready), and settle_append gives them back if it never does.
    void hold_append(kv_cache::impl& c, VkCommandBuffer cmd, std::size_t before) noexcept;
    /// The verdict of the recorded checks, after the commands have completed (not_complete before:
    /// not submitted, or still running).
    void check_completed() const;

    /// The verdict of the recorded checks (numeric_overflow). `locked`: the caller holds the
    /// core's lock (a run checks under the lock that ran it); else it is taken here.
    void check(bool locked = false) const;
    void check_attention(bool locked) const;  // attention_call.cpp
    void check_backward(bool locked) const;   // sdpa_backward_call.cpp
    /// Ready for the next recording at the same place: the buffers and device words are kept, the
    /// views and the check's facts are the new recording's. Returns the cache the last recording
    /// held, for the caller to let go of after the core's lock (a cache's destructor takes it).
    [[nodiscard]] std::shared_ptr<kv_cache::impl> reuse() {
        views.clear();
        flash_views = {};
        attention_views = {};
        backward_views = {};
        checks = false;
        read_finite = false;
        q_rows_per_head = 0;
        backward = false;
        table_check = false;
        attention.reset();
        return std::move(cache);
    }
};

struct recording_access {
    static recording make(std::unique_ptr<recording::impl> i) {
        recording r;
        r.impl_ = std::move(i);
        return r;
    }
    /// The end of a recording's life (its destructor, a move-assignment over it): released now
    /// where its commands have completed, else retired to its device core until they have, and an
    /// append's rows taken back.
    static void retire(std::unique_ptr<recording::impl> r) noexcept;
    /// The same with the core's lock already held (a record that failed part-way); returns what
    /// must be let go of after the lock (the cache it held: a cache's destructor takes the lock).
    /// A retiree keeps nothing that keeps the core alive, so the core's end releases every one.
    [[nodiscard]] static std::shared_ptr<void> retire_locked(std::unique_ptr<recording::impl> r) noexcept;
};

}  // namespace qkv::vulkan
