// qkv::vulkan::sequence: planned calls over tensors and cache appends recorded into one command
// buffer of qkv's, submitted once, each call checked after the run.
#include <mutex>
#include <utility>

#include "api/attention_call_impl.hpp"
#include "api/context_impl.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/paged_call_impl.hpp"
#include "api/recording_impl.hpp"
#include "api/sdpa_call_impl.hpp"
#include "qkv/vulkan/sequence.hpp"

namespace qkv::vulkan {

using namespace detail;

sequence::sequence(context& ctx) : impl_(std::make_unique<impl>()) {
    context::impl& owner = context_access::of(ctx);
    impl_->core = owner.core;
    std::lock_guard lock(owner.core->mutex);
    impl_->exec = std::make_unique<executor>(*owner.core->dev, owner.core->exec->max_groups(0));
}
sequence::~sequence() = default;
sequence::sequence(sequence&&) noexcept = default;
sequence& sequence::operator=(sequence&&) noexcept = default;

void sequence::record(sdpa_call& call, const sdpa_tensors& tensors) {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    record_in_sequence(*impl_, sdpa_call_access::of(call), tensors);
}

void sequence::record(paged_call& call, const paged_tensors& tensors) {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    record_in_sequence(*impl_, paged_call_access::of(call), tensors);
}

void sequence::record_append(kv_cache& cache, const tensor& k, const tensor& v, std::size_t rows) {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    impl& s = *impl_;
    const std::shared_ptr<kv_cache::impl> c = kv_cache_access::of(cache);
    if (c->core != s.core) throw qkv::invalid_argument("sequence::record_append: the cache is on another device");
    cache_refs release;  // after the lock
    const auto lock = c->lock_for_append(rows, "sequence::record_append", &s);
    if (rows == 0) return;
    s.core->guarded("sequence::record_append", [&] {
        s.ensure_begun();
        s.appended.reserve(s.appended.size() + 1);  // before anything is recorded: no allocation after
        const std::size_t before = c->size;
        recording::impl& r = s.next_scratch(release);  // its scratch: a quantized append's rows as float32
        s.record_or_abandon(release, true, [&] { c->record_append(*s.exec, k, v, rows, r.scratch); });
        if (c->pending_in != &s) {  // the rows are written when the sequence runs: until then, the cache waits
            s.appended.emplace_back(c, before);
            c->pending_in = &s;
        }
    });
}

std::size_t sequence::recorded() const {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    std::lock_guard lock(impl_->core->mutex);
    return impl_->records;
}

void sequence::run() {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    impl& s = *impl_;
    cache_refs release;  // after the lock
    {
        std::lock_guard lock(s.core->mutex);
        s.core->check_alive();
        if (!s.begun) return;
        try {
            s.exec->barrier(
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_UNIFORM_READ_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                    VK_ACCESS_HOST_READ_BIT);
            (void)s.exec->submit_and_wait();
        } catch (const device_lost&) {
            s.core->lost = true;
            s.abandon(release);
            throw;
        } catch (...) {  // not submitted: the appends did not happen
            s.abandon(release);
            throw;
        }
        s.begun = false;
        s.settle(release);
        // Under the lock that ran them: the verdicts and the caches' statistics as the run left
        // them (no append or clear of another thread in between).
        for (std::size_t i = 0; i < s.next; ++i) s.recorded[i]->check(true);
    }
}

void sequence::record(attention_call& call, const attention_tensors& tensors) {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    record_in_sequence(*impl_, attention_call_access::of(call), tensors);
}

}  // namespace qkv::vulkan
