// The size checks shared by every problem's validate(): products that cannot overflow, spans that
// fit their shapes, messages that name the inputs ("wq has 10 elements, expected d_in x d_k = 4 x 3
// = 12"). Internal to the library.
#pragma once

#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "qkv/runtime/error.hpp"

namespace qkv::shape_checks {

[[noreturn]] inline void fail(const std::string& message) { throw invalid_argument(message); }

/// "1.5 GiB": a size in the messages of a host allocation that failed.
inline std::string gib(double bytes) {
    char text[40];
    std::snprintf(text, sizeof text, "%.1f GiB", bytes / 1073741824.0);
    return std::string(text);
}

/// One factor of a size product: its name in messages and its value.
struct factor {
    std::string_view name;
    std::size_t value;
};

/// "batch x seq x d_in".
inline std::string names_of(std::initializer_list<factor> factors) {
    std::string s;
    for (const factor& f : factors) {
        if (!s.empty()) s += " x ";
        s += f.name;
    }
    return s;
}

/// "2 x 3 x 4 = 24".
inline std::string values_of(std::initializer_list<factor> factors, std::size_t product) {
    std::string s;
    for (const factor& f : factors) {
        if (!s.empty()) s += " x ";
        s += std::to_string(f.value);
    }
    return factors.size() > 1 ? s + " = " + std::to_string(product) : s;
}

/// The product of the factors; throws "shape too large: batch x seq x d_in overflows" if it does
/// not fit a std::size_t.
inline std::size_t checked_product(std::initializer_list<factor> factors) {
    std::size_t product = 1;
    for (const factor& f : factors) {
        if (f.value != 0 && product > std::numeric_limits<std::size_t>::max() / f.value)
            fail("shape too large: " + names_of(factors) + " overflows");
        product *= f.value;
    }
    return product;
}

/// `span` must hold exactly the product of `factors` elements:
/// "wq has 10 elements, expected d_in x d_k = 4 x 3 = 12".
template <class T>
void expect_size(std::string_view what, std::span<const T> span, std::initializer_list<factor> factors) {
    const std::size_t want = checked_product(factors);
    if (span.size() != want)
        fail(std::string(what) + " has " + std::to_string(span.size()) + " elements, expected " + names_of(factors) +
             " = " + values_of(factors, want));
}

/// A bias is optional: empty, or exactly `width` elements.
template <class T>
void expect_bias(std::string_view what, std::span<const T> bias, factor width) {
    if (!bias.empty() && bias.size() != width.value)
        fail(std::string(what) + " has " + std::to_string(bias.size()) + " elements, expected " +
             std::string(width.name) + " = " + std::to_string(width.value) + " (or none)");
}

inline void expect_positive(std::string_view name, std::size_t value) {
    if (value == 0) fail(std::string(name) + " must be at least 1");
}

}  // namespace qkv::shape_checks
