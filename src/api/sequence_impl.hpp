// The inside of qkv::vulkan::sequence (sequence.cpp): its command buffer, the scratch of each
// recorded call, the appends it holds until its run. And cache_refs, the caches let go of after
// the device's lock. Private to src/.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "api/device_core.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/recording_impl.hpp"
#include "qkv/vulkan/sequence.hpp"
#include "vk/executor.hpp"

namespace qkv::vulkan {

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

}  // namespace qkv::vulkan
