// qkv::vulkan::recording: what a recorded (or run) call owns until its commands have completed,
// and its check(): the device's verdict read back, the overflow rule applied as on the host path.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "api/attention_call_impl.hpp"
#include "api/recording_impl.hpp"
#include "contract/paged.h"
#include "kernels/range_guard.hpp"
#include "qkv/vulkan/interop.hpp"

namespace qkv::vulkan {

using namespace detail;

recording::recording() noexcept = default;
recording::~recording() { recording_access::retire(std::move(impl_)); }
recording::recording(recording&&) noexcept = default;
recording& recording::operator=(recording&& other) noexcept {
    if (this != &other) {
        std::unique_ptr<impl> old = std::move(impl_);
        impl_ = std::move(other.impl_);
        recording_access::retire(std::move(old));
    }
    return *this;
}

void recording::check() const {
    if (!impl_) throw qkv::error("qkv::vulkan::recording: empty (or moved from)");
    impl_->check_completed();
}

void recording::completes_with(VkFence fence) {
    if (!impl_) throw qkv::invalid_argument("qkv::vulkan::recording::completes_with: the recording is empty");
    if (fence == VK_NULL_HANDLE) throw qkv::invalid_argument("qkv::vulkan::recording::completes_with: no fence");
    if (!impl_->core || !impl_->rec)
        throw qkv::invalid_argument(
            "qkv::vulkan::recording::completes_with: a call run by qkv has completed already (no fence of yours)");
    std::lock_guard lock(impl_->core->mutex);
    impl_->fence = fence;
}

namespace {

/// A recording's device objects, views before the buffers they view, then its descriptor sets.
void release(recording::impl& r) noexcept {
    r.attention_views = {};
    r.backward_views = {};
    r.views.clear();
    r.flash_views = {};
    r.buffers.release();
    r.guard.reset();
    r.scratch.reset();
    r.marker.reset();
    r.rec.reset();
}

}  // namespace

recording::impl::~impl() {
    if (!core) {  // retired: released by its core, under its lock or at its end
        release(*this);
        return;
    }
    std::lock_guard lock(core->mutex);
    release(*this);
}

void recording::impl::begin_marker(recorder& r) {
    core->alloc->ensure(marker, 4, memory_use::readback, "recording completion marker");
    const std::uint32_t not_done = 0;
    std::memcpy(marker.mapped(), &not_done, 4);
    marker.flush();
    // Submitted again, the command buffer says "not done" until this submission's end (after the
    // last one's word).
    r.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_TRANSFER_WRITE_BIT);
    r.fill(marker.handle(), 0, 4, not_done);
}

void recording::impl::end_marker(recorder& r) {
    r.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_TRANSFER_WRITE_BIT);
    r.fill(marker.handle(), 0, 4, done_word);
    r.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
              VK_ACCESS_HOST_READ_BIT);
}

void recording::impl::zero_verdict(recorder& r, std::uint64_t bytes) {
    if (!rec) {
        std::memset(guard.mapped(), 0, bytes);
        guard.flush();
    } else {
        r.fill(guard.handle(), 0, bytes, 0);
    }
    r.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
              VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
              VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_UNIFORM_READ_BIT);
}

void recording::impl::verdict_to_host(recorder& r) const {
    if (rec)
        r.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                  VK_ACCESS_HOST_READ_BIT);
}

bool recording::impl::finished() const {
    if (!rec || !marker) return true;  // run by qkv (waited on), or nothing recorded
    if (fence != VK_NULL_HANDLE) {     // the caller's fence first: the word alone is no host synchronisation
        const VkResult status = core->dev->fn().vkGetFenceStatus(core->dev->handle(), fence);
        if (status != VK_SUCCESS) return false;  // VK_NOT_READY, or an error (a lost device): not known done
    }
    marker.invalidate();
    std::uint32_t word = 0;
    std::memcpy(&word, marker.mapped(), 4);
    return word == done_word;
}

void recording::impl::settle_append(bool completed) noexcept {
    if (settled || !appended_in || !cache) return;
    settled = true;
    kv_cache::impl& c = *cache;
    if (c.pending_in != static_cast<const void*>(appended_in) || c.pending_generation != append_generation) return;
    if (!completed) {  // never run (or not known to have): the command buffer's appends taken back
        c.size = c.pending_before;
        c.pending_count = 0;
    } else if (--c.pending_count != 0) {
        return;
    }
    c.pending_in = nullptr;
    ++c.pending_generation;
}

void recording::impl::hold_append(kv_cache::impl& c, VkCommandBuffer cmd, std::size_t before) noexcept {
    const void* in = static_cast<const void*>(cmd);
    if (c.pending_in != in) {
        c.pending_in = in;
        c.pending_count = 0;
        c.pending_before = before;
        ++c.pending_generation;
    }
    ++c.pending_count;
    appended_in = cmd;
    append_generation = c.pending_generation;
}

void recording::impl::check_completed() const {
    {
        std::lock_guard lock(core->mutex);
        if (!finished())
            throw not_complete(
                "qkv::vulkan::recording::check: the recorded commands have not completed (the command buffer was "
                "not submitted, or is still running), so there is no verdict yet; check after waiting on its fence");
        const_cast<impl*>(this)->settle_append(true);
        seen_complete = true;
    }
    check();
}

void recording_access::retire(std::unique_ptr<recording::impl> r) noexcept {
    if (!r || !r->core) return;
    const std::shared_ptr<detail::device_core> core = r->core;  // perhaps the last: goes last
    std::vector<std::shared_ptr<void>> later;                   // let go of after the lock
    std::shared_ptr<void> cache;
    std::lock_guard lock(core->mutex);
    // The earlier retirees first: this one is released at its own end only where the caller's
    // fence (completes_with) is signalled, since its word may read done while the caller's
    // command buffer is still pending (no fence waited yet), and destroying what a pending
    // command buffer uses is invalid; otherwise a later call releases it.
    later = core->reclaim();
    cache = retire_locked(std::move(r));
}

std::shared_ptr<void> recording_access::retire_locked(std::unique_ptr<recording::impl> r) noexcept {
    if (!r || !r->core) return {};
    const bool done = r->finished();
    r->settle_append(done);
    // Known complete through the caller's fence: released now. Otherwise the fence is forgotten
    // (the caller may destroy it once the recording is gone) and the word decides, as without one.
    if (r->fence != VK_NULL_HANDLE && done) r->seen_complete = true;
    r->fence = VK_NULL_HANDLE;
    // Its cache is let go of: the cache holds the core, so a retiree holding it would keep the
    // core (and every retiree, and the device objects) alive after the application's last qkv
    // object went. The application destroys a cache only after its commands over it completed.
    std::shared_ptr<void> cache = r->after_lock();
    std::shared_ptr<detail::device_core> core = std::move(r->core);
    if (r->rec && !r->seen_complete) {
        // Perhaps still running (the word is written by the device, not a fence the host waited
        // on): kept until a later record finds its word done (the core's reclaim), or
        // until the core goes, after the last object that shares it.
        try {
            core->retirees.push_back(std::move(r));
        } catch (...) {
            (void)r.release();  // kept forever rather than freed under running commands
        }
    }
    r.reset();  // released now (without its core: under the lock the caller holds)
    return cache;
}

void recording::impl::check(bool locked) const {
    if (attention) return check_attention(locked);
    if (backward) return check_backward(locked);
    if (table_check) {  // before the overflow rule: the output of a bad table is undefined
        std::uint32_t flags[contract::PAGED_FLAG_WORDS] = {};
        {
            std::unique_lock lock(core->mutex, std::defer_lock);
            if (!locked) lock.lock();
            guard.invalidate();
            std::memcpy(flags, guard.mapped() + table_flag_at, sizeof flags);
        }
        const std::uint32_t flag = flags[0];
        if ((flag & contract::PAGED_FLAG_LENGTH) != 0)
            throw qkv::invalid_argument(
                "paged_call: the cache_seqlens tensor holds a length that is negative, below the sequence's "
                "cache_leftpad, or past its table row's keys (max_pages x page_size) less the new rows: no row was "
                "appended and the output is undefined");
        if ((flag & contract::PAGED_FLAG_ENTRY) != 0)
            throw qkv::invalid_argument(
                "paged_call: the block table holds a page index past the pool (or a negative one) among the "
                "entries the step reads or writes (checked on the device): no row was appended and the output is "
                "undefined");
        if ((flag & contract::PAGED_FLAG_SHARED_ROW) != 0) {
            const std::uint64_t row = flags[1] - std::uint64_t{1};  // the largest row claimed twice
            throw qkv::invalid_argument(
                "paged_call: the block table sends new rows of two sequences to the same row of the pool (page " +
                std::to_string(row / table_page_size) + ", row " + std::to_string(row % table_page_size) +
                ", found on the device: two table rows name one page): appends must not share a row; no row was "
                "appended and the output is undefined");
        }
        if (flag != 0) throw qkv::error("internal: an unknown flag of the paged checks: " + std::to_string(flag));
    }
    if (!checks) return;
    kv_stats cache_stats;
    {
        std::unique_lock lock(core->mutex, std::defer_lock);
        if (!locked) lock.lock();
        guard.invalidate();
        words = guard_words::read(guard.mapped(), q_groups, cache ? 0 : kv_groups);
        if (cache) cache_stats = cache->read_stats();
    }
    if (q_rows_per_head) {  // a paged call's rows (token, head): the largest norm of each head
        std::vector<float> heads(shape.q_heads, 0.0f);
        for (std::size_t i = 0; i < words.q_norm.size(); ++i)
            heads[i % shape.q_heads] = std::max(heads[i % shape.q_heads], words.q_norm[i]);
        words.q_norm = std::move(heads);
    }
    // Recorded with the kernel for finite values, the decode read rows that were finite when it
    // was recorded (a later append's non-finite rows are beyond them): an output that is not
    // finite then is an overflow, never a NaN or Inf of the values, and is refused as on a host
    // call. (Rows replaced by clear() and an append before the commands ran are refused too.)
    if (read_finite) cache_stats.finite = true;
    const sdpa_facts facts = facts_from_device(words, cache ? &cache_stats : nullptr, additive);
    check_sdpa_scores(facts, shape, scale, fp16);
    check_value_sums(facts, shape.kv_len);
    check_output_flag(facts, (words.flags & contract::GUARD_FLAG_OUTPUT_NONFINITE) != 0);
}

void recording::impl::check_attention(bool locked) const {
    std::uint32_t in_flags = 0, out_flags = 0;
    {
        std::unique_lock lock(core->mutex, std::defer_lock);
        if (!locked) lock.lock();
        guard.invalidate();
        std::memcpy(&in_flags, guard.mapped(), 4);
        std::memcpy(&out_flags, guard.mapped() + output_flags_at, 4);
    }
    input_facts facts;
    facts.projection_inputs_finite = (in_flags & contract::GUARD_FLAG_INPUT_NONFINITE) == 0;
    facts.output_inputs_finite = (out_flags & contract::GUARD_FLAG_INPUT_NONFINITE) == 0;
    facts.additive_max = additive.max;
    facts.additive_nan_or_pos_inf = additive.nan_or_pos_inf;
    check_range_guard(buffers.guard, *attention, nullptr, facts);  // throws numeric_overflow
    if (facts.every_output_defined() && (in_flags & contract::GUARD_FLAG_OUTPUT_NONFINITE))
        throw numeric_overflow(
            "numeric overflow: an output element is not finite though every input is finite (a float32 sum left "
            "its range); scale the inputs down, or use the float64 cpu backend");
}

}  // namespace qkv::vulkan
