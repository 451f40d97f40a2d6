// Compile-only test: qkv::exp, qkv::sqrt and the helpers in qkv/math.hpp are
// usable in constant expressions and give the right values there.
// Build with e.g. `c++ -std=c++20 -Iinclude -fsyntax-only tests/compile/math_static.cpp`.
// Every assertion compares against an independent expected value (a literal
// or a bit pattern), so a wrong expected value or a wrong result breaks the
// build.
#include <qkv/math.hpp>

#include <bit>
#include <cstdint>
#include <limits>

namespace {

constexpr std::uint64_t bits(double x) { return std::bit_cast<std::uint64_t>(x); }
constexpr std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// Distance in representable values between two positive finite numbers.
constexpr std::uint64_t ulps(double a, double b) { return a < b ? bits(b) - bits(a) : bits(a) - bits(b); }
constexpr std::uint32_t ulps(float a, float b) { return a < b ? bits(b) - bits(a) : bits(a) - bits(b); }

constexpr double dinf = std::numeric_limits<double>::infinity();
constexpr float finf = std::numeric_limits<float>::infinity();
constexpr double dnan = std::numeric_limits<double>::quiet_NaN();
constexpr float fnan = std::numeric_limits<float>::quiet_NaN();

}  // namespace

// ---- helpers ---------------------------------------------------------------
static_assert(qkv::isnan(dnan) && qkv::isnan(fnan));
static_assert(qkv::isnan(qkv::quiet_nan<double>()) && qkv::isnan(qkv::quiet_nan<float>()));
static_assert(!qkv::isnan(1.0) && !qkv::isnan(dinf));
static_assert(qkv::isinf(qkv::infinity<double>()) && qkv::isinf(-qkv::infinity<float>()));
static_assert(!qkv::isinf(std::numeric_limits<double>::max()) && !qkv::isinf(dnan));
static_assert(qkv::isfinite(0.0) && qkv::isfinite(std::numeric_limits<float>::max()));
static_assert(qkv::isfinite(std::numeric_limits<double>::denorm_min()));
static_assert(!qkv::isfinite(dinf) && !qkv::isfinite(-finf) && !qkv::isfinite(dnan) && !qkv::isfinite(fnan));
static_assert(qkv::abs(-2.5) == 2.5 && qkv::abs(-2.5f) == 2.5f && qkv::abs(3.0) == 3.0);
static_assert(bits(qkv::abs(-0.0)) == 0 && bits(qkv::abs(-0.0f)) == 0);
static_assert(qkv::abs(-dinf) == dinf);
static_assert(qkv::signbit(-0.0) && !qkv::signbit(0.0) && qkv::signbit(-1.0f));

// ---- exp(double) -------------------------------------------------------------
static_assert(bits(qkv::exp(0.0)) == bits(1.0));
static_assert(bits(qkv::exp(-0.0)) == bits(1.0));
static_assert(ulps(qkv::exp(1.0), 2.718281828459045) <= 1);     // e
static_assert(ulps(qkv::exp(-1.0), 0.36787944117144233) <= 1);  // 1/e
static_assert(ulps(qkv::exp(0.6931471805599453), 2.0) <= 1);    // exp(ln 2)
static_assert(ulps(qkv::exp(10.0), 22026.465794806718) <= 1);
static_assert(ulps(qkv::exp(-20.5), 1.2501528663867426e-09) <= 1);
static_assert(ulps(qkv::exp(700.0), 1.0142320547350045e+304) <= 1);
static_assert(ulps(qkv::exp(-700.0), 9.85967654375977e-305) <= 1);
static_assert(ulps(qkv::exp(-720.0), 2.0322308024e-313) <= 1);  // subnormal result
static_assert(qkv::exp(1e-300) == 1.0 && qkv::exp(-1e-300) == 1.0);
// overflow threshold: 709.782712893384 is the last input with a finite result
static_assert(qkv::isfinite(qkv::exp(709.782712893384)) && qkv::exp(709.782712893384) > 1.79e308);
static_assert(qkv::exp(709.7827128933841) == dinf);
static_assert(qkv::exp(710.0) == dinf && qkv::exp(1e300) == dinf);
static_assert(qkv::exp(dinf) == dinf);
// underflow: subnormal results down to 2^-1074, then +0
static_assert(qkv::exp(-745.0) == std::numeric_limits<double>::denorm_min());
static_assert(qkv::exp(-745.13) == std::numeric_limits<double>::denorm_min());
static_assert(bits(qkv::exp(-745.14)) == 0);
static_assert(bits(qkv::exp(-746.0)) == 0 && bits(qkv::exp(-1e300)) == 0);
static_assert(bits(qkv::exp(-dinf)) == 0);
static_assert(qkv::isnan(qkv::exp(dnan)));

// ---- exp(float) --------------------------------------------------------------
static_assert(bits(qkv::exp(0.0f)) == bits(1.0f));
static_assert(bits(qkv::exp(-0.0f)) == bits(1.0f));
static_assert(ulps(qkv::exp(1.0f), 2.7182817f) <= 1);
static_assert(ulps(qkv::exp(-1.0f), 0.36787945f) <= 1);
static_assert(ulps(qkv::exp(10.0f), 22026.465f) <= 1);
static_assert(ulps(qkv::exp(-87.0f), 1.6458115e-38f) <= 1);
static_assert(ulps(qkv::exp(-100.0f), 3.78351e-44f) <= 1);  // subnormal result
static_assert(qkv::isfinite(qkv::exp(88.7228317f)) && qkv::exp(88.7228317f) > 3.40e38f);
static_assert(qkv::exp(88.7228394f) == finf);
static_assert(qkv::exp(89.0f) == finf && qkv::exp(finf) == finf);
static_assert(qkv::exp(-103.9f) == std::numeric_limits<float>::denorm_min());
static_assert(bits(qkv::exp(-104.0f)) == 0 && bits(qkv::exp(-1000.0f)) == 0);
static_assert(bits(qkv::exp(-finf)) == 0);
static_assert(qkv::isnan(qkv::exp(fnan)));

// ---- sqrt(double): correctly rounded, so compare bits ------------------------
static_assert(bits(qkv::sqrt(4.0)) == bits(2.0));
static_assert(bits(qkv::sqrt(1.0)) == bits(1.0));
static_assert(bits(qkv::sqrt(0.25)) == bits(0.5));
static_assert(bits(qkv::sqrt(2.0)) == bits(1.4142135623730951));
static_assert(bits(qkv::sqrt(3.0)) == bits(1.7320508075688772));
static_assert(bits(qkv::sqrt(0.5)) == bits(0.7071067811865476));
static_assert(bits(qkv::sqrt(64.0)) == bits(8.0));
static_assert(bits(qkv::sqrt(1e300)) == bits(1e150));
static_assert(bits(qkv::sqrt(std::numeric_limits<double>::max())) == bits(1.3407807929942596e154));
static_assert(bits(qkv::sqrt(std::numeric_limits<double>::denorm_min())) == bits(0x1p-537));
static_assert(bits(qkv::sqrt(0x1p-1073)) == bits(3.1434555694052576e-162));  // subnormal input, odd power
static_assert(bits(qkv::sqrt(0.0)) == bits(0.0));
static_assert(bits(qkv::sqrt(-0.0)) == bits(-0.0));
static_assert(qkv::sqrt(dinf) == dinf);
static_assert(qkv::isnan(qkv::sqrt(-1.0)));
static_assert(qkv::isnan(qkv::sqrt(-dinf)));
static_assert(qkv::isnan(qkv::sqrt(-std::numeric_limits<double>::denorm_min())));
static_assert(qkv::isnan(qkv::sqrt(dnan)));

// ---- sqrt(float) -------------------------------------------------------------
static_assert(bits(qkv::sqrt(4.0f)) == bits(2.0f));
static_assert(bits(qkv::sqrt(2.0f)) == bits(1.4142135f));
static_assert(bits(qkv::sqrt(3.0f)) == bits(1.7320508f));
static_assert(bits(qkv::sqrt(0.1f)) == bits(0.31622776f));
static_assert(bits(qkv::sqrt(64.0f)) == bits(8.0f));
static_assert(bits(qkv::sqrt(std::numeric_limits<float>::max())) == bits(1.8446743e19f));
static_assert(bits(qkv::sqrt(0x1p-148f)) == bits(0x1p-74f));  // subnormal input, exact
static_assert(bits(qkv::sqrt(std::numeric_limits<float>::denorm_min())) == bits(3.743392e-23f));
static_assert(bits(qkv::sqrt(0.0f)) == bits(0.0f));
static_assert(bits(qkv::sqrt(-0.0f)) == bits(-0.0f));
static_assert(qkv::sqrt(finf) == finf);
static_assert(qkv::isnan(qkv::sqrt(-1.0f)));
static_assert(qkv::isnan(qkv::sqrt(-finf)));
static_assert(qkv::isnan(qkv::sqrt(fnan)));

// ---- a softmax-sized workload stays within the default constexpr budgets ----
namespace {
constexpr double softmax_denominator(int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i)
        s += qkv::exp(-0.01 * i) + static_cast<double>(qkv::exp(-0.01f * static_cast<float>(i)));
    return s;
}
}  // namespace
static_assert(softmax_denominator(256) > 185.46 && softmax_denominator(256) < 185.47);

// ---- exp2 ----------------------------------------------------------------------
static_assert(bits(qkv::exp2(0.0)) == bits(1.0) && bits(qkv::exp2(-0.0f)) == bits(1.0f));
static_assert(qkv::exp2(10.0) == 1024.0 && qkv::exp2(-3.0f) == 0.125f);  // integers are exact
static_assert(qkv::exp2(-1074.0) == std::numeric_limits<double>::denorm_min());
static_assert(qkv::exp2(-149.0f) == std::numeric_limits<float>::denorm_min());
static_assert(ulps(qkv::exp2(0.5), 1.4142135623730951) <= 1);
static_assert(ulps(qkv::exp2(-0.125), 0.9170040432046712) <= 1);  // ALiBi's m0 for max_bias 1, 8 heads
static_assert(ulps(qkv::exp2(-7.5), 0.005524271728019903) <= 1);
static_assert(ulps(qkv::exp2(1023.5), 1.2711610061536464e308) <= 1);
static_assert(ulps(qkv::exp2(0.5f), 1.4142135f) <= 1 && ulps(qkv::exp2(-0.0625f), 0.95760328f) <= 1);
static_assert(qkv::exp2(1024.0) == dinf && qkv::exp2(128.0f) == finf && qkv::exp2(dinf) == dinf);
static_assert(bits(qkv::exp2(-1075.0)) == 0 && bits(qkv::exp2(-150.0f)) == 0 && bits(qkv::exp2(-dinf)) == 0);
static_assert(qkv::isnan(qkv::exp2(dnan)) && qkv::isnan(qkv::exp2(fnan)));

// ---- log -----------------------------------------------------------------------
static_assert(bits(qkv::log(1.0)) == 0 && bits(qkv::log(1.0f)) == 0);
static_assert(ulps(qkv::log(2.0), 0.6931471805599453) <= 1);
static_assert(ulps(qkv::log(2.718281828459045), 1.0) <= 1);
static_assert(ulps(qkv::log(10.0), 2.302585092994046) <= 1);
static_assert(ulps(qkv::log(1e-300), -690.7755278982137) <= 1);
static_assert(ulps(qkv::log(17.0f), 2.8332133f) <= 1 && ulps(qkv::log(0.3f), -1.2039728f) <= 1);
static_assert(qkv::log(0.5) == -qkv::log(2.0));
static_assert(ulps(-qkv::log(std::numeric_limits<double>::denorm_min()), 744.4400719213812) <= 1);  // subnormal
static_assert(qkv::log(0.0) == -dinf && qkv::log(-0.0f) == -finf && qkv::log(dinf) == dinf);
static_assert(qkv::isnan(qkv::log(-1.0)) && qkv::isnan(qkv::log(-1.0f)) && qkv::isnan(qkv::log(dnan)));

// ---- tanh ----------------------------------------------------------------------
static_assert(bits(qkv::tanh(0.0)) == 0 && bits(qkv::tanh(-0.0)) == bits(-0.0) && bits(qkv::tanh(0.0f)) == 0);
static_assert(ulps(qkv::tanh(0.5), 0.46211715726000974) <= 1);
static_assert(ulps(qkv::tanh(1.0), 0.7615941559557649) <= 1);
static_assert(ulps(qkv::tanh(0.125), 0.1243530017715962) <= 1);
static_assert(ulps(qkv::tanh(5.0), 0.9999092042625951) <= 1);
static_assert(ulps(qkv::tanh(0.5f), 0.46211717f) <= 1 && ulps(qkv::tanh(2.0f), 0.96402758f) <= 1);
static_assert(qkv::tanh(-0.5) == -qkv::tanh(0.5) && qkv::tanh(-0.5f) == -qkv::tanh(0.5f));
static_assert(qkv::tanh(1e-200) == 1e-200 && qkv::tanh(20.0) == 1.0 && qkv::tanh(-dinf) == -1.0);
static_assert(qkv::tanh(finf) == 1.0f && qkv::isnan(qkv::tanh(dnan)) && qkv::isnan(qkv::tanh(fnan)));
