// The command-line flags of sdpa_options (tools/qkv/option_flags.hpp), made from the option list:
// every field with a flag is a flag of `qkv sdpa` and of `qkv bench`, parses into the field, and
// every field is a key of the bench's JSON. Nothing here names a field: a field added to
// qkv/runtime/sdpa_options.def is tested without an edit.
#include <CLI/CLI.hpp>

#include <qkv/runtime/options.hpp>

#include <string>
#include <vector>

#include "qkv/option_flags.hpp"
#include "support/catch.hpp"
#include "support/options.hpp"

namespace {

/// `command` with the option flags of `which`, parsed from `args`.
qkv::sdpa_options parsed(qkv::cli::option_command which, std::vector<std::string> args,
                         std::vector<qkv::sdpa_options>* sweep = nullptr) {
    CLI::App app("test");
    qkv::cli::option_inputs in;
    qkv::cli::add_option_flags(app, in, which);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
    app.parse(reversed);
    if (which == qkv::cli::option_command::sdpa) return qkv::cli::options_from_flags(in);
    const std::vector<qkv::sdpa_options> rows = qkv::cli::option_sweep(in, {});
    if (sweep) *sweep = rows;
    REQUIRE(rows.size() == 1);
    return rows.front();
}

}  // namespace

TEST_CASE("option flags: every field with a flag is one, for qkv sdpa and qkv bench", "[options][cli]") {
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        if (f.flag.empty()) continue;
        INFO(f.name);
        const qkv::sdpa_options want = qkv_test::with_other({}, f);
        const std::string flag(f.flag);
        if (f.sdpa != qkv::sdpa_flag::none && f.sdpa != qkv::sdpa_flag::paired) {
            std::vector<std::string> args{flag};
            if (f.sdpa == qkv::sdpa_flag::output)
                args.push_back("out.npy");  // an output's file: given, the field is set
            else if (!qkv::holds_bool(f))
                args.push_back(qkv_test::other_text(f));
            CHECK(qkv::same_options(parsed(qkv::cli::option_command::sdpa, args), want));
        }
        if (f.bench != qkv::bench_flag::none && f.bench != qkv::bench_flag::paired) {
            std::vector<std::string> args{flag};
            const bool is_switch = qkv::holds_bool(f) && f.bench == qkv::bench_flag::one;
            if (!is_switch) args.push_back(qkv::holds_bool(f) ? "yes" : qkv_test::other_text(f));
            CHECK(qkv::same_options(parsed(qkv::cli::option_command::bench, args), want));
        }
    }
}

TEST_CASE("option flags: a bad value names the flag; a sweep is every combination", "[options][cli]") {
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        if (f.flag.empty() || f.sdpa != qkv::sdpa_flag::value || qkv::holds_bool(f)) continue;
        INFO(f.name);
        CHECK_THROWS_WITH(parsed(qkv::cli::option_command::sdpa, {std::string(f.flag), "x!y"}),
                          Catch::Matchers::StartsWith(std::string(f.flag) + " x!y: "));
    }
    // Two swept fields of two values each: four rows, the last field fastest.
    std::vector<const qkv::option_field*> swept;
    for (const qkv::option_field& f : qkv::sdpa_option_fields)
        if (f.bench == qkv::bench_flag::sweep && swept.size() < 2) swept.push_back(&f);
    REQUIRE(swept.size() == 2);
    std::vector<std::string> args;
    for (const qkv::option_field* f : swept) {
        const std::string one = qkv::holds_bool(*f) ? "no" : qkv::field_text({}, *f);
        const std::string other = qkv::holds_bool(*f) ? "yes" : qkv_test::other_text(*f);
        args.push_back(std::string(f->flag));
        args.push_back(f->sdpa == qkv::sdpa_flag::pair ? one + ",-1" : one + "," + other);
        if (f->sdpa == qkv::sdpa_flag::pair) args.insert(args.end(), {std::string(f->flag), other});
    }
    CLI::App app("test");
    qkv::cli::option_inputs in;
    qkv::cli::add_option_flags(app, in, qkv::cli::option_command::bench);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
    const std::vector<qkv::sdpa_options> rows = qkv::cli::option_sweep(in, {});
    CHECK(rows.size() == 4);
}

TEST_CASE("option flags: every field is a key of the bench's JSON and of its label", "[options][cli]") {
    const nlohmann::ordered_json j = qkv::cli::options_json({});
    CHECK(j.size() == std::size(qkv::sdpa_option_fields));
    CHECK(qkv::cli::options_label({}).empty());
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        INFO(f.name);
        CHECK(j.contains(std::string(f.name)));
        const qkv::sdpa_options changed = qkv_test::with_other({}, f);
        CHECK(qkv::cli::options_json(changed)[std::string(f.name)] != j[std::string(f.name)]);
        CHECK(qkv::cli::options_label(changed).find(std::string(f.name)) == 0);
    }
}
