// The one table of the names the CLI gives precisions, implementations and kernel families: the
// option parsers (`qkv attention`, `qkv bench`) and every printed table and JSON file use these.
#pragma once

#include <string>
#include <vector>

#include "choice_option.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::cli {

inline const choices<qkv::precision>& precision_names() {
    static const choices<qkv::precision> names{{"fp32", qkv::precision::fp32}, {"fp16", qkv::precision::fp16}};
    return names;
}

inline const choices<qkv::implementation>& implementation_names() {
    static const choices<qkv::implementation> names{{"auto", qkv::implementation::automatic},
                                                    {"staged", qkv::implementation::staged},
                                                    {"fused", qkv::implementation::fused}};
    return names;
}

inline const choices<qkv::kernel_family>& kernel_names() {
    static const choices<qkv::kernel_family> names{
        {"auto", qkv::kernel_family::automatic}, {"cpu", qkv::kernel_family::cpu}, {"gpu", qkv::kernel_family::gpu}};
    return names;
}

/// The table's name of `value` ("?" for a value not in it).
template <class Enum>
const char* name_in(const choices<Enum>& table, Enum value) {
    for (const auto& [name, e] : table)
        if (e == value) return name.c_str();
    return "?";
}
inline const char* name_of(qkv::precision p) { return name_in(precision_names(), p); }
inline const char* name_of(qkv::implementation i) { return name_in(implementation_names(), i); }
inline const char* name_of(qkv::kernel_family k) { return name_in(kernel_names(), k); }

/// The value named `name` in `table`; `fallback` for a name not in it (parsers validate first).
template <class Enum>
Enum value_in(const choices<Enum>& table, const std::string& name, Enum fallback) {
    for (const auto& [n, e] : table)
        if (n == name) return e;
    return fallback;
}

/// The names of a table, for CLI11's IsMember checks of list options.
template <class Enum>
std::vector<std::string> names_of(const choices<Enum>& table) {
    std::vector<std::string> out;
    for (const auto& entry : table) out.push_back(entry.first);
    return out;
}

}  // namespace qkv::cli
