// What every planned call over tensors (sdpa_call, attention_call) holds besides its plan, and the
// three ways one is carried out: run on the context's queue, recorded into a caller's command
// buffer, recorded into a sequence. Private to src/.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "api/device_core.hpp"
#include "api/recording_impl.hpp"
#include "api/sequence_impl.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan {

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

/// When a call is made (the lock held): its recording gone through once over stand-in tensors
/// (no memory), dry, so that every pipeline it dispatches is built and run()'s scratch allocated
/// now, not at the first record or run.
template <class Call, class Tensors>
void build_pipelines(Call& call, const Tensors& stand_ins) {
    if (!call.run_scratch) call.run_scratch = std::make_unique<recording::impl>();
    detail::dry_recorder dry(*call.core->dev, call.core->exec->max_groups(0));
    call.record(dry, *call.run_scratch, stand_ins);
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
            // The outputs readable by whatever the caller submits next (a download is a transfer),
            // and the verdict words by the host after the fence.
            exec.barrier(
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT);
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
    std::vector<std::shared_ptr<void>> later;  // retired recordings let go of after the lock
    std::shared_ptr<void> held;                // a failed recording's cache, likewise
    std::lock_guard lock(call.core->mutex);
    call.core->check_alive();
    later = call.core->reclaim();
    // A call over a cache may follow an append recorded into the same command buffer.
    check_cache_ready(call, "record", static_cast<const void*>(cmd));
    (void)call.check(tensors);  // every refusal before anything is recorded
    r->rec = std::make_unique<detail::external_recorder>(*call.core->dev, call.core->exec->max_groups(0), cmd);
    r->begin_marker(*r->rec);
    try {
        call.record(*r->rec, *r, tensors);
    } catch (...) {
        // Failed part-way (out of memory): commands that use its objects may be in `cmd`, so they
        // are kept (retired, never reported done) rather than freed under a submit of it.
        held = recording_access::retire_locked(std::move(r));
        throw;
    }
    r->end_marker(*r->rec);
    // A call that appends (paged_call with new rows) holds its pool as record_append holds a cache:
    // the rows are written once the recording is known to have run.
    if constexpr (requires { call.appends(); })
        if (call.appends()) r->hold_append(*call.cache, cmd, call.cache->size);
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
        s.appended.reserve(s.appended.size() + 1);  // before anything is recorded: no allocation after
        recording::impl& r = s.next_scratch(release);
        s.record_or_abandon(release, true, [&] { call.record(*s.exec, r, tensors); });
        // A call that appends holds its pool as sequence::record_append holds a cache: until the
        // sequence runs (or is abandoned), every other use of it waits.
        if constexpr (requires { call.appends(); })
            if (call.appends() && call.cache->pending_in != &s) {
                s.appended.emplace_back(call.cache, call.cache->size);
                call.cache->pending_in = &s;
            }
    });
}

}  // namespace qkv::vulkan
