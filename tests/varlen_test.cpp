// Ragged (varlen) batches on the float64 CPU reference (qkv/runtime/varlen.hpp): the packed
// result against a reference written from FlashAttention's varlen documentation over the packed
// layout (support/varlen_problems.hpp), odd lengths (0, 1, 3, 17, 113) mixed in one batch, every
// score rule per sequence; and the refusals, typed and naming what is wrong.
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/varlen.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "support/backend_checks.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/reference.hpp"
#include "support/varlen_problems.hpp"

namespace {

using qkv_test::expect_invalid;

// Query lengths 1, 3, 17, 113, a sequence without queries, one without keys, one with more
// queries than keys (bottom-right: its first rows see nothing).
const std::vector<std::size_t> mixed_q{1, 3, 17, 0, 113, 2, 9};
const std::vector<std::size_t> mixed_k{1, 17, 5, 4, 113, 0, 3};

}  // namespace

TEST_CASE("varlen: the CPU reference equals the packed reference, every rule per sequence", "[varlen]") {
    struct rules {
        const char* name;
        qkv::sdpa_options options;
        bool sinks;
        bool slopes = false;
    };
    const rules cases[] = {
        {"ALiBi slopes given, causal bottom-right, lse",
         {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
         false,
         true},
        {"plain", {}, false},
        {"causal top-left", {.causal = true}, false},
        {"causal bottom-right, lse",
         {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
         false},
        {"window, softcap, ALiBi, sinks, lse",
         {.causal = true,
          .alignment = qkv::causal_alignment::bottom_right,
          .window_left = 6,
          .window_right = 0,
          .softcap = 4.0f,
          .alibi_max_bias = 8.0f,
          .return_lse = true},
         true},
        {"two-sided window, scale", {.scale = 0.3f, .window_left = 2, .window_right = 3, .return_lse = true}, false},
    };
    for (const rules& c : cases) {
        INFO(c.name);
        qkv_test::owned_varlen o = qkv_test::random_varlen(mixed_q, mixed_k, 6, 2, 16, 24, 31);
        o.problem.options = c.options;
        if (c.sinks) {
            o.sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity(), 0.0f, 1.5f};
            o.problem.sinks = o.sinks;
        }
        if (c.slopes) {
            o.slopes = {0.5f, 0.0f, 0.125f, 1.0f, 0.25f, 0.0625f};
            o.problem.alibi_slopes = o.slopes;
        }
        qkv_test::check_cpu_backend(o.problem, qkv_test::varlen_reference(o));
    }
}

TEST_CASE("varlen: a batch of one sequence is that sequence's sdpa problem", "[varlen]") {
    qkv_test::owned_varlen o = qkv_test::random_varlen({17}, {33}, 4, 4, 8, 8, 5);
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    const qkv::varlen_output_f64 ragged = qkv::cpu::sdpa_f64(o.problem);
    const qkv::basic_varlen_sequence<float> s = qkv::sequence_of(o.problem, 0);
    const qkv::sdpa_output_f64 one = qkv::cpu::sdpa_f64(s.problem);
    // (1, H, L, Ev) against (L, H, Ev); lse (1, H, L) against (H, L).
    for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t i = 0; i < 17; ++i) {
            for (std::size_t e = 0; e < 8; ++e)
                CHECK(ragged.output[(i * 4 + h) * 8 + e] == one.output[(h * 17 + i) * 8 + e]);
            CHECK(ragged.lse[h * 17 + i] == one.lse[h * 17 + i]);
        }
}

TEST_CASE("varlen: a float64 problem and no queries at all", "[varlen]") {
    // float64 data, used as is; a batch whose sequences have no queries gives an empty output.
    qkv_test::owned_varlen o = qkv_test::random_varlen({3, 1}, {5, 2}, 2, 1, 4, 4, 9);
    std::vector<double> q(o.q.begin(), o.q.end()), k(o.k.begin(), o.k.end()), v(o.v.begin(), o.v.end());
    const qkv::varlen_problem_f64 p{.q_heads = 2,
                                    .kv_heads = 1,
                                    .d_qk = 4,
                                    .d_v = 4,
                                    .cu_seqlens_q = o.cu_q,
                                    .cu_seqlens_k = o.cu_k,
                                    .max_seqlen_q = 3,
                                    .max_seqlen_k = 5,
                                    .q = q,
                                    .k = k,
                                    .v = v};
    CHECK(qkv::cpu::sdpa(p).output == qkv::cpu::sdpa_f64(o.problem).output);
    const std::vector<std::int32_t> none{0, 0, 0}, keys{0, 2, 4};
    std::vector<float> kv(4 * 4, 1.0f);
    const qkv::varlen_problem empty{.q_heads = 1,
                                    .kv_heads = 1,
                                    .d_qk = 4,
                                    .d_v = 4,
                                    .cu_seqlens_q = none,
                                    .cu_seqlens_k = keys,
                                    .max_seqlen_q = 0,
                                    .max_seqlen_k = 2,
                                    .k = kv,
                                    .v = kv};
    CHECK(qkv::cpu::sdpa(empty).output.empty());
}

TEST_CASE("varlen: malformed batches are refused, naming what is wrong", "[varlen]") {
    qkv_test::owned_varlen o = qkv_test::random_varlen({3, 2}, {4, 1}, 2, 1, 8, 8, 1);
    const auto refused = [&](qkv::varlen_problem p, std::initializer_list<std::string> words) {
        expect_invalid([&] { (void)qkv::cpu::sdpa(p); }, words);
        expect_invalid([&] { qkv::validate(p); }, words);
    };
    qkv::varlen_problem p = o.problem;
    const std::vector<std::int32_t> from_one{1, 3, 5}, falling{0, 3, 2}, short_list{0}, three{0, 3, 4, 5},
        negative{0, -1, 5};
    p.cu_seqlens_q = from_one;
    refused(p, {"cu_seqlens_q[0]", "start at 0"});
    p = o.problem, p.cu_seqlens_k = falling;
    refused(p, {"cu_seqlens_k", "nondecreasing"});
    p = o.problem, p.cu_seqlens_q = negative;
    refused(p, {"cu_seqlens_q", "nondecreasing"});
    p = o.problem, p.cu_seqlens_q = short_list, p.cu_seqlens_k = short_list;
    refused(p, {"cu_seqlens_q", "B + 1"});
    p = o.problem, p.cu_seqlens_k = three;
    refused(p, {"cu_seqlens_k", "cu_seqlens_q"});
    p = o.problem, p.max_seqlen_q = 2;
    refused(p, {"max_seqlen_q", "3"});
    p = o.problem, p.max_seqlen_k = 3;
    refused(p, {"max_seqlen_k", "4"});
    p = o.problem, p.q = std::span<const float>(o.q).first(o.q.size() - 1);
    refused(p, {"q has", "total_q"});
    p = o.problem, p.v = std::span<const float>(o.v).first(8);
    refused(p, {"v has", "total_k"});
    p = o.problem, p.kv_heads = 3;
    refused(p, {"kv_heads"});
    p = o.problem, p.d_v = 0;
    refused(p, {"d_v"});
    p = o.problem, p.options.window_left = -2;
    refused(p, {"window_left"});
    p = o.problem, p.options.kv_type = qkv::element_type::q8_0;  // d 8: not blocks of 32
    refused(p, {"kv_type", "32"});
    const std::vector<float> nan_sink{std::nanf(""), 0.0f};
    p = o.problem, p.sinks = nan_sink;
    refused(p, {"sinks[0]"});
    const std::vector<float> one_slope{0.5f};
    p = o.problem, p.alibi_slopes = one_slope;
    refused(p, {"alibi_slopes"});
    // The capability table's refusal, with its reason.
    p = o.problem, p.options.return_weights = true;
    expect_invalid([&] { (void)qkv::cpu::sdpa(p); }, {"cpu::sdpa over a ragged batch", "return_weights", "ragged"});
    // A sequence index past the batch.
    expect_invalid([&] { (void)qkv::sequence_shape(o.problem, 2); }, {"sequence 2"});
}
