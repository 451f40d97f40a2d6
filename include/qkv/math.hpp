// qkv/math.hpp -- constexpr exp and sqrt for float and double.
//
// <cmath> is not constexpr in C++20, but compile-time attention needs exp
// (softmax) and sqrt (1/sqrt(d) scaling).  The functions here are usable in
// constant expressions on GCC >= 12, Clang >= 14 and MSVC (C++20), and the
// very same code runs at run time: there is no std::is_constant_evaluated()
// switch, so the run-time accuracy tests measure exactly what constant
// evaluation produces.
//
// Portability rules followed throughout:
//   * no compiler builtins, no long double (long double is double on MSVC);
//     the only bit-level tool is std::bit_cast, which is constexpr everywhere;
//   * no recursion (constexpr call-depth limit) and few statements per call
//     (Clang counts evaluated statements against -fconstexpr-steps): every
//     polynomial is one Horner expression, every loop has a fixed small count;
//   * constant evaluation rejects floating-point operations whose result is
//     NaN (Clang) or otherwise not well defined, so special inputs (NaN, inf,
//     overflow) are returned before any arithmetic touches them;
//   * the algorithms assume IEEE-754 binary32/binary64 evaluated in their own
//     precision (FLT_EVAL_METHOD 0, i.e. SSE2 / ARM / any 64-bit target) and
//     round-to-nearest.  The exactness arguments (Cody-Waite product, Fast2Sum
//     of 1 + r, power-of-two scaling) hold with or without FMA contraction, and
//     sqrt's final rounding decision is made in integer arithmetic.  Bit-equal
//     compile-time and run-time results additionally need the run-time code
//     not to be contracted (the default for GCC in -std=c++20 mode, for Clang
//     unless FMA is enabled with -march/-mfma, and for MSVC /fp:precise);
//     with contraction exp may differ by an ulp between the two.
//
// Accuracy (distance from the correctly rounded result, measured by
// tests/math_accuracy_test.cpp; see each function):
//   exp(float)   <= 1 ulp, in practice correctly rounded
//   exp(double)  <= 1 ulp, ~98% correctly rounded
//   sqrt(float)  correctly rounded
//   sqrt(double) correctly rounded
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <limits>

namespace qkv {

// ---------------------------------------------------------------------------
// Classification helpers and special values.  All constexpr, all NaN-safe:
// they only compare or reinterpret bits, never compute with a NaN.
// ---------------------------------------------------------------------------

/// +infinity of T (same as std::numeric_limits<T>::infinity()).
template <std::floating_point T>
[[nodiscard]] constexpr T infinity() noexcept {
    return std::numeric_limits<T>::infinity();
}

/// A quiet NaN of T (same as std::numeric_limits<T>::quiet_NaN()).
template <std::floating_point T>
[[nodiscard]] constexpr T quiet_nan() noexcept {
    return std::numeric_limits<T>::quiet_NaN();
}

/// True for any NaN (a NaN is the only value that compares unequal to itself).
[[nodiscard]] constexpr bool isnan(float x) noexcept { return x != x; }
[[nodiscard]] constexpr bool isnan(double x) noexcept { return x != x; }

/// True for +inf and -inf.
[[nodiscard]] constexpr bool isinf(float x) noexcept { return x == infinity<float>() || x == -infinity<float>(); }
[[nodiscard]] constexpr bool isinf(double x) noexcept { return x == infinity<double>() || x == -infinity<double>(); }

/// True for every value that is neither NaN nor infinite (NaN compares false).
[[nodiscard]] constexpr bool isfinite(float x) noexcept {
    return x >= -(std::numeric_limits<float>::max)() && x <= (std::numeric_limits<float>::max)();
}
[[nodiscard]] constexpr bool isfinite(double x) noexcept {
    return x >= -(std::numeric_limits<double>::max)() && x <= (std::numeric_limits<double>::max)();
}

/// True when the sign bit is set (also for -0 and negative NaNs).
[[nodiscard]] constexpr bool signbit(float x) noexcept { return (std::bit_cast<std::uint32_t>(x) >> 31) != 0; }
[[nodiscard]] constexpr bool signbit(double x) noexcept { return (std::bit_cast<std::uint64_t>(x) >> 63) != 0; }

/// |x| by clearing the sign bit: abs(-0) is +0, abs(NaN) is a NaN.
[[nodiscard]] constexpr float abs(float x) noexcept {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0x7FFF'FFFFu);
}
[[nodiscard]] constexpr double abs(double x) noexcept {
    return std::bit_cast<double>(std::bit_cast<std::uint64_t>(x) & 0x7FFF'FFFF'FFFF'FFFFull);
}

namespace detail {

// 2^k as an exact double, built from the exponent field.  k in [-1022, 1023].
[[nodiscard]] constexpr double pow2(int k) noexcept {
    return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

// Round-to-nearest integer for |v| < 2^31 (halfway cases go away from zero;
// exp only needs *a* nearby integer, the reduced argument stays small).
[[nodiscard]] constexpr int round_to_int(double v) noexcept { return static_cast<int>(v < 0.0 ? v - 0.5 : v + 0.5); }

// Cody-Waite split of ln 2.  ln2_hi keeps 42 significant bits (11 trailing zero
// bits), so k * ln2_hi is exact for |k| < 2^11 and x - k * ln2_hi is exact;
// ln2_lo = ln 2 - ln2_hi rounded to double.  inv_ln2 = 1 / ln 2 rounded.
inline constexpr double ln2_hi = 0x1.62e42fefa3800p-1;   // 0.6931471805598903
inline constexpr double ln2_lo = 0x1.ef35793c76730p-45;  // 5.497923018708371e-14
inline constexpr double inv_ln2 = 0x1.71547652b82fep+0;  // 1.4426950408889634

// exp overflow / underflow limits.
//   exp_max_d: largest double whose exp is finite (exp rounds to <= DBL_MAX).
//   exp_min_d: below this exp(x) < 2^-1075 (half the least subnormal), i.e. 0;
//              ln(2^-1075) = -745.13321910194120..., inputs between the two
//              are handled by the main path and round correctly to 0 or to a
//              subnormal.
//   exp_max_f / exp_min_f: the same for float; ln(2^-150) = -103.97207708...
inline constexpr double exp_max_d = 0x1.62e42fefa39efp+9;  // 709.782712893384
inline constexpr double exp_min_d = -745.2;
inline constexpr float exp_max_f = 0x1.62e42ep+6f;  // 88.72283172607422
inline constexpr float exp_min_f = -104.0f;

// 1/n! rounded to double (every n! used here is exactly representable).
inline constexpr double inv_fact2 = 1.0 / 2.0;
inline constexpr double inv_fact3 = 1.0 / 6.0;
inline constexpr double inv_fact4 = 1.0 / 24.0;
inline constexpr double inv_fact5 = 1.0 / 120.0;
inline constexpr double inv_fact6 = 1.0 / 720.0;
inline constexpr double inv_fact7 = 1.0 / 5040.0;
inline constexpr double inv_fact8 = 1.0 / 40320.0;
inline constexpr double inv_fact9 = 1.0 / 362880.0;
inline constexpr double inv_fact10 = 1.0 / 3628800.0;
inline constexpr double inv_fact11 = 1.0 / 39916800.0;
inline constexpr double inv_fact12 = 1.0 / 479001600.0;
inline constexpr double inv_fact13 = 1.0 / 6227020800.0;

// p * 2^k for p in [0.7, 1.5) and k in [-1075, 1024].  When 2^k is not a normal
// double (k < -1022 or k > 1023) or the product is subnormal, the scaling is
// split so that the first multiplication is exact and only the last one
// rounds: the subnormal result is p * 2^k correctly rounded (one rounding).
[[nodiscard]] constexpr double scale_pow2(double p, int k) noexcept {
    if (k < -1021) return (p * pow2(k + 64)) * 0x1p-64;
    if (k > 1023) return (p * pow2(k - 1)) * 2.0;
    return p * pow2(k);
}

inline constexpr double dbl_max = 0x1.fffffffffffffp+1023;
inline constexpr double dbl_min = 0x1p-1022;
inline constexpr float flt_max = 0x1.fffffep+127f;
inline constexpr float flt_min = 0x1p-126f;
inline constexpr std::uint64_t frac_mask_d = 0x000F'FFFF'FFFF'FFFFull;
inline constexpr std::uint64_t hidden_bit_d = 0x0010'0000'0000'0000ull;

// y clamped to [1, 2 - ulp]: sqrt(m) for m in [1, 4) lies in [1, 2), and the
// Newton result may be off by an ulp at either end.
[[nodiscard]] constexpr double clamp_1_2(double y, double ulp) noexcept {
    return y < 1.0 ? 1.0 : (y > 2.0 - ulp ? 2.0 - ulp : y);
}

// Final rounding step of sqrt.  Y is the candidate root as an integer (y =
// Y * ulp, y in [1, 2)), R = (m - y^2) / ulp^2 the exact residual as a two's
// complement 64-bit value.  With integers, sqrt(m) > y + ulp/2 iff
// m / ulp^2 > Y^2 + Y + 1/4 iff R > Y, and sqrt(m) < y - ulp/2 iff R <= -Y
// (equality is impossible: the square of a midpoint has too many bits).
// Returns Y, Y + 1 or Y - 1: the correctly rounded root when Y is within one
// unit of it.
[[nodiscard]] constexpr std::uint64_t sqrt_round(std::uint64_t R, std::uint64_t Y) noexcept {
    const auto r = static_cast<std::int64_t>(R);  // modular conversion (C++20)
    const auto y = static_cast<std::int64_t>(Y);
    return r > y ? Y + 1 : (r <= -y ? Y - 1 : Y);
}

// sqrt seed on [1, 4): quadratic minimax fit for relative error (Remez),
// max relative error 5.0e-3 (about 7.6 bits).  Each Newton step
// y <- (y + m/y) / 2 squares the relative error and halves it:
// 5.0e-3 -> 1.3e-5 -> 7.9e-11 -> 3.1e-21.
[[nodiscard]] constexpr double sqrt_seed(double m) noexcept {
    return 0.51855462778 + m * (0.52600969119 + m * -0.03954011280);
}

}  // namespace detail

// ---------------------------------------------------------------------------
// exp
// ---------------------------------------------------------------------------

/// e^x for double.
/// Method: x = k ln2 + r with k = round(x / ln2) and |r| <= ln2/2, r computed
/// with a Cody-Waite two-part ln2 (k * ln2_hi exact) and its rounding error c
/// kept; exp(r + c) from the degree-13 Taylor polynomial of exp(r) (truncation
/// < 5.9e-18 relative, below 2^-57) in one Horner expression, arranged as
/// (1 + r) + small with 1 + r split exactly (Fast2Sum), so that only the final
/// addition rounds at the result's scale; result = exp(r) * 2^k with an exact
/// power-of-two scale (detail::scale_pow2), which rounds subnormal results
/// only once.
/// Specials: NaN -> NaN, +inf -> +inf, -inf -> +0, x > 709.782712893384 ->
/// +inf, x < -745.2 -> +0, exp(+-0) == 1 exactly.
/// Accuracy: largest error measured 0.67 ulp (2e7 random inputs against an
/// 80-bit reference), i.e. <= 1 ulp from the correctly rounded result; ~98%
/// of inputs are correctly rounded.
[[nodiscard]] constexpr double exp(double x) noexcept {
    if (!(x <= detail::exp_max_d)) return isnan(x) ? x : infinity<double>();
    if (x < detail::exp_min_d) return 0.0;
    const int k = detail::round_to_int(x * detail::inv_ln2);
    const double kd = static_cast<double>(k);
    const double t = x - kd * detail::ln2_hi;        // exact
    const double r = t - kd * detail::ln2_lo;        // reduced argument, |r| <= 0.3466
    const double c = (t - r) - kd * detail::ln2_lo;  // rounding error of r
    const double one_r = 1.0 + r;                    // 1 + r == one_r + ((1 - one_r) + r) exactly
    // q(r) = (exp(r) - 1 - r) / r^2, Taylor to r^13 (truncation < 2^-57).
    const double q =
        detail::inv_fact2 +
        r * (detail::inv_fact3 +
             r * (detail::inv_fact4 +
                  r * (detail::inv_fact5 +
                       r * (detail::inv_fact6 +
                            r * (detail::inv_fact7 +
                                 r * (detail::inv_fact8 +
                                      r * (detail::inv_fact9 +
                                           r * (detail::inv_fact10 +
                                                r * (detail::inv_fact11 +
                                                     r * (detail::inv_fact12 + r * detail::inv_fact13))))))))));
    // exp(r + c) = 1 + r + c + r c + r^2 q(r) + O(c^2, c r^2): everything but
    // the leading 1 + r is small and is summed first, so only the last
    // addition rounds at the result's scale.
    return detail::scale_pow2(one_r + (((1.0 - one_r) + r) + (c + r * (c + r * q))), k);
}

/// e^x for float.
/// Method: as exp(double), but evaluated entirely in double (x is exact in
/// double) with a degree-11 Taylor polynomial (truncation < 9e-15 relative)
/// and 2^k applied exactly in double (k in [-150, 128] is always a normal
/// double); the double result, accurate to ~2^-46, is rounded once to float,
/// which also produces correctly rounded float subnormals.
/// Specials: NaN -> NaN, +inf -> +inf, -inf -> +0, x > 88.72283172607422f ->
/// +inf, x < -104 -> +0, exp(+-0) == 1 exactly.
/// Accuracy: <= 1 ulp; wrong rounding only when exp(x) lies within ~2^-46
/// (relative) of a midpoint between two floats.  Checked exhaustively: of all
/// 2.24e9 floats in [-110, 89], 2 differ (by 1 ulp) from std::exp in double
/// rounded to float.
[[nodiscard]] constexpr float exp(float x) noexcept {
    if (!(x <= detail::exp_max_f)) return isnan(x) ? x : infinity<float>();
    if (x < detail::exp_min_f) return 0.0f;
    const int k = detail::round_to_int(static_cast<double>(x) * detail::inv_ln2);
    const double kd = static_cast<double>(k);
    const double r = (static_cast<double>(x) - kd * detail::ln2_hi) - kd * detail::ln2_lo;
    const double p =
        1.0 +
        r * (1.0 + r * (detail::inv_fact2 +
                        r * (detail::inv_fact3 +
                             r * (detail::inv_fact4 +
                                  r * (detail::inv_fact5 +
                                       r * (detail::inv_fact6 +
                                            r * (detail::inv_fact7 +
                                                 r * (detail::inv_fact8 +
                                                      r * (detail::inv_fact9 +
                                                           r * (detail::inv_fact10 + r * detail::inv_fact11))))))))));
    return static_cast<float>(p * detail::pow2(k));
}

// ---------------------------------------------------------------------------
// sqrt
// ---------------------------------------------------------------------------

/// Square root for double, correctly rounded.
/// Method: subnormals are first multiplied by 2^54 (exact); then x = m * 4^j
/// with m in [1, 4) taken straight from the bits (mantissa plus exponent
/// parity), so sqrt(x) = sqrt(m) * 2^j with an exact 2^j.  sqrt(m): quadratic
/// seed (7.6 bits) and three Newton steps give y within 1 ulp; then the exact
/// residual R = m - y^2, scaled by 2^104, is computed in 64-bit integers (see
/// detail::sqrt_round) and y is moved by one ulp when the root lies beyond a
/// rounding midpoint y +- ulp/2.  Correctly rounded for every input.
/// Specials: NaN -> NaN, x < 0 (incl. -inf) -> NaN, -0 -> -0, +0 -> +0,
/// +inf -> +inf.
[[nodiscard]] constexpr double sqrt(double x) noexcept {
    if (!(x > 0.0)) return (x == 0.0 || isnan(x)) ? x : quiet_nan<double>();
    if (x > detail::dbl_max) return x;  // +inf
    const bool sub = x < detail::dbl_min;
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(sub ? x * 0x1p54 : x);
    const int e = static_cast<int>(bits >> 52) - 1023;  // unbiased exponent, even or odd
    const std::uint64_t frac = bits & detail::frac_mask_d;
    const double m = std::bit_cast<double>(frac | (static_cast<std::uint64_t>(1023 + (e & 1)) << 52));  // [1, 4)
    double y = detail::sqrt_seed(m);
    y = 0.5 * (y + m / y);
    y = 0.5 * (y + m / y);
    y = 0.5 * (y + m / y);
    // y in [1, 2) as a 53-bit integer Y = y * 2^52; m * 2^104 = M << (52 + parity).
    const std::uint64_t Y =
        (std::bit_cast<std::uint64_t>(detail::clamp_1_2(y, 0x1p-52)) & detail::frac_mask_d) | detail::hidden_bit_d;
    const std::uint64_t M = frac | detail::hidden_bit_d;
    const std::uint64_t R = (M << (52 + (e & 1))) - Y * Y;  // exact residual mod 2^64, |R| < 2^56
    // Y - 2^52 + (biased exponent << 52): a carry out of the fraction (Y == 2^53)
    // correctly bumps the exponent.
    return std::bit_cast<double>(detail::sqrt_round(R, Y) - detail::hidden_bit_d +
                                 (static_cast<std::uint64_t>(1023 + (e - (e & 1)) / 2 - (sub ? 27 : 0)) << 52));
}

/// Square root for float, correctly rounded.
/// Method: as sqrt(double), computed in double: subnormals scaled by 2^24,
/// x = m * 4^j with m in [1, 4); quadratic seed and two Newton steps give
/// sqrt(m) to ~2^-33, which rounded to a 24-bit Y is within 1 float ulp; the
/// exact integer residual m * 2^46 - Y^2 (no wrap-around needed here) then
/// selects the correctly rounded neighbour.
/// Specials: NaN -> NaN, x < 0 (incl. -inf) -> NaN, -0 -> -0, +0 -> +0,
/// +inf -> +inf.
[[nodiscard]] constexpr float sqrt(float x) noexcept {
    if (!(x > 0.0f)) return (x == 0.0f || isnan(x)) ? x : quiet_nan<float>();
    if (x > detail::flt_max) return x;  // +inf
    const bool sub = x < detail::flt_min;
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(sub ? x * 0x1p24f : x);
    const int e = static_cast<int>(bits >> 23) - 127;                       // unbiased exponent, even or odd
    const std::uint64_t M = (bits & 0x007F'FFFFu) | 0x0080'0000u;           // 24-bit mantissa
    const double m = static_cast<double>(M) * (e & 1 ? 0x1p-22 : 0x1p-23);  // [1, 4), exact
    double y = detail::sqrt_seed(m);
    y = 0.5 * (y + m / y);
    y = 0.5 * (y + m / y);
    // Nearest 24-bit integer to y * 2^23 (y in [1, 2)): Y in [2^23, 2^24).
    const std::uint64_t Y = static_cast<std::uint64_t>(detail::clamp_1_2(y, 0x1p-23) * 0x1p23 + 0.5);
    const std::uint64_t R = (M << (23 + (e & 1))) - Y * Y;  // m * 2^46 - Y^2, exact
    return std::bit_cast<float>(static_cast<std::uint32_t>(detail::sqrt_round(R, Y) - 0x0080'0000u) +
                                (static_cast<std::uint32_t>(127 + (e - (e & 1)) / 2 - (sub ? 12 : 0)) << 23));
}

}  // namespace qkv
