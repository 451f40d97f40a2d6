// Run-time accuracy and special-value tests for qkv/math.hpp.
//
// qkv::exp, exp2, log, tanh and sqrt run the same code at compile time and at run time, so
// these run-time measurements describe the constexpr results as well (the
// "constant evaluation matches run time" test checks that on sample points).
//
// References (each correctly rounded, or off only in astronomically rare
// double-rounding cases):
//   exp(float):   std::exp in double, rounded to float.
//   exp(double):  std::exp in long double rounded to double when long double
//                 has more than 53 mantissa bits (x86: 64), else std::exp.
//   exp2, log, tanh (float and double): std::exp2 / std::log / std::tanh in
//                 long double rounded to the type when long double has more
//                 than 53 mantissa bits, else the double function (then the
//                 reference itself may be an ulp off, and the bound checked
//                 is one ulp wider).
//   sqrt(float):  std::sqrt in double rounded to float (provably correctly
//                 rounded: 53 >= 2 * 24 + 2).
//   sqrt(double): std::sqrt(double) -- IEEE 754 requires sqrt to be correctly
//                 rounded (x86-64: the sqrtsd instruction).  sqrtl rounded to
//                 double would be a *worse* reference: 64 < 2 * 53 + 2, so the
//                 double rounding can go wrong exactly on the near-midpoint
//                 inputs this test feeds on purpose.
//
// Distance: the number of representable values between the result and the
// reference (0 = correctly rounded), computed from the bit patterns.
#include "support/catch.hpp"

#include <qkv/math.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>

namespace {

// ---------------------------------------------------------------------------
// ulp distance
// ---------------------------------------------------------------------------

// Map the bit pattern to an integer that is monotonic in the value, with
// -0 and +0 both mapping to 0.
std::int64_t ordered(double x) {
    const auto i = std::bit_cast<std::int64_t>(x);
    return i >= 0 ? i : std::numeric_limits<std::int64_t>::min() - i;
}
std::int64_t ordered(float x) {
    const auto i = static_cast<std::int64_t>(std::bit_cast<std::int32_t>(x));
    return i >= 0 ? i : static_cast<std::int64_t>(std::numeric_limits<std::int32_t>::min()) - i;
}

template <typename T>
std::int64_t ulp_distance(T a, T b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<std::int64_t>::max();
    const std::int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

template <typename T>
std::uint64_t bits(T x) {
    if constexpr (sizeof(T) == 4) {
        return std::bit_cast<std::uint32_t>(x);
    } else {
        return std::bit_cast<std::uint64_t>(x);
    }
}

// ---------------------------------------------------------------------------
// references
// ---------------------------------------------------------------------------

float ref_exp(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

double ref_exp(double x) {
    if constexpr (std::numeric_limits<long double>::digits > 53) {
        return static_cast<double>(std::exp(static_cast<long double>(x)));
    } else {
        return std::exp(x);
    }
}

// True when the long double references below are correctly rounded for double (x86: 64 bits).
constexpr bool extended_reference = std::numeric_limits<long double>::digits > 53;

// f in long double (or double), rounded to T.
template <typename T, typename F>
T ref_wide(F f, T x) {
    if constexpr (extended_reference) {
        return static_cast<T>(f(static_cast<long double>(x)));
    } else {
        return static_cast<T>(f(static_cast<double>(x)));
    }
}
template <typename T>
T ref_exp2(T x) {
    return ref_wide([](auto v) { return std::exp2(v); }, x);
}
template <typename T>
T ref_log(T x) {
    return ref_wide([](auto v) { return std::log(v); }, x);
}
template <typename T>
T ref_tanh(T x) {
    return ref_wide([](auto v) { return std::tanh(v); }, x);
}

// The ulp bound the new functions are held to: 1 against an extended reference, 2 otherwise.
constexpr std::int64_t wide_bound = extended_reference ? 1 : 2;

float ref_sqrt(float x) { return static_cast<float>(std::sqrt(static_cast<double>(x))); }
double ref_sqrt(double x) { return std::sqrt(x); }

// ---------------------------------------------------------------------------
// statistics
// ---------------------------------------------------------------------------

template <typename T>
struct Stats {
    std::int64_t max_ulp = 0;
    long long points = 0;
    long long not_correctly_rounded = 0;
    T worst_x{};
    T worst_got{};
    T worst_ref{};

    void add(T x, T got, T ref) {
        const std::int64_t d = ulp_distance(got, ref);
        ++points;
        if (d != 0) ++not_correctly_rounded;
        if (d > max_ulp) {
            max_ulp = d;
            worst_x = x;
            worst_got = got;
            worst_ref = ref;
        }
    }

    std::string report(const char* name) const {
        std::ostringstream s;
        s.precision(std::numeric_limits<T>::max_digits10);
        s << name << ": max ulp = " << max_ulp << " over " << points << " points, " << not_correctly_rounded
          << " not correctly rounded";
        if (max_ulp > 0) s << "; worst x = " << worst_x << " got " << worst_got << " ref " << worst_ref;
        return s.str();
    }
};

template <typename T>
void check_exp(Stats<T>& st, T x) {
    st.add(x, qkv::exp(x), ref_exp(x));
}

template <typename T>
void check_exp2(Stats<T>& st, T x) {
    st.add(x, qkv::exp2(x), ref_exp2(x));
}

template <typename T>
void check_log(Stats<T>& st, T x) {
    st.add(x, qkv::log(x), ref_log(x));
}

template <typename T>
void check_tanh(Stats<T>& st, T x) {
    st.add(x, qkv::tanh(x), ref_tanh(x));
}

template <typename T>
void check_sqrt(Stats<T>& st, T x) {
    st.add(x, qkv::sqrt(x), ref_sqrt(x));
}

// Uniform T in [lo, hi] (computed in double, then rounded to T).
template <typename T>
T uniform(std::mt19937_64& rng, double lo, double hi) {
    std::uniform_real_distribution<double> d(lo, hi);
    return static_cast<T>(d(rng));
}

// Log-uniform magnitude in [2^lo_exp, 2^hi_exp] with a random sign.
template <typename T>
T log_uniform_signed(std::mt19937_64& rng, int lo_exp, int hi_exp) {
    std::uniform_real_distribution<double> e(lo_exp, hi_exp);
    const double mag = std::exp2(e(rng));
    return static_cast<T>((rng() & 1u) != 0 ? -mag : mag);
}

template <typename T>
T next_up(T x) {
    return std::nextafter(x, std::numeric_limits<T>::infinity());
}
template <typename T>
T next_down(T x) {
    return std::nextafter(x, -std::numeric_limits<T>::infinity());
}

// The exp sweep shared by float and double.
//   ln_min_sub: ln(least subnormal), ln_max: the overflow threshold (last x
//   with a finite result), ln_min_norm: ln(least normal), zero_cut: ln(half
//   the least subnormal) (below it the result is 0).
template <typename T>
Stats<T> exp_sweep(std::uint64_t seed, double ln_min_sub, T x_max, double ln_min_norm, double zero_cut, double deep) {
    std::mt19937_64 rng(seed);
    Stats<T> st;
    const double ln_max = static_cast<double>(x_max);
    // 1. the whole finite, non-overflowing, non-underflowing range, uniformly
    for (int i = 0; i < 400000; ++i) check_exp(st, uniform<T>(rng, ln_min_sub, ln_max));
    // 2. dense near 0: uniform in [-1, 1] and log-uniform down to 2^-80
    for (int i = 0; i < 100000; ++i) check_exp(st, uniform<T>(rng, -1.0, 1.0));
    for (int i = 0; i < 100000; ++i) check_exp(st, log_uniform_signed<T>(rng, -80, 0));
    // 3. near the overflow edge: uniform in the last unit, and the last 2000
    //    representable inputs below the threshold
    for (int i = 0; i < 50000; ++i) check_exp(st, uniform<T>(rng, ln_max - 1.0, ln_max));
    {
        T x = x_max;
        for (int i = 0; i < 2000; ++i, x = next_down(x)) check_exp(st, x);
    }
    // 4. the subnormal-result range and the underflow-to-zero edge (including
    //    inputs below the zero cut where the result must round to +0)
    for (int i = 0; i < 50000; ++i) check_exp(st, uniform<T>(rng, deep, ln_min_norm));
    for (int i = 0; i < 50000; ++i) check_exp(st, uniform<T>(rng, ln_min_norm - 1.0, ln_min_norm + 1.0));
    {
        // 2000 representable inputs on either side of ln(least normal), of
        // ln(least subnormal) and of the zero cut
        for (const double c : {ln_min_norm, ln_min_sub, zero_cut}) {
            T x = static_cast<T>(c);
            for (int i = 0; i < 1000; ++i) x = next_down(x);
            for (int i = 0; i < 2000; ++i, x = next_up(x)) check_exp(st, x);
        }
    }
    return st;
}

}  // namespace

// ---------------------------------------------------------------------------
// exp
// ---------------------------------------------------------------------------

TEST_CASE("qkv::exp(double) accuracy over the whole range", "[math][exp]") {
    const double ln2 = 0.6931471805598903 + 5.497923018708371e-14;
    const Stats<double> st = exp_sweep<double>(0x9e3779b97f4a7c15ull, -1074.0 * ln2, 0x1.62e42fefa39efp+9,
                                               -1022.0 * ln2, -1075.0 * ln2, -745.2);
    WARN(st.report("exp(double)"));
    CHECK(st.points >= 100000);
    REQUIRE(st.max_ulp <= 2);
}

TEST_CASE("qkv::exp(float) accuracy over the whole range", "[math][exp]") {
    const double ln2 = 0.6931471805598903 + 5.497923018708371e-14;
    Stats<float> st =
        exp_sweep<float>(0x51ed270b2704e5a3ull, -149.0 * ln2, 0x1.62e42ep+6f, -126.0 * ln2, -150.0 * ln2, -104.0);
    // float is cheap to sweep densely: every float in [-104, -100] (the
    // subnormal/zero edge) and in [88, 88.72283] (the overflow edge).
    for (float x = -104.0f; x <= -100.0f; x = next_up(x)) check_exp(st, x);
    for (float x = 88.0f; x <= 0x1.62e42ep+6f; x = next_up(x)) check_exp(st, x);
    WARN(st.report("exp(float)"));
    CHECK(st.points >= 100000);
    REQUIRE(st.max_ulp <= 2);
}

TEST_CASE("qkv::exp special values", "[math][exp]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr float finf = std::numeric_limits<float>::infinity();

    // NaN -> NaN
    CHECK(std::isnan(qkv::exp(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::isnan(qkv::exp(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isnan(qkv::exp(-std::numeric_limits<double>::quiet_NaN())));
    // +inf -> +inf, -inf -> +0
    CHECK(bits(qkv::exp(dinf)) == bits(dinf));
    CHECK(bits(qkv::exp(finf)) == bits(finf));
    CHECK(bits(qkv::exp(-dinf)) == bits(0.0));
    CHECK(bits(qkv::exp(-finf)) == bits(0.0f));
    // exp(+-0) == 1 exactly
    CHECK(bits(qkv::exp(0.0)) == bits(1.0));
    CHECK(bits(qkv::exp(-0.0)) == bits(1.0));
    CHECK(bits(qkv::exp(0.0f)) == bits(1.0f));
    CHECK(bits(qkv::exp(-0.0f)) == bits(1.0f));
    // tiny arguments round to 1
    CHECK(qkv::exp(1e-300) == 1.0);
    CHECK(qkv::exp(-1e-300) == 1.0);
    CHECK(qkv::exp(1e-30f) == 1.0f);
    // overflow: the last finite input and its successor
    const double dmax_in = 0x1.62e42fefa39efp+9;
    CHECK(qkv::isfinite(qkv::exp(dmax_in)));
    CHECK(qkv::exp(dmax_in) > 1.79e308);
    CHECK(bits(qkv::exp(next_up(dmax_in))) == bits(dinf));
    CHECK(bits(qkv::exp(710.0)) == bits(dinf));
    CHECK(bits(qkv::exp(1e300)) == bits(dinf));
    CHECK(bits(qkv::exp(std::numeric_limits<double>::max())) == bits(dinf));
    const float fmax_in = 0x1.62e42ep+6f;
    CHECK(qkv::isfinite(qkv::exp(fmax_in)));
    CHECK(qkv::exp(fmax_in) > 3.40e38f);
    CHECK(bits(qkv::exp(next_up(fmax_in))) == bits(finf));
    CHECK(bits(qkv::exp(89.0f)) == bits(finf));
    CHECK(bits(qkv::exp(std::numeric_limits<float>::max())) == bits(finf));
    // deep underflow -> +0 (positive zero)
    CHECK(bits(qkv::exp(-746.0)) == bits(0.0));
    CHECK(bits(qkv::exp(-1e300)) == bits(0.0));
    CHECK(bits(qkv::exp(-std::numeric_limits<double>::max())) == bits(0.0));
    CHECK(bits(qkv::exp(-105.0f)) == bits(0.0f));
    CHECK(bits(qkv::exp(-std::numeric_limits<float>::max())) == bits(0.0f));
    // subnormal results: the least subnormal and its neighbourhood
    CHECK(qkv::exp(-745.0) == std::numeric_limits<double>::denorm_min());
    CHECK(qkv::exp(-745.13) == std::numeric_limits<double>::denorm_min());  // > 2^-1075
    CHECK(qkv::exp(-745.14) == 0.0);                                        // < 2^-1075
    CHECK(qkv::exp(-103.9f) == std::numeric_limits<float>::denorm_min());
    CHECK(qkv::exp(-104.0f) == 0.0f);
    CHECK(qkv::exp(-710.0) == ref_exp(-710.0));  // subnormal
    CHECK(qkv::exp(-100.0f) == ref_exp(-100.0f));
    // a few exact-ish landmarks
    CHECK(qkv::exp(1.0) == 2.718281828459045);
    CHECK(qkv::exp(1.0f) == 2.71828183f);
}

// ---------------------------------------------------------------------------
// exp2
// ---------------------------------------------------------------------------

TEST_CASE("qkv::exp2(double) accuracy over the whole range", "[math][exp2]") {
    std::mt19937_64 rng(0x3c6ef372fe94f82bull);
    Stats<double> st;
    // 1. the whole range with a finite, non-zero result, uniformly
    for (int i = 0; i < 400000; ++i) check_exp2(st, uniform<double>(rng, -1075.0, 1024.0));
    // 2. dense near 0 (the reduced argument itself) and log-uniform down to 2^-80
    for (int i = 0; i < 100000; ++i) check_exp2(st, uniform<double>(rng, -1.0, 1.0));
    for (int i = 0; i < 100000; ++i) check_exp2(st, log_uniform_signed<double>(rng, -80, 0));
    // 3. next to the integers (the reduction's switch points) and the halves (largest |f|)
    for (int i = 0; i < 50000; ++i) {
        const double n = std::floor(uniform<double>(rng, -1074.0, 1023.0));
        for (const double c : {n, n + 0.5})
            for (double x = next_down(next_down(c)), e = next_up(next_up(c)); x <= e; x = next_up(x)) check_exp2(st, x);
    }
    // 4. the overflow edge, the subnormal results and the underflow-to-zero edge
    {
        double x = next_down(1024.0);
        for (int i = 0; i < 2000; ++i, x = next_down(x)) check_exp2(st, x);
    }
    for (int i = 0; i < 50000; ++i) check_exp2(st, uniform<double>(rng, -1075.0, -1022.0));
    for (const double c : {-1022.0, -1074.0, -1075.0}) {
        double x = c;
        for (int i = 0; i < 1000; ++i) x = next_down(x);
        for (int i = 0; i < 2000; ++i, x = next_up(x)) check_exp2(st, x);
    }
    WARN(st.report("exp2(double)"));
    CHECK(st.points >= 700000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::exp2(float) accuracy over the whole range", "[math][exp2]") {
    std::mt19937_64 rng(0xa54ff53a5f1d36f1ull);
    Stats<float> st;
    // 1. every float in [1/2, 1), both signs (the reduced argument's range), then the whole range
    //    and log-uniform towards 0
    for (float x = 0.5f; x < 1.0f; x = next_up(x)) {
        check_exp2(st, x);
        check_exp2(st, -x);
    }
    for (int i = 0; i < 100000; ++i) check_exp2(st, log_uniform_signed<float>(rng, -40, 0));
    for (int i = 0; i < 400000; ++i) check_exp2(st, uniform<float>(rng, -150.0, 128.0));
    // 2. every float in the subnormal-result range and at the overflow edge
    for (float x = -150.0f; x <= -126.0f; x = next_up(x)) check_exp2(st, x);
    for (float x = 127.0f; x < 128.0f; x = next_up(x)) check_exp2(st, x);
    WARN(st.report("exp2(float)"));
    CHECK(st.points >= 1000000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::exp2 special values", "[math][exp2]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr float finf = std::numeric_limits<float>::infinity();
    CHECK(std::isnan(qkv::exp2(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::isnan(qkv::exp2(std::numeric_limits<float>::quiet_NaN())));
    CHECK(bits(qkv::exp2(dinf)) == bits(dinf));
    CHECK(bits(qkv::exp2(finf)) == bits(finf));
    CHECK(bits(qkv::exp2(-dinf)) == bits(0.0));
    CHECK(bits(qkv::exp2(-finf)) == bits(0.0f));
    CHECK(bits(qkv::exp2(0.0)) == bits(1.0));
    CHECK(bits(qkv::exp2(-0.0f)) == bits(1.0f));
    // every integer power of two is exact, subnormals included
    for (int n = -1074; n <= 1023; ++n) CHECK(qkv::exp2(static_cast<double>(n)) == std::ldexp(1.0, n));
    for (int n = -149; n <= 127; ++n) CHECK(qkv::exp2(static_cast<float>(n)) == std::ldexp(1.0f, n));
    // overflow and underflow edges
    CHECK(qkv::isfinite(qkv::exp2(next_down(1024.0))));
    CHECK(bits(qkv::exp2(1024.0)) == bits(dinf));
    CHECK(qkv::isfinite(qkv::exp2(next_down(128.0f))));
    CHECK(bits(qkv::exp2(128.0f)) == bits(finf));
    CHECK(bits(qkv::exp2(-1075.0)) == bits(0.0));  // 2^-1075: a tie, rounded to even (0)
    CHECK(qkv::exp2(next_up(-1075.0)) == std::numeric_limits<double>::denorm_min());
    CHECK(bits(qkv::exp2(-150.0f)) == bits(0.0f));
    CHECK(qkv::exp2(next_up(-150.0f)) == std::numeric_limits<float>::denorm_min());
    CHECK(bits(qkv::exp2(-2000.0)) == bits(0.0));
    CHECK(ulp_distance(qkv::exp2(0.5), 1.4142135623730951) <= 1);
    CHECK(qkv::exp2(-0.5f) == 0.70710677f);
}

// ---------------------------------------------------------------------------
// log
// ---------------------------------------------------------------------------

TEST_CASE("qkv::log(double) accuracy over the whole range", "[math][log]") {
    std::mt19937_64 rng(0x510e527fade682d1ull);
    Stats<double> st;
    // 1. random bit patterns over every positive finite double (incl. subnormals)
    std::uniform_int_distribution<std::uint64_t> all_pos(1, 0x7FEF'FFFF'FFFF'FFFFull);
    for (int i = 0; i < 300000; ++i) check_log(st, std::bit_cast<double>(all_pos(rng)));
    // 2. near 1, where the result is small: uniform in [1/2, 2] and 1 +- 2^-e
    for (int i = 0; i < 200000; ++i) check_log(st, uniform<double>(rng, 0.5, 2.0));
    for (int i = 0; i < 100000; ++i) check_log(st, 1.0 + log_uniform_signed<double>(rng, -52, -1));
    {
        double x = 1.0;
        for (int i = 0; i < 1000; ++i) x = next_down(x);
        for (int i = 0; i < 2000; ++i, x = next_up(x)) check_log(st, x);
    }
    // 3. next to sqrt(2) and sqrt(2)/2 (the reduction's switch) in several binades
    for (int e = -1000; e <= 1000; e += 50) {
        double x = std::ldexp(1.4142135623730951, e);
        for (int i = 0; i < 200; ++i) x = next_down(x);
        for (int i = 0; i < 400; ++i, x = next_up(x)) check_log(st, x);
    }
    // 4. subnormals, powers of two, the largest values
    std::uniform_int_distribution<std::uint64_t> subn(1, 0x000F'FFFF'FFFF'FFFFull);
    for (int i = 0; i < 50000; ++i) check_log(st, std::bit_cast<double>(subn(rng)));
    for (int e = -1074; e <= 1023; ++e) check_log(st, std::ldexp(1.0, e));
    {
        double x = std::numeric_limits<double>::max();
        for (int i = 0; i < 1000; ++i, x = next_down(x)) check_log(st, x);
    }
    WARN(st.report("log(double)"));
    CHECK(st.points >= 600000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::log(float) accuracy over the whole range", "[math][log]") {
    std::mt19937_64 rng(0x9b05688c2b3e6c1full);
    Stats<float> st;
    // 1. every float in [1/2, 2): the reduced range of every binade, and the results near 0
    for (float x = 0.5f; x < 2.0f; x = next_up(x)) check_log(st, x);
    // 2. random bit patterns over every positive finite float (incl. subnormals)
    std::uniform_int_distribution<std::uint32_t> all_pos(1, 0x7F7F'FFFFu);
    for (int i = 0; i < 400000; ++i) check_log(st, std::bit_cast<float>(all_pos(rng)));
    for (int e = -149; e <= 127; ++e) check_log(st, std::ldexp(1.0f, e));
    WARN(st.report("log(float)"));
    CHECK(st.points >= 1000000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::log special values", "[math][log]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr float finf = std::numeric_limits<float>::infinity();
    CHECK(std::isnan(qkv::log(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::isnan(qkv::log(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isnan(qkv::log(-1.0)));
    CHECK(std::isnan(qkv::log(-1.0f)));
    CHECK(std::isnan(qkv::log(-dinf)));
    CHECK(std::isnan(qkv::log(-std::numeric_limits<double>::denorm_min())));
    CHECK(bits(qkv::log(0.0)) == bits(-dinf));
    CHECK(bits(qkv::log(-0.0)) == bits(-dinf));
    CHECK(bits(qkv::log(0.0f)) == bits(-finf));
    CHECK(bits(qkv::log(dinf)) == bits(dinf));
    CHECK(bits(qkv::log(finf)) == bits(finf));
    CHECK(bits(qkv::log(1.0)) == bits(0.0));
    CHECK(bits(qkv::log(1.0f)) == bits(0.0f));
    CHECK(qkv::log(2.0) == 0.6931471805599453);
    CHECK(qkv::log(std::numeric_limits<double>::denorm_min()) == ref_log(std::numeric_limits<double>::denorm_min()));
    CHECK(qkv::log(std::numeric_limits<double>::max()) == 709.782712893384);
}

// ---------------------------------------------------------------------------
// tanh
// ---------------------------------------------------------------------------

TEST_CASE("qkv::tanh(double) accuracy", "[math][tanh]") {
    std::mt19937_64 rng(0x1f83d9abfb41bd6bull);
    Stats<double> st;
    // 1. where tanh is not +-1: uniform over [-20, 20], dense over [-1, 1], log-uniform to 2^-80
    for (int i = 0; i < 300000; ++i) check_tanh(st, uniform<double>(rng, -20.0, 20.0));
    for (int i = 0; i < 300000; ++i) check_tanh(st, uniform<double>(rng, -1.0, 1.0));
    for (int i = 0; i < 100000; ++i) check_tanh(st, log_uniform_signed<double>(rng, -80, 0));
    // 2. next to the method's switch (0.55) and to where the result rounds to 1 (19.1)
    for (const double c : {0.55, -0.55, 19.1, 19.0}) {
        double x = c;
        for (int i = 0; i < 1000; ++i) x = next_down(x);
        for (int i = 0; i < 2000; ++i, x = next_up(x)) check_tanh(st, x);
    }
    // 3. subnormals and huge values
    for (const double x : {std::numeric_limits<double>::denorm_min(), 1e-310, 1e-300, 30.0, 400.0, 1e300})
        check_tanh(st, x);
    WARN(st.report("tanh(double)"));
    CHECK(st.points >= 700000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::tanh(float) accuracy", "[math][tanh]") {
    std::mt19937_64 rng(0x5be0cd19137e2179ull);
    Stats<float> st;
    // 1. every float in [1/2, 1) (the method's switch at 0.55 included; tanh(-x) is -tanh(x) by
    //    construction) and in [8, 9.1] (the approach to 1)
    for (float x = 0.5f; x < 1.0f; x = next_up(x)) check_tanh(st, x);
    for (float x = 8.0f; x <= 9.1f; x = next_up(x)) check_tanh(st, x);
    // 2. random over [-10, 10] and log-uniform down to 2^-100 (subnormal results below 2^-126)
    for (int i = 0; i < 300000; ++i) check_tanh(st, uniform<float>(rng, -10.0, 10.0));
    for (int i = 0; i < 100000; ++i) check_tanh(st, log_uniform_signed<float>(rng, -140, 0));
    WARN(st.report("tanh(float)"));
    CHECK(st.points >= 1000000);
    REQUIRE(st.max_ulp <= wide_bound);
}

TEST_CASE("qkv::tanh special values", "[math][tanh]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr float finf = std::numeric_limits<float>::infinity();
    CHECK(std::isnan(qkv::tanh(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::isnan(qkv::tanh(std::numeric_limits<float>::quiet_NaN())));
    CHECK(bits(qkv::tanh(0.0)) == bits(0.0));
    CHECK(bits(qkv::tanh(-0.0)) == bits(-0.0));
    CHECK(bits(qkv::tanh(-0.0f)) == bits(-0.0f));
    CHECK(qkv::tanh(dinf) == 1.0);
    CHECK(qkv::tanh(-dinf) == -1.0);
    CHECK(qkv::tanh(finf) == 1.0f);
    CHECK(qkv::tanh(-finf) == -1.0f);
    CHECK(qkv::tanh(19.1) == 1.0);
    CHECK(qkv::tanh(-1e300) == -1.0);
    CHECK(qkv::tanh(std::numeric_limits<double>::denorm_min()) == std::numeric_limits<double>::denorm_min());
    CHECK(qkv::tanh(1e-30f) == 1e-30f);
    // odd: tanh(-x) == -tanh(x) bit for bit
    for (const double x : {0.1, 0.55, 0.7, 3.0, 18.0}) CHECK(bits(qkv::tanh(-x)) == bits(-qkv::tanh(x)));
}

// ---------------------------------------------------------------------------
// sqrt
// ---------------------------------------------------------------------------

TEST_CASE("qkv::sqrt(double) accuracy", "[math][sqrt]") {
    std::mt19937_64 rng(0x2545f4914f6cdd1dull);
    Stats<double> st;
    // 1. random bit patterns over every positive finite double (incl. subnormals)
    std::uniform_int_distribution<std::uint64_t> all_pos(1, 0x7FEF'FFFF'FFFF'FFFFull);
    for (int i = 0; i < 300000; ++i) check_sqrt(st, std::bit_cast<double>(all_pos(rng)));
    // 2. subnormals: random, plus the smallest and largest 1000
    std::uniform_int_distribution<std::uint64_t> subn(1, 0x000F'FFFF'FFFF'FFFFull);
    for (int i = 0; i < 100000; ++i) check_sqrt(st, std::bit_cast<double>(subn(rng)));
    for (std::uint64_t b = 1; b <= 1000; ++b) check_sqrt(st, std::bit_cast<double>(b));
    for (std::uint64_t b = 0x000F'FFFF'FFFF'FFFFull - 999; b <= 0x0010'0000'0000'0000ull + 1000; ++b)
        check_sqrt(st, std::bit_cast<double>(b));
    // 3. hard cases: inputs next to the square of a rounding midpoint
    //    z = y + ulp(y)/2 (the root lies within a hair of a midpoint), next to
    //    exact squares, scaled by random even powers of two.
    std::uniform_int_distribution<std::uint64_t> mant(0, (1ull << 52) - 1);
    std::uniform_int_distribution<int> pow4(-260, 255);
    for (int i = 0; i < 50000; ++i) {
        const double y = std::bit_cast<double>(0x3FF0'0000'0000'0000ull | mant(rng));  // [1, 2)
        const double scale = std::ldexp(1.0, 2 * pow4(rng));
        if constexpr (std::numeric_limits<long double>::digits > 53) {
            const long double z = static_cast<long double>(y) + 0x1p-53L;  // exact (54 bits)
            const double x = static_cast<double>(z * z);                   // ~ the midpoint squared
            for (double v = next_down(next_down(x)); v <= next_up(next_up(x)); v = next_up(v))
                check_sqrt(st, v * scale);
        }
        const double y26 = std::floor(y * 0x1p26) * 0x1p-26;  // 27 bits: y26^2 exact
        const double sq = y26 * y26;
        check_sqrt(st, sq * scale);
        check_sqrt(st, next_up(sq) * scale);
        check_sqrt(st, next_down(sq) * scale);
    }
    // 4. exact powers of two and the largest values
    for (int e = -1074; e <= 1023; ++e) check_sqrt(st, std::ldexp(1.0, e));
    {
        double x = std::numeric_limits<double>::max();
        for (int i = 0; i < 1000; ++i, x = next_down(x)) check_sqrt(st, x);
    }
    WARN(st.report("sqrt(double)"));
    CHECK(st.points >= 100000);
    REQUIRE(st.max_ulp <= 2);
    CHECK(st.not_correctly_rounded == 0);
}

TEST_CASE("qkv::sqrt(float) accuracy", "[math][sqrt]") {
    std::mt19937_64 rng(0x94d049bb133111ebull);
    Stats<float> st;
    // 1. exhaustive over [1, 4): every mantissa with both exponent parities.
    //    Outside this interval the input is scaled by an exact power of four,
    //    so this covers the core of every normal input.
    for (std::uint32_t b = 0x3F80'0000u; b < 0x4080'0000u; ++b) check_sqrt(st, std::bit_cast<float>(b));
    // 2. random bit patterns over every positive finite float (incl. subnormals)
    std::uniform_int_distribution<std::uint32_t> all_pos(1, 0x7F7F'FFFFu);
    for (int i = 0; i < 300000; ++i) check_sqrt(st, std::bit_cast<float>(all_pos(rng)));
    // 3. subnormals: random, plus the smallest and largest 1000
    std::uniform_int_distribution<std::uint32_t> subn(1, 0x007F'FFFFu);
    for (int i = 0; i < 100000; ++i) check_sqrt(st, std::bit_cast<float>(subn(rng)));
    for (std::uint32_t b = 1; b <= 1000; ++b) check_sqrt(st, std::bit_cast<float>(b));
    for (std::uint32_t b = 0x007F'FFFFu - 999; b <= 0x0080'0000u + 1000; ++b) check_sqrt(st, std::bit_cast<float>(b));
    // 4. powers of two and the largest values
    for (int e = -149; e <= 127; ++e) check_sqrt(st, std::ldexp(1.0f, e));
    for (std::uint32_t b = 0x7F7F'FFFFu - 999; b <= 0x7F7F'FFFFu; ++b) check_sqrt(st, std::bit_cast<float>(b));
    WARN(st.report("sqrt(float)"));
    CHECK(st.points >= 100000);
    REQUIRE(st.max_ulp <= 2);
    CHECK(st.not_correctly_rounded == 0);
}

TEST_CASE("qkv::sqrt special values", "[math][sqrt]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr float finf = std::numeric_limits<float>::infinity();
    // negative -> NaN (incl. -inf and the negative subnormals)
    CHECK(std::isnan(qkv::sqrt(-1.0)));
    CHECK(std::isnan(qkv::sqrt(-1.0f)));
    CHECK(std::isnan(qkv::sqrt(-dinf)));
    CHECK(std::isnan(qkv::sqrt(-finf)));
    CHECK(std::isnan(qkv::sqrt(-std::numeric_limits<double>::denorm_min())));
    CHECK(std::isnan(qkv::sqrt(-std::numeric_limits<float>::denorm_min())));
    // NaN -> NaN
    CHECK(std::isnan(qkv::sqrt(std::numeric_limits<double>::quiet_NaN())));
    CHECK(std::isnan(qkv::sqrt(std::numeric_limits<float>::quiet_NaN())));
    // +-0 -> +-0 (sign preserved), +inf -> +inf
    CHECK(bits(qkv::sqrt(0.0)) == bits(0.0));
    CHECK(bits(qkv::sqrt(-0.0)) == bits(-0.0));
    CHECK(bits(qkv::sqrt(0.0f)) == bits(0.0f));
    CHECK(bits(qkv::sqrt(-0.0f)) == bits(-0.0f));
    CHECK(bits(qkv::sqrt(dinf)) == bits(dinf));
    CHECK(bits(qkv::sqrt(finf)) == bits(finf));
    // exact results
    CHECK(qkv::sqrt(4.0) == 2.0);
    CHECK(qkv::sqrt(1.0) == 1.0);
    CHECK(qkv::sqrt(0.25f) == 0.5f);
    CHECK(qkv::sqrt(std::numeric_limits<double>::denorm_min()) == 0x1p-537);
    CHECK(qkv::sqrt(0x1p-148f) == 0x1p-74f);
    CHECK(qkv::sqrt(std::numeric_limits<double>::max()) == 1.3407807929942596e154);
    CHECK(qkv::sqrt(2.0) == 1.4142135623730951);
    CHECK(qkv::sqrt(2.0f) == 1.41421354f);
}

TEST_CASE("qkv math helpers", "[math]") {
    constexpr double dnan = std::numeric_limits<double>::quiet_NaN();
    constexpr float fnan = std::numeric_limits<float>::quiet_NaN();
    CHECK(qkv::isnan(dnan));
    CHECK(qkv::isnan(fnan));
    CHECK(qkv::isnan(qkv::quiet_nan<double>()));
    CHECK(qkv::isnan(qkv::quiet_nan<float>()));
    CHECK_FALSE(qkv::isnan(qkv::infinity<double>()));
    CHECK(qkv::isinf(qkv::infinity<double>()));
    CHECK(qkv::isinf(-qkv::infinity<float>()));
    CHECK_FALSE(qkv::isinf(dnan));
    CHECK_FALSE(qkv::isinf(std::numeric_limits<double>::max()));
    CHECK(qkv::isfinite(std::numeric_limits<double>::max()));
    CHECK(qkv::isfinite(-std::numeric_limits<float>::max()));
    CHECK(qkv::isfinite(std::numeric_limits<double>::denorm_min()));
    CHECK_FALSE(qkv::isfinite(dnan));
    CHECK_FALSE(qkv::isfinite(fnan));
    CHECK_FALSE(qkv::isfinite(-qkv::infinity<double>()));
    CHECK(bits(qkv::abs(-0.0)) == bits(0.0));
    CHECK(bits(qkv::abs(-0.0f)) == bits(0.0f));
    CHECK(qkv::abs(-2.5) == 2.5);
    CHECK(qkv::abs(2.5f) == 2.5f);
    CHECK(qkv::isnan(qkv::abs(dnan)));
    CHECK(qkv::signbit(-0.0));
    CHECK_FALSE(qkv::signbit(0.0f));
}

TEST_CASE("qkv::exp2, qkv::log, qkv::tanh: constant evaluation matches run time", "[math]") {
    constexpr double dx[] = {-1074.5, -1030.25, -3.7, -0.3, 1e-9, 0.5, 0.55, 1.0, 19.0, 1023.9};
    constexpr double dexp2[] = {qkv::exp2(dx[0]), qkv::exp2(dx[1]), qkv::exp2(dx[2]), qkv::exp2(dx[3]),
                                qkv::exp2(dx[4]), qkv::exp2(dx[5]), qkv::exp2(dx[6]), qkv::exp2(dx[7]),
                                qkv::exp2(dx[8]), qkv::exp2(dx[9])};
    constexpr double dtanh[] = {qkv::tanh(dx[0]), qkv::tanh(dx[1]), qkv::tanh(dx[2]), qkv::tanh(dx[3]),
                                qkv::tanh(dx[4]), qkv::tanh(dx[5]), qkv::tanh(dx[6]), qkv::tanh(dx[7]),
                                qkv::tanh(dx[8]), qkv::tanh(dx[9])};
    constexpr double lx[] = {5e-324, 1e-310, 0.3, 0.9999, 1.0, 1.5, 2.0, 3.0, 1e300, 1.7e308};
    constexpr double dlog[] = {qkv::log(lx[0]), qkv::log(lx[1]), qkv::log(lx[2]), qkv::log(lx[3]), qkv::log(lx[4]),
                               qkv::log(lx[5]), qkv::log(lx[6]), qkv::log(lx[7]), qkv::log(lx[8]), qkv::log(lx[9])};
    constexpr float fx[] = {-149.5f, -130.25f, -3.7f, -0.3f, 1e-9f, 0.5f, 0.55f, 1.0f, 9.0f, 127.9f};
    constexpr float fexp2[] = {qkv::exp2(fx[0]), qkv::exp2(fx[1]), qkv::exp2(fx[2]), qkv::exp2(fx[3]),
                               qkv::exp2(fx[4]), qkv::exp2(fx[5]), qkv::exp2(fx[6]), qkv::exp2(fx[7]),
                               qkv::exp2(fx[8]), qkv::exp2(fx[9])};
    constexpr float ftanh[] = {qkv::tanh(fx[0]), qkv::tanh(fx[1]), qkv::tanh(fx[2]), qkv::tanh(fx[3]),
                               qkv::tanh(fx[4]), qkv::tanh(fx[5]), qkv::tanh(fx[6]), qkv::tanh(fx[7]),
                               qkv::tanh(fx[8]), qkv::tanh(fx[9])};
    constexpr float flx[] = {1e-45f, 1e-40f, 0.3f, 0.9999f, 1.0f, 1.5f, 2.0f, 3.0f, 1e30f, 3e38f};
    constexpr float flog[] = {qkv::log(flx[0]), qkv::log(flx[1]), qkv::log(flx[2]), qkv::log(flx[3]), qkv::log(flx[4]),
                              qkv::log(flx[5]), qkv::log(flx[6]), qkv::log(flx[7]), qkv::log(flx[8]), qkv::log(flx[9])};
    for (int i = 0; i < 10; ++i) {
        volatile double vd = dx[i];  // volatile: force evaluation at run time
        volatile double vl = lx[i];
        volatile float vf = fx[i];
        volatile float vfl = flx[i];
        CHECK(bits(qkv::exp2(vd)) == bits(dexp2[i]));
        CHECK(bits(qkv::tanh(vd)) == bits(dtanh[i]));
        CHECK(bits(qkv::log(vl)) == bits(dlog[i]));
        CHECK(bits(qkv::exp2(vf)) == bits(fexp2[i]));
        CHECK(bits(qkv::tanh(vf)) == bits(ftanh[i]));
        CHECK(bits(qkv::log(vfl)) == bits(flog[i]));
    }
}

TEST_CASE("qkv::exp and qkv::sqrt: constant evaluation matches run time", "[math]") {
    // The same algorithm runs in both contexts, so the bits must agree.
    constexpr double dx[] = {-744.9, -720.5, -3.25, -0.3, 1e-9, 0.5, 1.0, 2.0, 37.1, 700.25};
    constexpr double dexp[] = {qkv::exp(dx[0]), qkv::exp(dx[1]), qkv::exp(dx[2]), qkv::exp(dx[3]), qkv::exp(dx[4]),
                               qkv::exp(dx[5]), qkv::exp(dx[6]), qkv::exp(dx[7]), qkv::exp(dx[8]), qkv::exp(dx[9])};
    constexpr float fx[] = {-103.5f, -90.25f, -3.25f, -0.3f, 1e-9f, 0.5f, 1.0f, 2.0f, 37.1f, 88.5f};
    constexpr float fexp[] = {qkv::exp(fx[0]), qkv::exp(fx[1]), qkv::exp(fx[2]), qkv::exp(fx[3]), qkv::exp(fx[4]),
                              qkv::exp(fx[5]), qkv::exp(fx[6]), qkv::exp(fx[7]), qkv::exp(fx[8]), qkv::exp(fx[9])};
    constexpr double sx[] = {5e-324, 1e-310, 0.3, 2.0, 3.0, 1e300};
    constexpr double dsqrt[] = {qkv::sqrt(sx[0]), qkv::sqrt(sx[1]), qkv::sqrt(sx[2]),
                                qkv::sqrt(sx[3]), qkv::sqrt(sx[4]), qkv::sqrt(sx[5])};
    constexpr float sfx[] = {1e-45f, 1e-40f, 0.3f, 2.0f, 3.0f, 1e38f};
    constexpr float fsqrt[] = {qkv::sqrt(sfx[0]), qkv::sqrt(sfx[1]), qkv::sqrt(sfx[2]),
                               qkv::sqrt(sfx[3]), qkv::sqrt(sfx[4]), qkv::sqrt(sfx[5])};
    for (int i = 0; i < 10; ++i) {
        volatile double vd = dx[i];  // volatile: force evaluation at run time
        volatile float vf = fx[i];
        CHECK(bits(qkv::exp(vd)) == bits(dexp[i]));
        CHECK(bits(qkv::exp(vf)) == bits(fexp[i]));
    }
    for (int i = 0; i < 6; ++i) {
        volatile double vd = sx[i];
        volatile float vf = sfx[i];
        CHECK(bits(qkv::sqrt(vd)) == bits(dsqrt[i]));
        CHECK(bits(qkv::sqrt(vf)) == bits(fsqrt[i]));
    }
}
