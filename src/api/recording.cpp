// qkv::vulkan::recording: what a recorded (or run) call owns until its commands have completed,
// and its check(): the device's verdict read back, the overflow rule applied as on the host path.
#include <mutex>

#include "api/attention_call_impl.hpp"
#include "api/recording_impl.hpp"
#include "kernels/range_guard.hpp"
#include "qkv/vulkan/interop.hpp"

namespace qkv::vulkan {

using namespace detail;

recording::recording() noexcept = default;
recording::~recording() = default;
recording::recording(recording&&) noexcept = default;
recording& recording::operator=(recording&&) noexcept = default;

void recording::check() const {
    if (!impl_) throw qkv::error("qkv::vulkan::recording: empty (or moved from)");
    impl_->check();
}

recording::impl::~impl() {
    if (!core) return;
    std::lock_guard lock(core->mutex);
    attention_views = {};
    backward_views = {};
    views.clear();
    flash_views = {};
    buffers.release();
    guard.reset();
    scratch.reset();
    rec.reset();
}

void recording::impl::check(bool locked) const {
    if (attention) return check_attention(locked);
    if (backward) return check_backward(locked);
    if (!checks) return;
    kv_stats cache_stats;
    {
        std::unique_lock lock(core->mutex, std::defer_lock);
        if (!locked) lock.lock();
        guard.invalidate();
        words = guard_words::read(guard.mapped(), q_groups, cache ? 0 : kv_groups);
        if (cache) cache_stats = cache->read_stats();
    }
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
