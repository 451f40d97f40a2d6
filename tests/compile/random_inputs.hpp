// Deterministic pseudo-random inputs for the compile-time proofs, computed by the compiler.
// tests/compile/gen_attention_reference.py generates the very same values (same formula, exact
// in float) to compute its float64 reference.
//
// Entry (i, j) of stream `seed` is splitmix64(seed << 32 | i · cols + j), a counter-based
// generator (no state: each entry is a pure function of its index). Its top 24 bits u give
//   inputs  x: (u - 2^23) · 2^-22, uniform on [-2, 2)      (variance 4/3)
//   weights w: (u - 2^23) · 2^-25, uniform on [-1/4, 1/4)  (variance 1/48)
// both exact in float. With d = 64 the queries and keys then have a standard deviation near 1.3
// and the scaled scores near 1.8: softmax rows that are neither one-hot nor flat, as in a trained
// model. Never all zeros.
#pragma once

#include <cstddef>
#include <cstdint>

#include <qkv/matrix.hpp>

namespace qkv_test {

constexpr std::uint64_t splitmix64(std::uint64_t z) {
    z += 0x9E37'79B9'7F4A'7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
    return z ^ (z >> 31);
}

/// R x C matrix of stream `seed`, entries (u - 2^23) · 2^-exponent (u: 24 random bits).
template <std::size_t R, std::size_t C>
constexpr qkv::matrix<float, R, C> random_matrix(std::uint64_t seed, int exponent) {
    qkv::matrix<float, R, C> m{};
    float scale = 1.f;
    for (int e = 0; e < exponent; ++e) scale *= 0.5f;
    for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < C; ++j) {
            const auto u = static_cast<std::int32_t>(splitmix64(seed << 32 | (i * C + j)) >> 40);
            m.elems[i][j] = static_cast<float>(u - (1 << 23)) * scale;
        }
    return m;
}

/// Inputs of an attention problem: x (N x d) from stream 1, wq, wk, wv (d x d) from 2, 3, 4.
template <std::size_t N, std::size_t D>
constexpr auto random_x() {
    return random_matrix<N, D>(1, 22);
}
template <std::size_t D>
constexpr auto random_w(std::uint64_t which) {  // 0: wq, 1: wk, 2: wv
    return random_matrix<D, D>(2 + which, 25);
}

}  // namespace qkv_test

namespace qkv_test {

/// Largest |out - ref| over all entries, in double; NaN in `out` gives +inf (never passes).
template <std::size_t R, std::size_t C>
constexpr double max_error(const qkv::matrix<float, R, C>& out, const double (&ref)[R][C]) {
    double worst = 0;
    for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < C; ++j) {
            const double v = static_cast<double>(out.elems[i][j]);
            if (v != v) return 1e300;
            const double d = v > ref[i][j] ? v - ref[i][j] : ref[i][j] - v;
            if (d > worst) worst = d;
        }
    return worst;
}

/// Largest |ref| (to show that the reference is not trivially small).
template <std::size_t R, std::size_t C>
constexpr double max_magnitude(const double (&ref)[R][C]) {
    double worst = 0;
    for (std::size_t i = 0; i < R; ++i)
        for (std::size_t j = 0; j < C; ++j) {
            const double a = ref[i][j] < 0 ? -ref[i][j] : ref[i][j];
            if (a > worst) worst = a;
        }
    return worst;
}

/// Tolerance of the float32 attention outputs against the float64 reference (|output| <= 4).
/// Each output entry is a chain of float32 sums of length d = 64 (projections, scores) and N
/// (softmax sum, weights·V), rounded at 2^-24 relative per step: the errors the generator's
/// float32 emulation of qkv's summation order measures are 1.8e-6 (N = 64) and 2.7e-6 (N = 256).
/// 2e-5 leaves a factor of 7 for exp's ulp and rounding luck and still fails on any real mistake:
/// a wrong scale, a dropped or reordered row, or one wrong weight of size 1e-4 and up.
inline constexpr double output_tolerance = 2e-5;

}  // namespace qkv_test
