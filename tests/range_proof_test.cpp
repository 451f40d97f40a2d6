// The host's proof that a call's projected Q, K, V stay in range (range_proven_on_host in
// src/kernels/range_guard.cpp): where it says "proven", the device range guard is not run, so the
// proof must never say so for inputs that break a limit. Checked here against the exact values,
// computed in float64 from the inputs, for random problems over forty orders of magnitude; and it
// must hold for the ordinary inputs it exists for, or it saves nothing. No Vulkan device needed.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/range_guard.hpp"
#include "plan/attention_plan.hpp"
#include "support/catch.hpp"
#include "support/problems.hpp"

using qkv::vulkan::detail::input_facts;
using qkv::vulkan::detail::plan;
using qkv::vulkan::detail::range_proven_on_host;
using qkv::vulkan::detail::scan_inputs;

namespace {

constexpr double two_to_127 = 0x1p127;

plan plan_of(const qkv_test::owned_problem& p, bool fp16) {
    plan pl;
    const qkv::attention_shape& s = p.shape;
    pl.fp16 = fp16;
    pl.batch = static_cast<std::uint32_t>(s.batch), pl.seq = static_cast<std::uint32_t>(s.seq);
    pl.d_in = static_cast<std::uint32_t>(s.d_in), pl.d_k = static_cast<std::uint32_t>(s.d_k);
    pl.d_v = static_cast<std::uint32_t>(s.d_v), pl.heads = static_cast<std::uint32_t>(s.heads);
    pl.ld = 2 * pl.d_k + pl.d_v;
    pl.scale = p.options.scale ? *p.options.scale : qkv::default_scale(s);
    pl.project.chunk_k = pl.d_in;
    return pl;
}

/// The exact quantities the range rule limits (README, Guarantees), from the inputs in float64.
struct exact_range {
    double element = 0;      // the largest |Q|, |K| or |V| element
    double worst_score = 0;  // per head max(1, |scale|) · max ||q_i|| · max ||k_j||, the largest over heads
    double scaled_rows = 0;  // max(1, |scale|) · the largest ||q_i|| or ||k_j|| of a head
    double value_sum = 0;    // seq · the largest |V|
};

exact_range exact_of(const qkv_test::owned_problem& p, double scale) {
    const qkv::attention_shape& s = p.shape;
    const double sc = std::max(1.0, std::fabs(scale));
    exact_range r;
    // One of Q, K, V for row `row`: width columns, head slices of width / heads.
    const auto project = [&](const std::vector<float>& w, const std::vector<float>& b, std::size_t width,
                             std::size_t row) {
        std::vector<double> out(width);
        for (std::size_t c = 0; c < width; ++c) {
            double sum = b.empty() ? 0.0 : b[c];
            for (std::size_t k = 0; k < s.d_in; ++k)
                sum += static_cast<double>(p.x[row * s.d_in + k]) * static_cast<double>(w[k * width + c]);
            out[c] = sum;
            r.element = std::max(r.element, std::fabs(sum));
        }
        return out;
    };
    for (std::size_t b = 0; b < s.batch; ++b) {
        std::vector<double> qmax(s.heads, 0.0), kmax(s.heads, 0.0);
        for (std::size_t i = 0; i < s.seq; ++i) {
            const std::size_t row = b * s.seq + i;
            const auto q = project(p.wq, p.bq, s.d_k, row), k = project(p.wk, p.bk, s.d_k, row);
            const auto v = project(p.wv, p.bv, s.d_v, row);
            const std::size_t dh = s.d_k / s.heads;
            for (std::size_t h = 0; h < s.heads; ++h) {
                double qq = 0, kk = 0;
                for (std::size_t c = h * dh; c < (h + 1) * dh; ++c) qq += q[c] * q[c], kk += k[c] * k[c];
                qmax[h] = std::max(qmax[h], std::sqrt(qq));
                kmax[h] = std::max(kmax[h], std::sqrt(kk));
            }
            for (double e : v) r.value_sum = std::max(r.value_sum, static_cast<double>(s.seq) * std::fabs(e));
        }
        for (std::size_t h = 0; h < s.heads; ++h) {
            r.worst_score = std::max(r.worst_score, sc * qmax[h] * kmax[h]);
            r.scaled_rows = std::max(r.scaled_rows, sc * std::max(qmax[h], kmax[h]));
        }
    }
    return r;
}

void scale_all(std::vector<float>& v, double by) {
    for (float& e : v) e = static_cast<float>(e * by);
}

}  // namespace

TEST_CASE("the host's range proof holds for ordinary inputs, and only where the exact values are in range",
          "[range_proof]") {
    std::mt19937_64 rng(20261124);
    std::uniform_real_distribution<double> decades(-3.0, 40.0), weight_decades(-3.0, 20.0);
    std::uniform_int_distribution<std::size_t> pick(0, 3);
    const std::size_t seqs[] = {1, 3, 17, 113};
    const std::size_t widths[] = {1, 4, 12, 17};
    std::size_t proven = 0, refused = 0;
    for (std::uint64_t trial = 0; trial < 400; ++trial) {
        qkv_test::problem_spec spec;
        spec.batch = 1 + trial % 2;
        spec.seq = seqs[pick(rng)];
        spec.d_in = widths[pick(rng)];
        spec.heads = trial % 3 == 0 ? 2 : 1;
        spec.d_k = 4 * spec.heads, spec.d_v = (trial % 5 == 0 ? 8 : 4) * spec.heads;
        spec.biases = trial % 4 == 1;
        auto p = qkv_test::make_problem(spec, 7000 + trial);
        // Magnitudes from 1e-3 to 1e40 for the scores' sake: x, the weights, sometimes a bias alone.
        scale_all(p.x, std::pow(10.0, decades(rng) / 2));
        scale_all(p.wq, std::pow(10.0, weight_decades(rng) / 2));
        scale_all(p.wk, std::pow(10.0, weight_decades(rng) / 2));
        scale_all(p.wv, std::pow(10.0, weight_decades(rng) / 2));
        if (spec.biases && trial % 8 == 1) scale_all(p.bv, 1e30);
        if (trial % 7 == 3) p.options.scale = static_cast<float>(std::pow(10.0, decades(rng) / 4));
        const bool fp16 = trial % 3 == 2;
        const plan pl = plan_of(p, fp16);
        const input_facts facts = scan_inputs(p.view());
        if (!facts.projection_inputs_finite) continue;  // float32 overflowed in the scaling: not this test's case
        INFO("trial " << trial << ": " << qkv_test::describe(spec) << (fp16 ? " fp16" : " fp32"));
        const exact_range e = exact_of(p, pl.scale);
        INFO("exact: element " << e.element << ", score " << e.worst_score << ", scaled rows " << e.scaled_rows
                               << ", value sums " << e.value_sum);
        if (range_proven_on_host(pl, p.view(), facts)) {
            ++proven;
            CHECK(e.element <= (fp16 ? 65504.0 : two_to_127));
            CHECK(e.worst_score <= two_to_127);
            CHECK(e.scaled_rows <= two_to_127);
            CHECK(e.value_sum <= two_to_127);
        } else {
            ++refused;
        }
    }
    // Both verdicts occur, so neither half of the test is empty.
    CHECK(proven >= 50);
    CHECK(refused >= 50);
}

TEST_CASE("the host's range proof: what it proves and what it leaves to the device", "[range_proof]") {
    // Ordinary inputs (N(0,1) data, N(0, 1/d_in) weights), at the benchmark's shape and odd ones.
    for (const auto& spec :
         {qkv_test::problem_spec{.seq = 4096, .d_in = 64, .d_k = 64, .d_v = 64},
          qkv_test::problem_spec{.batch = 2, .seq = 113, .d_in = 17, .d_k = 6, .d_v = 9, .heads = 3, .biases = true}}) {
        INFO(qkv_test::describe(spec));
        const auto p = qkv_test::make_problem(spec, 1);
        const input_facts facts = scan_inputs(p.view());
        CHECK(range_proven_on_host(plan_of(p, false), p.view(), facts));
        CHECK(range_proven_on_host(plan_of(p, true), p.view(), facts));
        // The largest row norm of x is the one the proof used.
        double largest = 0;
        for (std::size_t r = 0; r < spec.batch * spec.seq; ++r) {
            double sq = 0;
            for (std::size_t k = 0; k < spec.d_in; ++k) sq += double(p.x[r * spec.d_in + k]) * p.x[r * spec.d_in + k];
            largest = std::max(largest, std::sqrt(sq));
        }
        CHECK(facts.x_row_norm == Approx(largest).epsilon(1e-12));
    }
    auto p = qkv_test::make_problem({.seq = 17, .d_in = 4, .d_k = 4, .d_v = 4}, 2);
    // Not finite: the documented NaN rules are the device's to apply.
    auto nan = p;
    nan.x[5] = std::numeric_limits<float>::quiet_NaN();
    CHECK_FALSE(range_proven_on_host(plan_of(nan, false), nan.view(), scan_inputs(nan.view())));
    auto inf = p;
    inf.wk[3] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(range_proven_on_host(plan_of(inf, false), inf.view(), scan_inputs(inf.view())));
    // float16: values of about 1e3 are proven, one of 1e5 is not (beyond 65,504).
    auto half = p;
    scale_all(half.x, 300.0);
    CHECK(range_proven_on_host(plan_of(half, true), half.view(), scan_inputs(half.view())));
    half.x[0] = 1e5f;
    CHECK_FALSE(range_proven_on_host(plan_of(half, true), half.view(), scan_inputs(half.view())));
    CHECK(range_proven_on_host(plan_of(half, false), half.view(), scan_inputs(half.view())));
    // ... nor a float16 projection split over several dispatches (each rounds its partial sums).
    plan split = plan_of(p, true);
    split.project.chunk_k = 2;
    CHECK_FALSE(range_proven_on_host(split, p.view(), scan_inputs(p.view())));
    // Scores near the limit: the proof's bound is above the exact value, so it gives way first.
    auto big = p;
    scale_all(big.x, 1e20);  // scores of about 1e40
    CHECK_FALSE(range_proven_on_host(plan_of(big, false), big.view(), scan_inputs(big.view())));
    // An additive mask entry that takes ordinary scores beyond float32.
    auto masked = p;
    masked.additive.assign(17 * 17, 0.0f);
    masked.additive[3] = -FLT_MAX;
    CHECK(range_proven_on_host(plan_of(masked, false), masked.view(), scan_inputs(masked.view())));
    scale_all(masked.x, 1e17);
    CHECK_FALSE(range_proven_on_host(plan_of(masked, false), masked.view(), scan_inputs(masked.view())));
}

TEST_CASE("the host's range proof refuses every input whose exact values are just past a limit", "[range_proof]") {
    // Without biases Q, K, V scale with x: x times s scales every element, row norm and value sum
    // by s and every score by s². Each problem is scaled until one exact quantity is 1.01 or 1.5
    // times its limit, which the proof must then refuse, whatever the others are.
    const qkv_test::problem_spec specs[] = {
        {.seq = 1, .d_in = 1, .d_k = 1, .d_v = 1},
        {.seq = 3, .d_in = 4, .d_k = 4, .d_v = 4},
        {.batch = 2, .seq = 17, .d_in = 17, .d_k = 6, .d_v = 3, .heads = 3},
        {.seq = 113, .d_in = 12, .d_k = 8, .d_v = 16, .heads = 2},
    };
    std::uint64_t seed = 9000;
    for (const auto& spec : specs) {
        for (const bool fp16 : {false, true}) {
            for (const double past : {1.01, 1.5}) {
                const auto base = qkv_test::make_problem(spec, seed++);
                const exact_range e = exact_of(base, plan_of(base, fp16).scale);
                // (how x must scale, which quantity) for each limit
                const struct {
                    double s;
                    const char* what;
                } targets[] = {
                    {past * (fp16 ? 65504.0 : two_to_127) / e.element, "element"},
                    {std::sqrt(past * two_to_127 / e.worst_score), "score"},
                    {past * two_to_127 / e.scaled_rows, "scaled rows"},
                    {past * two_to_127 / e.value_sum, "value sums"},
                };
                for (const auto& t : targets) {
                    INFO(qkv_test::describe(spec)
                         << (fp16 ? " fp16" : " fp32") << ": " << t.what << " at " << past << " x its limit");
                    auto p = base;
                    scale_all(p.x, t.s);
                    const input_facts facts = scan_inputs(p.view());
                    if (!facts.projection_inputs_finite) continue;  // x itself left float32
                    const plan pl = plan_of(p, fp16);
                    const exact_range scaled = exact_of(p, pl.scale);
                    const bool beyond = scaled.element > (fp16 ? 65504.0 : two_to_127) ||
                                        scaled.worst_score > two_to_127 || scaled.scaled_rows > two_to_127 ||
                                        scaled.value_sum > two_to_127;
                    REQUIRE(beyond);
                    CHECK_FALSE(range_proven_on_host(pl, p.view(), facts));
                }
            }
        }
    }
}
