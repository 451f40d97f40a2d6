// Whether a matrix computed at run time agrees with the library's compile-time value.
#pragma once

#include <cstddef>
#include <string>

#include "grid.hpp"

namespace qkv::cli {

enum class tolerance {
    exact,  ///< whole-number steps: every element identical
    close,  ///< |run − compiled| ≤ 1e-6 · max(1, |compiled|) for every element
};

inline constexpr double close_tolerance = 1e-6;

struct agreement {
    bool agrees = true;
    double largest_difference = 0;  ///< max |run − compiled|
    std::size_t row = 0, col = 0;   ///< where the first disagreement is (when !agrees)
};

agreement compare(const grid& run, const grid& compiled, tolerance tol);

/// "✓ identical", "✓ largest difference 2.4e-08", or "✗ row 2, column 1 differs by 0.5".
std::string verdict(const agreement& a);

}  // namespace qkv::cli
