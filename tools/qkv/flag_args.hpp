// Checks every subcommand applies to its flags the same way, before any work (usage_error, exit 2,
// the message names the flag): file names that are empty, and counts.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>

#include "errors.hpp"

namespace qkv::cli {

/// Whether an option takes a file name: its type name is a file's (`X.npy`, `OUT.npy`, `FILE`).
/// Every file flag of the tool is declared so (its --help shows it).
inline bool is_file_flag(const CLI::Option& option) {
    const std::string type = option.get_type_name();
    return type == "FILE" || (type.size() > 4 && type.compare(type.size() - 4, 4, ".npy") == 0);
}

/// A file flag given as "" is refused: it never means "not given" (a script whose variable is
/// unset would silently get another computation, or no output). Call first in a subcommand's run.
inline void refuse_empty_file_names(const CLI::App& command) {
    for (const CLI::Option* option : command.get_options()) {
        if (option->count() == 0 || !is_file_flag(*option)) continue;
        for (const std::string& value : option->results())
            if (value.empty()) {
                const std::string flag = option->get_name();
                throw usage_error(flag + " is empty: name the file" +
                                  (option->get_required() ? std::string() : ", or leave " + flag + " out"));
            }
    }
}

/// A count flag (--heads, --seq, ...): a decimal whole number from 1 to `most`. Throws usage_error
/// naming the flag: "--seq must be at least 1 (it is 0)", "--seq 1e3: expected a whole number",
/// "--seq 4000000000: more than 2147483647, the largest <why>".
inline std::size_t parse_count(std::string_view flag, const std::string& text,
                               std::size_t most = static_cast<std::size_t>(-1), std::string_view why = {}) {
    const std::string name(flag);
    const std::string shown = text.empty() ? std::string("\"\"") : text;
    std::size_t value = 0;
    const char* end = text.data() + text.size();
    const auto [at, ec] = std::from_chars(text.data(), end, value);
    if (text.size() > 1 && text.front() == '-' && text.find_first_not_of("-0123456789") == std::string::npos)
        throw usage_error(name + " must be at least 1 (it is " + text + ")");
    const std::string limit = ": more than " + std::to_string(most) + ", the largest " + std::string(why);
    if (ec == std::errc::result_out_of_range)
        throw usage_error(name + " " + shown + (why.empty() ? std::string(": out of range") : limit));
    if (ec != std::errc() || at != end) throw usage_error(name + " " + shown + ": expected a whole number");
    if (value < 1) throw usage_error(name + " must be at least 1 (it is " + text + ")");
    if (value > most) throw usage_error(name + " " + shown + limit);
    return value;
}

}  // namespace qkv::cli
