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
    std::vector<std::unique_ptr<recording::impl>> recorded;
    bool begun = false;

    ~impl() {
        if (!core) return;
        recorded.clear();  // each releases under the lock
        std::lock_guard lock(core->mutex);
        exec.reset();
    }
    /// Releases the previous run's recordings (each takes the lock: call without it).
    void forget_previous_run() {
        if (!begun) recorded.clear();
    }
    /// The command buffer begun (call with the lock held).
    void ensure_begun() {
        if (begun) return;
        exec->begin();
        begun = true;
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
