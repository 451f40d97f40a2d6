// The Vulkan context the tests share (validation layer on, synchronisation validation included),
// and the check that fails a test on any validation message.
#pragma once

#include <qkv/vulkan/context.hpp>

#include <string>
#include <vector>

#include "catch.hpp"

namespace qkv_test {

/// One context per test process, created on first use, with validation on.
inline qkv::vulkan::context& gpu() {
    static qkv::vulkan::context ctx({.validation = true});
    return ctx;
}

/// A separate context with `options`, validation forced on.
inline qkv::vulkan::context make_context(qkv::vulkan::context_options options) {
    options.validation = true;
    return qkv::vulkan::context(options);
}

/// Fails the current test if the validation layer said anything since the last check.
inline void require_clean(qkv::vulkan::context& ctx) {
    const std::vector<std::string> messages = ctx.take_validation_messages();
    for (const auto& m : messages) UNSCOPED_INFO(m);
    REQUIRE(messages.empty());
}

}  // namespace qkv_test
