#include "api/device_core.hpp"

#include <vector>

#include "api/device_request.hpp"
#include "api/recording_impl.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {

device_core::device_core(const context_options& options, const testing::hooks& hooks) {
    inst = std::make_shared<const instance>(validation_requested(options.validation));
    bool from_environment = false;
    const std::optional<std::string> selector = device_selector(options.device, from_environment);
    std::size_t chosen = 0;
    try {
        chosen = select_device(inst->devices(), selector);
    } catch (const no_matching_device& e) {
        if (!from_environment) throw;
        throw no_matching_device("QKV_DEVICE=" + *selector + " (environment variable): " + e.what());
    }
    dev = std::make_unique<device>(inst, chosen);
    alloc = std::make_unique<allocator>(*dev, options.device_memory_limit, hooks.poison_new_memory);
    pipes = std::make_unique<pipeline_set>(*dev);
    exec = std::make_unique<executor>(*dev, hooks.max_workgroup_count, hooks.simulate_device_lost_at_submit);
}

device_core::device_core(std::shared_ptr<const instance> external, const external_handles& handles,
                         const context_options& options, const testing::hooks& hooks)
    : inst(std::move(external)) {
    dev = std::make_unique<device>(inst, handles);
    alloc = std::make_unique<allocator>(*dev, options.device_memory_limit, hooks.poison_new_memory);
    pipes = std::make_unique<pipeline_set>(*dev);
    exec = std::make_unique<executor>(*dev, hooks.max_workgroup_count, hooks.simulate_device_lost_at_submit);
}

void device_core::check_alive() const {
    if (lost)
        throw device_lost(
            "the Vulkan device of this context was lost earlier (VK_ERROR_DEVICE_LOST); create a new context");
}

std::vector<std::shared_ptr<void>> device_core::reclaim() noexcept {
    std::vector<std::shared_ptr<void>> later;
    if (retirees.empty()) return later;
    try {
        later.reserve(retirees.size());
    } catch (...) {
        return later;  // the next call tries again
    }
    std::erase_if(retirees, [&](std::unique_ptr<retired>& r) {
        if (!r->finished()) return false;
        later.push_back(r->after_lock());
        return true;
    });
    return later;
}

}  // namespace qkv::vulkan::detail

namespace qkv::vulkan {

testing::live_objects testing::live() noexcept {
    return {.device_cores = detail::live_count<detail::device_core>::now(),
            .recordings = detail::live_count<recording::impl>::now()};
}

std::size_t testing::pipelines_created() noexcept { return detail::pipeline_set::created(); }

}  // namespace qkv::vulkan
