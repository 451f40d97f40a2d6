// Finite inputs at and just past the range the Vulkan backend computes in: the answer equals the
// float64 reference, or the call throws qkv::vulkan::numeric_overflow. Never zeros or NaN with
// success. The rule (README, Guarantees; src/kernels/range_guard.hpp): every Q, K, V element finite after
// the projection (float16: at most 65,504), scores bounded by 2^127, seq x max|V| by 2^127.
#include <qkv/vulkan/runtime.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/gpu.hpp"
#include "support/problems.hpp"
#include "support/reference.hpp"

using qkv_test::gpu;
using qkv_test::require_clean;

namespace {

constexpr qkv::implementation implementations[] = {qkv::implementation::staged, qkv::implementation::fused};
const char* name_of(qkv::implementation i) { return i == qkv::implementation::staged ? "staged" : "fused"; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The message of the numeric_overflow `f` throws; fails the test if it returns normally (and
/// says what it returned).
template <class F>
std::string overflow_of(F&& f) {
    try {
        const qkv::attention_output r = f();
        std::size_t zeros = 0, nonfinite = 0;
        for (float v : r.output) {
            zeros += v == 0.0f;
            nonfinite += !std::isfinite(v);
        }
        FAIL("no numeric_overflow: the call succeeded with " << zeros << " zeros and " << nonfinite
                                                             << " non-finite values among " << r.output.size());
    } catch (const qkv::vulkan::numeric_overflow& e) {
        return e.what();
    }
    return {};
}

/// Attention over one-column inputs: Q = x·wq, K = x·wk, V = x·wv with d_in = d_k = d_v = 1,
/// so every projected value and score is known exactly. Scale 1 unless given.
qkv_test::owned_problem column_problem(std::vector<float> x, float wq, float wk, float wv) {
    qkv_test::owned_problem p;
    p.shape = {.batch = 1, .seq = x.size(), .d_in = 1, .d_k = 1, .d_v = 1};
    p.x = std::move(x);
    p.wq = {wq};
    p.wk = {wk};
    p.wv = {wv};
    p.options.scale = 1.0f;
    return p;
}

void require_matches_reference(qkv::vulkan::context& ctx, const qkv_test::owned_problem& p, double tolerance) {
    const auto want = qkv::cpu::attention_f64(p.view());
    for (double w : want.output) REQUIRE(std::isfinite(w));
    const auto got = ctx.attention(p.view());
    const double e = qkv_test::nmse(got.output, want.output);
    INFO("output nmse " << e);
    CHECK(e <= tolerance);
}

}  // namespace

TEST_CASE("scores just under 2^127 are finite and right; just past, and past FLT_MAX, are refused",
          "[overflow][vulkan]") {
    auto& ctx = gpu();
    // x = t·(1, -0.5, 0.25), wq = wk = wv = 1: the largest |score| is t², the largest |q|·|k|.
    const auto with_peak = [](double peak) {
        const auto t = static_cast<float>(std::sqrt(peak));
        return column_problem({t, -0.5f * t, 0.25f * t}, 1.0f, 1.0f, 1.0f);
    };
    for (auto impl : implementations) {
        INFO(name_of(impl));
        auto under = with_peak(0.99 * 0x1p127);
        under.options.implementation = impl;
        require_matches_reference(ctx, under, 1e-10);

        for (double peak : {1.01 * 0x1p127, 0.999 * FLT_MAX, 4.0 * FLT_MAX}) {
            INFO("peak score " << peak);
            auto past = with_peak(peak);
            past.options.implementation = impl;
            const std::string m = overflow_of([&] { return ctx.attention(past.view()); });
            CHECK(contains(m, "numeric overflow in the attention scores"));
            CHECK(contains(m, "batch 0, head 0"));
            CHECK(contains(m, "2^127"));
            // The float64 backend has no such limit.
            for (double w : qkv::cpu::attention_f64(past.view()).output) CHECK(std::isfinite(w));
        }
    }
    // The context keeps working after a refusal.
    require_matches_reference(ctx, qkv_test::make_problem({.seq = 5, .d_in = 3, .d_k = 2, .d_v = 2}, 3), 1e-10);
    require_clean(ctx);
}

TEST_CASE("inputs of about 3e19 give the typed error, not zeros or NaN", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        auto p = qkv_test::make_problem({.seq = 6, .d_in = 4, .d_k = 4, .d_v = 4, .heads = 2}, 140);
        for (auto& v : p.x) v *= 3e19f;  // Q·Kᵀ about 1e39 > FLT_MAX; every input finite
        p.options.implementation = impl;
        for (double w : qkv::cpu::attention_f64(p.view()).output) REQUIRE(std::isfinite(w));
        const std::string m = overflow_of([&] { return ctx.attention(p.view()); });
        CHECK(contains(m, "scores"));
        CHECK(contains(m, "cpu backend"));
        // A hundredth of it (scores about 1e35) is computed, and right.
        for (auto& v : p.x) v *= 0.01f;
        require_matches_reference(ctx, p, 1e-10);
    }
    require_clean(ctx);
}

TEST_CASE("a projection beyond float32 is refused, naming the element and its float64 value", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // K = x · 4: 3e38 · 4 = 1.2e39 is not a float.
        auto p = column_problem({1.0f, 3e38f, -2.0f}, 1e-30f, 4.0f, 1e-30f);
        p.options.implementation = impl;
        const std::string m = overflow_of([&] { return ctx.attention(p.view()); });
        CHECK(contains(m, "Q|K|V projection"));
        CHECK(contains(m, "K[batch 0, position 1, column 0]"));
        CHECK(contains(m, "1.2e+39"));
        CHECK(contains(m, "float32"));
    }
    require_clean(ctx);
}

TEST_CASE("fp16: 65,504 is stored and right, 65,520 and beyond are refused", "[overflow][vulkan][fp16]") {
    auto& ctx = gpu();
    if (!ctx.device().fp16_storage) {
        WARN("no 16-bit storage on " << ctx.device().name << ": fp16 not tested");
        return;
    }
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // Q of the first row is exactly float16's largest value; the scores stay small (wk tiny).
        auto at = column_problem({65504.0f, 1.0f, -3.0f, 0.5f}, 1.0f, 1e-4f, 1.0f);
        at.options.precision = qkv::precision::fp16;
        at.options.implementation = impl;
        require_matches_reference(ctx, at, 1e-5);

        for (float big : {65520.0f, 70000.0f, 1e6f}) {
            INFO("Q = " << big);
            auto past = at;
            past.x[0] = big;
            const std::string m = overflow_of([&] { return ctx.attention(past.view()); });
            CHECK(contains(m, "Q[batch 0, position 0, column 0]"));
            CHECK(contains(m, "65504"));
            CHECK(contains(m, "fp32 instead of fp16"));
            // The same input in fp32 is fine.
            past.options.precision = qkv::precision::fp32;
            require_matches_reference(ctx, past, 1e-10);
        }
        // K and V beyond float16 too.
        auto k = column_problem({1.0f, 2.0f, -3.0f}, 1e-5f, 4e4f, 1.0f);  // K of row 1 = 8e4
        k.options.precision = qkv::precision::fp16;
        k.options.implementation = impl;
        CHECK(contains(overflow_of([&] { return ctx.attention(k.view()); }), "K[batch 0, position 1, column 0]"));
        auto v = column_problem({1.0f, 2.0f, -3.0f}, 0.1f, 0.1f, 3e4f);  // V of row 2 = -9e4
        v.options.precision = qkv::precision::fp16;
        v.options.implementation = impl;
        CHECK(contains(overflow_of([&] { return ctx.attention(v.view()); }), "V[batch 0, position 2, column 0]"));
    }
    require_clean(ctx);
}

TEST_CASE("value sums past 2^127 and an overflowing output projection are refused", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // V up to 1e38 over 4 keys: seq x max|V| = 4e38.
        auto v = column_problem({1.0f, 0.5f, -0.25f, 0.75f}, 1.0f, 1.0f, 1e38f);
        v.options.implementation = impl;
        CHECK(contains(overflow_of([&] { return ctx.attention(v.view()); }), "value sums"));
        // ... and 1e37 is computed, and right.
        v.wv = {1e37f};
        require_matches_reference(ctx, v, 1e-10);

        // Output projection: every attention output is about 1 and positive, wo = 3e38 each.
        auto o = column_problem({1.0f, 1.5f, 2.0f}, 0.1f, 0.1f, 1.0f);
        o.shape.d_out = 2;
        o.wo = {3e38f, -3e38f};
        o.options.implementation = impl;
        const std::string m = overflow_of([&] { return ctx.attention(o.view()); });
        CHECK(contains(m, "output[batch 0, position 0"));
        CHECK(contains(m, "output projection"));
    }
    require_clean(ctx);
}

TEST_CASE("legal non-finite values still follow the documented rules, with no overflow error", "[overflow][vulkan]") {
    auto& ctx = gpu();
    constexpr float inf = std::numeric_limits<float>::infinity();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // +inf in the input: the rows that attend to it follow the documented NaN/-inf rules,
        // exactly as the float64 backend applies them; earlier rows (causal) are right.
        auto p = qkv_test::make_problem({.seq = 5, .d_in = 3, .d_k = 2, .d_v = 2, .causal = true}, 141);
        p.options.implementation = impl;
        p.x[2 * 3 + 1] = inf;
        const auto r = ctx.attention(p.view());
        const auto want = qkv::cpu::attention_f64(p.view()).output;
        for (std::size_t e = 0; e < 10; ++e) {
            INFO("element " << e);
            CHECK(std::isnan(r.output[e]) == std::isnan(want[e]));
            if (e < 4) CHECK(std::fabs(r.output[e] - want[e]) <= 1e-5 * (1.0 + std::fabs(want[e])));
        }
        CHECK(std::isnan(r.output[2 * 2]));  // row 2 attends to itself

        // -inf and -FLT_MAX (torch.finfo(float32).min) masks next to large scores: legal, right.
        auto m = qkv_test::make_problem({.seq = 7, .d_in = 3, .d_k = 4, .d_v = 2}, 142);
        m.options.implementation = impl;
        for (auto& x : m.x) x *= 1e9f;  // scores about 1e18
        m.additive.assign(49, 0.0f);
        for (std::size_t j = 0; j < 7; ++j) {
            m.additive[1 * 7 + j] = -inf;  // row 1 fully masked: zeros
            if (j % 2) m.additive[3 * 7 + j] = -FLT_MAX;
        }
        const auto rm = ctx.attention(m.view());
        CHECK(rm.output[1 * 2] == 0.0f);
        CHECK(rm.output[1 * 2 + 1] == 0.0f);
        require_matches_reference(ctx, m, 1e-10);

        // NaN in an additive mask: that row is NaN, as documented; no overflow error.
        m.additive[5 * 7 + 2] = std::numeric_limits<float>::quiet_NaN();
        const auto rn = ctx.attention(m.view());
        CHECK(std::isnan(rn.output[5 * 2]));
        CHECK(std::isfinite(rn.output[4 * 2]));
    }
    require_clean(ctx);
}

TEST_CASE("the additive mask counts towards the score bound", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // Scores up to 1e38 plus a mask entry of 3e38: 4e38 is not a float.
        auto p = column_problem({1e19f, 0.5e19f, -0.3e19f}, 1.0f, 1.0f, 1.0f);
        p.additive.assign(9, 0.0f);
        p.additive[0] = 3e38f;
        p.options.implementation = impl;
        CHECK(contains(overflow_of([&] { return ctx.attention(p.view()); }), "additive mask"));
        // Without the mask the same scores are computed, and right.
        p.additive.clear();
        require_matches_reference(ctx, p, 1e-10);
    }
    require_clean(ctx);
}

TEST_CASE("the guard reads every column of heads wider than its 4,096-column chunks", "[overflow][vulkan]") {
    auto& ctx = gpu();
    // d_in = 1, wide heads, staged (the fused kernels take heads up to 576): one large weight in
    // the last chunk decides.
    const auto wide = [](std::size_t d_k, std::size_t d_v) {
        qkv_test::owned_problem p;
        p.shape = {.batch = 1, .seq = 3, .d_in = 1, .d_k = d_k, .d_v = d_v};
        p.x = {1.0f, -0.5f, 0.25f};
        p.wq.assign(d_k, 1e-3f);
        p.wk.assign(d_k, 1e-3f);
        p.wv.assign(d_v, 1.0f);
        p.options.implementation = qkv::implementation::staged;
        return p;
    };
    // Q and K of 5,000 columns: column 4,500 of each about 2e19, so the scores reach 4e38.
    auto qk = wide(5000, 2);
    require_matches_reference(ctx, qk, 1e-10);
    qk.wq[4500] = 2e19f;
    qk.wk[4500] = 2e19f;
    CHECK(contains(overflow_of([&] { return ctx.attention(qk.view()); }), "scores"));
    // V of 65,537 columns: column 65,536 beyond float16, or large enough for the value sums.
    auto v = wide(2, 65537);
    v.wv[65536] = 1e5f;
    if (ctx.device().fp16_storage) {
        v.options.precision = qkv::precision::fp16;
        CHECK(contains(overflow_of([&] { return ctx.attention(v.view()); }), "V[batch 0, position 0, column 65536]"));
        v.options.precision = qkv::precision::fp32;
    }
    require_matches_reference(ctx, v, 1e-10);
    v.wv[65536] = 1e38f;
    CHECK(contains(overflow_of([&] { return ctx.attention(v.view()); }), "value sums"));
    require_clean(ctx);
}

TEST_CASE("a scale above 1 times a large Q row is refused even when the scores are small", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        INFO(name_of(impl));
        // K is tiny, so every score is small, but scale x Q reaches 1e39 (the fused kernel
        // multiplies Q by the scale first).
        auto p = column_problem({1.0f, -0.5f, 0.25f}, 1e38f, 1e-30f, 1.0f);
        p.options.scale = 10.0f;
        p.options.implementation = impl;
        CHECK(contains(overflow_of([&] { return ctx.attention(p.view()); }), "largest Q row norm"));
        p.wq = {1e36f};  // 1e37: computed, and right
        require_matches_reference(ctx, p, 1e-10);
    }
    require_clean(ctx);
}

TEST_CASE("the device range check runs only where the host cannot prove the inputs in range", "[overflow][vulkan]") {
    auto& ctx = gpu();
    for (auto impl : implementations) {
        for (auto prec : {qkv::precision::fp32, qkv::precision::fp16}) {
            if (prec == qkv::precision::fp16 && !ctx.device().fp16_storage) continue;
            INFO(name_of(impl) << (prec == qkv::precision::fp16 ? ", fp16" : ", fp32"));
            // Ordinary inputs: the host's bound proves them, no device pass; the answer is right.
            auto p = qkv_test::make_problem(
                {.batch = 2, .seq = 17, .d_in = 12, .d_k = 8, .d_v = 12, .heads = 2, .biases = true}, 143);
            p.options.implementation = impl;
            p.options.precision = prec;
            require_matches_reference(ctx, p, prec == qkv::precision::fp16 ? 1e-5 : 1e-10);
            CHECK_FALSE(ctx.last_call().device_range_check);
            // Legal inputs the bound cannot prove: x rows (t, t) with wq = (1, -1) give Q = 0, so
            // every score is 0, but the bound |q| <= ||x||·||wq|| = 2t gives scores up to 4t², past
            // 2^127 for t = 1e19. The device checks, and the answer is right (fp32; float16
            // cannot hold such values).
            if (prec == qkv::precision::fp32) {
                qkv_test::owned_problem big;
                big.shape = {.batch = 1, .seq = 3, .d_in = 2, .d_k = 1, .d_v = 1};
                big.x = {1e19f, 1e19f, -2e19f, -2e19f, 5e18f, 5e18f};
                big.wq = {1.0f, -1.0f};
                big.wk = {1.0f, 1.0f};
                big.wv = {1.0f, 0.0f};
                big.options.implementation = impl;
                require_matches_reference(ctx, big, 1e-10);
                CHECK(ctx.last_call().device_range_check);
            }
            // NaN in the input: the device applies the documented rules.
            auto nan = p;
            nan.x[5] = std::numeric_limits<float>::quiet_NaN();
            (void)ctx.attention(nan.view());
            CHECK(ctx.last_call().device_range_check);
        }
    }
    require_clean(ctx);
}
