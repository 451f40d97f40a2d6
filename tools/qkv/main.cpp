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
#include <cstdio>
#include <cwchar>
#include <utility>
#include <vector>

#include <windows.h>
// after windows.h, which it needs:
#include <shellapi.h>  // CommandLineToArgvW
#endif

namespace {

#ifdef _WIN32
/// The console's output code page is UTF-8 while qkv runs (the walkthrough prints ✓, ·, —) and
/// is restored afterwards: it belongs to the console window, which outlives qkv.
class utf8_console {
public:
    utf8_console() : previous_(GetConsoleOutputCP()) {
        if (previous_ != 0) SetConsoleOutputCP(CP_UTF8);  // 0: no console
    }
    ~utf8_console() {
        if (previous_ == 0) return;
        std::cout.flush();
        std::cerr.flush();
        std::fflush(nullptr);
        SetConsoleOutputCP(previous_);
    }
    utf8_console(const utf8_console&) = delete;
    utf8_console& operator=(const utf8_console&) = delete;

private:
    UINT previous_;
};

/// The command line in UTF-8, as the rest of qkv expects (file names included). main's argv has
/// it in the ANSI code page, which cannot spell most names; the UTF-16 original can.
std::vector<std::string> utf8_arguments(int argc, char** argv) {
    int n = 0;
    LPWSTR* wide = CommandLineToArgvW(GetCommandLineW(), &n);
    if (wide == nullptr) return std::vector<std::string>(argv, argv + argc);
    std::vector<std::string> args;
    for (int i = 0; i < n; ++i) {
        const int wlen = static_cast<int>(std::wcslen(wide[i]));
        const int len = WideCharToMultiByte(CP_UTF8, 0, wide[i], wlen, nullptr, 0, nullptr, nullptr);
        std::string arg(static_cast<std::size_t>(len > 0 ? len : 0), '\0');
        if (len > 0) WideCharToMultiByte(CP_UTF8, 0, wide[i], wlen, arg.data(), len, nullptr, nullptr);
        args.push_back(std::move(arg));
    }
    LocalFree(wide);
    return args;
}
#endif

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
    const utf8_console console;
    std::vector<std::string> utf8_args = utf8_arguments(argc, argv);
    std::vector<char*> utf8_argv;
    for (std::string& arg : utf8_args) utf8_argv.push_back(arg.data());
    utf8_argv.push_back(nullptr);
    argc = static_cast<int>(utf8_args.size());
    argv = utf8_argv.data();
#endif
    CLI::App app{"qkv: transformer self-attention, computed at compile time and on any Vulkan GPU.", "qkv"};
    app.set_version_flag("--version", std::string("qkv ") + qkv::version_string, "Print the version and exit");
    app.require_subcommand(1);
    // CLI11 reads `/word` as an option on Windows by default, so `--part /data/o.npy /data/lse.npy`
    // would end the list at the second path. qkv's options are `--name` on every system: a path
    // that starts with / (MSYS, wine, a forward-slash habit) is a value. Set before the
    // subcommands are added: they copy it.
    app.allow_windows_style_options(false);
    app.get_formatter()->column_width(34);
    app.footer("Start with `qkv example`. Run `qkv SUBCOMMAND --help` for the options of each subcommand.");

    qkv::cli::add_example(app);
    qkv::cli::add_devices(app);
    qkv::cli::add_attention(app);
    qkv::cli::add_sdpa(app);
    qkv::cli::add_merge(app);
    qkv::cli::add_bench(app);

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
    } catch (const qkv::vulkan::no_matching_device& e) {  // --device or QKV_DEVICE names no device
        return report(e.what(), qkv::cli::exit_usage);
    } catch (const qkv::vulkan::numeric_overflow& e) {  // inputs too large for the chosen precision
        return report(e.what(), qkv::cli::exit_usage);
    } catch (const std::exception& e) {
        return report(e.what(), qkv::cli::exit_failure);
    } catch (...) {
        return report("unexpected error", qkv::cli::exit_failure);
    }
}
