// qkv::vulkan::context: the public calls, each the call skeleton's frame (context_impl.hpp)
// around a run (runs.hpp).
#include "qkv/vulkan/context.hpp"

#include <mutex>
#include <utility>

#include "api/context_impl.hpp"
#include "api/runs.hpp"
#include "api/settings.hpp"
#include "qkv/runtime/capabilities.hpp"

namespace qkv::vulkan {

using namespace detail;

context::impl::impl(const context_options& options, const testing::hooks& hooks)
    : core(std::make_shared<device_core>(options, hooks)), set(read_settings(hooks)) {}

context::impl::impl(std::shared_ptr<device_core> shared, const testing::hooks& hooks)
    : core(std::move(shared)), set(read_settings(hooks)) {}

context::impl& context_access::of(const context& c) { return alive(c.impl_); }

context::impl::~impl() {
    // The buffers go back to the shared device under its lock: a cache may be using it.
    std::lock_guard lock(core->mutex);
    buffers.release();
}

context::context(const context_options& options) : impl_(std::make_unique<impl>(options, testing::hooks{})) {}
context::context(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
context::~context() = default;
context::context(context&&) noexcept = default;
context& context::operator=(context&&) noexcept = default;

const device_info& context::device() const { return alive(impl_).core->dev->info(); }

attention_output context::attention(const attention_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_attention, problem);
    return self.call("attention", [&](call_env& env) { return run_attention(env, problem); });
}

sdpa_output context::sdpa(const sdpa_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_sdpa, problem);
    return self.call("sdpa", [&](call_env& env) { return run_sdpa(env, problem); });
}

call_stats context::last_call() const {
    impl& self = alive(impl_);
    std::lock_guard lock(self.core->mutex);
    return self.last;
}

std::uint64_t context::device_memory_allocated() const { return alive(impl_).core->alloc->allocated(); }
std::uint64_t context::peak_device_memory() const { return alive(impl_).core->alloc->peak(); }
void context::reset_peak() { alive(impl_).core->alloc->reset_peak(); }

void context::trim() {
    impl& self = alive(impl_);
    std::lock_guard lock(self.core->mutex);
    self.buffers.release();
}

std::vector<std::string> context::take_validation_messages() { return alive(impl_).core->inst->messages().take(); }

context testing::make_context(const context_options& options, const hooks& h) {
    return context_access::make(std::make_unique<context::impl>(options, h));
}

}  // namespace qkv::vulkan
