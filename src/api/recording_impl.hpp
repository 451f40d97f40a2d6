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
#include "kernels/settings.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/vulkan/interop.hpp"
#include "qkv/vulkan/sequence.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

struct recording::impl {
    std::shared_ptr<detail::device_core> core;       // declared first: outlives the rest
    std::unique_ptr<detail::external_recorder> rec;  // its descriptor sets (a caller's command buffer)
    detail::call_buffers buffers;                    // the call's scratch
    detail::buffer guard;                            // the overflow rule's device words (host-visible)
    detail::buffer scratch;                          // a quantized append's rows as float32
    std::vector<detail::buffer_view> views;
    detail::flash_cpu_views flash_views;
    // What check() needs:
    bool checks = false;
    sdpa_shape shape{};
    float scale = 1.0f;
    bool fp16 = false;
    detail::additive_facts additive;  // the call's additive mask's (attention calls' too)
    std::shared_ptr<kv_cache::impl> cache;
    std::size_t q_groups = 0, kv_groups = 0;
    mutable detail::guard_words words;
    // An attention call's check (attention_call.cpp): its plan, the flags of its inputs' passes.
    std::unique_ptr<detail::plan> attention;
    detail::attention_views attention_views;
    std::uint64_t output_flags_at = 0;  // byte offset of the output projection inputs' flags in `guard`

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl();

    /// The verdict of the recorded checks (numeric_overflow). `locked`: the caller holds the
    /// core's lock (a run checks under the lock that ran it); else it is taken here.
    void check(bool locked = false) const;
    void check_attention(bool locked) const;  // attention_call.cpp
    /// Ready for the next recording at the same place: the buffers and device words are kept, the
    /// views and the check's facts are the new recording's. Returns the cache the last recording
    /// held, for the caller to let go of after the core's lock (a cache's destructor takes it).
    [[nodiscard]] std::shared_ptr<kv_cache::impl> reuse() {
        views.clear();
        flash_views = {};
        attention_views = {};
        checks = false;
        attention.reset();
        return std::move(cache);
    }
};

/// Caches let go of while the core's lock is held, released after it (declare one before the
/// lock_guard): the last reference to a cache runs its destructor, which takes the lock. Letting go
/// never allocates under the lock: `place` has room for one (a place's old cache), reserved here,
/// and a run's appended caches move in whole.
struct cache_refs {
    std::vector<std::shared_ptr<kv_cache::impl>> place;
    std::vector<std::pair<std::shared_ptr<kv_cache::impl>, std::size_t>> appended;
    cache_refs() { place.reserve(1); }
};

struct sequence::impl {
    std::shared_ptr<detail::device_core> core;  // declared first: outlives the rest
    std::unique_ptr<detail::executor> exec;     // its own command buffer, pool and fence
    /// The recordings of the current (or last) run, kept for the next: a call recorded at the same
    /// place reuses its scratch (allocating device memory per token would cost more than the call).
    std::vector<std::unique_ptr<recording::impl>> recorded;
    std::size_t next = 0;     // the place of the next recording in this run
    std::size_t records = 0;  // calls and appends recorded in this run
    bool begun = false;
    /// The caches this run's recorded appends grow (their pending_in is this), each with its size
    /// before them.
    std::vector<std::pair<std::shared_ptr<kv_cache::impl>, std::size_t>> appended;

    ~impl() {
        if (!core) return;
        recorded.clear();    // each releases under the lock
        cache_refs release;  // after the lock
        std::lock_guard lock(core->mutex);
        if (begun) abandon(release);  // recorded, never run: the appends did not happen
        exec.reset();
    }
    /// The scratch of the next recording (call with the lock held, the previous run completed): the
    /// one recorded at this place last run, its views dropped, or a new one.
    recording::impl& next_scratch(cache_refs& release) {
        if (next == recorded.size()) {
            recorded.push_back(std::make_unique<recording::impl>());
            recorded.back()->core = core;
        }
        recording::impl& r = *recorded[next++];
        release.place.push_back(r.reuse());  // room reserved: no allocation
        return r;
    }
    /// After the run (the lock held): the appends are written, the caches free for other uses.
    void settle(cache_refs& release) noexcept {
        for (auto& [cache, before] : appended) cache->pending_in = nullptr;
        release.appended = std::move(appended);
        appended.clear();
        records = 0;
    }
    /// A recording that failed part-way, or a sequence ended before its run (the lock held):
    /// recorded commands cannot be taken back, so everything recorded since the last run is
    /// dropped and the caches its appends grew return to their sizes before them.
    void abandon(cache_refs& release) noexcept {
        for (auto& [cache, before] : appended) cache->size = before;
        settle(release);
        begun = false;
        next = 0;
    }
    /// Runs `record` (the lock held), which records into exec. If it throws having recorded
    /// nothing, the sequence is as it was (`place` is given back); having recorded something, the
    /// sequence is abandoned. Either way the exception goes on.
    template <class Record>
    void record_or_abandon(cache_refs& release, bool takes_place, Record&& record) {
        const std::uint64_t commands = exec->commands_recorded();
        try {
            record();
            ++records;
        } catch (...) {
            if (exec->commands_recorded() != commands) {
                abandon(release);
            } else {
                if (takes_place) --next;
                if (records == 0) begun = false;  // nothing in the command buffer: as if never begun
            }
            throw;
        }
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

/// What every planned call over tensors holds besides its plan: its device core (declared first:
/// outlives the rest), its settings, its constants on the device (the masks, uploaded once) and
/// run()'s scratch, reused from run to run.
struct planned_call {
    std::shared_ptr<detail::device_core> core;
    detail::settings set;
    detail::buffer constants;
    std::unique_ptr<recording::impl> run_scratch;

    planned_call() = default;
    planned_call(const planned_call&) = delete;
    planned_call& operator=(const planned_call&) = delete;
    ~planned_call() {
        if (!core) return;
        std::lock_guard lock(core->mutex);
        constants.reset();
    }
};

// ---- The three ways every planned call over tensors is carried out -----------------------------
// `Call` is a call's impl (sdpa_call::impl, attention_call::impl): its `core`, its `run_scratch`
// and `record(recorder&, recording::impl&, const Tensors&)`, which records the whole call (its
// leading barrier, the kernels and the verdict) with the core's lock held.

/// A call over a cache (sdpa_call::impl's `cache`) refuses to use it while a sequence other than
/// `by` holds a recorded append to it that has not run (the lock held).
template <class Call>
void check_cache_ready(const Call& call, const char* what, const void* by) {
    if constexpr (requires { call.cache; })
        if (call.cache) call.cache->check_ready(what, by);
}

/// call.run(tensors): recorded into the core's own command buffer, submitted, waited on, checked.
template <class Call, class Tensors>
void run_call(Call& call, const Tensors& tensors, const char* what) {
    detail::device_core& core = *call.core;
    cache_refs release;  // after the lock
    {
        std::lock_guard lock(core.mutex);
        core.check_alive();
        check_cache_ready(call, what, nullptr);
        core.guarded(what, [&] {
            if (!call.run_scratch) call.run_scratch = std::make_unique<recording::impl>();
            recording::impl& r = *call.run_scratch;
            release.place.push_back(r.reuse());  // room reserved: no allocation
            detail::executor& exec = *core.exec;
            exec.begin();
            call.record(exec, r, tensors);
            // The outputs readable by whatever the caller submits next (a download is a transfer).
            exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT);
            (void)exec.submit_and_wait();
        });
        // Under the lock that ran it: another thread's run of this call, or an append to its
        // cache, cannot come between the run and its verdict.
        call.run_scratch->check(true);
    }
}

/// record(call, cmd, tensors): into the caller's command buffer; the recording owns the scratch.
template <class Call, class Tensors>
recording record_call(Call& call, VkCommandBuffer cmd, const Tensors& tensors) {
    if (!cmd) throw qkv::invalid_argument("record: no VkCommandBuffer");
    require_supported(entry_point::interop_record, call.desc);
    auto r = std::make_unique<recording::impl>();
    r->core = call.core;
    std::lock_guard lock(call.core->mutex);
    call.core->check_alive();
    check_cache_ready(call, "record", nullptr);
    r->rec = std::make_unique<detail::external_recorder>(*call.core->dev, call.core->exec->max_groups(0), cmd);
    call.record(*r->rec, *r, tensors);
    return recording_access::make(std::move(r));
}

/// sequence::record(call, tensors): into the sequence's command buffer, at its next place.
template <class Call, class Tensors>
void record_in_sequence(sequence::impl& s, Call& call, const Tensors& tensors) {
    if (call.core != s.core) throw qkv::invalid_argument("sequence::record: the call is on another device");
    require_supported(entry_point::sequence_record, call.desc);
    cache_refs release;  // after the lock
    std::lock_guard lock(s.core->mutex);
    s.core->check_alive();
    check_cache_ready(call, "sequence::record", &s);
    s.core->guarded("sequence::record", [&] {
        s.ensure_begun();
        recording::impl& r = s.next_scratch(release);
        s.record_or_abandon(release, true, [&] { call.record(*s.exec, r, tensors); });
    });
}

}  // namespace qkv::vulkan
