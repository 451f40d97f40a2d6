// The inside of qkv::vulkan::context, shared by the files that run work on it (context.cpp,
// kv_cache.cpp, ceiling.cpp). Private to src/.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "api/device_core.hpp"
#include "plan/settings.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/testing.hpp"
#include "run/io.hpp"
#include "run/run.hpp"

namespace qkv::vulkan {

struct context::impl {
    std::shared_ptr<detail::device_core> core;  // declared first: outlives the buffers below
    detail::settings set;
    detail::run_buffers buffers;  // guarded by core->mutex
    /// A ragged batch's sequences' own buffers (run_sdpa_batch), kept between calls; guarded by
    /// core->mutex.
    std::vector<detail::run_buffers> parts;
    call_stats last{};  // guarded by core->mutex

    impl(const context_options& options, const testing::hooks& hooks);
    /// A context on a shared device core (a caller's device: interop.cpp).
    impl(std::shared_ptr<detail::device_core> shared, const testing::hooks& hooks);
    ~impl();
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;

    [[nodiscard]] detail::run_env env() { return {*core, set, buffers}; }

    /// The run skeleton's frame: the device's lock, the check that the device is alive, the
    /// bookkeeping of device loss and host allocation failure, and the statistics of the run that
    /// `body` (a function of run_env returning a run_result) returns. Returns its output.
    template <class Body>
    auto host_call(const char* what, Body&& body) {
        const auto start = std::chrono::steady_clock::now();
        std::lock_guard lock(core->mutex);
        core->check_alive();
        return core->guarded(what, [&] {
            detail::run_env e = env();
            auto run = body(e);
            last = call_stats{};
            last.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
            last.device_ms = run.times.device_ms;
            last.projection_ms = run.times.projection_ms;
            last.attention_ms = run.times.attention_ms;
            last.output_projection_ms = run.times.output_projection_ms;
            last.backward_dq_ms = run.times.backward_dq_ms, last.backward_dkdv_ms = run.times.backward_dkdv_ms;
            last.device_range_check = run.times.device_range_check;
            last.device_bytes = core->alloc->allocated();
            return std::move(run.output);
        });
    }
};

struct context_access {
    static context make(std::unique_ptr<context::impl> i) { return context(std::move(i)); }
    static context::impl& of(const context& c);
};

/// The inside of a context, or qkv::error for a moved-from one.
inline context::impl& alive(const std::unique_ptr<context::impl>& impl) {
    if (!impl) throw qkv::error("qkv::vulkan::context used after move: it holds no device any more");
    return *impl;
}

}  // namespace qkv::vulkan
