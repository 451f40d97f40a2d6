// scaled_dot_product_attention on the Vulkan backend (qkv::vulkan::context::sdpa), validation
// layer on, against a float64 reference (support/sdpa_reference.hpp) by normalised MSE, failing on
// NaN or Inf: every fused kernel family the device has, forced (support/families.hpp; and the gpu
// family with a discrete GPU's tiles), fp32 and fp16 storage (the cooperative-matrix family: fp16), L != S, E != Ev,
// grouped-query heads, bool and additive masks of every broadcast shape, both causal alignments (with empty rows),
// weights on request, and key chunks (forced short, and past lavapipe's 65,535-iteration loop limit).
#include <qkv/vulkan/runtime.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/problems.hpp"
#include "support/reference.hpp"
#include "support/sdpa_problems.hpp"
#include "support/sdpa_reference.hpp"

using qkv_test::require_clean;

namespace {

using masks = qkv_test::mask_kind;
using qkv_test::owned_sdpa;

struct sdpa_spec {
    std::size_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, d_qk = 16, d_v = 16;
    masks mask = masks::none;
    std::vector<std::size_t> mask_shape{};  ///< empty: (L, S)
    bool causal = false;
    qkv::causal_alignment alignment = qkv::causal_alignment::top_left;
    bool weights = false;
};

std::string describe(const sdpa_spec& s) {
    std::ostringstream o;
    o << "B=" << s.batch << " Hq=" << s.q_heads << " Hkv=" << s.kv_heads << " L=" << s.q_len << " S=" << s.kv_len
      << " E=" << s.d_qk << " Ev=" << s.d_v;
    if (s.mask != masks::none) {
        o << (s.mask == masks::boolean    ? " bool"
              : s.mask == masks::additive ? " additive"
                                          : " bool+additive")
          << " mask (";
        for (std::size_t d : s.mask_shape) o << d << ",";
        o << ")";
    }
    if (s.causal) o << " causal " << (s.alignment == qkv::causal_alignment::top_left ? "top-left" : "bottom-right");
    if (s.weights) o << " +weights";
    return o.str();
}

owned_sdpa make_sdpa(const sdpa_spec& s, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    owned_sdpa o =
        qkv_test::random_sdpa({.shape = qkv_test::shape_of(s), .mask = s.mask, .mask_shape = s.mask_shape}, rng);
    qkv::sdpa_problem& p = o.problem;
    p.options.causal = s.causal;
    p.options.alignment = s.alignment;
    p.options.return_weights = s.weights;
    return o;
}

/// Runs `p` with `family` and `precision` (the cooperative-matrix family's: fp16) and checks output
/// (and weights) against the float64 reference. Rows the reference leaves empty must be exactly zero.
void check_sdpa(qkv::vulkan::context& ctx, owned_sdpa& o, qkv::kernel_family family, qkv::precision precision) {
    qkv::sdpa_problem& p = o.problem;
    precision = qkv_test::case_precision(family, precision);
    p.options.kernel = family;
    p.options.precision = precision;
    const double tolerance = precision == qkv::precision::fp32 ? 1e-9 : 2e-5;
    const qkv_test::sdpa_ref_result want = qkv_test::sdpa_reference(p);
    const qkv::sdpa_output got = ctx.sdpa(p);
    CHECK(got.kernel == family);
    CHECK(got.shape == p.shape);
    REQUIRE(got.output.size() == want.output.size());
    const double e = qkv_test::nmse(got.output, want.output);
    INFO("output nmse " << e);
    CHECK(e <= tolerance);
    const std::size_t rows = want.output.size() / p.shape.d_v;
    std::size_t wrong_zero_rows = 0;
    for (std::size_t r = 0; r < rows; ++r) {
        bool empty = true;
        for (std::size_t c = 0; c < p.shape.d_v; ++c) empty = empty && want.output[r * p.shape.d_v + c] == 0.0;
        if (!empty) continue;
        for (std::size_t c = 0; c < p.shape.d_v; ++c) wrong_zero_rows += got.output[r * p.shape.d_v + c] != 0.0f;
    }
    CHECK(wrong_zero_rows == 0);
    if (p.options.return_weights) {
        REQUIRE(got.weights.size() == want.weights.size());
        const double ew = qkv_test::nmse(got.weights, want.weights);
        INFO("weights nmse " << ew);
        CHECK(ew <= tolerance);
        std::size_t nonzero_masked = 0;
        for (std::size_t i = 0; i < want.weights.size(); ++i)
            nonzero_masked += want.weights[i] == 0.0 && got.weights[i] != 0.0f;
        CHECK(nonzero_masked == 0);  // masked keys and empty rows: exactly 0
    } else {
        CHECK(got.weights.empty());
    }
}

// The shapes of the suite: odd L, S and E, Ev != E, grouped-query heads, every mask broadcast.
// Each is a few MFLOP.
std::vector<sdpa_spec> suite() {
    using qkv::causal_alignment;
    return {
        {.q_len = 1, .kv_len = 1, .d_qk = 16, .d_v = 16},
        {.batch = 2,
         .q_heads = 8,
         .kv_heads = 2,
         .q_len = 3,
         .kv_len = 300,
         .d_qk = 64,
         .d_v = 64,
         .mask = masks::boolean},
        {.q_heads = 3,
         .kv_heads = 1,
         .q_len = 37,
         .kv_len = 300,
         .d_qk = 80,
         .d_v = 48,
         .mask = masks::additive,
         .mask_shape = {1, 3, 1, 300},
         .weights = true},
        {.batch = 2,
         .q_heads = 8,
         .kv_heads = 2,
         .q_len = 3,
         .kv_len = 300,
         .d_qk = 16,
         .d_v = 24,
         .mask = masks::both,
         .mask_shape = {2, 1, 3, 300},
         .causal = true,
         .alignment = causal_alignment::bottom_right},
        {.q_len = 1,
         .kv_len = 5000,
         .d_qk = 64,
         .d_v = 64,
         .mask = masks::additive,
         .mask_shape = {5000},
         .weights = true},
        {.q_heads = 2,
         .kv_heads = 2,
         .q_len = 37,
         .kv_len = 5000,
         .d_qk = 16,
         .d_v = 8,
         .causal = true,
         .alignment = causal_alignment::bottom_right},
        {.batch = 2, .q_len = 37, .kv_len = 1, .d_qk = 80, .d_v = 80, .causal = true},  // top-left: every row sees key
                                                                                        // 0
        // L > S, bottom-right: the first L - S rows see nothing (zeros, zero weights)
        {.q_heads = 3,
         .kv_heads = 1,
         .q_len = 37,
         .kv_len = 3,
         .d_qk = 16,
         .d_v = 16,
         .mask = masks::boolean,
         .causal = true,
         .alignment = causal_alignment::bottom_right,
         .weights = true},
        // L < S, top-left: row i sees keys 0..i only
        {.q_heads = 8,
         .kv_heads = 2,
         .q_len = 37,
         .kv_len = 300,
         .d_qk = 64,
         .d_v = 64,
         .mask = masks::additive,
         .causal = true,
         .weights = true},
    };
}

std::string name_of(qkv::kernel_family f) { return qkv_test::family_name(f); }

}  // namespace

TEST_CASE("sdpa matches the float64 reference with every kernel family", "[sdpa][vulkan][families]") {
    auto& ctx = qkv_test::gpu();
    std::uint64_t seed = 1200;
    for (const sdpa_spec& s : suite())
        for (qkv::kernel_family family : qkv_test::fused_families()) {
            owned_sdpa o = make_sdpa(s, seed++);
            INFO(describe(s) << ", " << name_of(family) << ", fp32");
            check_sdpa(ctx, o, family, qkv::precision::fp32);
        }
    require_clean(ctx);
}

TEST_CASE("sdpa with fp16 storage matches the float64 reference", "[sdpa][vulkan][fp16][families]") {
    auto& ctx = qkv_test::gpu();
    if (!ctx.device().fp16_storage) {
        WARN("no 16-bit storage buffers on " << ctx.device().name << ": fp16 not tested");
        return;
    }
    std::uint64_t seed = 1300;
    const auto specs = suite();
    for (std::size_t i = 1; i < specs.size(); i += 2)
        for (qkv::kernel_family family : qkv_test::fused_families()) {
            owned_sdpa o = make_sdpa(specs[i], seed++);
            INFO(describe(specs[i]) << ", " << name_of(family) << ", fp16");
            check_sdpa(ctx, o, family, qkv::precision::fp16);
        }
    require_clean(ctx);
}

TEST_CASE("sdpa key chunks: forced short, with staged I/O, stay exact", "[sdpa][vulkan][chunks][families]") {
    const auto families = qkv_test::fused_families();
    auto ctx = qkv_test::make_context({.max_fused_keys_per_dispatch = 37, .force_staging = true});
    std::uint64_t seed = 1400;
    const auto specs = suite();
    for (std::size_t i : {1u, 3u, 7u, 8u})
        for (qkv::kernel_family family : families) {
            owned_sdpa o = make_sdpa(specs[i], seed++);
            o.problem.options.return_weights = true;
            INFO(describe(specs[i]) << ", " << name_of(family) << ", chunks of 37 keys, staged I/O");
            check_sdpa(ctx, o, family, qkv::precision::fp32);
        }
    require_clean(ctx);
}

TEST_CASE("sdpa with a discrete GPU's tiles (subgroup 32) matches the reference", "[sdpa][vulkan][gpu_tiles]") {
    qkv::vulkan::device_info as = qkv_test::gpu().device();
    as.type = qkv::vulkan::device_type::discrete_gpu;
    as.subgroup_size = 32;
    as.max_shared_memory = 49152;
    as.max_workgroup_invocations = 1024;
    auto ctx = qkv_test::make_context({.fused_tiles_as = as});
    std::uint64_t seed = 1500;
    for (const sdpa_spec& s : suite()) {
        owned_sdpa o = make_sdpa(s, seed++);
        INFO(describe(s) << ", gpu family with the tiles of a discrete GPU (subgroup 32)");
        check_sdpa(ctx, o, qkv::kernel_family::block_tiles, qkv::precision::fp32);
    }
    require_clean(ctx);
}

// One query against more keys than one invocation may loop over on lavapipe (65,535 iterations):
// 70,000 keys (the gpu family's K/V tiles pass that count of loop iterations far earlier), and
// 600,000 (the cpu family takes 8 keys per iteration: 75,000 steps). The host must split the keys
// into chunks. The last key dominates the softmax (score 16 against about N(0, 1) for the others), so cutting any
// key off shows.
TEST_CASE("sdpa over more keys than one invocation may loop: nothing cut short",
          "[sdpa][vulkan][loop_limit][families]") {
    auto& ctx = qkv_test::gpu();
    for (std::size_t kv_len : {std::size_t{70000}, std::size_t{600000}})
        for (qkv::kernel_family family : qkv_test::fused_families()) {
            const sdpa_spec s{.q_len = 1, .kv_len = kv_len, .d_qk = 4, .d_v = 4};
            owned_sdpa o = make_sdpa(s, 1600 + kv_len);
            for (std::size_t c = 0; c < s.d_qk; ++c) {  // score 8·|q|²·scale = 16 for the last key
                o.q[c] = 1.0f;
                o.k[(s.kv_len - 1) * s.d_qk + c] = 8.0f;
            }
            INFO(describe(s) << ", " << name_of(family));
            check_sdpa(ctx, o, family, qkv::precision::fp32);
        }
    require_clean(ctx);
}

TEST_CASE("sdpa refuses what the device kernels cannot take, with a clear error", "[sdpa][vulkan][errors]") {
    auto& ctx = qkv_test::gpu();
    owned_sdpa wide = make_sdpa({.q_len = 3, .kv_len = 5, .d_qk = 600, .d_v = 16}, 1700);
    try {
        (void)ctx.sdpa(wide.problem);
        FAIL("a head of 600 columns was accepted");
    } catch (const qkv::vulkan::limit_exceeded& e) {
        CHECK(std::string(e.what()).find("d_qk = 600") != std::string::npos);
    }
    owned_sdpa gqa = make_sdpa({.q_heads = 3, .kv_heads = 1, .q_len = 3, .kv_len = 5}, 1701);
    gqa.problem.shape.kv_heads = 2;  // does not divide 3
    CHECK_THROWS_AS(ctx.sdpa(gqa.problem), qkv::invalid_argument);
    require_clean(ctx);
}

TEST_CASE("sdpa fills the call statistics and gives identical bits on every run", "[sdpa][vulkan][stats][families]") {
    auto& ctx = qkv_test::gpu();
    for (qkv::kernel_family family : qkv_test::fused_families()) {
        owned_sdpa o = make_sdpa({.q_heads = 8, .kv_heads = 2, .q_len = 1, .kv_len = 300, .d_qk = 64, .d_v = 64}, 1800);
        o.problem.options.kernel = family;
        o.problem.options.precision = qkv_test::case_precision(family, qkv::precision::fp32);
        const auto first = ctx.sdpa(o.problem);
        CHECK(ctx.last_call().host_ms > 0);
        CHECK(ctx.last_call().device_bytes > 0);
        CHECK(first.device == ctx.device().name);
        for (int i = 0; i < 3; ++i) CHECK(ctx.sdpa(o.problem).output == first.output);
    }
    require_clean(ctx);
}

// The self-attention path through the same kernels: a (N, N) bool mask shared by the batch with a
// (B, N, N) additive mask, the one case where the two masks' batch strides differ (a_bs != m_bs
// in contract/flash.h), in both families, against the float64 attention reference.
TEST_CASE("fused attention with a shared bool mask and a batched additive mask", "[sdpa][vulkan][families]") {
    auto& ctx = qkv_test::gpu();
    for (qkv::kernel_family family : qkv_test::fused_families()) {
        auto p = qkv_test::make_problem({.batch = 3,
                                         .seq = 37,
                                         .d_in = 16,
                                         .d_k = 16,
                                         .d_v = 24,
                                         .heads = 2,
                                         .causal = true,
                                         .mask = qkv_test::mask_kind::both,
                                         .batched_mask = true},
                                        1900);
        p.mask.resize(37 * 37);  // the first batch element's mask, now shared by all three
        p.options.implementation = qkv::implementation::fused;
        p.options.kernel = family;
        p.options.precision = qkv_test::case_precision(family, qkv::precision::fp32);
        const auto want = qkv::cpu::attention_f64(p.view());
        const auto got = ctx.attention(p.view());
        INFO(name_of(family));
        CHECK(got.kernel == family);
        const double e = qkv_test::nmse(got.output, want.output);
        INFO("output nmse " << e);
        CHECK(e <= qkv_test::case_tolerance(family, 1e-10));
    }
    require_clean(ctx);
}
