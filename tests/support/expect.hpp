// Expectations shared by the tests: a call refused with qkv::invalid_argument, its message naming
// what the test says it must.
#pragma once

#include <qkv/runtime/error.hpp>

#include <concepts>
#include <initializer_list>
#include <string>

#include "support/catch.hpp"

namespace qkv_test {

/// Runs `call` (a callable: so that a test's own expect_invalid of a problem is not this one),
/// expecting a qkv::invalid_argument whose message contains every one of `words`.
template <std::invocable F>
void expect_invalid(F&& call, std::initializer_list<std::string> words) {
    bool thrown = false;
    try {
        call();
    } catch (const qkv::invalid_argument& e) {
        thrown = true;
        const std::string message = e.what();
        INFO("message: " << message);
        for (const std::string& w : words) CHECK(message.find(w) != std::string::npos);
    }
    CHECK(thrown);
}

}  // namespace qkv_test
