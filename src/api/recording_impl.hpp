// The inside of qkv::vulkan::recording: what one recorded (or run) call owns until its commands
// have completed, and what its check() needs. Private to src/.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "api/call_io.hpp"
#include "api/device_core.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/plan.hpp"
#include "api/runs.hpp"
#include "api/sdpa_guard.hpp"
#include "kernels/flash_cpu.hpp"
#include "qkv/vulkan/interop.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

struct recording::impl {
    std::shared_ptr<detail::device_core> core;       // declared first: outlives the rest
    std::unique_ptr<detail::external_recorder> rec;  // its descriptor sets (a caller's command buffer)
    detail::call_buffers buffers;                    // the call's scratch
    detail::buffer guard;                            // the overflow rule's device words (host-visible)
    std::vector<detail::buffer_view> views;
    detail::flash_cpu_views flash_views;
    // What check() needs:
    bool checks = false;
    sdpa_shape shape{};
    float scale = 1.0f;
    bool fp16 = false;
    sdpa_problem masks;  // the additive mask's facts (its spans point into `additive`)
    std::vector<float> additive;
    std::shared_ptr<kv_cache::impl> cache;
    std::size_t q_groups = 0, kv_groups = 0;
    mutable detail::guard_words words;
    // An attention call's check (attention_call.cpp): its plan, the flags of its inputs' passes.
    std::unique_ptr<detail::plan> attention;
    detail::attention_views attention_views;
    std::uint64_t output_flags_at = 0;  // byte offset of the output projection inputs' flags in `guard`
    double additive_max = 0;
    bool additive_poison = false;

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl();

    void check() const;
    void check_attention() const;  // attention_call.cpp
};

struct sequence::impl {
    std::shared_ptr<detail::device_core> core;  // declared first: outlives the rest
    std::unique_ptr<detail::executor> exec;     // its own command buffer, pool and fence
    /// The recordings of the current (or last) run, kept for the next: a call recorded at the same
    /// place reuses its scratch (allocating device memory per token would cost more than the call).
    std::vector<std::unique_ptr<recording::impl>> recorded;
    std::size_t next = 0;  // the place of the next recording in this run
    bool begun = false;

    ~impl() {
        if (!core) return;
        recorded.clear();  // each releases under the lock
        std::lock_guard lock(core->mutex);
        exec.reset();
    }
    /// The scratch of the next recording (call with the lock held, the previous run completed): the
    /// one recorded at this place last run, its views dropped, or a new one.
    recording::impl& next_scratch() {
        if (next == recorded.size()) {
            recorded.push_back(std::make_unique<recording::impl>());
            recorded.back()->core = core;
        }
        recording::impl& r = *recorded[next++];
        r.views.clear();
        r.flash_views = {};
        r.attention_views = {};
        r.checks = false;
        r.attention.reset();
        return r;
    }
    /// The command buffer begun (call with the lock held).
    void ensure_begun() {
        if (begun) return;
        exec->begin();
        begun = true;
        next = 0;
    }
};

struct recording_access {
    static recording make(std::unique_ptr<recording::impl> i) {
        recording r;
        r.impl_ = std::move(i);
        return r;
    }
};

}  // namespace qkv::vulkan
