// qkv — the command-line tool: registers the subcommands, parses, and maps every failure to an
// exit status (see errors.hpp) with one message on stderr.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "errors.hpp"
#include "qkv/version.hpp"
#include "qkv/vulkan/error.hpp"

#ifdef _WIN32
#include <windows.h>
#endif

namespace {

int report(const char* message, int status) {
    std::cerr << "qkv: " << message << '\n';
    return status;
}

std::string unknown_subcommand(const CLI::App& app, const std::string& word) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
    return "unknown subcommand '" + word + "' (the subcommands are " + names + "; see qkv --help)";
}

}  // namespace

int main(int argc, char** argv) {
#ifdef _WIN32
    SetConsoleOutputCP(CP_UTF8);  // the walkthrough prints ✓, ·, —
#endif
    CLI::App app{"qkv: transformer self-attention, computed at compile time and on any Vulkan GPU.", "qkv"};
    app.set_version_flag("--version", std::string("qkv ") + qkv::version_string, "Print the version and exit");
    app.require_subcommand(1);
    app.get_formatter()->column_width(34);
    app.footer("Start with `qkv example`. Run `qkv SUBCOMMAND --help` for the options of each subcommand.");

    qkv::cli::add_example(app);
    qkv::cli::add_devices(app);
    qkv::cli::add_attention(app);

    try {
        app.parse(argc, argv);  // runs the chosen subcommand
        return qkv::cli::exit_success;
    } catch (const CLI::RequiredError& e) {
        // `qkv frobnicate` reads to CLI11 as no subcommand at all: name the word it did not know.
        if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-')
            return report(unknown_subcommand(app, argv[1]).c_str(), qkv::cli::exit_usage);
        return app.exit(e) == 0 ? qkv::cli::exit_success : qkv::cli::exit_usage;
    } catch (const CLI::ParseError& e) {
        // --help and --version end parsing with status 0; everything else is a usage error.
        return app.exit(e) == 0 ? qkv::cli::exit_success : qkv::cli::exit_usage;
    } catch (const qkv::cli::usage_error& e) {
        return report(e.what(), qkv::cli::exit_usage);
    } catch (const qkv::invalid_argument& e) {
        return report(e.what(), qkv::cli::exit_usage);
    } catch (const std::exception& e) {
        return report(e.what(), qkv::cli::exit_failure);
    } catch (...) {
        return report("unexpected error", qkv::cli::exit_failure);
    }
}
