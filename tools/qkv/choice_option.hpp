// An option that takes one of a few names (case-insensitive) and stores the matching enum value:
// `--impl auto|staged|fused`. A name not in the list is a CLI11 validation error naming the choices.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

namespace qkv::cli {

template <class Enum>
using choices = std::vector<std::pair<std::string, Enum>>;

template <class Enum>
CLI::Option* add_choice(CLI::App& command, const std::string& name, Enum& value, const choices<Enum>& options,
                        const std::string& description) {
    std::string names;
    for (const auto& option : options) names += (names.empty() ? "" : "|") + option.first;
    const auto lower = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        return s;
    };
    // The validator turns the name into the enum's number, which CLI11 then stores in `value`.
    const CLI::Validator to_number(
        [options, names, lower](std::string& input) -> std::string {
            for (const auto& [option, e] : options)
                if (lower(input) == option) {
                    input = std::to_string(static_cast<long long>(e));
                    return {};
                }
            return "'" + input + "' is not one of " + names;
        },
        "");
    const std::string default_name =
        std::find_if(options.begin(), options.end(), [&](const auto& option) { return option.second == value; })->first;
    return command.add_option(name, value, description)
        ->transform(to_number)
        ->type_name(names)
        ->default_str(default_name);
}

}  // namespace qkv::cli
