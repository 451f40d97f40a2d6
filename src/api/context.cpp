// qkv::vulkan::context: owns the device, the pipelines and the reusable buffers, and runs calls.
#include "qkv/vulkan/context.hpp"

#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>

#include "api/context_impl.hpp"
#include "api/dispatch.hpp"
#include "api/sdpa_dispatch.hpp"
#include "kernels/sdpa_decode.hpp"

namespace qkv::vulkan {

using namespace detail;

context::context(const context_options& options) : impl_(std::make_unique<impl>(options)) {}
context::~context() = default;
context::context(context&&) noexcept = default;
context& context::operator=(context&&) noexcept = default;

const device_info& context::device() const { return impl_->dev->info(); }

attention_output context::attention(const attention_problem& problem) {
    validate(problem);
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard lock(impl_->mutex);
    impl_->check_alive();
    try {
        dispatch_environment env = impl_->environment();
        attention_run run = run_attention(env, problem);
        impl_->last.host_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        impl_->last.device_ms = run.device_ms;
        impl_->last.projection_ms = run.projection_ms;
        impl_->last.attention_ms = run.attention_ms;
        impl_->last.output_projection_ms = run.output_projection_ms;
        impl_->last.device_range_check = run.range_guard;
        impl_->last.device_bytes = impl_->alloc->allocated();
        return std::move(run.output);
    } catch (const device_lost&) {
        impl_->lost = true;
        throw;
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while running attention");
    }
}

sdpa_output context::sdpa(const sdpa_problem& problem) {
    validate(problem);
    const auto start = std::chrono::steady_clock::now();
    // Few query rows per K/V head against many keys: the split-S decode kernels (src/kernels/sdpa_decode.hpp),
    // unless a test hook of the fused kernels is set. Where the decode path cannot run here
    // (limits, texel formats) the fused kernels take the problem.
    if (decode_suits(problem.shape, problem.options.return_weights) && !impl_->options.fused_tiles_as &&
        impl_->options.max_fused_keys_per_dispatch == 0) {
        try {
            sdpa_output out = sdpa_through_cache(*this, problem);
            std::lock_guard lock(impl_->mutex);
            impl_->last.host_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
            return out;
        } catch (const limit_exceeded&) {
        } catch (const unavailable&) {
        }
    }
    std::lock_guard lock(impl_->mutex);
    impl_->check_alive();
    try {
        dispatch_environment env = impl_->environment();
        sdpa_run run = run_sdpa(env, problem);
        impl_->last = call_stats{};
        impl_->last.host_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        impl_->last.device_ms = run.device_ms;
        impl_->last.attention_ms = run.attention_ms;
        impl_->last.device_bytes = impl_->alloc->allocated();
        return std::move(run.output);
    } catch (const device_lost&) {
        impl_->lost = true;
        throw;
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while running sdpa");
    }
}

call_stats context::last_call() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->last;
}

std::uint64_t context::device_memory_allocated() const { return impl_->alloc->allocated(); }
std::uint64_t context::peak_device_memory() const { return impl_->alloc->peak(); }
void context::reset_peak() { impl_->alloc->reset_peak(); }

void context::trim() {
    std::lock_guard lock(impl_->mutex);
    impl_->buffers = buffer_cache{};
}

std::vector<std::string> context::take_validation_messages() { return impl_->inst->messages().take(); }

}  // namespace qkv::vulkan
