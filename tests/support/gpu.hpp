// The Vulkan context the tests share (validation layer on, synchronisation validation included),
// and the check that fails a test on any validation message.
#pragma once

#include <qkv/vulkan/context.hpp>
#include <qkv/vulkan/testing.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "end_of_run.hpp"

namespace qkv_test {

/// One context per test process, created on first use, with validation on and every new
/// host-visible allocation filled with 0xFF bytes (no test may pass by finding zeroed memory).
/// Destroyed at the end of the run, before exit() (end_of_run.hpp says why).
inline qkv::vulkan::context& gpu() {
    static std::optional<qkv::vulkan::context> ctx;
    if (!ctx) {
        ctx.emplace(qkv::vulkan::testing::make_context({.validation = true}, {.poison_new_memory = true}));
        at_end_of_run([] { ctx.reset(); });
    }
    return *ctx;
}

/// What a test may set of a context: the memory cap and the test hooks (qkv/vulkan/testing.hpp),
/// in the order the tests' designated initialisers name them.
struct context_setup {
    std::uint64_t device_memory_limit = 0;
    std::uint32_t max_workgroup_count = 0;
    std::uint32_t max_fused_keys_per_dispatch = 0;
    std::uint32_t max_fused_backward_heads = 0;
    bool force_staging = false;
    std::uint32_t simulate_device_lost_at_submit = 0;
    std::optional<qkv::vulkan::device_info> fused_tiles_as{};
    std::uint32_t max_decode_chunks = 0;
    std::uint32_t decode_unrolled_texels = 0;
    std::uint64_t kv_storage_range = 0;
    bool poison_new_memory = true;  // new host-visible memory filled with 0xFF bytes
    bool decode_vote = false;
};

/// A context with the validation layer (and synchronisation validation) on.
inline qkv::vulkan::context make_context(const context_setup& setup) {
    qkv::vulkan::context_options options;
    options.validation = true;
    options.device_memory_limit = setup.device_memory_limit;
    return qkv::vulkan::testing::make_context(options,
                                              {.max_workgroup_count = setup.max_workgroup_count,
                                               .max_fused_keys_per_dispatch = setup.max_fused_keys_per_dispatch,
                                               .max_fused_backward_heads = setup.max_fused_backward_heads,
                                               .force_staging = setup.force_staging,
                                               .simulate_device_lost_at_submit = setup.simulate_device_lost_at_submit,
                                               .fused_tiles_as = setup.fused_tiles_as,
                                               .max_decode_chunks = setup.max_decode_chunks,
                                               .decode_unrolled_texels = setup.decode_unrolled_texels,
                                               .kv_storage_range = setup.kv_storage_range,
                                               .poison_new_memory = setup.poison_new_memory,
                                               .decode_vote = setup.decode_vote});
}

/// Fails the current test if the validation layer said anything since the last check.
inline void require_clean(qkv::vulkan::context& ctx) {
    const std::vector<std::string> messages = ctx.take_validation_messages();
    for (const auto& m : messages) UNSCOPED_INFO(m);
    REQUIRE(messages.empty());
}

}  // namespace qkv_test
