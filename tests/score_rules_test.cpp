// The score rules' host-side halves, no device needed: the softcap formula the kernels run
// (contract/score.h: softcapped, the same source compiled as C++) against long double over every
// binade of s / C, and the reduction of positions (src/kernels/score_positions.hpp) against the
// rules computed in 64 bits, for offsets and window sides up to 2^62 and beyond.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "contract/score.h"
#include "kernels/score_positions.hpp"
#include "support/catch.hpp"

using qkv::contract::softcapped;
using qkv::vulkan::detail::reduce_positions;
using qkv::vulkan::detail::score_positions;

namespace {

/// |got - want| / |want| in units of 2^-24 (half a float32 ulp at the bottom of a binade).
double units(float got, long double want) {
    return static_cast<double>(std::fabs((static_cast<long double>(got) - want) / want) / std::ldexp(1.0L, -24));
}

/// softcapped with C and 1/C as the host writes them (sdpa_plan.cpp: put_score_params).
float cap(float s, float c) {
    const qkv::contract::softcap_factors f = qkv::contract::softcap_factors_of(c);
    return softcapped(s, f.c, f.prescale, f.inverse);
}

}  // namespace

TEST_CASE("softcap: C·tanh(s / C) within a few units of 2^-24 for every C and every s / C", "[score_rules][softcap]") {
    // s / C over 1e-30 .. 1e3 in small steps, densely around the branch point |s / C| = 1, both
    // signs, for C from the smallest normal float to 1e30.
    std::vector<double> ratios;
    for (double x = 1e-30; x < 1e3; x *= 1.01) ratios.push_back(x);
    for (int k = -2000; k <= 2000; ++k) ratios.push_back(1.0 + k * 1e-4);
    const float cs[] = {std::numeric_limits<float>::min(), 1e-20f, 0.5f, 1.0f, 3.0f, 50.0f, 1e4f, 1e6f, 1e30f, 3e38f};
    double worst = 0;
    std::string where;
    for (const float c : cs) {
        for (const double x : ratios) {
            for (const double sign : {1.0, -1.0}) {
                const double sd = sign * x * static_cast<double>(c);
                if (std::fabs(sd) > std::numeric_limits<float>::max()) continue;
                const auto s = static_cast<float>(sd);
                // Normal floats only: a subnormal s (or result) holds fewer bits than the bound.
                if (std::fabs(s) < std::numeric_limits<float>::min()) continue;
                const long double want =
                    static_cast<long double>(c) * std::tanh(static_cast<long double>(s) / static_cast<long double>(c));
                const float got = cap(s, c);
                REQUIRE(std::isfinite(got));
                const double u = units(got, want);
                if (u > worst) {
                    std::ostringstream o;
                    o << "s = " << s << ", C = " << c;
                    worst = u, where = o.str();
                }
            }
        }
    }
    INFO("worst: " << worst << " units of 2^-24 at " << where);
    CHECK(worst <= 3.0);  // 2.6 measured with glibc's expf (docs/kernels.md has the budget)
}

TEST_CASE("softcap: the host's factors are normal floats for every C, 1/C to within one rounding",
          "[score_rules][softcap]") {
    // A device may flush subnormals to zero: 1/C for C above 2^126 is one, so it is split.
    const float smallest = std::numeric_limits<float>::min();
    for (const float c : {std::numeric_limits<float>::denorm_min(), smallest / 8, smallest, 1e-30f, 1.0f, 3e20f,
                          8.5e37f, 1e38f, 3e38f, std::numeric_limits<float>::max()}) {
        INFO("C = " << c);
        const qkv::contract::softcap_factors f = qkv::contract::softcap_factors_of(c);
        CHECK(f.c == std::max(c, smallest));
        CHECK(std::fpclassify(f.prescale) == FP_NORMAL);
        CHECK(std::fpclassify(f.inverse) == FP_NORMAL);
        const double want = 1.0 / static_cast<double>(f.c);
        CHECK(std::fabs(static_cast<double>(f.prescale) * f.inverse - want) <= want * std::ldexp(1.0, -24));
    }
    // With C near float's largest and s within a few orders of it, x = s / C is no longer tiny:
    // a flushed 1/C would have returned s.
    CHECK(units(cap(1e37f, 3e38f), 3e38L * std::tanh(1e37L / 3e38L)) <= 3.0);
    CHECK(units(cap(-2e38f, 3e38f), 3e38L * std::tanh(-2e38L / 3e38L)) <= 3.0);
}

TEST_CASE("softcap: its limits and special values", "[score_rules][softcap]") {
    // For C far above s the result is s itself: the old C·tanh(s / C) multiplied tanh's absolute
    // error (about 1e-7) by C.
    for (const float s : {1e-3f, 0.75f, 3.0f, -7.5f, 12.25f, 1e4f})
        for (const float c : {1e10f, 1e20f, 1e30f, 3e38f}) CHECK(cap(s, c) == s);
    CHECK(cap(0.0f, 5.0f) == 0.0f);
    // Saturation: ±C, never past it, never NaN.
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(cap(1e30f, 2.0f) == 2.0f);
    CHECK(cap(-1e30f, 2.0f) == -2.0f);
    CHECK(cap(inf, 30.0f) == 30.0f);
    CHECK(cap(-inf, 30.0f) == -30.0f);
    CHECK(cap(3e38f, std::numeric_limits<float>::min()) == std::numeric_limits<float>::min());
    CHECK(std::isnan(cap(std::numeric_limits<float>::quiet_NaN(), 10.0f)));
    // Odd.
    for (const float s : {0.1f, 0.9999f, 1.0f, 1.0001f, 2.5f, 40.0f}) CHECK(cap(-s, 1.0f) == -cap(s, 1.0f));
}

namespace {

// The rules as the kernels compute them on the reduced positions, in 32-bit arithmetic
// (score_rules.glsl: rule_score, window_admits, nearest_key_distance), and as the reference
// computes them on the true ones (64 bits).
struct decision {
    bool causal_ok, window_ok;
    std::int64_t alibi;  ///< |d| - (distance to the nearest key)
    std::int64_t near;   ///< the distance to the nearest key
};

decision exact(std::int64_t i, std::int64_t j, std::int64_t off, std::int64_t left, std::int64_t right,
               std::int64_t kv_len) {
    const std::int64_t p = i + off, d = j - p;
    const std::int64_t near = p < 0 ? -p : (p > kv_len - 1 ? p - (kv_len - 1) : 0);
    // i + off - left <= j <= i + off + right, without overflow: compare d with the sides.
    const bool window = (left < 0 || d >= -left) && (right < 0 || d <= right);
    return {d <= 0, window, (d < 0 ? -d : d) - near, near};
}

decision reduced(std::int32_t i, std::int32_t j, const score_positions& r, std::int32_t kv_len) {
    const std::int32_t p = i + r.offset, d = j - p;
    const std::int32_t near = p < 0 ? -p : std::max(p - kv_len + 1, 0);
    const bool window = (r.window_left < 0 || d >= -r.window_left) && (r.window_right < 0 || d <= r.window_right);
    return {d <= 0, window, (d < 0 ? -d : d) - near, near};
}

}  // namespace

TEST_CASE("positions: the reduction keeps every rule's answer, offsets and sides up to 2^62",
          "[score_rules][positions]") {
    constexpr std::int64_t two30 = std::int64_t{1} << 30, two31 = std::int64_t{1} << 31, two62 = std::int64_t{1} << 62;
    constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
    const std::int64_t offsets[] = {0,         5,          -7,        two30 - 1,  two30,      two30 + 1,
                                    two31 - 1, two31,      two31 + 1, -two31,     -two31 - 1, 100000,
                                    1000000,   1000000000, -1000000,  two62 - 10, two62,      -two62};
    for (const std::int64_t L : {1, 3, 17}) {
        for (const std::int64_t S : {1, 3, 17, 113}) {
            for (const std::int64_t off : offsets) {
                // Sides: none, small, ones that cut into the block from far away (off ∓ a little),
                // 2^30, 2^62 and the largest int64.
                const std::int64_t reach = off < 0 ? -off : off;
                const std::int64_t sides[] = {-1, 0, 2, two30, two62, big, reach, reach + 5, reach - 5, reach + S / 2};
                for (const std::int64_t left : sides) {
                    for (const std::int64_t right : sides) {
                        if (left < -1 || right < -1) continue;
                        const score_positions r = reduce_positions(off, left, right);
                        INFO("L " << L << " S " << S << " off " << off << " left " << left << " right " << right);
                        REQUIRE(std::abs(std::int64_t{r.offset}) <= two30);
                        REQUIRE(r.window_left >= -1);
                        REQUIRE(r.window_right >= -1);
                        REQUIRE((left < 0) == (r.window_left < 0));
                        REQUIRE((right < 0) == (r.window_right < 0));
                        REQUIRE(r.alibi_far == static_cast<double>(reach - std::abs(std::int64_t{r.offset})));
                        std::size_t wrong = 0;
                        for (std::int64_t i = 0; i < L; ++i) {
                            for (std::int64_t j = 0; j < S; ++j) {
                                const decision want = exact(i, j, off, left, right, S);
                                const decision got = reduced(static_cast<std::int32_t>(i), static_cast<std::int32_t>(j),
                                                             r, static_cast<std::int32_t>(S));
                                wrong += want.causal_ok != got.causal_ok || want.window_ok != got.window_ok ||
                                         want.alibi != got.alibi ||
                                         static_cast<double>(want.near) != static_cast<double>(got.near) + r.alibi_far;
                            }
                        }
                        CHECK(wrong == 0);
                    }
                }
            }
        }
    }
}

TEST_CASE("positions: the reduction does not depend on kv_len, and is the identity near the keys",
          "[score_rules][positions]") {
    // A planned call against a growing cache writes its params once (sdpa_call.cpp), so the
    // reduction must be a function of off and the sides alone: it is, by its signature; here,
    // that offsets and sides within 2^30 pass unchanged.
    const score_positions a = reduce_positions(12345, 40, 0);
    CHECK(a.offset == 12345);
    CHECK(a.window_left == 40);
    CHECK(a.window_right == 0);
    CHECK(a.alibi_far == 0.0);
    const score_positions b = reduce_positions(-(std::int64_t{1} << 30) + 1, -1, 7);
    CHECK(b.offset == -(1 << 30) + 1);
    CHECK(b.window_left == -1);
    CHECK(b.window_right == 7);
    // Sides past 2^31 - 1 admit every key, as 2^31 - 1 does.
    const score_positions c = reduce_positions(0, std::int64_t{1} << 40, std::numeric_limits<std::int64_t>::max());
    CHECK(c.window_left == std::numeric_limits<std::int32_t>::max());
    CHECK(c.window_right == std::numeric_limits<std::int32_t>::max());
}
