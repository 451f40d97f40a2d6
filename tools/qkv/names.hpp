// The names the CLI gives precisions, implementations and kernel families: the option parsers
// (`qkv attention`, `qkv bench`) and every printed table and JSON file use these. The options'
// enums take their names from the runtime's one table each (qkv/runtime/options.hpp).
#pragma once

#include <string>
#include <vector>

#include "choice_option.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv::cli {

/// The runtime's names of an options enum, aliases (accepted, never printed) last.
template <class Enum>
choices<Enum> runtime_choices() {
    choices<Enum> out;
    for (const bool alias : {false, true})
        for (const qkv::enum_name<Enum>& n : qkv::names_of<Enum>())
            if (n.alias == alias) out.emplace_back(std::string(n.name), n.value);
    return out;
}

inline const choices<qkv::precision>& precision_names() {
    static const choices<qkv::precision> names = runtime_choices<qkv::precision>();
    return names;
}

inline const choices<qkv::implementation>& implementation_names() {
    static const choices<qkv::implementation> names{{"auto", qkv::implementation::automatic},
                                                    {"staged", qkv::implementation::staged},
                                                    {"fused", qkv::implementation::fused}};
    return names;
}

inline const choices<qkv::kernel_family>& kernel_names() {
    static const choices<qkv::kernel_family> names = runtime_choices<qkv::kernel_family>();
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
