// Ragged (varlen) batches on the Vulkan backend (context::sdpa over a varlen_problem), validation
// layer and synchronisation validation on: odd lengths (0, 1, 3, 17, 113) mixed in one batch, every
// score rule per sequence, every fused family (the cooperative-matrix one where the device has it:
// [families], support/families.hpp) and the decode route, fp16 and quantized K/V, against the
// float64 CPU reference (itself checked against the packed reference in varlen_test.cpp) by
// normalised MSE, computed from the same rounded values, so every path must reach float32's nmse
// (1e-9; the cooperative-matrix family, whose P·V takes P in float16, the fp16 bound). And the
// refusals: the capability table's, with its reason, and a malformed batch, before any device
// work. (Each family on the cases with every rule; the plain cases on the route the plan picks.)
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/element_type.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/backend_checks.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/varlen_problems.hpp"

namespace {

using qkv::element_type;

const std::vector<std::size_t> mixed_q{1, 3, 17, 0, 113, 2, 9, 1};
const std::vector<std::size_t> mixed_k{1, 17, 5, 4, 113, 0, 3, 150};

/// A case's score rules: its options, and sinks or ALiBi slopes (for 4 query heads) where it says.
struct rules {
    const char* name;
    qkv::sdpa_options options;
    bool sinks;
    bool slopes = false;
};

/// Gives `o` the rules of `c`.
void apply(const rules& c, qkv_test::owned_varlen& o) {
    o.problem.options = c.options;
    if (c.sinks) {
        o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f};
        o.problem.sinks = o.sinks;
    }
    if (c.slopes) {
        o.slopes = {0.5f, 0.0f, 0.125f, 1.0f};
        o.problem.alibi_slopes = o.slopes;
    }
}

}  // namespace

TEST_CASE("varlen vulkan: a mixed batch equals the float64 reference, every rule, on the routes the plan picks",
          "[varlen]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    const qkv::sdpa_options all{.causal = true,
                                .alignment = qkv::causal_alignment::bottom_right,
                                .window_left = 6,
                                .softcap = 4.0f,
                                .alibi_max_bias = 8.0f,
                                .return_lse = true};
    const rules cases[] = {
        {"plain", {}, false},
        {"causal bottom-right, lse",
         {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
         false},
        {"window, softcap, ALiBi, sinks, lse", all, true},
        {"ALiBi slopes given", {.causal = true, .alignment = qkv::causal_alignment::bottom_right}, false, true},
    };
    for (const rules& c : cases) {
        INFO(c.name);
        qkv_test::owned_varlen o = qkv_test::random_varlen(mixed_q, mixed_k, 4, 2, 16, 24, 77);
        apply(c, o);
        const qkv::varlen_output got = ctx.sdpa(o.problem);
        qkv_test::check_packed(got, qkv_test::device_reference(o.problem));
        CHECK(got.device == ctx.device().name);
        qkv_test::require_clean(ctx);
    }
}

// Each fused family of this run (support/families.hpp: row_tiles, block_tiles, and coopmat where the
// device has it, at the precision it runs: fp16) on a batch with both routes per family: a
// decode-shaped sequence (3 queries against 1,030 keys: the family's split-K decode) beside fused
// ones of odd lengths, every rule at once, and with the slopes given.
TEST_CASE("varlen vulkan: each fused family on a mixed batch with every rule, decode-shaped sequences too",
          "[varlen][families]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    const rules cases[] = {
        {"window, softcap, ALiBi, sinks, lse",
         {.causal = true,
          .alignment = qkv::causal_alignment::bottom_right,
          .window_left = 6,
          .softcap = 4.0f,
          .alibi_max_bias = 8.0f,
          .return_lse = true},
         true},
        {"ALiBi slopes given, top-left causal, lse", {.causal = true, .return_lse = true}, false, true},
    };
    for (const qkv::kernel_family family : qkv_test::fused_families())
        for (const rules& c : cases) {
            INFO(c.name << ", " << qkv_test::family_name(family));
            qkv_test::owned_varlen o =
                qkv_test::random_varlen({1, 3, 17, 0, 113, 2, 9}, {1, 1030, 5, 4, 113, 0, 3}, 4, 2, 16, 24, 78);
            apply(c, o);
            o.problem.options.kernel = family;
            o.problem.options.precision = qkv_test::case_precision(family, qkv::precision::fp32);
            const qkv::varlen_output got = ctx.sdpa(o.problem);
            qkv_test::check_packed(got, qkv_test::device_reference(o.problem), qkv_test::case_tolerance(family, 1e-9));
            CHECK(got.device == ctx.device().name);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("varlen vulkan: fp16 and quantized K/V", "[varlen]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const auto& [precision, kv_type] :
         {std::pair{qkv::precision::fp16, std::optional<element_type>{}},
          std::pair{qkv::precision::fp32, std::optional<element_type>{element_type::q8_0}},
          std::pair{qkv::precision::fp32, std::optional<element_type>{element_type::q4_0}}}) {
        INFO((kv_type ? std::string(qkv::to_string(*kv_type)) : std::string("fp16")));
        qkv_test::owned_varlen o = qkv_test::random_varlen({1, 17, 3}, {40, 17, 113}, 4, 1, 32, 32, 8);
        o.problem.options = {.causal = true,
                             .alignment = qkv::causal_alignment::bottom_right,
                             .precision = precision,
                             .return_lse = true,
                             .kv_type = kv_type};
        qkv_test::check_packed(ctx.sdpa(o.problem), qkv_test::device_reference(o.problem));
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("varlen vulkan: one command buffer gives each sequence's context::sdpa bits, staged or mapped", "[varlen]") {
    for (const bool staged : {false, true}) {
        INFO((staged ? "staged" : "mapped"));
        qkv::vulkan::context ctx = qkv_test::make_context({.force_staging = staged});
        // Both routes in one batch: a decode-shaped sequence (1 query, 150 keys) beside fused ones.
        qkv_test::owned_varlen o = qkv_test::random_varlen({1, 17, 3, 113}, {150, 17, 40, 113}, 4, 2, 16, 16, 21);
        o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
        const qkv::varlen_output got = ctx.sdpa(o.problem);
        qkv_test::check_packed(got, qkv_test::device_reference(o.problem));
        const std::size_t total_q = static_cast<std::size_t>(o.cu_q.back());
        for (std::size_t b = 0; b < 4; ++b) {
            const qkv::basic_varlen_sequence<float> s = qkv::sequence_of(o.problem, b);
            const qkv::sdpa_output one = ctx.sdpa(s.problem);
            const std::size_t L = s.problem.shape.q_len, q0 = static_cast<std::size_t>(o.cu_q[b]);
            std::size_t differ = 0;
            for (std::size_t h = 0; h < 4; ++h)
                for (std::size_t i = 0; i < L; ++i) {
                    for (std::size_t e = 0; e < 16; ++e)
                        differ += got.output[((q0 + i) * 4 + h) * 16 + e] != one.output[(h * L + i) * 16 + e];
                    differ += got.lse[h * total_q + q0 + i] != one.lse[h * L + i];
                }
            CHECK(differ == 0);
        }
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("varlen vulkan: more sequences than one command buffer takes", "[varlen]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    // 70 short sequences: two command buffers (64 sequences each at most), the rows in order.
    std::vector<std::size_t> lq, lk;
    for (std::size_t b = 0; b < 70; ++b) lq.push_back(1 + b % 3), lk.push_back(2 + b % 5);
    qkv_test::owned_varlen o = qkv_test::random_varlen(lq, lk, 2, 1, 8, 8, 70);
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    qkv_test::check_packed(ctx.sdpa(o.problem), qkv_test::device_reference(o.problem));
    qkv_test::require_clean(ctx);
}

TEST_CASE("varlen vulkan: refusals come first, typed, with the table's reason", "[varlen]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_varlen o = qkv_test::random_varlen({3, 2}, {4, 1}, 2, 1, 8, 8, 1);
    qkv::varlen_problem p = o.problem;
    p.options.return_weights = true;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); },
                             {"context::sdpa over a ragged batch", "return_weights", "ragged batch has no"});
    const std::vector<std::int32_t> falling{0, 4, 3};
    p = o.problem, p.cu_seqlens_k = falling;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); }, {"cu_seqlens_k", "nondecreasing"});
    p = o.problem, p.max_seqlen_q = 1;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); }, {"max_seqlen_q"});
    qkv_test::require_clean(ctx);
}
