// Never silently wrong, on the newer surfaces: sdpa's overflow rule on every route
// (fused families, decode from the host, decode from a kv_cache), +inf values whose weight
// underflows, one fp16 convention for the fused and the decode routes, a thread-safe kv_cache,
// and safe lifetimes of moved-from and orphaned contexts and caches. Validation layer on.
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"

using qkv_test::require_clean;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

/// Σ(got − want)² / Σ want², failing on a non-finite value where the reference is finite.
double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isfinite(want[i])) REQUIRE(std::isfinite(got[i]));
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

/// A decode-shaped problem (one query row per head, many keys) that owns its data.
struct owned {
    std::vector<float> q, k, v, additive;
    qkv::sdpa_problem p;
    owned(std::size_t hq, std::size_t hkv, std::size_t L, std::size_t S, std::size_t E, std::size_t Ev,
          std::uint64_t seed = 3) {
        std::mt19937_64 rng(seed);
        q = normal(hq * L * E, rng), k = normal(hkv * S * E, rng), v = normal(hkv * S * Ev, rng);
        p.shape = {.batch = 1, .q_heads = hq, .kv_heads = hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
        bind();
    }
    void bind() {
        p.q = q, p.k = k, p.v = v;
        p.additive_mask = additive;
    }
};

/// float32 -> float16 -> float32, rounding to nearest even (normal range; these tests stay in it).
float through_half(float f) {
    if (f == 0.0f || !std::isfinite(f)) return f;
    int e = 0;
    (void)std::frexp(f, &e);  // f = m * 2^e, 0.5 <= |m| < 1: 11 significant bits
    const double ulp = std::ldexp(1.0, std::max(e - 11, -24));
    return static_cast<float>(std::nearbyint(static_cast<double>(f) / ulp) * ulp);
}

std::string name(qkv::kernel_family f) { return qkv_test::family_name(f); }

bool coop(qkv::kernel_family f) { return f == qkv::kernel_family::coopmat; }

}  // namespace

TEST_CASE("sdpa: large finite values give their finite answer on every route", "[guarantees][overflow][families]") {
    const auto families = qkv_test::fused_families();
    auto ctx = qkv_test::make_context({});
    // One query, zero keys, values 3e38: the answer is 3e38 (PyTorch float32 and the cpu backend),
    // though the value sum 2 x 3e38 is beyond float32. S = 2 is the fused route, S = 1024 decode.
    for (const std::size_t S : {2u, 1024u}) {
        owned o(1, 1, 1, S, 4, 4);
        std::fill(o.k.begin(), o.k.end(), 0.0f);
        std::fill(o.v.begin(), o.v.end(), 3e38f);
        o.p.options.scale = 1.0f;
        for (const auto f : families) {
            INFO("S = " << S << ", family " << name(f));
            o.p.options.kernel = f;
            if (coop(f)) {  // float16 operands: 3e38 is beyond float16's range, refused (never inf)
                o.p.options.precision = qkv::precision::fp16;
                CHECK_THROWS_WITH(ctx.sdpa(o.p), Catch::Matchers::Contains("float16"));
                o.p.options.precision = qkv::precision::fp32;
                continue;
            }
            const qkv::sdpa_output r = ctx.sdpa(o.p);
            // Exact for two keys; 1024 float32 additions of equal values round on the way.
            for (const float x : r.output) CHECK(std::fabs(x - 3e38f) <= (S == 2 ? 0.0f : 1e-4f * 3e38f));
            require_clean(ctx);
        }
        // The same keys and values in a cache.
        qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = S, .d_qk = 4, .d_v = 4});
        cache.append(o.k, o.v, S);
        qkv::sdpa_problem p = o.p;
        p.k = {}, p.v = {};
        p.options.kernel = qkv::kernel_family::automatic;
        for (const float x : ctx.sdpa(p, cache).output) CHECK(std::fabs(x - 3e38f) <= 1e-4f * 3e38f);
        require_clean(ctx);
    }
    // Mixed signs and magnitudes near the limit, GQA, against float64.
    owned o(4, 2, 3, 1500, 8, 8, 11);
    for (std::size_t i = 0; i < o.v.size(); ++i) o.v[i] *= (i % 3 == 0) ? 1e37f : 1.0f;  // S·max|v| > 2^127
    o.bind();
    const std::vector<double> want = qkv::cpu::sdpa_f64(o.p).output;
    for (const auto f : families) {
        INFO("family " << name(f));
        o.p.options.kernel = f;
        if (coop(f)) continue;  // 1e37 is no float16 value: the case above
        CHECK(nmse(ctx.sdpa(o.p).output, want) <= 1e-10);
    }
    require_clean(ctx);
}

TEST_CASE("sdpa: scores beyond float32 are refused with numeric_overflow, never NaN",
          "[guarantees][overflow][families]") {
    const auto families = qkv_test::fused_families();
    auto ctx = qkv_test::make_context({});
    for (const std::size_t S : {3u, 1024u}) {
        owned o(2, 1, 1, S, 8, 8);
        o.p.options.scale = 1e38f;  // scores of order 1e38 and their differences leave float32
        for (const auto f : families) {
            INFO("S = " << S << ", family " << name(f));
            o.p.options.kernel = f;
            o.p.options.precision = qkv_test::case_precision(f, qkv::precision::fp32);
            CHECK_THROWS_AS(ctx.sdpa(o.p), qkv::vulkan::numeric_overflow);
            try {
                (void)ctx.sdpa(o.p);
            } catch (const qkv::vulkan::numeric_overflow& e) {
                CHECK_THAT(e.what(), Catch::Matchers::Contains("scores"));
            }
        }
        // The context stays usable.
        o.p.options.scale = std::nullopt;
        o.p.options.precision = qkv::precision::fp32;
        o.p.options.kernel = qkv::kernel_family::automatic;
        CHECK(nmse(ctx.sdpa(o.p).output, qkv::cpu::sdpa_f64(o.p).output) <= 1e-10);
        require_clean(ctx);
    }
}

TEST_CASE("sdpa: +inf in V behind a large negative additive mask stays inf", "[guarantees][nan][families]") {
    const auto families = qkv_test::fused_families();
    auto ctx = qkv_test::make_context({});
    for (const std::size_t S : {5u, 1024u}) {
        owned o(1, 1, 1, S, 4, 4);
        o.additive.assign(S, 0.0f);
        o.additive[2] = -200.0f;  // e^-200 underflows in float32, not in float64
        o.v[2 * 4 + 1] = inf;
        o.bind();
        o.p.mask_shape = {1, S};
        const std::vector<double> want = qkv::cpu::sdpa_f64(o.p).output;
        REQUIRE(want[1] == std::numeric_limits<double>::infinity());
        for (const auto f : families) {
            INFO("S = " << S << ", family " << name(f));
            o.p.options.kernel = f;
            o.p.options.precision = qkv_test::case_precision(f, qkv::precision::fp32);
            const qkv::sdpa_output r = ctx.sdpa(o.p);
            CHECK(r.output[1] == inf);
            // (float16 inputs and weights: about 2^-11 of each value)
            const double relative = coop(f) ? 2e-3 : 1e-5;
            for (const std::size_t c : {0u, 2u, 3u})
                CHECK(std::fabs(r.output[c] - want[c]) <= relative * std::fabs(want[c]) + 1e-6);
        }
        // A masked key's value adds nothing, even inf: -inf in the mask.
        o.additive[2] = -inf;
        for (const auto f : families) {
            o.p.options.kernel = f;
            o.p.options.precision = qkv_test::case_precision(f, qkv::precision::fp32);
            for (const float x : ctx.sdpa(o.p).output) CHECK(std::isfinite(x));
        }
        o.p.options.precision = qkv::precision::fp32;
        require_clean(ctx);
    }
}

TEST_CASE("sdpa: fp16 stores Q as float16 on the fused and the decode route alike", "[guarantees][fp16]") {
    auto ctx = qkv_test::make_context({});
    // S = 1023: fused; S = 1024: decode. The same Q, whose values float16 cannot hold exactly.
    for (const std::size_t S : {1023u, 1024u}) {
        owned o(2, 1, 1, S, 16, 16, 5);
        for (float& x : o.q) x *= 1.0001f;
        o.p.options.precision = qkv::precision::fp16;
        // The reference: every input rounded to float16 first.
        owned r = o;
        for (auto* t : {&r.q, &r.k, &r.v})
            for (float& x : *t) x = through_half(x);
        r.bind();
        const std::vector<double> rounded = qkv::cpu::sdpa_f64(r.p).output;
        const std::vector<double> exact = qkv::cpu::sdpa_f64(o.p).output;
        const qkv::sdpa_output got = ctx.sdpa(o.p);
        INFO("S = " << S);
        // Q rounded too: much closer to the rounded reference than the float32 Q would be.
        CHECK(nmse(got.output, rounded) <= 1e-11);
        CHECK(nmse(got.output, rounded) * 10 < nmse(got.output, exact));
        // A q beyond float16's range is refused on both routes, naming q.
        owned big = o;
        big.q[3] = 70000.0f;
        big.bind();
        CHECK_THROWS_WITH(ctx.sdpa(big.p), Catch::Matchers::Contains("q[3]") && Catch::Matchers::Contains("float16"));
        require_clean(ctx);
    }
}

TEST_CASE("sdpa: fp16 host K and V on the decode route refuse the first value float16 cannot hold",
          "[guarantees][fp16]") {
    auto ctx = qkv_test::make_context({});
    // S = 1024: the decode route, whose rows of texels are checked as they are converted; E = 17
    // and Ev = 3 (padded to whole texels), the offending values in rows past the first.
    owned o(2, 1, 1, 1024, 17, 3, 11);
    o.p.options.precision = qkv::precision::fp16;
    const auto refusal = [&] {
        try {
            static_cast<void>(ctx.sdpa(o.p));
        } catch (const qkv::vulkan::numeric_overflow& e) {
            return std::string(e.what());
        }
        return std::string("no refusal");
    };
    // Infinity and NaN are no overflow (they are stored as they are): the first finite value that
    // rounds to inf is named, by its index in k; a later one is not.
    o.k[40] = std::numeric_limits<float>::infinity(), o.k[41] = std::nanf("");
    o.k[5 * 17 + 3] = -65520.0f;  // the tie rounds to even: inf
    o.k[900 * 17 + 16] = 1e6f;
    o.bind();
    CHECK_THAT(refusal(), Catch::Matchers::StartsWith("sdpa: k[88] = -65520 is beyond float16's range (65504)"));
    o.k[88] = -65519.99f;  // rounds to -65504
    o.bind();
    CHECK_THAT(refusal(), Catch::Matchers::StartsWith("sdpa: k[15316] = 1000000 is beyond float16's range"));
    o.k[15316] = 1.0f, o.k[40] = o.k[41] = 0.5f;
    o.v[1023 * 3 + 2] = 7e4f;  // the last value of v
    o.bind();
    CHECK_THAT(refusal(), Catch::Matchers::StartsWith("sdpa: v[3071] = 70000 is beyond float16's range"));
    o.v[3071] = 65504.0f;  // float16's largest: stored
    o.bind();
    const qkv::sdpa_output out = ctx.sdpa(o.p);
    CHECK(std::all_of(out.output.begin(), out.output.end(), [](float x) { return std::isfinite(x); }));
    require_clean(ctx);
}

TEST_CASE("kv_cache: concurrent appends and decodes never pass the capacity", "[guarantees][threads]") {
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t E = 8, capacity = 200, rows = 7, threads = 4;
    qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = capacity, .d_qk = E, .d_v = E});
    // Every append writes rows of one value (its thread and round), so the decode's reference is
    // known from the cache's contents; appends race for the capacity.
    std::atomic<std::size_t> appended{0}, refused{0}, decoded{0};
    std::atomic<bool> bad{false};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            const std::vector<float> q(E, 0.0f);
            for (std::size_t round = 0; round < 12; ++round) {
                const std::vector<float> k(rows * E, 0.0f), v(rows * E, static_cast<float>(t + 1));
                try {
                    cache.append(k, v, rows);
                    appended += rows;
                } catch (const qkv::vulkan::limit_exceeded&) {
                    ++refused;
                }
                if (cache.size() > cache.capacity()) bad = true;
                // Zero keys: the output is the mean of the values, within the values' range.
                qkv::sdpa_problem p;
                p.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
                p.q = q;
                const qkv::sdpa_output o = ctx.sdpa(p, cache);
                for (const float x : o.output)
                    if (!(x >= 1.0f && x <= static_cast<float>(threads))) bad = true;
                ++decoded;
            }
        });
    for (auto& th : pool) th.join();
    CHECK_FALSE(bad);
    CHECK(cache.size() <= capacity);
    CHECK(cache.size() == appended.load());
    CHECK(cache.size() == capacity / rows * rows);  // 48 appends of 7 rows: it fills up to 196
    CHECK(refused.load() == threads * 12 - capacity / rows);
    CHECK(decoded.load() == threads * 12);
    require_clean(ctx);
}

TEST_CASE("context and kv_cache: moved-from objects throw, orphaned caches keep working", "[guarantees][lifetime]") {
    owned o(2, 1, 1, 64, 8, 8);
    qkv::sdpa_problem q_only = o.p;
    q_only.k = {}, q_only.v = {}, q_only.shape.kv_len = 0;
    const std::vector<double> want = qkv::cpu::sdpa_f64(o.p).output;

    SECTION("a moved-from context") {
        auto ctx = qkv_test::make_context({});
        qkv::vulkan::context other = std::move(ctx);
        CHECK(nmse(other.sdpa(o.p).output, want) <= 1e-10);
        CHECK_THROWS_WITH(ctx.sdpa(o.p), Catch::Matchers::Contains("used after move"));
        CHECK_THROWS_WITH((void)ctx.device(), Catch::Matchers::Contains("used after move"));
        CHECK_THROWS_AS((void)ctx.last_call(), qkv::error);
        CHECK_THROWS_AS(ctx.trim(), qkv::error);
        CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.capacity = 4, .d_qk = 8, .d_v = 8}), qkv::error);
    }
    SECTION("a moved-from cache") {
        auto ctx = qkv_test::make_context({});
        qkv::vulkan::kv_cache cache(ctx, {.capacity = 64, .d_qk = 8, .d_v = 8});
        qkv::vulkan::kv_cache moved = std::move(cache);
        moved.append(o.k, o.v, 64);
        CHECK_THROWS_WITH((void)cache.size(), Catch::Matchers::Contains("used after move"));
        CHECK_THROWS_AS(cache.append(o.k, o.v, 64), qkv::error);
        CHECK_THROWS_AS((void)ctx.sdpa(q_only, cache), qkv::error);
        CHECK_THROWS_AS(cache.clear(), qkv::error);
        CHECK(nmse(ctx.sdpa(q_only, moved).output, want) <= 1e-10);
        // Move-assigning a live cache over it: it works again.
        cache = std::move(moved);
        CHECK(cache.size() == 64);
        CHECK(nmse(ctx.sdpa(q_only, cache).output, want) <= 1e-10);
        require_clean(ctx);
    }
    SECTION("the context destroyed first") {
        auto cache = [&] {
            auto ctx = qkv_test::make_context({});
            return qkv::vulkan::kv_cache(ctx, {.capacity = 128, .d_qk = 8, .d_v = 8});
        }();
        cache.append(o.k, o.v, 64);  // the device lives on with the cache
        CHECK(cache.size() == 64);
        cache.clear();
        CHECK(cache.size() == 0);
    }
    SECTION("the context moved away, or move-assigned over") {
        auto ctx = qkv_test::make_context({});
        qkv::vulkan::kv_cache cache(ctx, {.capacity = 64, .d_qk = 8, .d_v = 8});
        cache.append(o.k, o.v, 64);
        qkv::vulkan::context moved = std::move(ctx);
        CHECK(nmse(moved.sdpa(q_only, cache).output, want) <= 1e-10);  // the cache belongs to its device
        moved = qkv_test::make_context({});                            // its old device now lives only in the cache
        CHECK_THROWS_WITH(moved.sdpa(q_only, cache), Catch::Matchers::Contains("another context"));
        CHECK(cache.size() == 64);
        cache.append(std::span<const float>{}, std::span<const float>{}, 0);
        require_clean(moved);
    }
}
