// A seeded random sweep: shapes (odd sizes), masks, heads, batches, precisions, implementations
// and both backends against float64, each within its documented tolerance (Vulkan fp32 nmse
// <= 1e-10, fp16 <= 1e-5; the cpu backend against an independent float64 attention), plus inputs
// scaled into the overflow region, where the only acceptable outcomes are the right answer or
// qkv::vulkan::numeric_overflow. Every failure prints the seed and the case.
//
// QKV_SWEEP_SEED=<n> replays another sweep; QKV_SWEEP_CASES=<n> changes its length;
// QKV_SWEEP_FIRST=<n> starts it at case n of the same seeded stream (the cases before it are drawn
// and not run), so that several CTest entries share one sweep: qkv_sweep_tests runs its first
// cases in every leg that runs the sweep, qkv_sweep_rest the rest in the gcc leg
// (tests/CMakeLists.txt).
//
// [loop_limit]: widths just past 65,535 (llvmpipe ends every shader loop after 65,535
// iterations), which the matrix products reach by splitting K across dispatches; in the
// qkv_sweep_tests entry.
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/problems.hpp"
#include "support/reference.hpp"

using qkv_test::mask_kind;
using qkv_test::problem_spec;

namespace {

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct sweep_case {
    problem_spec spec;
    qkv::precision precision = qkv::precision::fp32;
    qkv::implementation implementation = qkv::implementation::staged;
    qkv::kernel_family kernel = qkv::kernel_family::automatic;  ///< the fused family asked for
    bool weights = false;
    double magnitude = 1.0;  // x is multiplied by this: 1, or into the overflow region
    std::uint64_t seed = 0;
};

std::string describe(const sweep_case& c) {
    std::ostringstream s;
    s << qkv_test::describe(c.spec) << (c.precision == qkv::precision::fp16 ? " fp16" : " fp32")
      << (c.implementation == qkv::implementation::fused ? " fused" : " staged")
      << (c.kernel != qkv::kernel_family::automatic ? " " + qkv_test::family_name(c.kernel) : std::string())
      << (c.weights ? " weights" : "") << " x*" << c.magnitude << " data-seed=" << c.seed;
    return s.str();
}

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> options) {
    std::uniform_int_distribution<std::size_t> d(0, options.size() - 1);
    return options.begin()[d(rng)];
}

/// A random case; with `family` (not automatic) it is a fused case on that family, at the
/// precision the family runs it (support/families.hpp).
sweep_case random_case(std::mt19937_64& rng, bool fp16_available,
                       qkv::kernel_family family = qkv::kernel_family::automatic) {
    sweep_case c;
    problem_spec& s = c.spec;
    s.batch = pick<std::size_t>(rng, {1, 1, 2, 3});
    s.seq = pick<std::size_t>(rng, {1, 2, 3, 5, 7, 17, 31, 33, 64, 113});
    s.d_in = pick<std::size_t>(rng, {1, 3, 5, 16, 17, 33});
    s.heads = pick<std::size_t>(rng, {1, 1, 2, 3, 4});
    s.d_k = s.heads * pick<std::size_t>(rng, {1, 2, 3, 8, 13, 32});
    s.d_v = s.heads * pick<std::size_t>(rng, {1, 3, 5, 8, 16});
    s.d_out = pick<std::size_t>(rng, {0, 0, 1, 7});
    s.biases = pick<int>(rng, {0, 1}) == 1;
    s.output_bias = pick<int>(rng, {0, 1}) == 1;
    s.causal = pick<int>(rng, {0, 0, 1}) == 1;
    s.mask = pick<mask_kind>(rng, {mask_kind::none, mask_kind::boolean, mask_kind::additive, mask_kind::both});
    s.batched_mask = s.mask != mask_kind::none && pick<int>(rng, {0, 1}) == 1;
    s.fully_masked_row = s.mask != mask_kind::none && pick<int>(rng, {0, 0, 0, 1}) == 1;
    c.precision = fp16_available && pick<int>(rng, {0, 0, 1}) == 1 ? qkv::precision::fp16 : qkv::precision::fp32;
    c.implementation = pick<qkv::implementation>(rng, {qkv::implementation::staged, qkv::implementation::fused});
    c.weights = c.implementation == qkv::implementation::staged && pick<int>(rng, {0, 0, 1}) == 1;
    if (family != qkv::kernel_family::automatic) {
        c.implementation = qkv::implementation::fused;
        c.kernel = family;
        c.precision = qkv_test::case_precision(family, c.precision);
        c.weights = false;  // attention's fused implementation never forms them (the staged one does)
    }
    // One case in five is scaled towards (or past) the overflow limits: fp32 scores of 1e24 to
    // 1e44, fp16 values of 1e3 to 1e6 (float16 holds at most 65,504).
    if (pick<int>(rng, {0, 0, 0, 0, 1}) == 1) {
        std::uniform_real_distribution<double> e(c.precision == qkv::precision::fp16 ? 3.0 : 12.0,
                                                 c.precision == qkv::precision::fp16 ? 6.0 : 22.0);
        c.magnitude = std::pow(10.0, e(rng));
    }
    c.seed = rng();
    return c;
}

qkv_test::owned_problem build(const sweep_case& c) {
    auto p = qkv_test::make_problem(c.spec, c.seed);
    for (auto& v : p.x) v = static_cast<float>(v * c.magnitude);
    p.options.precision = c.precision;
    p.options.implementation = c.implementation;
    p.options.kernel = c.kernel;
    p.options.return_weights = c.weights;
    return p;
}

/// The independent float64 attention of tests/support/reference.hpp, batch element by element.
std::vector<double> independent_reference(const qkv_test::owned_problem& p) {
    const qkv::attention_shape& s = p.shape;
    const auto wide = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    const std::size_t nn = s.seq * s.seq;
    std::vector<double> out;
    for (std::size_t b = 0; b < s.batch; ++b) {
        qkv_test::ref_problem r;
        r.n = s.seq, r.d_in = s.d_in, r.d_k = s.d_k, r.d_v = s.d_v, r.heads = s.heads, r.d_out = s.d_out;
        r.x.assign(p.x.begin() + static_cast<std::ptrdiff_t>(b * s.seq * s.d_in),
                   p.x.begin() + static_cast<std::ptrdiff_t>((b + 1) * s.seq * s.d_in));
        r.wq = wide(p.wq), r.wk = wide(p.wk), r.wv = wide(p.wv);
        r.bq = wide(p.bq), r.bk = wide(p.bk), r.bv = wide(p.bv), r.wo = wide(p.wo), r.bo = wide(p.bo);
        if (!p.mask.empty()) {
            const std::size_t at = p.mask.size() == nn ? 0 : b * nn;
            r.allowed.assign(p.mask.begin() + static_cast<std::ptrdiff_t>(at),
                             p.mask.begin() + static_cast<std::ptrdiff_t>(at + nn));
        }
        if (!p.additive.empty()) {
            const std::size_t at = p.additive.size() == nn ? 0 : b * nn;
            r.additive.assign(p.additive.begin() + static_cast<std::ptrdiff_t>(at),
                              p.additive.begin() + static_cast<std::ptrdiff_t>(at + nn));
        }
        r.causal = p.options.causal;
        const auto res = qkv_test::reference_attention(r);
        out.insert(out.end(), res.output.begin(), res.output.end());
    }
    return out;
}

/// One case on the cpu backend and on Vulkan. Returns an empty string when it passes, else what
/// went wrong.
std::string run_case(qkv::vulkan::context& ctx, const sweep_case& c, bool* refused = nullptr) {
    const auto p = build(c);
    const auto want = qkv::cpu::attention_f64(p.view());
    std::ostringstream why;
    // The cpu backend against the independent float64 attention (both float64: only the order of
    // the sums differs).
    if (c.magnitude == 1.0) {
        const double e = qkv_test::nmse(want.output, independent_reference(p));
        if (!(e <= 1e-20)) why << "cpu backend vs independent float64 reference: nmse " << e << "; ";
        const auto rounded = qkv::cpu::attention(p.view());
        const double er = qkv_test::nmse(rounded.output, want.output);
        if (!(er <= 1e-13)) why << "cpu backend float32 results: nmse " << er << "; ";
    }
    // The documented tolerances; float32 projections over very wide inputs (d_in in the tens of
    // thousands, only in [loop_limit]) round in proportion to d_in, so those get d_in / 8192 times it.
    const double tolerance =
        (c.precision == qkv::precision::fp16 ? 1e-5 : 1e-10) * std::max(1.0, static_cast<double>(c.spec.d_in) / 8192.0);
    try {
        const auto got = ctx.attention(p.view());
        if (c.kernel != qkv::kernel_family::automatic && got.kernel != c.kernel)
            why << "ran on the " << qkv::name_of(got.kernel) << " family, not the one asked for; ";
        if (c.magnitude == 1.0 || c.precision == qkv::precision::fp32) {
            const double e = qkv_test::nmse(got.output, want.output);
            if (!(e <= tolerance)) why << "Vulkan output nmse " << e << " > " << tolerance << "; ";
            if (c.weights) {
                const double ew = qkv_test::nmse(got.weights, want.weights);
                if (!(ew <= tolerance)) why << "Vulkan weights nmse " << ew << " > " << tolerance << "; ";
            }
        } else {
            // fp16 near its limit: rounding Q and K to 11 bits may legitimately pick another key
            // among near-ties of scores in the thousands; what must hold is that nothing is
            // silently lost: every value finite, and zero rows only where the reference has them.
            const std::size_t width = p.shape.out_width();
            for (std::size_t row = 0; row * width < got.output.size(); ++row) {
                bool got_zero = true, want_zero = true;
                for (std::size_t col = 0; col < width; ++col) {
                    const float g = got.output[row * width + col];
                    if (!std::isfinite(g)) why << "Vulkan output row " << row << " not finite; ";
                    got_zero = got_zero && g == 0.0f;
                    want_zero = want_zero && want.output[row * width + col] == 0.0;
                }
                if (got_zero && !want_zero) why << "Vulkan output row " << row << " is zeros, the reference's is not; ";
            }
        }
    } catch (const qkv::vulkan::numeric_overflow& e) {
        if (refused) *refused = true;
        if (c.magnitude == 1.0) why << "unexpected numeric_overflow: " << e.what() << "; ";
    }
    qkv_test::require_clean(ctx);
    return why.str();
}

}  // namespace

TEST_CASE("random sweep: shapes, masks, precisions, implementations and both backends against float64",
          "[sweep][vulkan][random_sweep]") {
    auto& ctx = qkv_test::gpu();
    const std::uint64_t seed = env_or("QKV_SWEEP_SEED", 20261123);
    const std::uint64_t first = env_or("QKV_SWEEP_FIRST", 0);
    const std::uint64_t cases = env_or("QKV_SWEEP_CASES", 200);
    REQUIRE(cases > 0);
    std::printf("sweep: seed %llu, cases %llu to %llu (QKV_SWEEP_SEED / QKV_SWEEP_FIRST / QKV_SWEEP_CASES to change)\n",
                static_cast<unsigned long long>(seed), static_cast<unsigned long long>(first),
                static_cast<unsigned long long>(first + cases - 1));
    std::mt19937_64 rng(seed);
    const bool fp16 = ctx.device().fp16_storage;
    std::size_t failures = 0, scaled = 0, refused = 0;
    for (std::uint64_t i = 0; i < first + cases; ++i) {
        const sweep_case c = random_case(rng, fp16);
        if (i < first) continue;  // drawn, so that case i is the same whatever the entry
        bool was_refused = false;
        const std::string why = run_case(ctx, c, &was_refused);
        scaled += c.magnitude != 1.0;
        refused += was_refused;
        if (!why.empty()) {
            ++failures;
            UNSCOPED_INFO("sweep seed " << seed << ", case " << i << ": " << describe(c) << ": " << why);
        }
    }
    std::printf("sweep: %zu failures; %zu cases scaled towards overflow, %zu of them refused with numeric_overflow\n",
                failures, scaled, refused);
    CHECK(failures == 0);
}

TEST_CASE("sweep: heads wider than the guard's 4,096-column chunks", "[sweep][vulkan]") {
    auto& ctx = qkv_test::gpu();
    // V heads of 5,000 and 65,537 columns (the aggregate loops over seq, so no loop limit is
    // involved; the fused kernels take heads up to 576); the range guard covers them in chunks.
    const bool fp16 = ctx.device().fp16_storage;
    for (std::size_t d_v : {5000u, 65537u})
        for (auto prec : {qkv::precision::fp32, qkv::precision::fp16}) {
            if (prec == qkv::precision::fp16 && !fp16) continue;
            sweep_case c;
            c.spec = {.batch = 2, .seq = 3, .d_in = 2, .d_k = 2, .d_v = d_v};
            c.precision = prec;
            c.seed = d_v;
            const std::string why = run_case(ctx, c);
            INFO(describe(c) << ": " << why);
            CHECK(why.empty());
        }
}

TEST_CASE("sweep: an input width just past 65,535", "[sweep][vulkan][loop_limit]") {
    auto& ctx = qkv_test::gpu();
    const bool fp16 = ctx.device().fp16_storage;
    for (std::size_t d_in : {65535u, 65537u, 140000u})
        for (auto impl : {qkv::implementation::staged, qkv::implementation::fused})
            for (auto prec : {qkv::precision::fp32, qkv::precision::fp16}) {
                if (prec == qkv::precision::fp16 && !fp16) continue;
                sweep_case c;
                c.spec = {.seq = 3, .d_in = d_in, .d_k = 2, .d_v = 1};
                c.implementation = impl;
                c.precision = prec;
                c.seed = d_in;
                const std::string why = run_case(ctx, c);
                INFO(describe(c) << ": " << why);
                CHECK(why.empty());
            }
}

// The same generator on each fused family of this run (support/families.hpp: row_tiles and
// block_tiles, and coopmat where the device has it; QKV_TEST_FAMILIES keeps some), every case fused
// on that family at the precision it runs (the cooperative-matrix family's is fp16). A sampled
// subset of the sweep above (its own seed, QKV_SWEEP_FAMILY_CASES cases, 40 unless set): the mesa26
// leg runs it with the cooperative-matrix family alone (tests/CMakeLists.txt), bench/gpu/check.sh
// with every family. Not in qkv_sweep_tests ([family_sweep], not [sweep]): on Mesa 22's lavapipe
// each case's pipelines cost LLVM about half a CPU second to build, and the sweep above already
// runs its fused cases on the family the plan picks there.
TEST_CASE("random sweep on each fused family: odd shapes, masks, projections, overflow against float64",
          "[vulkan][families][family_sweep]") {
    auto& ctx = qkv_test::gpu();
    const std::uint64_t seed = env_or("QKV_SWEEP_SEED", 20261127);
    const std::uint64_t cases = env_or("QKV_SWEEP_FAMILY_CASES", 40);
    const bool fp16 = ctx.device().fp16_storage;
    for (const qkv::kernel_family family : qkv_test::fused_families()) {
        std::printf("sweep on the %s: seed %llu, %llu cases (QKV_SWEEP_SEED / QKV_SWEEP_FAMILY_CASES to change)\n",
                    qkv_test::family_name(family).c_str(), static_cast<unsigned long long>(seed),
                    static_cast<unsigned long long>(cases));
        std::mt19937_64 rng(seed);
        std::size_t failures = 0;
        for (std::uint64_t i = 0; i < cases; ++i) {
            const sweep_case c = random_case(rng, fp16, family);
            const std::string why = run_case(ctx, c);
            if (!why.empty()) {
                ++failures;
                UNSCOPED_INFO("sweep seed " << seed << ", case " << i << ": " << describe(c) << ": " << why);
            }
        }
        std::printf("sweep on the %s: %zu failures\n", qkv_test::family_name(family).c_str(), failures);
        CHECK(failures == 0);
    }
}
