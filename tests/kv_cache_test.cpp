// The device-resident K/V cache and the split-S decode kernels (context::sdpa with a kv_cache),
// on whatever device runs the suite (lavapipe in CI), validation layer on: the cache's contract
// (append, capacity, errors), parity with a float64 reference for both kernel families and both
// precisions, causal alignments and broadcast masks, a key count beyond llvmpipe's 65,535
// iterations per loop, identical bits over repeated runs, and the unsplit path against the split.
#include <qkv/runtime/half.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/decode_reference.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"

using qkv_test::gpu;
using qkv_test::require_clean;

namespace {

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

/// float32 -> float16 -> float32 (round to nearest even), for the fp16 reference.
double through_half(double x) {
    const float f = static_cast<float>(x);
    if (f == 0.0f || !std::isfinite(f)) return f;
    int e = 0;
    (void)std::frexp(f, &e);                    // f = m * 2^e, 0.5 <= |m| < 1
    const int ulp_exp = std::max(e - 11, -24);  // 11 significant bits; subnormals below 2^-14
    return std::nearbyint(static_cast<double>(f) / std::ldexp(1.0, ulp_exp)) * std::ldexp(1.0, ulp_exp);
}

struct decode_case {
    std::size_t batch = 1, q_heads = 8, kv_heads = 2, q_len = 1, kv_len = 300, d_qk = 16, d_v = 12;
    qkv::precision precision = qkv::precision::fp32;
    qkv::kernel_family kernel = qkv::kernel_family::automatic;
    bool causal = false;
    qkv::causal_alignment alignment = qkv::causal_alignment::bottom_right;
    bool mask = false, additive = false;
    std::size_t appends = 1;  // the keys arrive in this many appends
};

struct decode_data {
    qkv_test::decode_ref_problem ref;
    std::vector<float> q, k, v, additive;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> mask_shape;
};

decode_data make_data(const decode_case& c, std::uint64_t seed = 7) {
    std::mt19937_64 rng(seed);
    decode_data d;
    qkv_test::decode_ref_problem& r = d.ref;
    r.batch = c.batch, r.q_heads = c.q_heads, r.kv_heads = c.kv_heads, r.q_len = c.q_len, r.kv_len = c.kv_len;
    r.d_qk = c.d_qk, r.d_v = c.d_v;
    r.q = qkv_test::normal_values(c.batch * c.q_heads * c.q_len * c.d_qk, rng);
    r.k = qkv_test::normal_values(c.batch * c.kv_heads * c.kv_len * c.d_qk, rng);
    r.v = qkv_test::normal_values(c.batch * c.kv_heads * c.kv_len * c.d_v, rng);
    d.q = to_float(r.q), d.k = to_float(r.k), d.v = to_float(r.v);
    for (std::size_t i = 0; i < r.q.size(); ++i) r.q[i] = d.q[i];
    for (std::size_t i = 0; i < r.k.size(); ++i)
        r.k[i] = c.precision == qkv::precision::fp16 ? through_half(d.k[i]) : d.k[i];
    for (std::size_t i = 0; i < r.v.size(); ++i)
        r.v[i] = c.precision == qkv::precision::fp16 ? through_half(d.v[i]) : d.v[i];
    r.causal = c.causal;
    r.causal_offset = c.alignment == qkv::causal_alignment::top_left
                          ? 0
                          : static_cast<std::ptrdiff_t>(c.kv_len) - static_cast<std::ptrdiff_t>(c.q_len);
    if (c.mask || c.additive) {
        // (B, 1, L, S): broadcast over the heads.
        d.mask_shape = {c.batch, 1, c.q_len, c.kv_len};
        r.mask_dims[0] = c.batch, r.mask_dims[1] = 1, r.mask_dims[2] = c.q_len, r.mask_dims[3] = c.kv_len;
        const std::size_t n = c.batch * c.q_len * c.kv_len;
        std::bernoulli_distribution keep(0.7);
        if (c.mask) {
            d.mask.resize(n);
            for (auto& m : d.mask) m = keep(rng) ? 1 : 0;
            if (c.q_len > 1)  // one row with nothing to attend: zeros
                for (std::size_t j = 0; j < c.kv_len; ++j) d.mask[1 * c.kv_len + j] = 0;
            r.mask = d.mask;
        }
        if (c.additive) {
            std::uniform_real_distribution<double> u(-2.0, 1.0);
            d.additive.resize(n);
            for (auto& a : d.additive) a = static_cast<float>(u(rng));
            r.additive.assign(d.additive.begin(), d.additive.end());
        }
    }
    return d;
}

qkv::sdpa_problem problem_of(const decode_case& c, const decode_data& d) {
    qkv::sdpa_problem p;
    p.shape = {.batch = c.batch,
               .q_heads = c.q_heads,
               .kv_heads = c.kv_heads,
               .q_len = c.q_len,
               .kv_len = c.kv_len,
               .d_qk = c.d_qk,
               .d_v = c.d_v};
    p.q = d.q;
    p.mask = d.mask;
    p.additive_mask = d.additive;
    p.mask_shape = d.mask_shape;
    p.options.causal = c.causal;
    p.options.alignment = c.alignment;
    p.options.kernel = c.kernel;
    p.options.precision = c.precision;
    return p;
}

/// Fills a cache with d's keys and values in c.appends pieces.
void fill(qkv::vulkan::kv_cache& cache, const decode_case& c, const decode_data& d) {
    const std::size_t groups = c.batch * c.kv_heads;
    std::size_t done = 0;
    for (std::size_t a = 0; a < c.appends; ++a) {
        const std::size_t rows = a + 1 == c.appends ? c.kv_len - done : c.kv_len / c.appends;
        std::vector<float> k(groups * rows * c.d_qk), v(groups * rows * c.d_v);
        for (std::size_t z = 0; z < groups; ++z) {
            std::memcpy(k.data() + z * rows * c.d_qk, d.k.data() + (z * c.kv_len + done) * c.d_qk, rows * c.d_qk * 4);
            std::memcpy(v.data() + z * rows * c.d_v, d.v.data() + (z * c.kv_len + done) * c.d_v, rows * c.d_v * 4);
        }
        cache.append(k, v, rows);
        done += rows;
    }
    REQUIRE(cache.size() == c.kv_len);
}

qkv::vulkan::kv_cache make_cache(qkv::vulkan::context& ctx, const decode_case& c, std::size_t capacity = 0) {
    return qkv::vulkan::kv_cache(
        ctx, {.batch = c.batch,
              .kv_heads = c.kv_heads,
              .capacity = capacity ? capacity : c.kv_len,
              .d_qk = c.d_qk,
              .d_v = c.d_v,
              .type = c.precision == qkv::precision::fp16 ? qkv::element_type::f16 : qkv::element_type::f32});
}

double tolerance(qkv::precision p) { return p == qkv::precision::fp16 ? 1e-7 : 1e-9; }

/// Runs c on ctx and checks it against the float64 reference; returns the output. The
/// cooperative-matrix family runs it in fp16 (support/families.hpp).
std::vector<float> check_case(qkv::vulkan::context& ctx, decode_case c) {
    c.precision = qkv_test::case_precision(c.kernel, c.precision);
    const decode_data d = make_data(c);
    qkv::vulkan::kv_cache cache = make_cache(ctx, c, c.kv_len + 5);
    fill(cache, c, d);
    const qkv::sdpa_output out = ctx.sdpa(problem_of(c, d), cache);
    const std::vector<double> want = qkv_test::decode_reference(d.ref);
    const double err = qkv_test::nmse(out.output, want);
    INFO("B " << c.batch << " Hq " << c.q_heads << " Hkv " << c.kv_heads << " L " << c.q_len << " S " << c.kv_len
              << " E " << c.d_qk << " Ev " << c.d_v << " fp16 " << (c.precision == qkv::precision::fp16) << " kernel "
              << static_cast<int>(c.kernel) << " causal " << c.causal << " mask " << c.mask << " additive "
              << c.additive << " nmse " << err);
    CHECK(err < qkv_test::case_tolerance(c.kernel, tolerance(c.precision)));
    if (c.kernel != qkv::kernel_family::automatic) CHECK(out.kernel == c.kernel);
    require_clean(ctx);
    return out.output;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("kv_cache: append, size, capacity, clear and errors", "[kv_cache]") {
    qkv::vulkan::context& ctx = gpu();
    qkv::vulkan::kv_cache cache(ctx, {.batch = 2, .kv_heads = 3, .capacity = 10, .d_qk = 5, .d_v = 7});
    CHECK(cache.size() == 0);
    CHECK(cache.capacity() == 10);
    const std::vector<float> k4(2 * 3 * 4 * 5, 0.5f), v4(2 * 3 * 4 * 7, -0.25f);
    cache.append(k4, v4, 4);
    CHECK(cache.size() == 4);
    cache.append(k4, v4, 4);
    CHECK(cache.size() == 8);
    // past the capacity: limit_exceeded, nothing appended
    CHECK_THROWS_AS(cache.append(k4, v4, 4), qkv::vulkan::limit_exceeded);
    CHECK(cache.size() == 8);
    // wrong sizes: invalid_argument naming the expected shape, nothing appended
    const std::vector<float> short_k(k4.begin(), k4.end() - 1);
    try {
        cache.append(short_k, v4, 4);
        FAIL("no exception");
    } catch (const qkv::invalid_argument& e) {
        CHECK(std::string(e.what()).find("(2, 3, 4, 5)") != std::string::npos);
    }
    CHECK_THROWS_AS(cache.append(k4, v4, 3), qkv::invalid_argument);
    CHECK(cache.size() == 8);
    cache.clear();
    CHECK(cache.size() == 0);
    cache.append(k4, v4, 4);
    CHECK(cache.size() == 4);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = 0, .d_qk = 4, .d_v = 4}),
                    qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.batch = 1, .kv_heads = 0, .capacity = 4, .d_qk = 4, .d_v = 4}),
                    qkv::invalid_argument);
    // Rows wider than the kernels' 24-bit texel index, and more rows than 2^31: refused before
    // anything is allocated (a row was cut to 2^24 texels before, and appends wrote past it).
    constexpr std::size_t widest = std::size_t{0xffffff} * 4;
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.capacity = 1, .d_qk = widest + 4, .d_v = 4}),
                    qkv::vulkan::limit_exceeded);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.capacity = 1, .d_qk = 4, .d_v = widest + 1}),
                    qkv::vulkan::limit_exceeded);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.capacity = std::size_t{1} << 31, .d_qk = 4, .d_v = 4}),
                    qkv::vulkan::limit_exceeded);
    // sdpa against it: problem errors
    qkv::sdpa_problem p;
    p.shape = {.batch = 2, .q_heads = 6, .kv_heads = 3, .q_len = 1, .kv_len = 0, .d_qk = 5, .d_v = 7};
    std::vector<float> q(2 * 6 * 1 * 5, 1.0f);
    p.q = q;
    CHECK(ctx.sdpa(p, cache).output.size() == 2 * 6 * 7);
    p.shape.kv_len = 5;  // the cache holds 4
    CHECK_THROWS_AS(ctx.sdpa(p, cache), qkv::invalid_argument);
    p.shape.kv_len = 4;
    p.shape.d_qk = 4;
    CHECK_THROWS_AS(ctx.sdpa(p, cache), qkv::invalid_argument);
    p.shape.d_qk = 5;
    p.options.return_weights = true;
    CHECK_THROWS_AS(ctx.sdpa(p, cache), qkv::invalid_argument);
    p.options.return_weights = false;
    p.shape.q_heads = 4;  // 3 does not divide 4
    CHECK_THROWS_AS(ctx.sdpa(p, cache), qkv::invalid_argument);
    require_clean(ctx);
}

TEST_CASE("kv_cache: fp16 refuses values beyond float16's range", "[kv_cache]") {
    qkv::vulkan::kv_cache cache(
        gpu(), {.batch = 1, .kv_heads = 1, .capacity = 4, .d_qk = 2, .d_v = 2, .type = qkv::element_type::f16});
    std::vector<float> k{1.0f, 2.0f}, v{3.0f, 70000.0f};
    CHECK_THROWS_AS(cache.append(k, v, 1), qkv::vulkan::numeric_overflow);
    CHECK(cache.size() == 0);
    v[1] = 65504.0f;  // the largest float16
    cache.append(k, v, 1);
    CHECK(cache.size() == 1);
    require_clean(gpu());
}

TEST_CASE("kv_cache: append_f16 stores what append stores of the same values", "[kv_cache][f16]") {
    // Two groups of 3 rows, E = 5 and Ev = 3 (padded to whole texels), with the special halves:
    // ±0, a subnormal, the largest, ±inf, a quiet and a signalling NaN (made quiet, as the float32
    // round trip makes it).
    constexpr std::size_t Hkv = 2, rows = 3, E = 5, Ev = 3;
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<std::uint16_t> k(Hkv * rows * E), v(Hkv * rows * Ev);
    for (auto& h : k) h = qkv::to_half_bits(normal(rng));
    for (auto& h : v) h = qkv::to_half_bits(normal(rng));
    const std::vector<std::uint16_t> special{0x0000, 0x8000, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfd55};
    std::vector<std::uint16_t> k_special = k, v_special = v;
    std::copy(special.begin(), special.end(), k_special.begin() + 7);
    std::copy(special.begin(), special.begin() + 5, v_special.begin() + 11);
    const auto widened = [](const std::vector<std::uint16_t>& h) {
        std::vector<float> f(h.size());
        qkv::from_half_bits(h, f);
        return f;
    };
    const auto bits = [](const std::vector<float>& f) {
        std::vector<std::uint32_t> b(f.size());
        std::memcpy(b.data(), f.data(), f.size() * 4);
        return b;
    };
    qkv::vulkan::context staged = qkv_test::make_context({.force_staging = true});
    for (qkv::vulkan::context* ctx : {&gpu(), &staged})
        for (const qkv::element_type type : {qkv::element_type::f16, qkv::element_type::f32}) {
            INFO("type " << qkv::to_string(type) << (ctx == &staged ? ", staged" : ""));
            const qkv::kv_layout layout{.batch = 1, .kv_heads = Hkv, .capacity = 8, .d_qk = E, .d_v = Ev, .type = type};
            qkv::vulkan::kv_cache halves(*ctx, layout), floats(*ctx, layout);
            halves.append_f16(k, v, rows), floats.append(widened(k), widened(v), rows);
            halves.append_f16(k_special, v_special, rows), floats.append(widened(k_special), widened(v_special), rows);
            CHECK(halves.size() == 2 * rows);
            CHECK(bits(halves.keys().download()) == bits(floats.keys().download()));
            CHECK(bits(halves.values().download()) == bits(floats.values().download()));
            // Sizes are checked as append() checks them; nothing is appended.
            CHECK_THROWS_WITH(halves.append_f16(std::span(k).first(k.size() - 1), v, rows),
                              Catch::Matchers::Contains("kv_cache::append: k has 29 elements"));
            CHECK(halves.size() == 2 * rows);
        }
    // The facts of the rows (the overflow rule's statistics) are those of the float32 values: the
    // same decode, bit for bit.
    qkv::vulkan::kv_cache halves(
        gpu(), {.batch = 1, .kv_heads = Hkv, .capacity = 8, .d_qk = E, .d_v = Ev, .type = qkv::element_type::f16});
    qkv::vulkan::kv_cache floats(gpu(), halves.layout());
    halves.append_f16(k, v, rows), floats.append(widened(k), widened(v), rows);
    std::vector<float> q(4 * E);
    for (float& x : q) x = normal(rng);
    qkv::sdpa_problem p;
    p.shape = {.batch = 1, .q_heads = 4, .kv_heads = Hkv, .q_len = 1, .kv_len = rows, .d_qk = E, .d_v = Ev};
    p.q = q;
    p.options.precision = qkv::precision::fp16;
    CHECK(bits(gpu().sdpa(p, halves).output) == bits(gpu().sdpa(p, floats).output));
    // A quantized cache takes the float32 values, with its refusals (an infinite value).
    qkv::vulkan::kv_cache blocks(
        gpu(), {.batch = 1, .kv_heads = 1, .capacity = 4, .d_qk = 32, .d_v = 32, .type = qkv::element_type::q8_0});
    std::vector<std::uint16_t> block_k(32, 0x3c00), block_v(32, 0xbc00);
    blocks.append_f16(block_k, block_v, 1);
    block_v[3] = 0x7c00;
    CHECK_THROWS_AS(blocks.append_f16(block_k, block_v, 1), qkv::invalid_argument);
    CHECK(blocks.size() == 1);
    require_clean(gpu());
    require_clean(staged);
}

TEST_CASE("kv_cache: out of device memory at creation", "[kv_cache]") {
    qkv::vulkan::context ctx = qkv_test::make_context({.device_memory_limit = 1 << 20});
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.batch = 1, .kv_heads = 2, .capacity = 65536, .d_qk = 64, .d_v = 64}),
                    qkv::vulkan::out_of_memory);
    CHECK(ctx.device_memory_allocated() == 0);
    // the context still works: a cache that fits
    qkv::vulkan::kv_cache small(ctx, {.batch = 1, .kv_heads = 1, .capacity = 64, .d_qk = 8, .d_v = 8});
    CHECK(small.capacity() == 64);
    require_clean(ctx);
}

TEST_CASE("decode: parity with the float64 reference", "[kv_cache][decode][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    const qkv::precision precision = GENERATE(qkv::precision::fp32, qkv::precision::fp16);
    const std::size_t q_len = GENERATE(std::size_t{1}, std::size_t{3});
    const std::size_t kv_len = GENERATE(std::size_t{1}, std::size_t{300}, std::size_t{5000});
    if (qkv_test::case_precision(family, precision) != precision) return;  // coopmat: the fp16 cases only
    decode_case c;
    c.kernel = family, c.precision = precision, c.q_len = q_len, c.kv_len = kv_len;
    c.appends = kv_len > 1 ? 3 : 1;
    (void)check_case(gpu(), c);
}

TEST_CASE("decode: head widths 64 and odd, batches", "[kv_cache][decode][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    decode_case c;
    c.kernel = family;
    c.d_qk = 64, c.d_v = 64, c.kv_len = 2000, c.q_len = 1;
    (void)check_case(gpu(), c);
    c.batch = 2, c.q_heads = 3, c.kv_heads = 3, c.d_qk = 17, c.d_v = 5, c.kv_len = 1500, c.q_len = 3;
    (void)check_case(gpu(), c);
}

TEST_CASE("decode: causal alignments and broadcast masks", "[kv_cache][decode][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    decode_case c;
    c.kernel = family;
    c.q_len = 3, c.kv_len = 2500, c.batch = 2;
    c.causal = true;
    c.alignment = qkv::causal_alignment::bottom_right;
    (void)check_case(gpu(), c);
    c.alignment = qkv::causal_alignment::top_left;  // rows see 1, 2, 3 keys
    (void)check_case(gpu(), c);
    c.causal = false;
    c.mask = true;
    (void)check_case(gpu(), c);
    c.additive = true;
    c.causal = true;
    c.alignment = qkv::causal_alignment::bottom_right;
    (void)check_case(gpu(), c);
}

TEST_CASE("decode: more keys than llvmpipe's 65,535 loop iterations", "[kv_cache][decode][long][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    decode_case c;
    c.kernel = family;
    c.q_heads = 2, c.kv_heads = 1, c.d_qk = 4, c.d_v = 4, c.kv_len = 70001, c.q_len = 1;
    (void)check_case(gpu(), c);
    qkv::vulkan::context unsplit = qkv_test::make_context({.max_decode_chunks = 1});
    (void)check_case(unsplit, c);
}

TEST_CASE("decode: ten runs give identical bits; the unsplit path agrees", "[kv_cache][decode][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    decode_case c;
    c.kernel = family, c.kv_len = 5000, c.q_len = 1;
    c.precision = qkv_test::case_precision(family, c.precision);
    const decode_data d = make_data(c);
    qkv::vulkan::context& ctx = gpu();
    qkv::vulkan::kv_cache cache = make_cache(ctx, c);
    fill(cache, c, d);
    const qkv::sdpa_problem p = problem_of(c, d);
    const std::vector<float> first = ctx.sdpa(p, cache).output;
    for (int run = 1; run < 10; ++run) CHECK(same_bits(ctx.sdpa(p, cache).output, first));

    qkv::vulkan::context unsplit = qkv_test::make_context({.max_decode_chunks = 1});
    qkv::vulkan::kv_cache cache1 = make_cache(unsplit, c);
    fill(cache1, c, d);
    const std::vector<float> one = unsplit.sdpa(p, cache1).output;
    const std::vector<double> want(one.begin(), one.end());
    // (the cooperative-matrix family rounds each chunk's weights to float16 against its own maximum)
    CHECK(qkv_test::nmse(first, want) < qkv_test::case_tolerance(family, 1e-10));
    CHECK_FALSE(same_bits(first, std::vector<float>(first.size(), 0.0f)));
    require_clean(ctx);
    require_clean(unsplit);
}

TEST_CASE("kv_cache: a prefill's upload staging is given back, a decode step's kept", "[kv_cache]") {
    // Through staging (as on a discrete GPU), under a device memory limit with room for two 2 MiB
    // caches and one prefill's staging at a time: a cache that kept the staging of its 2 MiB
    // prefill would leave no room for the second's.
    constexpr std::size_t Hkv = 2, S = 2048, E = 64, cache_bytes = 2 * Hkv * S * E * 4;
    qkv::vulkan::context ctx =
        qkv_test::make_context({.device_memory_limit = 3 * cache_bytes + 512 * 1024, .force_staging = true});
    const qkv::kv_layout shape{.batch = 1, .kv_heads = Hkv, .capacity = S, .d_qk = E, .d_v = E};
    qkv::vulkan::kv_cache first(ctx, shape);
    const std::vector<float> k(Hkv * (S - 1) * E, 0.5f), v(Hkv * (S - 1) * E, -0.25f);
    first.append(k, v, S - 1);
    qkv::vulkan::kv_cache second(ctx, shape);
    second.append(k, v, S - 1);
    first.append(std::vector<float>(Hkv * E, 1.0f), std::vector<float>(Hkv * E, 2.0f), 1);
    CHECK(first.size() == S);
    CHECK(second.size() == S - 1);
    require_clean(ctx);
}

TEST_CASE("decode: staged uploads and the shared-memory maxima", "[kv_cache][decode]") {
    decode_case c;
    c.q_len = 3, c.kv_len = 3000;
    qkv::vulkan::context staged = qkv_test::make_context({.force_staging = true});
    c.kernel = qkv::kernel_family::row_tiles;
    (void)check_case(staged, c);
    // The gpu variant as on a device without subgroup arithmetic: maxima through shared memory.
    qkv::vulkan::device_info no_subgroups = gpu().device();
    no_subgroups.subgroup_arithmetic = false;
    qkv::vulkan::context tree = qkv_test::make_context({.fused_tiles_as = no_subgroups});
    c.kernel = qkv::kernel_family::block_tiles;
    (void)check_case(tree, c);
}

TEST_CASE("sdpa with host K/V takes the decode kernels for decode shapes", "[kv_cache][decode][families]") {
    const qkv::kernel_family family = GENERATE(from_range(qkv_test::fused_families()));
    decode_case c;
    c.kernel = family, c.q_len = 1, c.kv_len = 3000;
    c.precision = qkv_test::case_precision(family, c.precision);
    const decode_data d = make_data(c);
    qkv::sdpa_problem p = problem_of(c, d);
    p.k = d.k;
    p.v = d.v;
    qkv::vulkan::context& ctx = gpu();
    const qkv::sdpa_output host = ctx.sdpa(p);
    CHECK(host.kernel == family);
    CHECK(qkv_test::nmse(host.output, qkv_test::decode_reference(d.ref)) < qkv_test::case_tolerance(family, 1e-9));
    // the same bits as through a cache: it is the same kernel
    qkv::vulkan::kv_cache cache = make_cache(ctx, c);
    fill(cache, c, d);
    CHECK(same_bits(host.output, ctx.sdpa(problem_of(c, d), cache).output));
    require_clean(ctx);
}
