// npy_compare ACTUAL.npy EXPECTED.npy [--max-nmse T]: the CLI tests' judge of a numeric result.
//
// Passes (exit 0) when both files hold the same shape and
//   * wherever EXPECTED is NaN or ±inf, ACTUAL holds the same (NaN for NaN, the same infinity);
//   * wherever EXPECTED is finite, ACTUAL is finite;
//   * the normalised mean squared error over the finite entries, Σ(a − e)² / Σe², is at most T
//     (default 1e-9); when Σe² is 0 the plain Σ(a − e)² is used.
// Prints "nmse <value>" (and the reason of a failure) and exits 1 on failure, 2 on bad usage or an
// unreadable file.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cwchar>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "npy/npy.hpp"

#ifdef _WIN32
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
// after windows.h, which it needs:
#include <shellapi.h>  // CommandLineToArgvW
#endif

namespace {

struct comparison {
    bool ok = true;
    std::string reason;
    double nmse = 0;
};

std::string index_string(std::size_t flat, const std::vector<std::size_t>& shape) {
    std::vector<std::size_t> index(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) {
        index[d] = flat % shape[d];
        flat /= shape[d];
    }
    std::string s = "(";
    for (std::size_t d = 0; d < index.size(); ++d) s += (d ? ", " : "") + std::to_string(index[d]);
    return s + ")";
}

comparison compare(const qkv::npy::array& actual, const qkv::npy::array& expected) {
    comparison c;
    if (actual.shape != expected.shape) {
        c.ok = false;
        c.reason = "shape " + actual.shape_string() + " differs from the expected " + expected.shape_string();
        return c;
    }
    const std::vector<double> a = actual.to_double(), e = expected.to_double();
    double error = 0, norm = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
        if (!std::isfinite(e[i])) {
            const bool same = std::isnan(e[i]) ? std::isnan(a[i]) : a[i] == e[i];
            if (!same && c.ok) {
                c.ok = false;
                c.reason = "element " + index_string(i, expected.shape) + " is " + std::to_string(a[i]) +
                           ", expected " + std::to_string(e[i]);
            }
            continue;
        }
        if (!std::isfinite(a[i]) && c.ok) {
            c.ok = false;
            c.reason = "element " + index_string(i, expected.shape) + " is " + std::to_string(a[i]) +
                       " where the expected value is finite (" + std::to_string(e[i]) + ")";
        }
        error += (a[i] - e[i]) * (a[i] - e[i]);
        norm += e[i] * e[i];
    }
    c.nmse = norm > 0 ? error / norm : error;
    return c;
}

int usage() {
    std::cerr << "usage: npy_compare ACTUAL.npy EXPECTED.npy [--max-nmse T]\n";
    return 2;
}

}  // namespace

/// The arguments as UTF-8. On Windows argv is in the ANSI code page, which cannot spell most file
/// names (the CLI tests use "ñ ✓ out.npy"); the UTF-16 command line can, as in tools/qkv/main.cpp.
std::vector<std::string> utf8_arguments(int argc, char** argv) {
#ifdef _WIN32
    int n = 0;
    LPWSTR* wide = CommandLineToArgvW(GetCommandLineW(), &n);
    if (wide != nullptr) {
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
    return std::vector<std::string>(argv, argv + argc);
}

int main(int argc, char** argv) {
    const std::vector<std::string> all = utf8_arguments(argc, argv);
    std::vector<std::string_view> args(all.begin() + (all.empty() ? 0 : 1), all.end());
    double max_nmse = 1e-9;
    std::vector<std::string> files;
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--max-nmse" && i + 1 < args.size()) {
            char* end = nullptr;
            const std::string value(args[++i]);
            max_nmse = std::strtod(value.c_str(), &end);
            if (end == value.c_str() || *end != '\0') return usage();
        } else {
            files.emplace_back(args[i]);
        }
    }
    if (files.size() != 2) return usage();

    try {
        const qkv::npy::array actual = qkv::npy::read(qkv::npy::path_from_utf8(files[0]));
        const qkv::npy::array expected = qkv::npy::read(qkv::npy::path_from_utf8(files[1]));
        const comparison c = compare(actual, expected);
        std::printf("%s vs %s: nmse %.3e (at most %.1e)\n", files[0].c_str(), files[1].c_str(), c.nmse, max_nmse);
        if (!c.ok) {
            std::printf("FAIL: %s\n", c.reason.c_str());
            return 1;
        }
        if (!(c.nmse <= max_nmse)) {
            std::printf("FAIL: nmse above the limit\n");
            return 1;
        }
        return 0;
    } catch (const qkv::npy::error& e) {
        std::cerr << "npy_compare: " << e.what() << '\n';
        return 2;
    }
}
