// Comparing run-time matrices with compile-time ones (see agreement.hpp).
#include "agreement.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace qkv::cli {

agreement compare(const grid& run, const grid& compiled, tolerance tol) {
    agreement a;
    if (run.rows != compiled.rows || run.cols != compiled.cols) {
        a.agrees = false;
        a.largest_difference = std::numeric_limits<double>::infinity();
        return a;
    }
    for (std::size_t r = 0; r < run.rows; ++r)
        for (std::size_t c = 0; c < run.cols; ++c) {
            const double got = run(r, c), want = compiled(r, c);
            const double difference = std::fabs(got - want);
            const bool ok =
                tol == tolerance::exact ? got == want : difference <= close_tolerance * std::max(1.0, std::fabs(want));
            if (!ok && a.agrees) {
                a.agrees = false;
                a.row = r;
                a.col = c;
            }
            // NaN never agrees and makes the largest difference NaN.
            if (!(difference <= a.largest_difference)) a.largest_difference = difference;
        }
    return a;
}

std::string verdict(const agreement& a) {
    const auto scientific = [](double value, int digits) {
        char buffer[32];
        std::snprintf(buffer, sizeof buffer, "%.*e", digits, value);
        return std::string(buffer);
    };
    if (!a.agrees)
        return "\u2717 row " + std::to_string(a.row + 1) + ", column " + std::to_string(a.col + 1) +
               " differs (largest difference " + scientific(a.largest_difference, 1) + ")";
    if (a.largest_difference == 0) return "\u2713 identical";
    return "\u2713 largest difference " + scientific(a.largest_difference, 1);
}

}  // namespace qkv::cli
