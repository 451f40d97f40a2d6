// The matrix products (projection, scores, aggregation, output projection) and the staged
// softmax, in both kernel families, against the float64 CPU reference, validation layer on:
// odd shapes with each family forced, inner dimensions past a CPU driver's 65,535-iteration loop
// limit (lavapipe ends every loop silently there; the products split K across dispatches), and
// the staged path at the longest sequence the device's maxStorageBufferRange allows.
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/gpu.hpp"
#include "support/problems.hpp"
#include "support/reference.hpp"

using qkv::kernel_family;
using qkv_test::make_problem;
using qkv_test::mask_kind;
using qkv_test::problem_spec;
using qkv_test::require_clean;

namespace {

const char* name(kernel_family k) { return k == kernel_family::row_tiles ? "cpu family" : "gpu family"; }

/// Output (and weights, when returned) against the float64 reference by normalised MSE.
void check(qkv::vulkan::context& ctx, const qkv_test::owned_problem& p, double tolerance) {
    const auto want = qkv::cpu::attention_f64(p.view());
    const auto got = ctx.attention(p.view());
    REQUIRE(got.output.size() == want.output.size());
    const double e = qkv_test::nmse(got.output, want.output);
    INFO("output nmse " << e);
    CHECK(e <= tolerance);
    if (p.options.return_weights) {
        REQUIRE(got.weights.size() == want.weights.size());
        const double ew = qkv_test::nmse(got.weights, want.weights);
        INFO("weights nmse " << ew);
        CHECK(ew <= tolerance);
    }
}

}  // namespace

TEST_CASE("each kernel family of the products matches the reference on odd shapes", "[vulkan][gemm]") {
    for (kernel_family family : {kernel_family::row_tiles, kernel_family::block_tiles}) {
        auto ctx = qkv_test::make_context({});
        std::uint64_t seed = 7000;
        std::size_t k = 0;
        for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{113}})
            for (std::size_t d : {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{64}}) {
                problem_spec s;
                s.seq = n;
                s.d_in = 3 + 14 * (k % 3);
                s.d_k = d;
                s.heads = d % 2 == 0 && k % 2 == 0 ? 2 : 1;
                s.d_v = k % 2 ? d : d + s.heads;
                s.batch = k % 3 == 1 ? 2 : 1;
                s.biases = k % 2 == 0;
                s.d_out = k % 4 == 3 ? 5 : 0;
                s.causal = k % 3 == 2;
                s.mask = static_cast<mask_kind>(k % 4);
                s.batched_mask = s.batch > 1;
                s.fully_masked_row = s.mask != mask_kind::none && n > 1 && k % 5 == 1;
                auto p = make_problem(s, seed++);
                p.options.kernel = family;
                for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
                    p.options.implementation = impl;
                    p.options.return_weights = impl == qkv::implementation::staged;
                    p.options.precision = qkv::precision::fp32;
                    INFO(qkv_test::describe(s)
                         << (impl == qkv::implementation::staged ? " staged " : " fused ") << name(family));
                    check(ctx, p, 1e-10);
                    if (ctx.device().fp16_storage && k % 2 == 1) {
                        p.options.precision = qkv::precision::fp16;
                        INFO("fp16");
                        check(ctx, p, 1e-5);
                    }
                }
                ++k;
            }
        require_clean(ctx);
    }
}

TEST_CASE("the projection's texel variant matches the reference", "[vulkan][gemm][texels]") {
    // d_in and 2·d_k + d_v multiples of 4: on a CPU device that reads RGBA32F texel buffers the
    // cpu family's projection reads X and the weights through texel views (project_cpu_tx).
    // Row counts that leave a partial row block, widths that leave a partial column block, a K
    // past the loop limit (two dispatches, whole texels each), biases, batches and fp16 storage;
    // Q|K|V rows of whole groups of 8 columns (the eight-column stores where the device shuffles:
    // 24, 40 with a partial column block, 192) and of 12 and 20 (four-column stores).
    auto ctx = qkv_test::make_context({});
    std::uint64_t seed = 9000;
    struct shape {
        std::size_t seq, d_in, d_k, d_v, heads, batch;
    };
    for (const shape& sh : {shape{1, 4, 4, 4, 1, 1}, shape{3, 8, 2, 8, 1, 2}, shape{17, 64, 64, 64, 1, 1},
                            shape{113, 20, 6, 8, 2, 1}, shape{113, 64, 64, 64, 4, 2}, shape{33, 16, 12, 16, 2, 1},
                            shape{5, 270'000, 4, 4, 1, 1}, shape{5, 270'000, 8, 8, 1, 1}}) {
        problem_spec s;
        s.seq = sh.seq, s.d_in = sh.d_in, s.d_k = sh.d_k, s.d_v = sh.d_v, s.heads = sh.heads, s.batch = sh.batch;
        s.biases = sh.seq % 2 == 1;
        s.causal = sh.seq == 113;
        auto p = make_problem(s, seed++);
        p.options.kernel = kernel_family::row_tiles;
        for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
            p.options.implementation = impl;
            p.options.precision = qkv::precision::fp32;
            INFO(qkv_test::describe(s) << (impl == qkv::implementation::staged ? " staged" : " fused"));
            // A float32 sum over 270,000 terms rounds more (as in the loop-limit test below).
            check(ctx, p, sh.d_in > 65'535 ? 1e-8 : 1e-10);
            if (ctx.device().fp16_storage) {
                p.options.precision = qkv::precision::fp16;
                INFO("fp16");
                check(ctx, p, 1e-5);
            }
        }
    }
    require_clean(ctx);
}

TEST_CASE("the staged scores and aggregation through texel views match the reference", "[vulkan][gemm][texels]") {
    // Where the device shuffles (lavapipe), the cpu family's staged scores read Q and K through a
    // texel view of Q|K|V when every head starts on whole texels (d_k / H and 2·d_k + d_v
    // multiples of 4), and the aggregation reads the weights and V through texel views when N and
    // d_v / H are multiples of 4 too (scores_cpu_tx, aggregate_cpu_tx; with QKV_CPU_SHUFFLE=0,
    // as CTest also runs this, the storage-buffer variants). N = 17 and 113 leave the score rows
    // off whole texels (four scalar stores instead of one vec4); 260 and 36 leave partial tiles.
    auto ctx = qkv_test::make_context({});
    std::uint64_t seed = 9100;
    const problem_spec specs[] = {
        {.seq = 4, .d_in = 8, .d_k = 4, .d_v = 4},
        {.batch = 2, .seq = 36, .d_in = 12, .d_k = 8, .d_v = 16, .heads = 2, .biases = true, .causal = true},
        {.batch = 2,
         .seq = 64,
         .d_in = 16,
         .d_k = 16,
         .d_v = 8,
         .heads = 2,
         .mask = mask_kind::boolean,
         .batched_mask = true},
        {.seq = 100,
         .d_in = 20,
         .d_k = 32,
         .d_v = 32,
         .heads = 4,
         .causal = true,
         .mask = mask_kind::both,
         .fully_masked_row = true},
        {.seq = 17, .d_in = 8, .d_k = 8, .d_v = 8, .mask = mask_kind::additive},
        {.seq = 113, .d_in = 12, .d_k = 12, .d_v = 4, .causal = true, .mask = mask_kind::boolean},
        {.seq = 260, .d_in = 16, .d_k = 64, .d_v = 64, .mask = mask_kind::additive, .fully_masked_row = true},
    };
    for (const auto& s : specs) {
        auto p = make_problem(s, seed++);
        p.options.kernel = kernel_family::row_tiles;
        p.options.implementation = qkv::implementation::staged;
        p.options.return_weights = seed % 2 == 0;
        INFO(qkv_test::describe(s));
        check(ctx, p, 1e-10);
        if (ctx.device().fp16_storage) {  // Q|K|V as float16: an RGBA16F view
            p.options.precision = qkv::precision::fp16;
            INFO("fp16");
            check(ctx, p, 1e-5);
        }
    }
    // The softmax's rules with a row per lane (softmax_cpu_tx, rows of whole texels): a fully
    // masked row is zeros, a NaN or +inf score makes its row NaN, the other rows are right.
    {
        auto m = make_problem({.seq = 12, .d_in = 4, .d_k = 4, .d_v = 4, .mask = mask_kind::additive}, seed++);
        m.options.kernel = kernel_family::row_tiles;
        m.options.implementation = qkv::implementation::staged;
        m.options.return_weights = true;
        for (std::size_t j = 0; j < 12; ++j) m.additive[2 * 12 + j] = -std::numeric_limits<float>::infinity();
        m.additive[5 * 12 + 7] = std::numeric_limits<float>::quiet_NaN();
        m.additive[7 * 12 + 0] = std::numeric_limits<float>::infinity();
        const auto want = qkv::cpu::attention_f64(m.view());
        const auto got = ctx.attention(m.view());
        for (std::size_t i = 0; i < 12; ++i)
            for (std::size_t j = 0; j < 12; ++j) {
                INFO("weight " << i << ", " << j);
                const double w = want.weights[i * 12 + j];
                const float g = got.weights[i * 12 + j];
                CHECK(std::isnan(g) == (i == 5 || i == 7));
                CHECK(std::isnan(w) == (i == 5 || i == 7));
                if (i == 2) CHECK(g == 0.0f);
                if (!std::isnan(w)) CHECK(std::fabs(g - w) <= 1e-6);
            }
    }
    // NaN in one input row makes that row's V NaN: rows that never attend to it (causal) must
    // stay right, so a zero weight adds nothing rather than 0·NaN.
    auto p = make_problem({.seq = 8, .d_in = 4, .d_k = 4, .d_v = 4, .causal = true}, seed++);
    p.options.kernel = kernel_family::row_tiles;
    p.options.implementation = qkv::implementation::staged;
    p.x[5 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
    const auto want = qkv::cpu::attention_f64(p.view()).output;
    const auto got = ctx.attention(p.view()).output;
    for (std::size_t i = 0; i < 8; ++i)
        for (std::size_t c = 0; c < 4; ++c) {
            INFO("row " << i << ", column " << c);
            CHECK(std::isnan(got[i * 4 + c]) == (i >= 5));
            if (i < 5) CHECK(std::fabs(got[i * 4 + c] - want[i * 4 + c]) <= 1e-5 * (1.0 + std::fabs(want[i * 4 + c])));
        }
    require_clean(ctx);
}

TEST_CASE("inner dimensions past 65,535 are right in both families", "[vulkan][gemm][loop_limit]") {
    // Just past 65,535, and 270,000: past the point where the shared-memory tiles of a short
    // product fail on lavapipe without the split (16 k per step, 5 loop iterations per step:
    // ~210,000), and where the CPU family (4 k per iteration) needs two dispatches.
    const std::size_t wide = GENERATE(std::size_t{65'537}, std::size_t{270'000});
    for (kernel_family family : {kernel_family::row_tiles, kernel_family::block_tiles}) {
        auto ctx = qkv_test::make_context({});
        SECTION("projection: d_in past 65,535") {
            problem_spec s;
            s.seq = 3, s.d_in = wide, s.d_k = 2, s.d_v = 3, s.biases = true;
            auto p = make_problem(s, 11);
            p.options.kernel = family;
            for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
                p.options.implementation = impl;
                INFO("width " << wide << " " << name(family)
                              << (impl == qkv::implementation::staged ? " staged" : " fused"));
                check(ctx, p, 1e-8);
            }
            if (ctx.device().fp16_storage) {  // fp16 Q|K|V: the split sums are rounded once per dispatch
                p.options.precision = qkv::precision::fp16;
                INFO(name(family) << " fp16");
                check(ctx, p, 1e-5);
            }
        }
        SECTION("output projection: d_v past 65,535") {
            problem_spec s;
            s.seq = 2, s.d_in = 3, s.d_k = 2, s.d_v = wide, s.d_out = 3;
            auto p = make_problem(s, 12);
            p.options.kernel = family;
            p.options.implementation = qkv::implementation::staged;  // heads this wide: staged only
            INFO("width " << wide << " " << name(family));
            check(ctx, p, 1e-8);
        }
        SECTION("scores: a head of d_k past 65,535") {
            // d_v = 4: at d_k = 270,000 the Q|K|V rows are whole texels, so the cpu family's
            // scores take their texel variant where the device shuffles, split in two dispatches.
            problem_spec s;
            s.seq = 3, s.d_in = 2, s.d_k = wide, s.d_v = 4, s.causal = true;
            auto p = make_problem(s, 13);
            p.options.kernel = family;
            p.options.implementation = qkv::implementation::staged;
            p.options.return_weights = true;
            INFO("width " << wide << " " << name(family));
            check(ctx, p, 1e-8);
        }
        require_clean(ctx);
    }
}

TEST_CASE("the staged path at the longest sequence the device allows", "[vulkan][gemm][loop_limit][long]") {
    // The staged score matrix (B x H x N x N floats) must fit maxStorageBufferRange, so that bounds
    // N; the softmax and the aggregation loop over N, and must stay under a CPU driver's loop
    // limit there (make_plan checks the softmax's budget, the aggregation splits along N).
    auto ctx = qkv_test::make_context({});
    const std::uint64_t range = ctx.device().max_storage_buffer_range;
    std::uint64_t n = static_cast<std::uint64_t>(std::sqrt(static_cast<double>(range / 4)));
    while (n * n * 4 > range) --n;
    while ((n + 1) * (n + 1) * 4 <= range) ++n;
    if (n > 8192) {
        WARN("maxStorageBufferRange allows N = " << n << "; testing N = 8192 to keep the test short");
        n = 8192;
    }
    problem_spec s;
    s.seq = n, s.d_in = 2, s.d_k = 1, s.d_v = 1, s.causal = true;
    auto p = make_problem(s, 14);
    p.options.implementation = qkv::implementation::staged;
    INFO("N = " << n);
    check(ctx, p, 1e-8);
    require_clean(ctx);
}

TEST_CASE("projection timing of each family (not run by default)", "[.][bench]") {
    // N = 4096 rows of d_in = 64 times [Wq|Wk|Wv] (64 x 192), as batch 4096 of length 1 so the
    // attention itself costs nothing; prints the median device time of the projection phase.
    problem_spec s;
    s.batch = 4096, s.seq = 1, s.d_in = 64, s.d_k = 64, s.d_v = 64;
    auto p = make_problem(s, 15);
    for (kernel_family family : {kernel_family::row_tiles, kernel_family::block_tiles}) {
        qkv::vulkan::context ctx;
        p.options.kernel = family;
        std::vector<double> ms;
        for (int i = 0; i < 12; ++i) {
            (void)ctx.attention(p.view());
            if (i >= 2) ms.push_back(ctx.last_call().projection_ms);
        }
        std::sort(ms.begin(), ms.end());
        WARN(name(family) << ": projection 4096 x 64 x 192, median " << ms[ms.size() / 2] << " ms (min " << ms.front()
                          << ")");
    }
}
