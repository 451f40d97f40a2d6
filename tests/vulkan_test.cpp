// The Vulkan backend on whatever device the machine has (lavapipe in CI), validation layer on:
// the worked example against the compile-time results, a sweep of odd shapes against the float64
// CPU reference for both implementations and both precisions, and the error paths. Every test that
// runs the fused implementation runs once per kernel family, forced (FUSED_FAMILY below), so every
// family the device has is proven on whatever device runs the suite (the cooperative-matrix one in
// fp16: support/families.hpp).
#include <qkv/tutorial.hpp>
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/testing.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/problems.hpp"
#include "support/reference.hpp"

using qkv_test::family_name;
using qkv_test::gpu;
using qkv_test::make_problem;
using qkv_test::mask_kind;
using qkv_test::problem_spec;
using qkv_test::require_clean;

/// The fused kernel family of this run of the test case: Catch2 runs the case once per value.
#define FUSED_FAMILY() GENERATE(from_range(qkv_test::fused_families()))

namespace {

/// Whether a case runs `impl` with `family`: the cooperative-matrix family has no staged products.
bool runs(qkv::implementation impl, qkv::kernel_family family) {
    return impl != qkv::implementation::staged || family != qkv::kernel_family::coopmat;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class E, class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("the expected exception was not thrown");
    return {};
}

qkv::attention_problem tutorial_problem(const std::vector<float>& x, const std::vector<float>& wq,
                                        const std::vector<float>& wk, const std::vector<float>& wv) {
    return {.shape = {.seq = 3, .d_in = 4, .d_k = 3, .d_v = 3}, .x = x, .wq = wq, .wk = wk, .wv = wv};
}

template <std::size_t R, std::size_t C>
std::vector<float> flat(const qkv::matrix<float, R, C>& m) {
    std::vector<float> v;
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) v.push_back(m(r, c));
    return v;
}

/// Runs `p` on the GPU and checks output (and weights, when returned) against the CPU float64
/// reference by normalised MSE, and that nothing is NaN or Inf where the reference is finite. With
/// the cooperative-matrix family the case runs in fp16, judged by the fp16 bound.
void check_against_reference(qkv::vulkan::context& ctx, qkv_test::owned_problem p, double tolerance) {
    p.options.precision = qkv_test::case_precision(p.options.kernel, p.options.precision);
    tolerance = qkv_test::case_tolerance(p.options.kernel, tolerance);
    const auto want = qkv::cpu::attention_f64(p.view());
    const auto got = ctx.attention(p.view());
    REQUIRE(got.output.size() == want.output.size());
    if (got.implementation == qkv::implementation::fused && p.options.kernel != qkv::kernel_family::automatic)
        CHECK(got.kernel == p.options.kernel);  // the forced family is the one that ran
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

std::vector<problem_spec> sweep_specs() {
    // Every N and every width meets several head counts, batches, biases and masks; the mask
    // kinds rotate so each appears with small and large N.
    const std::size_t seqs[] = {1, 2, 3, 17, 113, 300};
    const std::size_t widths[] = {1, 3, 16, 64, 80};
    std::vector<problem_spec> specs;
    std::size_t k = 0;
    for (std::size_t n : seqs)
        for (std::size_t d : widths) {
            problem_spec s;
            s.seq = n;
            s.d_k = d;
            const std::size_t heads_choice[] = {1, 2, 4};
            s.heads = 1;
            for (std::size_t h : heads_choice)
                if (d % h == 0 && (k % 3 == 0 || h <= 2)) s.heads = h;
            s.d_v = (k % 2 == 0) ? d : d + s.heads * (1 + k % 3);  // d_v != d_k half the time
            s.d_in = 5 + (k % 4) * 9;
            s.batch = (k % 3 == 1) ? 3 : 1;
            s.biases = k % 2 == 1;
            s.d_out = (k % 5 == 2) ? 7 : 0;
            s.causal = k % 4 == 1 || k % 7 == 3;
            s.mask = static_cast<mask_kind>(k % 4);
            s.batched_mask = s.batch > 1 && k % 2 == 0;
            s.fully_masked_row = s.mask != mask_kind::none && n > 1 && k % 3 != 2;
            // keep lavapipe's work small: the largest cases get one batch element
            if (n * n * d > 1'000'000) s.batch = 1;
            specs.push_back(s);
            ++k;
        }
    return specs;
}

}  // namespace

TEST_CASE("the worked example on the GPU equals the compile-time result", "[vulkan][tutorial][families]") {
    namespace tut = qkv::tutorial;
    const auto x = flat(tut::inputs), wq = flat(tut::w_query), wk = flat(tut::w_key), wv = flat(tut::w_value);
    auto& ctx = gpu();
    const auto family = FUSED_FAMILY();
    INFO(family_name(family));
    // The cooperative-matrix family in fp16: the projections are small integers (exact in float16),
    // the weights rounded to float16 for P·V move the outputs by up to about 2^-11 of their size.
    const bool half = family == qkv::kernel_family::coopmat;
    const float out_tolerance = half ? 2e-3f : 1e-5f;
    for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
        if (!runs(impl, family)) continue;
        auto p = tutorial_problem(x, wq, wk, wv);
        p.options.implementation = impl;
        p.options.kernel = family;
        p.options.precision = qkv_test::case_precision(family, qkv::precision::fp32);
        p.options.return_weights = impl == qkv::implementation::staged;
        for (bool scaled : {false, true}) {
            p.options.scale = scaled ? std::nullopt : std::optional<float>(1.f);
            const auto& expected = scaled ? tut::scaled : tut::plain;
            const auto r = ctx.attention(p);
            INFO((impl == qkv::implementation::staged ? "staged" : "fused") << (scaled ? ", scaled" : ", scale 1"));
            CHECK(r.implementation == impl);
            if (impl == qkv::implementation::fused) CHECK(r.kernel == family);
            for (std::size_t i = 0; i < 3; ++i)
                for (std::size_t c = 0; c < 3; ++c)
                    CHECK(std::abs(r.output[i * 3 + c] - expected.output(i, c)) <=
                          out_tolerance * std::max(1.f, std::abs(expected.output(i, c))));
            if (p.options.return_weights)
                for (std::size_t i = 0; i < 3; ++i)
                    for (std::size_t j = 0; j < 3; ++j)
                        CHECK(std::abs(r.weights[i * 3 + j] - expected.weights(i, j)) <= 1e-6f);
        }
    }
    require_clean(ctx);
}

TEST_CASE("staged and fused match the float64 reference on odd shapes (fp32)", "[vulkan][sweep][families]") {
    auto& ctx = gpu();
    const auto family = FUSED_FAMILY();
    std::uint64_t seed = 1000;
    for (const auto& spec : sweep_specs()) {
        auto p = make_problem(spec, seed++);
        p.options.kernel = family;
        for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
            if (!runs(impl, family)) continue;
            p.options.implementation = impl;
            p.options.return_weights = impl == qkv::implementation::staged;
            INFO(qkv_test::describe(spec)
                 << (impl == qkv::implementation::staged ? " staged" : " fused, ") << family_name(family));
            check_against_reference(ctx, p, 1e-10);
        }
    }
    require_clean(ctx);
}

TEST_CASE("fp16 storage stays within 1e-5 of the float64 reference", "[vulkan][sweep][fp16][families]") {
    auto& ctx = gpu();
    if (!ctx.device().fp16_storage) {
        auto p = make_problem({}, 1);
        p.options.precision = qkv::precision::fp16;
        CHECK(contains(error_of<qkv::vulkan::unavailable>([&] { (void)ctx.attention(p.view()); }), "fp16"));
        return;
    }
    const auto family = FUSED_FAMILY();
    std::uint64_t seed = 2000;
    const auto specs = sweep_specs();
    for (std::size_t i = 0; i < specs.size(); i += 2) {  // every other case: fp16 adds pipelines, not new logic
        auto p = make_problem(specs[i], seed++);
        p.options.precision = qkv::precision::fp16;
        p.options.kernel = family;
        for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
            if (!runs(impl, family)) continue;
            p.options.implementation = impl;
            INFO(qkv_test::describe(specs[i])
                 << (impl == qkv::implementation::staged ? " staged" : " fused") << " fp16, " << family_name(family));
            check_against_reference(ctx, p, 1e-5);
        }
    }
    require_clean(ctx);
}

TEST_CASE("automatic picks fused unless the weights are requested", "[vulkan]") {
    auto& ctx = gpu();
    auto p = make_problem({.seq = 17, .d_in = 8, .d_k = 8, .d_v = 8, .heads = 2}, 7);
    const auto fused = ctx.attention(p.view());
    CHECK(fused.implementation == qkv::implementation::fused);
    // and the row_tiles family on CPU devices (lavapipe), block_tiles elsewhere (fp32: the
    // cooperative-matrix family is chosen for fp16 calls only)
    CHECK(fused.kernel == (ctx.device().type == qkv::vulkan::device_type::cpu ? qkv::kernel_family::row_tiles
                                                                              : qkv::kernel_family::block_tiles));
    // fp16 on a GPU with cooperative matrices: that family; lavapipe's gate keeps row_tiles
    auto half = p;
    half.options.precision = qkv::precision::fp16;
    if (ctx.device().fp16_storage)
        CHECK(ctx.attention(half.view()).kernel ==
              (ctx.device().type == qkv::vulkan::device_type::cpu ? qkv::kernel_family::row_tiles
               : qkv_test::coopmat_runs(ctx.device())             ? qkv::kernel_family::coopmat
                                                                  : qkv::kernel_family::block_tiles));
    p.options.return_weights = true;
    const auto r = ctx.attention(p.view());
    CHECK(r.implementation == qkv::implementation::staged);
    CHECK(r.kernel == qkv::kernel_family::automatic);
    CHECK(r.weights.size() == 2 * 17 * 17);
    require_clean(ctx);
}

TEST_CASE("fused attention takes DeepSeek's MLA widths (576 / 512) on both families; wider heads go staged",
          "[vulkan]") {
    auto& ctx = gpu();
    // Heads past 256 fused, right: DeepSeek's MLA (576 for Q and K, 512 for V) on the gpu family,
    // Mistral's 320 / 256 on the cpu family (its 576-wide pipelines cost lavapipe ~30 s to build
    // cold, and the sdpa tests build them already: qkv_sdpa_features_vulkan_tests).
    struct wide_case {
        std::size_t d_k, d_v;
        qkv::kernel_family family;
    };
    for (const wide_case w :
         {wide_case{576, 512, qkv::kernel_family::block_tiles}, wide_case{320, 256, qkv::kernel_family::row_tiles}}) {
        auto p = make_problem({.seq = 5, .d_in = 7, .d_k = w.d_k, .d_v = w.d_v}, w.d_k);
        p.options.implementation = qkv::implementation::fused;
        p.options.kernel = w.family;
        INFO(w.d_k << " / " << w.d_v << ", " << family_name(w.family));
        check_against_reference(ctx, p, 1e-10);
        CHECK(ctx.attention(p.view()).implementation == qkv::implementation::fused);
    }
    // 577 columns: automatic takes the staged path, an explicit fused request is refused.
    auto p = make_problem({.seq = 3, .d_in = 2, .d_k = 577, .d_v = 8}, 5);
    CHECK(ctx.attention(p.view()).implementation == qkv::implementation::staged);
    p.options.implementation = qkv::implementation::fused;
    CHECK_THROWS_AS(ctx.attention(p.view()), qkv::vulkan::limit_exceeded);
    require_clean(ctx);
}

TEST_CASE("bad input throws invalid_argument and the context keeps working", "[vulkan][errors]") {
    auto& ctx = gpu();
    auto good = make_problem({.seq = 5, .d_in = 4, .d_k = 4, .d_v = 4, .heads = 2}, 3);
    const auto before = ctx.attention(good.view()).output;

    auto bad = good;
    bad.shape.heads = 3;
    CHECK(contains(error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); }), "heads"));
    bad = good;
    bad.x.pop_back();
    CHECK(contains(error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); }), "x"));
    bad = good;
    bad.mask.assign(7, 1);
    CHECK(contains(error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); }), "mask"));
    bad = good;
    bad.options.implementation = qkv::implementation::fused;
    bad.options.return_weights = true;
    CHECK(contains(error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); }), "fused"));
    bad = good;
    bad.options.kernel = static_cast<qkv::kernel_family>(7);
    CHECK(contains(error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); }), "kernel family"));
    bad = good;
    bad.shape.seq = 0;
    bad.x.clear();
    (void)error_of<qkv::invalid_argument>([&] { (void)ctx.attention(bad.view()); });

    // The same context still computes, and the same result.
    CHECK(ctx.attention(good.view()).output == before);
    require_clean(ctx);
}

TEST_CASE("a request beyond maxStorageBufferRange is refused before any work", "[vulkan][limits]") {
    auto& ctx = gpu();
    const auto range = ctx.device().max_storage_buffer_range;
    // Staged scores of seq x seq floats larger than the range, tiny everything else.
    std::size_t n = 64;
    while (n * n * 4 <= range) n *= 2;
    qkv_test::owned_problem p = make_problem({.seq = 1, .d_in = 1, .d_k = 1, .d_v = 1}, 5);
    p.shape.seq = n;
    p.x.assign(n, 0.5f);
    p.options.implementation = qkv::implementation::staged;
    const auto allocated = ctx.device_memory_allocated();
    const std::string msg = error_of<qkv::vulkan::limit_exceeded>([&] { (void)ctx.attention(p.view()); });
    CHECK(contains(msg, "maxStorageBufferRange"));
    CHECK(contains(msg, "fused"));
    CHECK(ctx.device_memory_allocated() == allocated);  // refused before allocating

    // The context keeps working.
    auto small = make_problem({.seq = 9, .d_in = 3, .d_k = 2, .d_v = 2}, 6);
    check_against_reference(ctx, small, 1e-10);
    require_clean(ctx);
}

TEST_CASE("an allocation failure is a typed error that leaks nothing", "[vulkan][limits]") {
    auto ctx = qkv_test::make_context({.device_memory_limit = 256 * 1024});
    auto small = make_problem({.seq = 8, .d_in = 4, .d_k = 4, .d_v = 4}, 8);
    check_against_reference(ctx, small, 1e-10);
    const auto held = ctx.device_memory_allocated();
    auto big = make_problem({.seq = 300, .d_in = 16, .d_k = 16, .d_v = 16}, 9);
    big.options.implementation = qkv::implementation::staged;  // 360 KB of scores: over the cap
    const std::string msg = error_of<qkv::vulkan::out_of_memory>([&] { (void)ctx.attention(big.view()); });
    CHECK(contains(msg, "VK_ERROR_OUT_OF_DEVICE_MEMORY"));
    CHECK(ctx.device_memory_allocated() == 0);  // the failed call keeps nothing, its cache is released
    CHECK(held > 0);
    ctx.trim();
    CHECK(ctx.device_memory_allocated() == 0);
    check_against_reference(ctx, small, 1e-10);  // and the context still works
    require_clean(ctx);
}

TEST_CASE("grids beyond maxComputeWorkGroupCount are split and stay correct", "[vulkan][limits][families]") {
    auto ctx = qkv_test::make_context({.max_workgroup_count = 2});
    const auto family = FUSED_FAMILY();
    INFO(family_name(family));
    for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
        if (!runs(impl, family)) continue;
        auto p = make_problem({.batch = 3,
                               .seq = 113,
                               .d_in = 9,
                               .d_k = 8,
                               .d_v = 12,
                               .heads = 4,
                               .d_out = 5,
                               .causal = true,
                               .mask = mask_kind::both},
                              11);
        p.options.implementation = impl;
        p.options.kernel = family;
        p.options.return_weights = impl == qkv::implementation::staged;
        check_against_reference(ctx, p, 1e-10);
    }
    require_clean(ctx);
}

TEST_CASE("staging through host-visible buffers (the discrete-GPU path) gives the same results", "[vulkan][families]") {
    auto ctx = qkv_test::make_context({.force_staging = true});
    auto p = make_problem({.batch = 2,
                           .seq = 33,
                           .d_in = 7,
                           .d_k = 8,
                           .d_v = 6,
                           .heads = 2,
                           .d_out = 3,
                           .biases = true,
                           .mask = mask_kind::additive},
                          12);
    p.options.return_weights = true;
    const auto direct = gpu().attention(p.view());
    const auto staged = ctx.attention(p.view());
    CHECK(direct.output == staged.output);
    CHECK(direct.weights == staged.weights);
    p.options.return_weights = false;  // the fused implementation, each family
    p.options.kernel = FUSED_FAMILY();
    p.options.precision = qkv_test::case_precision(p.options.kernel, p.options.precision);
    INFO(family_name(p.options.kernel));
    CHECK(gpu().attention(p.view()).output == ctx.attention(p.view()).output);
    require_clean(ctx);
    require_clean(gpu());
}

TEST_CASE("the same input gives bitwise-identical output every call", "[vulkan][families]") {
    auto& ctx = gpu();
    auto p = make_problem({.batch = 2, .seq = 65, .d_in = 16, .d_k = 16, .d_v = 16, .heads = 4, .causal = true}, 13);
    p.options.kernel = FUSED_FAMILY();
    p.options.precision = qkv_test::case_precision(p.options.kernel, p.options.precision);
    INFO(family_name(p.options.kernel));
    for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
        if (!runs(impl, p.options.kernel)) continue;
        p.options.implementation = impl;
        const auto first = ctx.attention(p.view()).output;
        for (int i = 0; i < 5; ++i) CHECK(ctx.attention(p.view()).output == first);
    }
    require_clean(ctx);
}

TEST_CASE("numerical edge cases: NaN propagates, -inf masks, huge scores stay finite or are refused, N = d = 1",
          "[vulkan][edge][families]") {
    auto& ctx = gpu();
    const auto family = FUSED_FAMILY();
    const qkv::precision precision = qkv_test::case_precision(family, qkv::precision::fp32);
    for (auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
        if (!runs(impl, family)) continue;
        INFO((impl == qkv::implementation::staged ? "staged" : "fused") << ", " << family_name(family));
        // NaN in one input row: rows that attend to it become NaN, as in PyTorch; a causal
        // mask keeps earlier rows clean.
        auto p = make_problem({.seq = 6, .d_in = 4, .d_k = 4, .d_v = 4, .causal = true}, 14);
        p.options.implementation = impl;
        p.options.kernel = family;
        p.options.precision = precision;
        p.x[3 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
        const auto r = ctx.attention(p.view());
        for (std::size_t i = 0; i < 6; ++i)
            for (std::size_t c = 0; c < 4; ++c) CHECK(std::isnan(r.output[i * 4 + c]) == (i >= 3));

        // -inf in an additive mask masks; a row of -inf is a fully masked row (zeros).
        auto m = make_problem({.seq = 4, .d_in = 3, .d_k = 2, .d_v = 2}, 15);
        m.options.implementation = impl;
        m.options.kernel = family;
        m.options.precision = precision;
        m.additive.assign(16, 0.f);
        for (std::size_t j = 0; j < 4; ++j) m.additive[2 * 4 + j] = -std::numeric_limits<float>::infinity();
        m.additive[0 * 4 + 1] = -std::numeric_limits<float>::infinity();
        const auto rm = ctx.attention(m.view());
        CHECK(rm.output[2 * 2] == 0.f);
        CHECK(rm.output[2 * 2 + 1] == 0.f);
        check_against_reference(ctx, m, 1e-10);

        // Scores in the real overflow region: about 1e36 (far beyond exp's range, within the
        // guard's 2^127) are finite and right; 100 times the inputs (scores about 1e40, beyond
        // FLT_MAX) is refused with numeric_overflow, never zeros or NaN with success.
        auto big = make_problem({.seq = 5, .d_in = 2, .d_k = 2, .d_v = 2}, 16);
        big.options.implementation = impl;
        big.options.kernel = family;
        big.options.precision = precision;
        for (auto& v : big.x) v *= 1e17f;
        for (auto& v : big.wq) v *= 10.f;
        for (auto& v : big.wk) v *= 10.f;
        if (precision == qkv::precision::fp16) {  // Q, K and V beyond float16's 65,504: refused, not inf
            CHECK(contains(error_of<qkv::vulkan::numeric_overflow>([&] { (void)ctx.attention(big.view()); }), "65504"));
            continue;
        }
        const auto rb = ctx.attention(big.view());
        for (float v : rb.output) CHECK(std::isfinite(v));
        check_against_reference(ctx, big, 1e-10);
        for (auto& v : big.x) v *= 100.f;
        const std::string huge = error_of<qkv::vulkan::numeric_overflow>([&] { (void)ctx.attention(big.view()); });
        CHECK(contains(huge, "scores"));

        // N = 1 and d = 1.
        auto one = make_problem({.seq = 1, .d_in = 1, .d_k = 1, .d_v = 1}, 17);
        one.options.implementation = impl;
        one.options.kernel = family;
        one.options.precision = precision;
        check_against_reference(ctx, one, 1e-12);
    }
    require_clean(ctx);
}

TEST_CASE("device selection prefers discrete GPUs and honours index and name", "[vulkan][devices]") {
    using qkv::vulkan::device_type;
    std::vector<qkv::vulkan::device_info> devices(4);
    const device_type types[] = {device_type::cpu, device_type::integrated_gpu, device_type::discrete_gpu,
                                 device_type::virtual_gpu};
    const char* names[] = {"llvmpipe (LLVM 15)", "Intel(R) UHD 770", "NVIDIA H100", "virtio"};
    for (std::uint32_t i = 0; i < 4; ++i) {
        devices[i].index = i;
        devices[i].type = types[i];
        devices[i].name = names[i];
        devices[i].has_compute_queue = true;
    }
    CHECK(qkv::vulkan::select_device(devices, std::nullopt) == 2);
    devices[2].has_compute_queue = false;  // a device that cannot compute is never picked
    CHECK(qkv::vulkan::select_device(devices, std::nullopt) == 1);
    CHECK(qkv::vulkan::select_device(devices, std::string("0")) == 0);
    CHECK(qkv::vulkan::select_device(devices, std::string("LLVMPIPE")) == 0);
    CHECK(qkv::vulkan::select_device(devices, std::string("uhd")) == 1);
    CHECK(contains(
        error_of<qkv::vulkan::unavailable>([&] { (void)qkv::vulkan::select_device(devices, std::string("7")); }),
        "index 7"));
    CHECK(contains(
        error_of<qkv::vulkan::unavailable>([&] { (void)qkv::vulkan::select_device(devices, std::string("radeon")); }),
        "radeon"));
    CHECK(contains(
        error_of<qkv::vulkan::unavailable>([&] { (void)qkv::vulkan::select_device(devices, std::string("2")); }),
        "compute"));

    // The real machine: the listing is not empty and the context took the selected device.
    const auto real = qkv::vulkan::list_devices({.validation = true});
    REQUIRE(!real.empty());
    CHECK(gpu().device().name == real[qkv::vulkan::select_device(real, std::nullopt)].name);
}

// Run by CTest in its own process with VK_DRIVER_FILES pointing nowhere (see tests/CMakeLists.txt).
TEST_CASE("no Vulkan driver gives a clear unavailable error", "[no_driver]") {
    const std::string msg = error_of<qkv::vulkan::unavailable>([] { qkv::vulkan::context ctx; });
    CHECK((contains(msg, "no Vulkan driver") || contains(msg, "no Vulkan device")));
    CHECK_THROWS_AS(qkv::vulkan::list_devices(), qkv::vulkan::unavailable);
    // The CPU backend needs no driver.
    namespace tut = qkv::tutorial;
    const auto x = flat(tut::inputs), wq = flat(tut::w_query), wk = flat(tut::w_key), wv = flat(tut::w_value);
    const auto r = qkv::cpu::attention(tutorial_problem(x, wq, wk, wv));
    CHECK(std::abs(r.output[0] - tut::scaled.output(0, 0)) < 1e-6f);
}

// Run by CTest in its own process with QKV_VULKAN_LIBRARY pointing at no library.
TEST_CASE("no Vulkan loader gives a clear unavailable error", "[no_loader]") {
    const std::string msg = error_of<qkv::vulkan::unavailable>([] { qkv::vulkan::context ctx; });
    CHECK(contains(msg, "no Vulkan loader found"));
    // Every later attempt says the same, and is still a typed error.
    CHECK(contains(error_of<qkv::vulkan::error>([] { (void)qkv::vulkan::list_devices(); }), "no Vulkan loader found"));
}

TEST_CASE("the device ceiling is measured with positive, finite numbers", "[vulkan][ceiling]") {
    auto& ctx = gpu();
    const auto c = qkv::vulkan::testing::measure_ceiling(ctx);
    CHECK(c.fma_gflops > 0);
    CHECK(std::isfinite(c.fma_gflops));
    CHECK(c.copy_gb_per_s > 0);
    CHECK(std::isfinite(c.copy_gb_per_s));
    CHECK(c.empty_submit_ms > 0);
    CHECK(c.device_timestamps == ctx.device().timestamps);
    CHECK(ctx.device_memory_allocated() < (1u << 20));  // its temporary buffers are gone
    require_clean(ctx);
}

TEST_CASE("per-call statistics time each phase within the whole call", "[vulkan][stats][families]") {
    auto& ctx = gpu();
    auto p = make_problem({.seq = 33, .d_in = 12, .d_k = 8, .d_v = 12, .heads = 2, .d_out = 5}, 11);
    p.options.kernel = FUSED_FAMILY();
    p.options.precision = qkv_test::case_precision(p.options.kernel, p.options.precision);
    INFO(family_name(p.options.kernel));
    for (const auto impl : {qkv::implementation::staged, qkv::implementation::fused}) {
        if (!runs(impl, p.options.kernel)) continue;
        p.options.implementation = impl;
        (void)ctx.attention(p.view());
        const qkv::vulkan::call_stats s = ctx.last_call();
        CHECK(s.host_ms > 0);
        CHECK(s.device_bytes == ctx.device_memory_allocated());
        if (!ctx.device().timestamps) {
            CHECK(s.device_ms == 0);
            continue;
        }
        CHECK(s.projection_ms > 0);
        CHECK(s.attention_ms > 0);
        CHECK(s.output_projection_ms > 0);
        CHECK(s.projection_ms + s.attention_ms + s.output_projection_ms <= s.device_ms * (1 + 1e-9));
        CHECK(s.device_ms <= s.host_ms);
    }
    p.shape.d_out = 0;
    p.wo.clear();
    p.bo.clear();
    (void)ctx.attention(p.view());
    CHECK(ctx.last_call().output_projection_ms == 0);
    require_clean(ctx);
}

// The GPU family's tile configurations of real GPUs, forced onto this device (context_options::
// fused_tiles_as): 256 or 128 invocations in teams of 32, 64 or 16 lanes. lavapipe's subgroups
// have 8 lanes, so the kernel must notice that a team is not one subgroup and reduce through
// shared memory; the last entry takes that path on purpose (no subgroup arithmetic).
namespace {
std::vector<std::pair<std::string, qkv::vulkan::device_info>> gpu_tile_devices(const qkv::vulkan::device_info& real) {
    using qkv::vulkan::device_type;
    const auto as = [&](device_type type, std::uint32_t subgroup, bool arithmetic, std::uint32_t shared) {
        qkv::vulkan::device_info d = real;
        d.type = type;
        d.subgroup_size = subgroup;
        d.subgroup_arithmetic = arithmetic;
        d.max_shared_memory = shared;
        d.max_workgroup_invocations = 1024;
        return d;
    };
    return {{"discrete, subgroup 32", as(device_type::discrete_gpu, 32, true, 49152)},
            {"discrete, subgroup 64", as(device_type::discrete_gpu, 64, true, 65536)},
            {"integrated, subgroup 16", as(device_type::integrated_gpu, 16, true, 65536)},
            {"discrete, no subgroup arithmetic", as(device_type::discrete_gpu, 32, false, 49152)}};
}
}  // namespace

TEST_CASE("fused attention with a GPU's tiles matches the float64 reference", "[vulkan][sweep][gpu_tiles]") {
    std::uint64_t seed = 5000;
    const auto specs = sweep_specs();
    std::size_t offset = 0;
    for (const auto& [name, as] : gpu_tile_devices(gpu().device())) {
        auto ctx = qkv_test::make_context({.fused_tiles_as = as});
        for (std::size_t i = offset++ % 3; i < specs.size(); i += 3) {  // a third each, 30 cases in all
            auto p = make_problem(specs[i], seed++);
            p.options.implementation = qkv::implementation::fused;
            INFO(qkv_test::describe(specs[i]) << " fused, tiles of " << name);
            check_against_reference(ctx, p, 1e-10);
            if (ctx.device().fp16_storage && i % 2 == 0) {
                p.options.precision = qkv::precision::fp16;
                check_against_reference(ctx, p, 1e-5);
            }
        }
        require_clean(ctx);
        // Key chunks, staging, determinism and the NaN rules with the same tiles.
        auto chunked =
            qkv_test::make_context({.max_fused_keys_per_dispatch = 37, .force_staging = true, .fused_tiles_as = as});
        for (std::size_t i = offset; i < specs.size(); i += 4) {
            if (specs[i].seq <= 37) continue;
            auto p = make_problem(specs[i], seed++);
            p.options.implementation = qkv::implementation::fused;
            INFO(qkv_test::describe(specs[i]) << " fused, chunks of 37 keys, staged I/O, tiles of " << name);
            check_against_reference(chunked, p, 1e-10);
        }
        auto p =
            make_problem({.batch = 2, .seq = 65, .d_in = 16, .d_k = 16, .d_v = 16, .heads = 4, .causal = true}, 13);
        p.options.implementation = qkv::implementation::fused;
        const auto first = chunked.attention(p.view()).output;
        for (int i = 0; i < 3; ++i) CHECK(chunked.attention(p.view()).output == first);
        auto nan = make_problem({.seq = 90, .d_in = 4, .d_k = 4, .d_v = 4, .causal = true}, 77);
        nan.options.implementation = qkv::implementation::fused;
        nan.wv[0] = 1.0f;
        nan.x[50 * 4 + 0] = std::numeric_limits<float>::quiet_NaN();  // V row 50
        const auto r = chunked.attention(nan.view());
        for (std::size_t row = 0; row < 90; ++row) {
            INFO("row " << row << ", tiles of " << name);
            CHECK(std::isnan(r.output[row * 4]) == (row >= 50));
        }
        require_clean(chunked);
    }
}

// A GPU's tiles forced onto a CPU device on a sequence long enough that the host splits it into
// key chunks by its own loop budget (5,024 keys here, not a forced chunk length): the online-
// softmax state must cross the chunk border intact with the GPU geometry (256 invocations, teams
// of 32, shared-memory reductions). About 7 GFLOP: in the long entry.
TEST_CASE("a GPU's tiles on lavapipe: key chunks from the loop budget stay exact", "[vulkan][long][gpu_tiles]") {
    const auto devices = gpu_tile_devices(gpu().device());
    auto ctx = qkv_test::make_context({.fused_tiles_as = devices[0].second});
    auto p = make_problem({.seq = 5100, .d_in = 64, .d_k = 64, .d_v = 64, .heads = 1}, 5100);
    p.options.implementation = qkv::implementation::fused;
    check_against_reference(ctx, p, 1e-9);
    require_clean(ctx);
}

// The long-sequence target: 16384 keys for every query. The staged path would need 1 GiB
// for the scores alone; the fused kernel streams K and V and keeps O(N·d). About 69 GFLOP: a
// minute or two on lavapipe, so it runs as its own CTest entry (qkv_vulkan_long).
TEST_CASE("N = 16384, d = 64, one head: fused, under 64 MiB of device memory, right on sampled rows",
          "[vulkan][long]") {
    auto ctx = qkv_test::make_context({});  // a context of its own: the peak is this call's alone
    constexpr std::size_t N = 16384, d = 64;
    auto p = make_problem({.seq = N, .d_in = d, .d_k = d, .d_v = d, .heads = 1}, 16384);
    p.options.implementation = qkv::implementation::fused;
    p.options.kernel = FUSED_FAMILY();
    p.options.precision = qkv_test::case_precision(p.options.kernel, p.options.precision);
    INFO(family_name(p.options.kernel));
    const auto r = ctx.attention(p.view());
    REQUIRE(r.implementation == qkv::implementation::fused);
    REQUIRE(r.kernel == p.options.kernel);
    REQUIRE(r.output.size() == N * d);
    const std::uint64_t peak = ctx.peak_device_memory();
    INFO("peak device memory " << peak << " bytes");
    CHECK(peak < 64u * 1024 * 1024);
    for (float v : r.output) REQUIRE(std::isfinite(v));

    // float64 reference on 32 rows: both ends, odd positions, and a spread in between.
    const auto project = [&](const std::vector<float>& w) {
        std::vector<double> out(N * d, 0.0);
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t k = 0; k < d; ++k) {
                const double xv = p.x[i * d + k];
                for (std::size_t j = 0; j < d; ++j) out[i * d + j] += xv * w[k * d + j];
            }
        return out;
    };
    const std::vector<double> q = project(p.wq), k = project(p.wk), v = project(p.wv);
    std::vector<std::size_t> rows{0, 1, 3, 17, 113, 4095, 8191, 16383};
    for (std::size_t i = 0; rows.size() < 32; ++i) rows.push_back((i * 2654435761u + 12345) % N);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<float> got;
    std::vector<double> want;
    std::vector<double> s(N);
    for (const std::size_t i : rows) {
        double m = -INFINITY;
        for (std::size_t j = 0; j < N; ++j) {
            double dot = 0;
            for (std::size_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
            s[j] = dot * scale;
            m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (std::size_t c = 0; c < d; ++c) {
            double o = 0;
            for (std::size_t j = 0; j < N; ++j) o += s[j] * v[j * d + c];
            want.push_back(o / sum);
            got.push_back(r.output[i * d + c]);
        }
    }
    const double e = qkv_test::nmse(got, want);
    INFO("nmse on 32 sampled rows " << e);
    CHECK(e <= qkv_test::case_tolerance(p.options.kernel, 1e-9));
    require_clean(ctx);
}

// Past lavapipe's 65,535 loop iterations per invocation with real keys: N = 65,600, causal, narrow
// heads so it stays a few seconds. The cpu family in one dispatch per key chunk of at most 40,000
// keys (two chunks) and in its own chunking; float64 reference on sampled rows, the last included.
TEST_CASE("N = 65,600 causal, d = 3 / 4: the cpu kernel family gets every key", "[vulkan][long]") {
    constexpr std::size_t N = 65600, d_in = 4, dk = 3, dv = 4;
    auto p = make_problem({.seq = N, .d_in = d_in, .d_k = dk, .d_v = dv, .heads = 1, .causal = true}, 65600);
    p.options.implementation = qkv::implementation::fused;
    p.options.kernel = qkv::kernel_family::row_tiles;
    const auto project = [&](const std::vector<float>& w, std::size_t width) {
        std::vector<double> out(N * width, 0.0);
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t k = 0; k < d_in; ++k)
                for (std::size_t j = 0; j < width; ++j)
                    out[i * width + j] += double{p.x[i * d_in + k]} * w[k * width + j];
        return out;
    };
    const std::vector<double> q = project(p.wq, dk), k = project(p.wk, dk), v = project(p.wv, dv);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    std::vector<std::size_t> rows{0, 1, 8191, 65534, 65535, 65536, 65599};
    for (std::size_t i = 0; rows.size() < 24; ++i) rows.push_back((i * 2654435761u + 777) % N);
    std::vector<double> want;
    for (const std::size_t i : rows) {
        std::vector<double> s(i + 1);
        double m = -INFINITY;
        for (std::size_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (std::size_t c = 0; c < dk; ++c) dot += q[i * dk + c] * k[j * dk + c];
            m = std::max(m, s[j] = dot * scale);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (std::size_t c = 0; c < dv; ++c) {
            double o = 0;
            for (std::size_t j = 0; j <= i; ++j) o += s[j] * v[j * dv + c];
            want.push_back(o / sum);
        }
    }
    for (const std::uint32_t chunk : {40000u, 0u}) {
        auto ctx = qkv_test::make_context({.max_fused_keys_per_dispatch = chunk});
        INFO("at most " << chunk << " keys a dispatch (0: the device's own)");
        const auto r = ctx.attention(p.view());
        REQUIRE(r.kernel == qkv::kernel_family::row_tiles);
        std::vector<float> got;
        for (const std::size_t i : rows)
            for (std::size_t c = 0; c < dv; ++c) got.push_back(r.output[i * dv + c]);
        const double e = qkv_test::nmse(got, want);
        INFO("nmse on " << rows.size() << " sampled rows " << e);
        CHECK(e <= 1e-9);
        require_clean(ctx);
    }
}

// The key-chunk path of the fused kernel (several dispatches carrying the online-softmax state),
// which lavapipe takes for long sequences, forced here at small sizes with odd chunk lengths:
// every mask kind, causal, batches, heads, fully masked rows, both precisions.
TEST_CASE("fused attention split into key chunks matches the float64 reference", "[vulkan][sweep][chunks][families]") {
    const auto family = FUSED_FAMILY();
    std::uint64_t seed = 3000;
    const auto specs = sweep_specs();
    for (const std::uint32_t chunk : {3u, 37u, 64u}) {
        auto ctx = qkv_test::make_context({.max_fused_keys_per_dispatch = chunk});
        for (std::size_t i = chunk % 2; i < specs.size(); i += 2) {
            if (specs[i].seq <= chunk) continue;  // one chunk: the plain path, tested above
            auto p = make_problem(specs[i], seed++);
            p.options.implementation = qkv::implementation::fused;
            p.options.kernel = family;
            INFO(qkv_test::describe(specs[i])
                 << " fused, " << family_name(family) << ", at most " << chunk << " keys a dispatch");
            check_against_reference(ctx, p, 1e-10);
            if (ctx.device().fp16_storage && i % 4 < 2) {
                p.options.precision = qkv::precision::fp16;
                check_against_reference(ctx, p, 1e-5);
            }
        }
        // A NaN in one key's value poisons every row that attends to it, across chunk borders.
        auto p = make_problem({.seq = 9, .d_in = 4, .d_k = 4, .d_v = 4, .causal = true}, 77);
        p.options.implementation = qkv::implementation::fused;
        p.options.kernel = family;
        p.options.precision = qkv_test::case_precision(family, p.options.precision);
        p.wv[0] = 1.0f;
        p.x[5 * 4 + 0] = std::numeric_limits<float>::quiet_NaN();  // row 5 of x, so V row 5
        const auto r = ctx.attention(p.view());
        for (std::size_t row = 0; row < 9; ++row) {
            INFO("row " << row << ", chunks of " << chunk);
            CHECK(std::isnan(r.output[row * 4]) == (row >= 5));
        }
        require_clean(ctx);
    }
}
