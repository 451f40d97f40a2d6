// libFuzzer target for the command line of `qkv attention`: arbitrary arguments (the input split
// at newlines) parsed with the tool's own options (tools/qkv/attention_args.cpp), then the tool's
// usage checks. Invariants: CLI11 reports only ParseErrors; the checks report only usage_errors
// whose message names the flag; whatever passes them holds values the run can use as they are.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "attention_args.hpp"
#include "errors.hpp"

namespace {

[[noreturn]] void die(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "cli_args_fuzz: invariant violated: %s %s\n", what, detail.c_str());
    std::abort();
}

void check(bool ok, const char* what, const std::string& detail = {}) {
    if (!ok) die(what, detail);
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

/// parse_scale on any text: a usage_error naming --scale, or a finite float32 that is 0 only
/// when the text means 0.
void check_scale(const std::string& text) {
    float scale = 0;
    try {
        scale = qkv::cli::parse_scale(text);
    } catch (const qkv::cli::usage_error& e) {
        check(starts_with(e.what(), "--scale "), "a --scale error that does not name --scale:", e.what());
        return;
    }
    check(std::isfinite(scale), "parse_scale accepted a non-finite scale:", text);
    if (scale == 0) check(std::strtod(text.c_str(), nullptr) == 0, "parse_scale rounded to 0:", text);
}

/// parse_heads on any text: a usage_error naming --heads, or a count of at least 1.
void check_heads(const std::string& text) {
    try {
        check(qkv::cli::parse_heads(text) >= 1, "parse_heads accepted 0:", text);
    } catch (const qkv::cli::usage_error& e) {
        check(starts_with(e.what(), "--heads "), "a --heads error that does not name --heads:", e.what());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    std::vector<std::string> args;
    for (std::size_t start = 0; start <= text.size() && args.size() < 64;) {
        const std::size_t end = std::min(text.find('\n', start), text.size());
        args.emplace_back(text.substr(start, end - start));
        start = end + 1;
    }
    for (const std::string& a : args) {
        check_scale(a);
        check_heads(a);
    }

    CLI::App app{"qkv", "qkv"};
    qkv::cli::attention_options o;
    CLI::App* cmd = app.add_subcommand("attention", "");
    qkv::cli::add_attention_options(*cmd, o);
    std::vector<std::string> argv{"attention"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
    try {
        app.parse(reversed);
    } catch (const CLI::ParseError&) {
        return 0;  // --help included
    }
    if (!app.got_subcommand(cmd)) return 0;
    try {
        qkv::cli::check_usage(o);
    } catch (const qkv::cli::usage_error& e) {
        check(starts_with(e.what(), "--"), "a usage error that names no flag:", e.what());
        return 0;
    }
    // Accepted: everything run() takes as it is.
    check(!o.out.empty(), "an empty --out was accepted");
    check(!(o.weights_option->count() > 0 && o.weights.empty()), "an empty --weights was accepted");
    check(qkv::cli::parse_heads(o.heads) >= 1, "--heads below 1 was accepted");
    if (o.scale_option->count() > 0) check(std::isfinite(qkv::cli::parse_scale(o.scale)), "non-finite --scale");
    check(o.weights.empty() || o.implementation != qkv::implementation::fused, "--weights with --impl fused");
    return 0;
}
