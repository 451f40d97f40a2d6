// The cooperative-matrix family on a device that has it (Mesa 26.1's lavapipe in the mesa26 leg; a
// GPU with VK_KHR_cooperative_matrix): what the shared parity suites (which run every fused case with
// it, support/families.hpp) do not say. FlashAttention's own rule for fp16 (at most twice the error
// of a reference computed in the same dtype), planned calls over float16 device tensors on both
// routes, GQA groups wider than a matrix tile, NaN and Inf in V across tiles, every refusal, and
// every Vulkan entry point taking kernel = coopmat as the capability table says. On
// a device without the family the cases check that it is refused, naming why.
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/element_type.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/sdpa_problems.hpp"
#include "support/varlen_problems.hpp"

using qkv_test::gpu;
using qkv_test::require_clean;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// float32 -> float16 -> float32, rounding to nearest even (with float16's subnormals).
double r16(double f) {
    if (f == 0.0 || !std::isfinite(f)) return f;
    int e = 0;
    (void)std::frexp(f, &e);
    const double ulp = std::ldexp(1.0, std::max(e - 11, -24));
    return std::nearbyint(f / ulp) * ulp;
}

/// A problem of float16-representable N(0, 1) data (the inputs an fp16 caller has).
qkv_test::owned_sdpa half_problem(const qkv::sdpa_shape& shape, std::uint64_t seed, bool causal = false) {
    std::mt19937_64 rng(seed);
    qkv_test::owned_sdpa o = qkv_test::random_sdpa({.shape = shape}, rng);
    for (auto* t : {&o.q, &o.k, &o.v})
        for (float& x : *t) x = static_cast<float>(r16(x));
    o.problem.options.causal = causal;
    o.problem.options.alignment = qkv::causal_alignment::bottom_right;
    o.problem.options.precision = qkv::precision::fp16;
    return o;
}

/// PyTorch's math attention computed in float16 (FlashAttention's "same dtype" reference): S = Q·Kᵀ
/// rounded to float16, then scaled and rounded; P = softmax(S) in float32, rounded to float16;
/// O = P·V accumulated in float32, rounded to float16. Causal bottom-right as the problem says.
std::vector<double> same_dtype_reference(const qkv::sdpa_problem& p) {
    const qkv::sdpa_shape& s = p.shape;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.d_qk));
    const std::size_t group = s.q_heads / s.kv_heads;
    const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(s.kv_len) - static_cast<std::ptrdiff_t>(s.q_len);
    std::vector<double> out(s.batch * s.q_heads * s.q_len * s.d_v);
    std::vector<float> row(s.kv_len);
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t h = 0; h < s.q_heads; ++h)
            for (std::size_t i = 0; i < s.q_len; ++i) {
                const float* q = p.q.data() + ((b * s.q_heads + h) * s.q_len + i) * s.d_qk;
                const std::size_t g = b * s.kv_heads + h / group;
                float m = -inf;
                for (std::size_t j = 0; j < s.kv_len; ++j) {
                    const float* k = p.k.data() + (g * s.kv_len + j) * s.d_qk;
                    float dot = 0;
                    for (std::size_t c = 0; c < s.d_qk; ++c) dot += q[c] * k[c];
                    const bool visible =
                        !p.options.causal || static_cast<std::ptrdiff_t>(j) <= static_cast<std::ptrdiff_t>(i) + off;
                    row[j] = visible ? static_cast<float>(r16(r16(dot) * scale)) : -inf;
                    m = std::max(m, row[j]);
                }
                float sum = 0;
                for (float& x : row) sum += (x = x == -inf ? 0.0f : std::exp(x - m));
                for (float& x : row) x = static_cast<float>(r16(x / sum));
                for (std::size_t c = 0; c < s.d_v; ++c) {
                    float o = 0;
                    for (std::size_t j = 0; j < s.kv_len; ++j) o += row[j] * p.v[(g * s.kv_len + j) * s.d_v + c];
                    out[((b * s.q_heads + h) * s.q_len + i) * s.d_v + c] = r16(o);
                }
            }
    return out;
}

double max_abs_error(const std::vector<float>& got, const std::vector<double>& want) {
    double e = 0;
    for (std::size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(got[i] - want[i]));
    return e;
}
double max_abs_error(const std::vector<double>& got, const std::vector<double>& want) {
    double e = 0;
    for (std::size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(got[i] - want[i]));
    return e;
}

/// The family runs on the tests' device (else each case checks the refusal and ends).
bool coop_here() {
    if (qkv_test::family_runs(qkv::kernel_family::coopmat)) return true;
    qkv_test::owned_sdpa o = half_problem({.q_len = 3, .kv_len = 5, .d_qk = 8, .d_v = 8}, 1);
    o.problem.options.kernel = qkv::kernel_family::coopmat;
    CHECK_THROWS_AS(gpu().sdpa(o.problem), qkv::vulkan::unavailable);
    return false;
}

}  // namespace

TEST_CASE("coopmat: at most twice the error of attention computed in float16 (FlashAttention's rule)",
          "[vulkan][coopmat][isolate]") {
    if (!coop_here()) return;
    struct shape_case {
        qkv::sdpa_shape shape;
        bool causal;
    };
    const shape_case cases[] = {
        {{.q_heads = 2, .kv_heads = 2, .q_len = 113, .kv_len = 113, .d_qk = 64, .d_v = 64}, false},
        {{.q_heads = 4, .kv_heads = 1, .q_len = 37, .kv_len = 300, .d_qk = 128, .d_v = 128}, true},
        {{.q_heads = 3, .kv_heads = 3, .q_len = 17, .kv_len = 17, .d_qk = 3, .d_v = 17}, true},
        {{.q_heads = 8, .kv_heads = 2, .q_len = 1, .kv_len = 2048, .d_qk = 64, .d_v = 64}, true},  // decode
    };
    std::uint64_t seed = 33;
    for (const shape_case& c : cases) {
        INFO("Hq " << c.shape.q_heads << " Hkv " << c.shape.kv_heads << " L " << c.shape.q_len << " S "
                   << c.shape.kv_len << " E " << c.shape.d_qk << " Ev " << c.shape.d_v);
        qkv_test::owned_sdpa o = half_problem(c.shape, ++seed, c.causal);
        o.problem.options.kernel = qkv::kernel_family::coopmat;
        const std::vector<double> exact = qkv::cpu::sdpa_f64(o.problem).output;  // of the float16 inputs
        const qkv::sdpa_output got = gpu().sdpa(o.problem);
        CHECK(got.kernel == qkv::kernel_family::coopmat);
        const double ours = max_abs_error(got.output, exact);
        const double same_dtype = max_abs_error(same_dtype_reference(o.problem), exact);
        INFO("max |error| " << ours << ", attention in float16 " << same_dtype);
        CHECK(ours <= 2 * same_dtype);
        CHECK(qkv_test::nmse(got.output, exact) <= 1e-6);
    }
    require_clean(gpu());
}

TEST_CASE("coopmat: planned calls over float16 device tensors, fused and decode, and a cache",
          "[vulkan][coopmat][tensor]") {
    if (!coop_here()) return;
    auto& ctx = gpu();
    for (const qkv::sdpa_shape shape :
         {qkv::sdpa_shape{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 113, .d_qk = 16, .d_v = 12},
          qkv::sdpa_shape{.q_heads = 8, .kv_heads = 2, .q_len = 1, .kv_len = 1500, .d_qk = 64, .d_v = 64}}) {
        INFO("L " << shape.q_len << " S " << shape.kv_len);
        qkv_test::owned_sdpa o = half_problem(shape, 71, true);
        o.problem.options.kernel = qkv::kernel_family::coopmat;
        const std::vector<double> want = qkv::cpu::sdpa_f64(o.problem).output;
        qkv::sdpa_problem desc = o.problem;
        desc.q = {}, desc.k = {}, desc.v = {};
        const auto f16 = qkv::element_type::f16;
        qkv::vulkan::tensor q(ctx, {shape.batch, shape.q_heads, shape.q_len, shape.d_qk}, f16);
        qkv::vulkan::tensor k(ctx, {shape.batch, shape.kv_heads, shape.kv_len, shape.d_qk}, f16);
        qkv::vulkan::tensor v(ctx, {shape.batch, shape.kv_heads, shape.kv_len, shape.d_v}, f16);
        qkv::vulkan::tensor out(ctx, {shape.batch, shape.q_heads, shape.q_len, shape.d_v});
        q.upload(o.q), k.upload(o.k), v.upload(o.v);
        qkv::vulkan::sdpa_call call(ctx, desc);
        CHECK(call.kernel() == qkv::kernel_family::coopmat);
        call.run({.q = &q, .k = &k, .v = &v, .out = &out});
        CHECK(qkv_test::nmse(out.download(), want) <= 1e-6);
        // A NaN in V behind a masked key adds nothing, found on the device (the careful path):
        // key 0 is out of reach of every row through the window.
        std::vector<float> poisoned = o.v;
        for (std::size_t z = 0; z < shape.batch * shape.kv_heads; ++z)
            poisoned[z * shape.kv_len * shape.d_v] = std::numeric_limits<float>::quiet_NaN();
        qkv::sdpa_problem windowed = desc;
        windowed.options.window_left = static_cast<std::int64_t>(shape.kv_len - shape.q_len) - 1;
        qkv::sdpa_problem host = o.problem;
        host.options.window_left = windowed.options.window_left;
        host.v = poisoned;
        const std::vector<double> want_windowed = qkv::cpu::sdpa_f64(host).output;
        v.upload(poisoned);
        qkv::vulkan::sdpa_call window_call(ctx, windowed);
        window_call.run({.q = &q, .k = &k, .v = &v, .out = &out});
        const std::vector<float> got = out.download();
        CHECK(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
        CHECK(qkv_test::nmse(got, want_windowed) <= 1e-6);
        require_clean(ctx);
    }
}

TEST_CASE("coopmat: GQA groups wider than a matrix tile, and infinities in V across tiles",
          "[vulkan][coopmat][isolate]") {
    if (!coop_here()) return;
    auto& ctx = gpu();
    // 40 query heads over 2 K/V heads, 3 rows each: 60 rows of a group, several M-tiles and row blocks.
    qkv_test::owned_sdpa wide =
        half_problem({.q_heads = 40, .kv_heads = 2, .q_len = 3, .kv_len = 1100, .d_qk = 32, .d_v = 32}, 5, true);
    wide.problem.options.kernel = qkv::kernel_family::coopmat;
    CHECK(qkv_test::nmse(ctx.sdpa(wide.problem).output, qkv::cpu::sdpa_f64(wide.problem).output) <= 1e-6);
    // +inf in V at key 3 of 100 (the first K/V tile): every row that sees key 3 is +inf in that
    // column whatever its weight, rows before it (causal, top-left) stay finite, the later tiles'
    // products carry the infinity (the careful path from then on).
    qkv_test::owned_sdpa o = half_problem({.q_len = 100, .kv_len = 100, .d_qk = 16, .d_v = 16}, 6);
    o.problem.options.causal = true;
    o.problem.options.alignment = qkv::causal_alignment::top_left;
    o.problem.options.kernel = qkv::kernel_family::coopmat;
    o.v[3 * 16 + 5] = inf;
    const qkv::sdpa_output got = ctx.sdpa(o.problem);
    const std::vector<double> want = qkv::cpu::sdpa_f64(o.problem).output;
    for (std::size_t i = 0; i < 100; ++i) {
        INFO("row " << i);
        CHECK((got.output[i * 16 + 5] == inf) == (i >= 3));
        for (std::size_t c = 0; c < 16; ++c)
            if (c != 5)
                CHECK(std::fabs(got.output[i * 16 + c] - want[i * 16 + c]) <= 4e-3 * (1 + std::fabs(want[i * 16 + c])));
    }
    require_clean(ctx);
}

TEST_CASE("coopmat: refusals name why, and the automatic choice keeps out of the gates", "[vulkan][coopmat]") {
    auto& ctx = gpu();
    qkv_test::owned_sdpa o =
        half_problem({.q_heads = 2, .kv_heads = 1, .q_len = 5, .kv_len = 9, .d_qk = 8, .d_v = 8}, 9);
    o.problem.options.kernel = qkv::kernel_family::coopmat;
    const auto refusal = [&](auto&& call) -> std::string {
        try {
            call();
        } catch (const qkv::vulkan::error& e) {
            return e.what();
        }
        return {};
    };
    if (!qkv_test::coopmat_runs(ctx.device())) {  // the device (or this build) lacks it: said so
        CHECK(contains(refusal([&] { (void)ctx.sdpa(o.problem); }), "cooperative"));
        return;
    }
    // float32: float16 products are never taken in secret
    o.problem.options.precision = qkv::precision::fp32;
    CHECK(contains(refusal([&] { (void)ctx.sdpa(o.problem); }), "precision fp16"));
    o.problem.options.precision = qkv::precision::fp16;
    // quantized K/V and heads beyond 256
    qkv_test::owned_sdpa q8 = half_problem({.q_len = 5, .kv_len = 9, .d_qk = 32, .d_v = 32}, 10);
    q8.problem.options.kernel = qkv::kernel_family::coopmat;
    q8.problem.options.kv_type = qkv::element_type::q8_0;
    CHECK_THROWS_AS(ctx.sdpa(q8.problem), qkv::vulkan::unavailable);
    qkv_test::owned_sdpa wide = half_problem({.q_len = 5, .kv_len = 9, .d_qk = 320, .d_v = 8}, 11);
    wide.problem.options.kernel = qkv::kernel_family::coopmat;
    CHECK(contains(refusal([&] { (void)ctx.sdpa(wide.problem); }), "256"));
    // attention's staged implementation (the weights) has no cooperative-matrix products
    auto p = qkv_test::make_problem({.seq = 9, .d_in = 8, .d_k = 8, .d_v = 8}, 12);
    p.options.kernel = qkv::kernel_family::coopmat;
    p.options.precision = qkv::precision::fp16;
    p.options.return_weights = true;
    CHECK(contains(refusal([&] { (void)ctx.attention(p.view()); }), "staged"));
    // sdpa's weights come from the fused route: given
    o.problem.options.return_weights = true;
    const qkv::sdpa_output w = ctx.sdpa(o.problem);
    CHECK(w.kernel == qkv::kernel_family::coopmat);
    CHECK(qkv_test::nmse(w.weights, qkv::cpu::sdpa_f64(o.problem).weights) <= 1e-6);
    // The automatic choice: lavapipe's gate keeps the cpu family (the emulated matrices are slower);
    // elsewhere the family itself, for fp16.
    o.problem.options.kernel = qkv::kernel_family::automatic;
    o.problem.options.return_weights = false;
    const bool llvmpipe = ctx.device().driver_id == 13;
    CHECK(ctx.sdpa(o.problem).kernel == (llvmpipe ? qkv::kernel_family::row_tiles : qkv::kernel_family::coopmat));
    require_clean(ctx);
}

TEST_CASE("coopmat: every Vulkan entry point takes kernel = coopmat as the capability table says",
          "[vulkan][coopmat][capabilities]") {
    if (!coop_here()) return;
    auto& ctx = gpu();
    const auto f16 = qkv::element_type::f16;
    // A prefill (17 query rows, the fused route) and a decode step (one row, against a cache), GQA 2.
    const qkv::sdpa_shape prefill{.q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 40, .d_qk = 16, .d_v = 16};
    qkv_test::owned_sdpa o = half_problem(prefill, 501, true);
    o.problem.options.kernel = qkv::kernel_family::coopmat;
    const std::vector<double> want = qkv::cpu::sdpa_f64(o.problem).output;
    qkv_test::owned_sdpa step =
        half_problem({.q_heads = 4, .kv_heads = 2, .q_len = 1, .kv_len = 40, .d_qk = 16, .d_v = 16}, 502, true);
    step.problem.options.kernel = qkv::kernel_family::coopmat;
    const std::vector<double> want_step = qkv::cpu::sdpa_f64(step.problem).output;
    qkv::vulkan::kv_cache cache(ctx, {.kv_heads = 2, .capacity = 64, .d_qk = 16, .d_v = 16, .type = f16});
    cache.append(step.k, step.v, 40);
    const auto description = [](qkv::sdpa_problem p) {
        p.q = {}, p.k = {}, p.v = {};
        return p;
    };
    const auto tensor_of = [&](std::vector<std::size_t> shape, const std::vector<float>& values) {
        qkv::vulkan::tensor t(ctx, std::move(shape), f16);
        t.upload(values);
        return t;
    };
    // The sdpa paths: the output and the family that ran, judged at the fp16 bound.
    const auto check = [&](const std::vector<float>& got, const std::vector<double>& reference,
                           qkv::kernel_family ran) {
        CHECK(ran == qkv::kernel_family::coopmat);
        CHECK(qkv_test::nmse(got, reference) <= 1e-5);
        require_clean(ctx);
    };
    const auto over_tensors = [&](bool in_sequence) {
        qkv::vulkan::sdpa_call call(ctx, description(o.problem));
        qkv::vulkan::tensor q = tensor_of({1, 4, 17, 16}, o.q), k = tensor_of({1, 2, 40, 16}, o.k),
                            v = tensor_of({1, 2, 40, 16}, o.v), out(ctx, {1, 4, 17, 16});
        const qkv::vulkan::sdpa_tensors t{.q = &q, .k = &k, .v = &v, .out = &out};
        if (in_sequence) {
            qkv::vulkan::sequence seq(ctx);
            seq.record(call, t);
            seq.run();
        } else {
            call.run(t);
        }
        check(out.download(), want, call.kernel());
    };
    // Self-attention in fp16 through the fused kernel, from the host and over tensors (the same kernels).
    std::mt19937_64 rng(503);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    std::vector<float> x(2 * 17 * 16), w(16 * 16);
    for (float& e : x) e = normal(rng);
    for (float& e : w) e = normal(rng);
    qkv::attention_problem attention{.shape = {.batch = 2, .seq = 17, .d_in = 16, .d_k = 16, .d_v = 16, .heads = 2},
                                     .x = x,
                                     .wq = w,
                                     .wk = w,
                                     .wv = w};
    attention.options.precision = qkv::precision::fp16;
    attention.options.causal = true;
    attention.options.kernel = qkv::kernel_family::coopmat;

    std::map<qkv::entry_point, std::function<void()>> runners{
        {qkv::entry_point::context_sdpa,
         [&] {
             const qkv::sdpa_output r = ctx.sdpa(o.problem);
             check(r.output, want, r.kernel);
         }},
        {qkv::entry_point::context_decode,
         [&] {
             qkv::sdpa_problem p = step.problem;
             p.k = {}, p.v = {};
             const qkv::sdpa_output r = ctx.sdpa(p, cache);
             check(r.output, want_step, r.kernel);
         }},
        {qkv::entry_point::sdpa_call, [&] { over_tensors(false); }},
        {qkv::entry_point::sequence_record, [&] { over_tensors(true); }},
        {qkv::entry_point::sdpa_call_decode,
         [&] {
             qkv::vulkan::sdpa_call call(ctx, description(step.problem), cache);
             qkv::vulkan::tensor q = tensor_of({1, 4, 1, 16}, step.q), out(ctx, {1, 4, 1, 16});
             call.run({.q = &q, .out = &out});
             check(out.download(), want_step, call.kernel());
         }},
        // The backward pass has no cooperative-matrix kernels: both refuse it (the table's reason), a
        // well-formed problem (d_out of the output's size; out and lse recomputed) so that the
        // refusal, not the validation, is what answers.
        {qkv::entry_point::context_sdpa_backward,
         [&] { (void)ctx.sdpa_backward({.forward = o.problem, .d_out = o.q}); }},
        {qkv::entry_point::sdpa_backward_call,
         [&] { qkv::vulkan::sdpa_backward_call(ctx, {.forward = description(o.problem)}); }},
        // A ragged batch: each sequence on the family (its fused route here), at the fp16 bound.
        {qkv::entry_point::context_varlen,
         [&] {
             qkv_test::owned_varlen r = qkv_test::random_varlen({17, 3}, {40, 113}, 4, 2, 16, 16, 504);
             r.problem.options = {.causal = true,
                                  .alignment = qkv::causal_alignment::bottom_right,
                                  .precision = qkv::precision::fp16,
                                  .kernel = qkv::kernel_family::coopmat};
             qkv::varlen_problem rounded = r.problem;
             const std::vector<float> q16 = qkv::round_trip(f16, r.q), k16 = qkv::round_trip(f16, r.k),
                                      v16 = qkv::round_trip(f16, r.v);
             rounded.q = q16, rounded.k = k16, rounded.v = v16;
             const qkv::varlen_output got = ctx.sdpa(r.problem);
             CHECK(qkv_test::nmse(got.output, qkv::cpu::sdpa_f64(rounded).output) <= 1e-5);
             require_clean(ctx);
         }},
        {qkv::entry_point::context_attention,
         [&] {
             const qkv::attention_output r = ctx.attention(attention);
             CHECK(r.kernel == qkv::kernel_family::coopmat);
             CHECK(qkv_test::nmse(r.output, qkv::cpu::attention_f64(attention).output) <= 1e-5);
             require_clean(ctx);
         }},
        {qkv::entry_point::attention_call,
         [&] {
             qkv::attention_problem desc = attention;
             desc.x = {}, desc.wq = {}, desc.wk = {}, desc.wv = {};
             qkv::vulkan::attention_call call(ctx, desc);
             qkv::vulkan::tensor tx(ctx, {2, 17, 16}), tw(ctx, {16, 16}), out(ctx, {2, 17, 16});
             tx.upload(x), tw.upload(w);
             call.run({.x = &tx, .wq = &tw, .wk = &tw, .wv = &tw, .out = &out});
             CHECK(call.kernel() == qkv::kernel_family::coopmat);
             CHECK(out.download() == ctx.attention(attention).output);  // the host call's kernels
             require_clean(ctx);
         }},
    };
    // Not run here: the CPU backend's (it takes every kernel value and ignores it), the MPI ones
    // (their Vulkan backend runs each block as context::sdpa), record (interop), which records the
    // sdpa_call above into the caller's command buffer, and the appends (no kernel to choose).
    for (const qkv::entry_point e : qkv::entry_points()) {
        if (!qkv::applies(e, qkv::values::coopmat) || !runners.count(e)) continue;
        INFO(qkv::name_of(e));
        if (const qkv::refusal* r = qkv::refused(e, qkv::values::coopmat))
            CHECK_THROWS_WITH(runners.at(e)(), Catch::Matchers::Contains(std::string(r->why)));
        else
            runners.at(e)();
    }
}
