// qkv/math.hpp -- constexpr exp, exp2, log, tanh and sqrt for float and double.
//
// <cmath> is not constexpr in C++20, but compile-time attention needs exp
// (softmax), sqrt (1/sqrt(d) scaling), tanh (logit softcapping), log (the
// log-sum-exp of a row) and exp2 (ALiBi's slopes).  The functions here are usable in
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
//   exp2(float)  <= 1 ulp, in practice correctly rounded
//   exp2(double) <= 1 ulp, ~97% correctly rounded
//   log(float)   <= 1 ulp, in practice correctly rounded
//   log(double)  <= 1 ulp, ~98% correctly rounded
//   tanh(float)  <= 1 ulp, in practice correctly rounded
//   tanh(double) <= 1 ulp, ~93% correctly rounded
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
inline constexpr double inv_fact14 = 1.0 / 87178291200.0;
inline constexpr double inv_fact15 = 1.0 / 1307674368000.0;
inline constexpr double inv_fact16 = 1.0 / 20922789888000.0;
inline constexpr double inv_fact17 = 1.0 / 355687428096000.0;
inline constexpr double inv_fact18 = 1.0 / 6402373705728000.0;
inline constexpr double inv_fact19 = 1.0 / 121645100408832000.0;
inline constexpr double inv_fact20 = 1.0 / 2432902008176640000.0;

// ln 2 as a double-double: ln2_d (ln 2 rounded to double) + ln2_tail (the rest, rounded), and
// ln2_d split into two halves of 26 significant bits each (ln2_d_hi + ln2_d_lo == ln2_d exactly),
// whose products with another 26-bit half are exact (Dekker's product).
inline constexpr double ln2_d = 0x1.62e42fefa39efp-1;      // 0.6931471805599453
inline constexpr double ln2_tail = 0x1.abc9e3b39803fp-56;  // 2.3190468138462996e-17
inline constexpr double ln2_d_hi = 0x1.62e43p-1;           // 26 bits
inline constexpr double ln2_d_lo = -0x1.05c611p-29;        // 26 bits

// The upper 26 significant bits of a (|a| < 2^1000), Veltkamp's split: a - split_hi(a) holds the
// remaining bits exactly, and the products of two such halves are exact.
[[nodiscard]] constexpr double split_hi(double a) noexcept {
    const double c = 134217729.0 * a;  // 2^27 + 1
    return c - (c - a);
}

// The rounding error of p = f * ln2_d: f * ln2_d - p, exactly (Dekker's two-product).
[[nodiscard]] constexpr double ln2_product_error(double f, double p) noexcept {
    const double f_hi = split_hi(f);
    const double f_lo = f - f_hi;
    return (((f_hi * ln2_d_hi - p) + f_hi * ln2_d_lo) + f_lo * ln2_d_hi) + f_lo * ln2_d_lo;
}

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

// exp(r + c) * 2^k for |r| <= 0.3466 and c a correction far below ulp(r) (r + c is the reduced
// argument to about 2^-106), k in [-1075, 1024]; the method is exp(double)'s, below.
[[nodiscard]] constexpr double exp_kernel(double r, double c, int k) noexcept {
    const double one_r = 1.0 + r;  // 1 + r == one_r + ((1 - one_r) + r) exactly
    // q(r) = (exp(r) - 1 - r) / r^2, Taylor to r^13 (truncation < 2^-57).
    const double q =
        inv_fact2 +
        r * (inv_fact3 +
             r * (inv_fact4 +
                  r * (inv_fact5 +
                       r * (inv_fact6 +
                            r * (inv_fact7 +
                                 r * (inv_fact8 + r * (inv_fact9 + r * (inv_fact10 +
                                                                        r * (inv_fact11 +
                                                                             r * (inv_fact12 + r * inv_fact13))))))))));
    // exp(r + c) = 1 + r + c + r c + r^2 q(r) + O(c^2, c r^2): everything but
    // the leading 1 + r is small and is summed first, so only the last
    // addition rounds at the result's scale.
    return scale_pow2(one_r + (((1.0 - one_r) + r) + (c + r * (c + r * q))), k);
}

// exp(r) for |r| <= 0.3466 to about 2^-46 (the degree-11 Taylor polynomial), for the float
// functions, which round it once.
[[nodiscard]] constexpr double exp_poly_f(double r) noexcept {
    return 1.0 +
           r * (1.0 + r * (inv_fact2 +
                           r * (inv_fact3 +
                                r * (inv_fact4 +
                                     r * (inv_fact5 +
                                          r * (inv_fact6 +
                                               r * (inv_fact7 +
                                                    r * (inv_fact8 +
                                                         r * (inv_fact9 + r * (inv_fact10 + r * inv_fact11))))))))));
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
    return detail::exp_kernel(r, c, k);
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
    return static_cast<float>(detail::exp_poly_f(r) * detail::pow2(k));
}

// ---------------------------------------------------------------------------
// exp2
// ---------------------------------------------------------------------------

/// 2^x for double.
/// Method: x = k + f with k = round(x) and |f| <= 1/2, f exact; f ln2 as a
/// double-double p + e (Dekker's exact product with ln2_d, plus f * ln2_tail),
/// so the reduced argument r = f ln2 (|r| <= 0.3466) is known to ~2^-106;
/// then exp(double)'s kernel: 2^x = exp(r) * 2^k with an exact power of two.
/// Specials: NaN -> NaN, +inf -> +inf, -inf -> +0, x >= 1024 -> +inf,
/// x < -1075 -> +0 (2^-1075 itself rounds to +0), exp2(n) == 2^n exactly for
/// every integer n in [-1074, 1023], exp2(+-0) == 1.
/// Accuracy: <= 1 ulp measured against an 80-bit reference
/// (tests/math_accuracy_test.cpp); ~97% of inputs are correctly rounded.
[[nodiscard]] constexpr double exp2(double x) noexcept {
    if (!(x < 1024.0)) return isnan(x) ? x : infinity<double>();
    if (x < -1075.0) return 0.0;
    const int k = detail::round_to_int(x);
    const double f = x - static_cast<double>(k);  // exact, |f| <= 1/2
    const double p = f * detail::ln2_d;
    const double e = detail::ln2_product_error(f, p) + f * detail::ln2_tail;  // f ln2 = p + e
    const double r = p + e;
    return detail::exp_kernel(r, (p - r) + e, k);
}

/// 2^x for float.
/// Method: as exp(float): computed in double, x = k + f with f exact, exp(f ln2)
/// by the degree-11 polynomial (f ln2 rounded once: 2^-53 relative), times an
/// exact 2^k, rounded once to float (also for subnormal results).
/// Specials: NaN -> NaN, +inf -> +inf, -inf -> +0, x >= 128 -> +inf,
/// x < -150 -> +0, exp2(n) == 2^n exactly for integers n in [-149, 127].
/// Accuracy: <= 1 ulp, in practice correctly rounded (tests/math_accuracy_test.cpp).
[[nodiscard]] constexpr float exp2(float x) noexcept {
    if (!(x < 128.0f)) return isnan(x) ? x : infinity<float>();
    if (x < -150.0f) return 0.0f;
    const int k = detail::round_to_int(static_cast<double>(x));
    const double r = (static_cast<double>(x) - static_cast<double>(k)) * detail::ln2_d;
    return static_cast<float>(detail::exp_poly_f(r) * detail::pow2(k));
}

// ---------------------------------------------------------------------------
// log
// ---------------------------------------------------------------------------

namespace detail {

// The larger mantissa of log's reduction: 1.m at or above it is halved (m in [sqrt2/2, sqrt2)).
inline constexpr std::uint64_t sqrt2_frac = 0x6'A09E'667F'3BCDull;  // sqrt(2) = 0x1.6a09e667f3bcdp+0

// R(z) = (log((1 + s) / (1 - s)) - 2s) / s for z = s^2: 2z/3 + 2z^2/5 + ... + 2z^11/23, the
// Taylor series to s^23. |s| <= 3 - 2 sqrt2 = 0.1716, z <= 0.0295, so the first term left out,
// 2 s^25 / 25, is below 2^-65 relative to the result 2s + s R(z).
[[nodiscard]] constexpr double log_r(double z) noexcept {
    return z * (2.0 / 3.0 +
                z * (2.0 / 5.0 +
                     z * (2.0 / 7.0 +
                          z * (2.0 / 9.0 +
                               z * (2.0 / 11.0 +
                                    z * (2.0 / 13.0 +
                                         z * (2.0 / 15.0 +
                                              z * (2.0 / 17.0 +
                                                   z * (2.0 / 19.0 + z * (2.0 / 21.0 + z * (2.0 / 23.0)))))))))));
}

}  // namespace detail

/// Natural logarithm for double.
/// Method (fdlibm's e_log.c, with Taylor coefficients): subnormals are first
/// multiplied by 2^54 (exact); x = 2^k * m with m in [sqrt2/2, sqrt2) taken from
/// the bits, f = m - 1 (exact), s = f / (2 + f), so log(m) = log((1+s)/(1-s))
/// = 2s + s R(s^2); written as f - (f^2/2 - s (f^2/2 + R)) (2s = f - s f),
/// the rounding errors stay far below the leading f; then
/// log(x) = k ln2_hi + (that + k ln2_lo), with k * ln2_hi exact.
/// Specials: NaN -> NaN, x < 0 (incl. -inf) -> NaN, +-0 -> -inf, +inf -> +inf,
/// log(1) == +0.
/// Accuracy: <= 1 ulp measured against an 80-bit reference
/// (tests/math_accuracy_test.cpp); ~98% of inputs are correctly rounded.
[[nodiscard]] constexpr double log(double x) noexcept {
    if (!(x > 0.0)) return x == 0.0 ? -infinity<double>() : (isnan(x) ? x : quiet_nan<double>());
    if (x > detail::dbl_max) return x;  // +inf
    const bool sub = x < detail::dbl_min;
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(sub ? x * 0x1p54 : x);
    const std::uint64_t frac = bits & detail::frac_mask_d;
    const bool high = frac >= detail::sqrt2_frac;  // 1.frac >= sqrt2: use m = 1.frac / 2
    const int k = static_cast<int>(bits >> 52) - 1023 - (sub ? 54 : 0) + (high ? 1 : 0);
    const double m = std::bit_cast<double>(frac | (static_cast<std::uint64_t>(high ? 1022 : 1023) << 52));
    const double f = m - 1.0;  // exact (Sterbenz)
    const double s = f / (2.0 + f);
    const double hfsq = 0.5 * f * f;
    const double kd = static_cast<double>(k);
    return kd * detail::ln2_hi + (f - (hfsq - (s * (hfsq + detail::log_r(s * s)) + kd * detail::ln2_lo)));
}

/// Natural logarithm for float: log(double) of the (exact) double value, rounded
/// once to float.
/// Specials: NaN -> NaN, x < 0 -> NaN, +-0 -> -inf, +inf -> +inf, log(1) == +0.
/// Accuracy: <= 1 ulp; wrong rounding only when log(x) lies within ~2^-52
/// (relative) of a midpoint between two floats (tests/math_accuracy_test.cpp).
[[nodiscard]] constexpr float log(float x) noexcept { return static_cast<float>(log(static_cast<double>(x))); }

// ---------------------------------------------------------------------------
// tanh
// ---------------------------------------------------------------------------

namespace detail {

// (e^y - 1 - y - y^2/2) / y^3 for |y| <= 1.1: its Taylor series to y^17 (the first term left out,
// y^18/21!, is below 2^-62 relative to 1/6).
[[nodiscard]] constexpr double expm1_cubic(double y) noexcept {
    return inv_fact3 +
           y * (inv_fact4 +
                y * (inv_fact5 +
                     y * (inv_fact6 +
                          y * (inv_fact7 +
                               y * (inv_fact8 +
                                    y * (inv_fact9 +
                                         y * (inv_fact10 +
                                              y * (inv_fact11 +
                                                   y * (inv_fact12 +
                                                        y * (inv_fact13 +
                                                             y * (inv_fact14 +
                                                                  y * (inv_fact15 +
                                                                       y * (inv_fact16 +
                                                                            y * (inv_fact17 +
                                                                                 y * (inv_fact18 +
                                                                                      y * (inv_fact19 +
                                                                                           y * inv_fact20))))))))))))))));
}

// Below this |x|, tanh uses e^(2|x|) - 1 directly; at and above, 1 - 2 / (e^(2|x|) + 1).
inline constexpr double tanh_switch = 0.55;
// At and above this |x|, tanh(x) rounds to +-1 in double (1 - tanh(19.1) < 2^-54).
inline constexpr double tanh_one = 19.1;

}  // namespace detail

/// Hyperbolic tangent for double.
/// Method: odd, computed on |x|. For |x| < 0.55, with y = 2|x|, u = e^y - 1
/// and p = (e^y - 1 - y - y^2/2) / y^3 (Taylor, no cancellation), tanh =
/// u / (u + 2) is written as |x| + |x|^3 (8p(1 - |x|) - 2) / (u + 2): exact
/// algebra, and the correction, about -|x|^3/3, is small beside |x|, so its
/// rounding errors stay below half an ulp of the result; for 0.55 <= |x| < 19.1,
/// tanh = 1 - 2 / (e^(2|x|) + 1) with exp(double), where 2 / (e + 1) <= 0.4995
/// so the subtraction loses at most one bit; above, +-1.
/// Specials: NaN -> NaN, +-0 -> +-0, +-inf -> +-1, tiny x -> x.
/// Accuracy: <= 1 ulp measured against an 80-bit reference
/// (tests/math_accuracy_test.cpp); ~93% of inputs are correctly rounded.
[[nodiscard]] constexpr double tanh(double x) noexcept {
    if (isnan(x) || x == 0.0) return x;
    const double ax = abs(x);
    double t = 1.0;
    if (ax < detail::tanh_switch) {
        const double y = 2.0 * ax;
        const double p = detail::expm1_cubic(y);
        const double u = y + y * (y * (0.5 + y * p));  // e^y - 1
        t = ax + ax * ax * ax * (8.0 * p * (1.0 - ax) - 2.0) / (u + 2.0);
    } else if (ax < detail::tanh_one) {
        t = 1.0 - 2.0 / (exp(2.0 * ax) + 1.0);
    }
    return signbit(x) ? -t : t;
}

/// Hyperbolic tangent for float: tanh(double) of the (exact) double value,
/// rounded once to float.
/// Specials: NaN -> NaN, +-0 -> +-0, +-inf -> +-1.
/// Accuracy: <= 1 ulp, in practice correctly rounded (tests/math_accuracy_test.cpp).
[[nodiscard]] constexpr float tanh(float x) noexcept { return static_cast<float>(tanh(static_cast<double>(x))); }

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
