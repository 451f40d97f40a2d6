// The inside of qkv::vulkan::context, shared by the files that run work on it (context.cpp,
// ceiling.cpp). Private to src/.
#pragma once

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/dispatch.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "vk/device.hpp"
#include "vk/executor.hpp"
#include "vk/instance.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan {

using namespace detail;

struct context::impl {
    context_options options;
    std::shared_ptr<const instance> inst;
    std::unique_ptr<detail::device> dev;
    std::unique_ptr<allocator> alloc;
    std::unique_ptr<pipeline_set> pipes;
    std::unique_ptr<executor> exec;
    buffer_cache buffers;  // declared last: released before the allocator and device
    std::mutex mutex;      // serialises every use of the device, buffers and executor
    bool lost = false;
    call_stats last{};

    explicit impl(const context_options& opts) : options(opts) {
        inst = std::make_shared<const instance>(opts.validation || validation_from_environment());
        std::optional<std::string> selector = opts.device;
        const bool from_environment = !selector;
        if (!selector)
            if (const char* env = std::getenv("QKV_DEVICE"); env && *env) selector = env;
        std::size_t chosen = 0;
        try {
            chosen = select_device(inst->devices(), selector);
        } catch (const no_matching_device& e) {
            if (!from_environment) throw;
            throw no_matching_device("QKV_DEVICE=" + *selector + " (environment variable): " + e.what());
        }
        dev = std::make_unique<detail::device>(inst, chosen);
        alloc = std::make_unique<allocator>(*dev, opts.device_memory_limit);
        pipes = std::make_unique<pipeline_set>(*dev);
        exec = std::make_unique<executor>(*dev, opts.max_workgroup_count, opts.simulate_device_lost_at_submit);
    }

    /// Throws device_lost when an earlier call lost the device. Call with `mutex` held.
    void check_alive() const {
        if (lost)
            throw device_lost(
                "the Vulkan device of this context was lost earlier (VK_ERROR_DEVICE_LOST); create a new context");
    }

    /// What the dispatchers (run_attention, run_sdpa) work with. Call with `mutex` held.
    dispatch_environment environment() {
        dispatch_environment env{
            *dev, *alloc, *pipes, *exec, buffers, options.force_staging, options.max_fused_keys_per_dispatch};
        if (options.fused_tiles_as) env.fused_tiles_as = &*options.fused_tiles_as;
        return env;
    }
};

}  // namespace qkv::vulkan
