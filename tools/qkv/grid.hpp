// grid: a run-time matrix of doubles (row-major), what the tool prints and compares. Built from
// run-time data or from one of the library's compile-time qkv::matrix values.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "qkv/matrix.hpp"

namespace qkv::cli {

struct grid {
    std::size_t rows = 0;
    std::size_t cols = 0;
    std::vector<double> values;  // rows * cols, row-major

    grid() = default;
    grid(std::size_t r, std::size_t c) : rows(r), cols(c), values(r * c, 0.0) {}

    double& operator()(std::size_t r, std::size_t c) { return values[r * cols + c]; }
    double operator()(std::size_t r, std::size_t c) const { return values[r * cols + c]; }
};

/// A rows x cols grid holding `data` (row-major).
inline grid to_grid(std::span<const float> data, std::size_t rows, std::size_t cols) {
    grid g(rows, cols);
    for (std::size_t i = 0; i < g.values.size(); ++i) g.values[i] = static_cast<double>(data[i]);
    return g;
}

template <class T, std::size_t R, std::size_t C>
grid to_grid(const qkv::matrix<T, R, C>& m) {
    grid g(R, C);
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) g(r, c) = static_cast<double>(m(r, c));
    return g;
}

}  // namespace qkv::cli
