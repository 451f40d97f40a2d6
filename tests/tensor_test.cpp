// Device tensors and planned calls (qkv/vulkan/tensor.hpp): tensors up and down in both element
// types, sdpa_call::run over tensors on the fused and the decode route against the float64
// reference, a K/V cache filled from tensors, the device's overflow verdict, and misuse refused.
// Validation layer on. (Recording into a caller's command buffer: tests/interop_test.cpp.)
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/gpu.hpp"

using qkv_test::require_clean;

namespace {

std::vector<float> normal(std::size_t n, std::mt19937_64& rng, float sigma = 1.0f) {
    std::normal_distribution<float> d(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isfinite(want[i])) REQUIRE(std::isfinite(got[i]));
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

struct case_spec {
    std::size_t batch, hq, hkv, L, S, E, Ev;
    bool causal = false, mask = false;
};

}  // namespace

TEST_CASE("tensor: upload and download in f32 and f16, misuse refused", "[tensor]") {
    auto ctx = qkv_test::make_context({});
    std::mt19937_64 rng(1);
    const std::vector<float> x = normal(3 * 17, rng);
    qkv::vulkan::tensor t(ctx, {3, 17});
    CHECK(t.elements() == 51);
    CHECK(t.bytes() == 51 * 4);
    CHECK_FALSE(t.wraps_caller_memory());
    t.upload(x);
    CHECK(t.download() == x);
    qkv::vulkan::tensor h(ctx, {51}, qkv::element_type::f16);
    h.upload(x);
    const std::vector<float> back = h.download();
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(back[i] - x[i]) <= std::fabs(x[i]) * 0x1p-11f);
    std::vector<float> big(x.size(), 0.5f);  // every value other than back's: a partial write would show
    big[7] = 70000.0f;
    CHECK_THROWS_AS(h.upload(big), qkv::vulkan::numeric_overflow);
    CHECK(h.download() == back);  // nothing was written
    CHECK_THROWS_AS(t.upload(std::vector<float>(50)), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::tensor(ctx, {3, 0}), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::tensor(ctx, {4}, qkv::element_type::q8_0), qkv::invalid_argument);
    qkv::vulkan::tensor moved = std::move(t);
    CHECK_THROWS_AS((void)t.download(), qkv::error);
    CHECK(moved.download() == x);
    require_clean(ctx);
}

TEST_CASE("tensor: i32 up and down as int32, refused where floats are needed", "[tensor]") {
    auto ctx = qkv_test::make_context({});
    const std::vector<std::int32_t> idx{0, -1, 7, 2147483647, -2147483647 - 1, 65536, 3, 113, -17, 16777217};
    qkv::vulkan::tensor t(ctx, {2, 5}, qkv::element_type::i32);
    CHECK(t.bytes() == 40);
    t.upload(idx);
    CHECK(t.download_int32() == idx);  // every bit kept (2^24 + 1 is no float32)
    const std::vector<float> x(10, 1.0f);
    qkv_test::expect_invalid([&] { t.upload(x); }, {"tensor::upload", "i32", "int32 values"});
    qkv_test::expect_invalid([&] { (void)t.download(); }, {"tensor::download", "download_int32"});
    qkv_test::expect_invalid([&] { t.upload(std::vector<std::int32_t>(9)); }, {"9 values", "10 elements"});
    CHECK(t.download_int32() == idx);  // nothing was written
    qkv::vulkan::tensor f(ctx, {10});
    qkv_test::expect_invalid([&] { f.upload(idx); }, {"tensor::upload", "f32", "i32 tensors only"});
    qkv_test::expect_invalid([&] { (void)f.download_int32(); }, {"download_int32", "f32"});
    // An i32 q is refused by a call that takes floats, naming the tensor and the type it needs.
    qkv::sdpa_problem d;
    d.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 4, .d_qk = 4, .d_v = 4};
    qkv::vulkan::sdpa_call call(ctx, d);
    qkv::vulkan::tensor q(ctx, {1, 1, 1, 4}, qkv::element_type::i32), k(ctx, {1, 1, 4, 4}), v(ctx, {1, 1, 4, 4}),
        out(ctx, {1, 1, 1, 4});
    qkv_test::expect_invalid([&] { call.run({.q = &q, .k = &k, .v = &v, .out = &out}); }, {"q tensor", "i32", "f32"});
    require_clean(ctx);
}

TEST_CASE("sdpa_call: run over device tensors, fused and decode routes", "[tensor][sdpa]") {
    auto ctx = qkv_test::make_context({});
    const case_spec cases[] = {
        {1, 1, 1, 1, 1, 4, 4},                // the smallest
        {2, 4, 2, 17, 113, 16, 12, true},     // fused, GQA, causal
        {1, 3, 3, 3, 17, 8, 8, false, true},  // fused, a bool mask
        {1, 8, 2, 1, 1500, 64, 64},           // decode
        {2, 6, 2, 2, 1200, 16, 20, true},     // decode, causal bottom-right
    };
    for (const case_spec& c : cases)
        for (const auto precision : {qkv::precision::fp32, qkv::precision::fp16}) {
            INFO("B " << c.batch << " Hq " << c.hq << " Hkv " << c.hkv << " L " << c.L << " S " << c.S << " E " << c.E
                      << " Ev " << c.Ev << (precision == qkv::precision::fp16 ? " fp16" : " fp32"));
            std::mt19937_64 rng(c.S * 7 + c.L);
            std::vector<float> q = normal(c.batch * c.hq * c.L * c.E, rng),
                               k = normal(c.batch * c.hkv * c.S * c.E, rng),
                               v = normal(c.batch * c.hkv * c.S * c.Ev, rng);
            const bool fp16 = precision == qkv::precision::fp16;
            if (fp16)  // the reference of float16 storage: the inputs rounded
                for (auto* t : {&q, &k, &v}) {
                    qkv::vulkan::tensor r(ctx, {t->size()}, qkv::element_type::f16);
                    r.upload(*t);
                    *t = r.download();
                }
            std::vector<std::uint8_t> mask;
            qkv::sdpa_problem desc;
            desc.shape = {.batch = c.batch,
                          .q_heads = c.hq,
                          .kv_heads = c.hkv,
                          .q_len = c.L,
                          .kv_len = c.S,
                          .d_qk = c.E,
                          .d_v = c.Ev};
            desc.options.causal = c.causal;
            desc.options.alignment = qkv::causal_alignment::bottom_right;
            desc.options.precision = precision;
            if (c.mask) {
                for (std::size_t i = 0; i < c.L * c.S; ++i) mask.push_back(i % 3 != 0 ? 1 : 0);
                desc.mask = mask;
            }
            qkv::sdpa_problem host = desc;
            host.q = q, host.k = k, host.v = v;
            const std::vector<double> want = qkv::cpu::sdpa_f64(host).output;

            const auto type = fp16 ? qkv::element_type::f16 : qkv::element_type::f32;
            qkv::vulkan::tensor tq(ctx, {c.batch, c.hq, c.L, c.E}, type), tk(ctx, {c.batch, c.hkv, c.S, c.E}, type),
                tv(ctx, {c.batch, c.hkv, c.S, c.Ev}, type), out(ctx, {c.batch, c.hq, c.L, c.Ev});
            tq.upload(q), tk.upload(k), tv.upload(v);
            qkv::vulkan::sdpa_call call(ctx, desc);
            call.run({.q = &tq, .k = &tk, .v = &tv, .out = &out});
            CHECK(nmse(out.download(), want) <= (fp16 ? 1e-10 : 1e-10));
            // The host call on the same problem gives the same kernel family.
            CHECK(call.kernel() == ctx.sdpa(host).kernel);
            require_clean(ctx);
        }
}

TEST_CASE("sdpa_call: decode against a cache filled from tensors", "[tensor][cache]") {
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t B = 1, Hq = 4, Hkv = 2, E = 16, Ev = 8, capacity = 2000;
    std::mt19937_64 rng(5);
    qkv::vulkan::kv_cache cache(ctx, {.batch = B, .kv_heads = Hkv, .capacity = capacity, .d_qk = E, .d_v = Ev});
    std::vector<float> all_k, all_v;
    qkv::sdpa_problem desc;
    desc.shape = {.batch = B, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = Ev};
    qkv::vulkan::sdpa_call call(ctx, desc, cache);
    qkv::vulkan::tensor tq(ctx, {B, Hq, 1, E}), out(ctx, {B, Hq, 1, Ev});
    // Appends of 700 and then 1 row at a time from device tensors, one from the host between.
    std::size_t held = 0;
    for (const std::size_t rows : {700u, 1u, 400u, 1u}) {
        const std::vector<float> k = normal(B * Hkv * rows * E, rng), v = normal(B * Hkv * rows * Ev, rng);
        if (rows == 400) {
            cache.append(k, v, rows);  // the host form
        } else {
            qkv::vulkan::tensor tk(ctx, {B, Hkv, rows, E}), tv(ctx, {B, Hkv, rows, Ev});
            tk.upload(k), tv.upload(v);
            cache.append(tk, tv, rows);
        }
        // Keep (B, Hkv, S, E) on the host for the reference.
        std::vector<float> nk, nv;
        const auto append = [](std::vector<float>& to, const std::vector<float>& from, std::size_t first,
                               std::size_t count) {
            for (std::size_t i = 0; i < count; ++i) to.push_back(from[first + i]);
        };
        for (std::size_t z = 0; z < B * Hkv; ++z) {
            append(nk, all_k, z * held * E, held * E);
            append(nk, k, z * rows * E, rows * E);
            append(nv, all_v, z * held * Ev, held * Ev);
            append(nv, v, z * rows * Ev, rows * Ev);
        }
        all_k = nk, all_v = nv, held += rows;
        REQUIRE(cache.size() == held);
        const std::vector<float> q = normal(B * Hq * E, rng);
        tq.upload(q);
        call.run({.q = &tq, .out = &out});
        qkv::sdpa_problem host = desc;
        host.shape.kv_len = held;
        host.q = q, host.k = all_k, host.v = all_v;
        INFO("held " << held);
        CHECK(nmse(out.download(), qkv::cpu::sdpa_f64(host).output) <= 1e-10);
        require_clean(ctx);
    }
    // The storage tensors: the first key row as appended, padded to whole texels.
    const std::vector<float> stored = cache.keys().download();
    CHECK(cache.keys().shape() == std::vector<std::size_t>{B, Hkv, capacity, E});
    for (std::size_t c = 0; c < E; ++c) CHECK(stored[c] == all_k[c]);
}

TEST_CASE("sdpa_call: the device's verdict on inputs beyond float32", "[tensor][overflow]") {
    auto ctx = qkv_test::make_context({});
    std::mt19937_64 rng(9);
    for (const std::size_t S : {5u, 1100u}) {  // fused, decode
        qkv::sdpa_problem desc;
        desc.shape = {.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 1, .kv_len = S, .d_qk = 8, .d_v = 8};
        desc.options.scale = 1e38f;  // the scores leave float32
        std::vector<float> q = normal(16, rng), k = normal(S * 8, rng), v = normal(S * 8, rng);
        qkv::vulkan::tensor tq(ctx, {1, 2, 1, 8}), tk(ctx, {1, 1, S, 8}), tv(ctx, {1, 1, S, 8}), out(ctx, {1, 2, 1, 8});
        tq.upload(q), tk.upload(k), tv.upload(v);
        qkv::vulkan::sdpa_call call(ctx, desc);
        INFO("S = " << S);
        CHECK_THROWS_AS(call.run({.q = &tq, .k = &tk, .v = &tv, .out = &out}), qkv::vulkan::numeric_overflow);
        // Values whose sum leaves float32: refused (the tensor path accumulates them unscaled).
        desc.options.scale = std::nullopt;
        std::fill(v.begin(), v.end(), 3e38f);
        tv.upload(v);
        qkv::vulkan::sdpa_call sums(ctx, desc);
        CHECK_THROWS_WITH(sums.run({.q = &tq, .k = &tk, .v = &tv, .out = &out}),
                          Catch::Matchers::Contains("value sums"));
        // NaN inputs follow the NaN rules: no verdict.
        v[3] = std::numeric_limits<float>::quiet_NaN();
        std::fill(v.begin() + 4, v.end(), 1.0f);
        v[0] = v[1] = v[2] = 1.0f;
        tv.upload(v);
        CHECK_NOTHROW(sums.run({.q = &tq, .k = &tk, .v = &tv, .out = &out}));
        require_clean(ctx);
    }
}

TEST_CASE("sdpa_call: tensors that do not fit the description are refused", "[tensor]") {
    auto ctx = qkv_test::make_context({});
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 3, .kv_len = 5, .d_qk = 8, .d_v = 4};
    qkv::vulkan::sdpa_call call(ctx, desc);
    qkv::vulkan::tensor q(ctx, {1, 2, 3, 8}), k(ctx, {1, 1, 5, 8}), v(ctx, {1, 1, 5, 4}), out(ctx, {1, 2, 3, 4}),
        wrong(ctx, {1, 1, 5, 7}), half(ctx, {1, 2, 3, 8}, qkv::element_type::f16);
    CHECK_THROWS_AS(call.run({.q = &q, .k = &k, .v = &wrong, .out = &out}), qkv::invalid_argument);
    CHECK_THROWS_AS(call.run({.q = &half, .k = &k, .v = &v, .out = &out}), qkv::invalid_argument);
    CHECK_THROWS_AS(call.run({.q = &q, .k = &k, .v = &v}), qkv::invalid_argument);
    std::vector<float> data(24, 1.0f);
    qkv::sdpa_problem with_data = desc;
    with_data.q = data;
    CHECK_THROWS_AS(qkv::vulkan::sdpa_call(ctx, with_data), qkv::invalid_argument);
    require_clean(ctx);
}

TEST_CASE("sequence: several layers' decode calls in one submit equal the host calls", "[tensor][sequence]") {
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t layers = 3, Hq = 4, Hkv = 2, E = 16, S = 1030;
    std::mt19937_64 rng(17);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    std::vector<qkv::vulkan::kv_cache> caches;
    std::vector<qkv::vulkan::sdpa_call> calls;
    std::vector<qkv::vulkan::tensor> qs, outs;
    std::vector<std::vector<float>> host_q;
    for (std::size_t l = 0; l < layers; ++l) {
        caches.emplace_back(ctx, qkv::kv_layout{.batch = 1, .kv_heads = Hkv, .capacity = S, .d_qk = E, .d_v = E});
        caches.back().append(normal(Hkv * S * E, rng), normal(Hkv * S * E, rng), S);
        calls.emplace_back(ctx, desc, caches.back());
        host_q.push_back(normal(Hq * E, rng));
        qs.emplace_back(ctx, std::vector<std::size_t>{1, Hq, 1, E});
        qs.back().upload(host_q.back());
        outs.emplace_back(ctx, std::vector<std::size_t>{1, Hq, 1, E});
    }
    qkv::vulkan::sequence seq(ctx);
    for (int round = 0; round < 2; ++round) {  // recorded again after a run: the previous scratch goes
        for (std::size_t l = 0; l < layers; ++l) seq.record(calls[l], {.q = &qs[l], .out = &outs[l]});
        seq.run();
        for (std::size_t l = 0; l < layers; ++l) {
            qkv::sdpa_problem host = desc;
            host.q = host_q[l];
            CHECK(outs[l].download() == ctx.sdpa(host, caches[l]).output);  // the same kernels, the same bits
        }
    }
    seq.run();  // nothing recorded: nothing to do
    require_clean(ctx);
}

TEST_CASE("sdpa_call over a cache: the decode's check of q and the output, run and in a sequence",
          "[tensor][sequence][overflow]") {
    // A decode recorded over a cache checks q's rows as its kernel reads q (or, where the kernel's
    // texels are not q's values or the family reads none, in the merge) and its output in the
    // merge's dispatch: q's norms must reach the verdict (scores beyond float32 refused), and a NaN
    // in q must be seen as an input's (the NaN rules: a NaN output, no verdict), for float32 and
    // float16 q, each kernel of the decode: the cpu one unrolled (E = 16, read in place), over
    // packed rows padded to whole texels (E = 17) and its wide form (E = 160); the gpu one; the
    // cooperative-matrix one where the device has it (fp16).
    // And the merge's output flag by a subgroup vote, where the device offers votes (a hook: the
    // plan keeps the per-element flag on a CPU device).
    auto plain = qkv_test::make_context({});
    auto voting = qkv_test::make_context({.decode_vote = true});
    std::mt19937_64 rng(31);
    constexpr std::size_t Hq = 4, Hkv = 2, S = 17;
    struct variant {
        std::size_t e;
        qkv::kernel_family kernel;
        bool vote;
    };
    const variant variants[] = {
        {16, qkv::kernel_family::automatic, false},  {17, qkv::kernel_family::automatic, false},
        {160, qkv::kernel_family::automatic, false}, {17, qkv::kernel_family::block_tiles, false},
        {16, qkv::kernel_family::coopmat, false},    {17, qkv::kernel_family::automatic, true}};
    for (const variant& va : variants)
        for (const bool half : {false, true}) {
            qkv::vulkan::context& ctx = va.vote ? voting : plain;
            if (va.vote && !ctx.device().subgroup_vote) continue;
            const std::size_t E = va.e;
            if (half && !ctx.device().fp16_storage) continue;
            if (va.kernel == qkv::kernel_family::coopmat && (!half || !ctx.device().cooperative_matrix)) continue;
            if (E == 160 && half) continue;  // one wide case is enough
            const qkv::element_type type = half ? qkv::element_type::f16 : qkv::element_type::f32;
            qkv::sdpa_problem desc;
            desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
            if (half) desc.options.precision = qkv::precision::fp16;
            desc.options.kernel = va.kernel;
            qkv::vulkan::kv_cache cache(
                ctx, qkv::kv_layout{.batch = 1, .kv_heads = Hkv, .capacity = S, .d_qk = E, .d_v = E, .type = type});
            cache.append(normal(Hkv * S * E, rng), normal(Hkv * S * E, rng), S);
            std::vector<float> q = normal(Hq * E, rng);
            qkv::vulkan::tensor tq(ctx, {1, Hq, 1, E}, type), out(ctx, {1, Hq, 1, E});
            tq.upload(q);
            INFO((half ? "fp16" : "fp32")
                 << ", E = " << E << ", kernel " << static_cast<int>(va.kernel) << (va.vote ? ", vote" : ""));
            // Scores beyond float32 (q's norms times k's times the scale): refused.
            qkv::sdpa_problem big = desc;
            big.options.scale = 1e38f;
            qkv::vulkan::sdpa_call over(ctx, big, cache);
            CHECK_THROWS_AS(over.run({.q = &tq, .out = &out}), qkv::vulkan::numeric_overflow);
            qkv::vulkan::sequence seq(ctx);
            seq.record(over, {.q = &tq, .out = &out});
            CHECK_THROWS_AS(seq.run(), qkv::vulkan::numeric_overflow);
            // The same q at the default scale: the host call's answer.
            qkv::vulkan::sdpa_call call(ctx, desc, cache);
            qkv::sdpa_problem host = desc;
            host.q = q;
            const std::vector<float> want = ctx.sdpa(host, cache).output;
            seq.record(call, {.q = &tq, .out = &out});
            seq.run();
            CHECK(out.download() == want);
            // A NaN in a row of q: that row's output is NaN, and no verdict.
            q[E + 3] = std::numeric_limits<float>::quiet_NaN();
            tq.upload(q);
            seq.record(call, {.q = &tq, .out = &out});
            CHECK_NOTHROW(seq.run());
            const std::vector<float> got = out.download();
            CHECK(std::isnan(got[E]));
            CHECK(std::isfinite(got[0]));
            CHECK_NOTHROW(call.run({.q = &tq, .out = &out}));
            require_clean(ctx);
        }
}

TEST_CASE("sequence: a decode over a cache holding infinities takes the host call's kernel", "[tensor][sequence]") {
    // A recorded decode chooses its kernel as a host call does: for finite values where the
    // cache's rows are all finite (no append pending), else the careful one. Key 0's value is
    // infinite and its weight underflows to 0 once key 1's score (200 higher) is seen: the kernel
    // for finite values would rescale the infinity by 0 (NaN); the careful one does not.
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t E = 4, S = 3;
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> k = {1, 0, 0, 0, 401, 0, 0, 0, -1, 0, 0, 0};
    const std::vector<float> v = {inf, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const std::vector<float> finite_v = {0.5f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    qkv::vulkan::kv_cache cache(ctx, qkv::kv_layout{.batch = 1, .kv_heads = 1, .capacity = S, .d_qk = E, .d_v = E});
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    desc.options.scale = 1.0f;
    const std::vector<float> q = {1, 0, 0, 0};
    qkv::vulkan::tensor tq(ctx, {1, 1, 1, E}), out(ctx, {1, 1, 1, E});
    tq.upload(q);
    const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        REQUIRE(a.size() == b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
            INFO(i << ": " << a[i] << " vs " << b[i]);
            CHECK(((std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i]));
        }
    };
    qkv::sdpa_problem host = desc;
    host.q = q;
    cache.append(k, v, S);
    qkv::vulkan::sdpa_call call(ctx, desc, cache);
    const std::vector<float> want = ctx.sdpa(host, cache).output;
    qkv::vulkan::sequence seq(ctx);
    seq.record(call, {.q = &tq, .out = &out});
    seq.run();
    same(out.download(), want);
    call.run({.q = &tq, .out = &out});
    same(out.download(), want);

    // Recorded over finite rows, which are then replaced by these before the run: the result is
    // the host call's over them, or the run refuses it; never the finite kernel's answer.
    cache.clear();
    cache.append(k, finite_v, S);
    seq.record(call, {.q = &tq, .out = &out});
    cache.clear();
    cache.append(k, v, S);
    try {
        seq.run();
        same(out.download(), want);
    } catch (const qkv::vulkan::numeric_overflow&) {
        SUCCEED("refused");
    }
    require_clean(ctx);
}

namespace {

/// A one-head cache of width E with `rows` host rows, the rows kept for the reference.
struct small_cache {
    static constexpr std::size_t E = 16;
    qkv::vulkan::kv_cache cache;
    std::vector<float> k, v;  // (1, 1, size, E)

    small_cache(qkv::vulkan::context& ctx, std::size_t capacity, std::size_t rows, std::mt19937_64& rng)
        : cache(ctx, qkv::kv_layout{.batch = 1, .kv_heads = 1, .capacity = capacity, .d_qk = E, .d_v = E}),
          k(normal(rows * E, rng)),
          v(normal(rows * E, rng)) {
        cache.append(k, v, rows);
    }
    /// The float64 reference of one query against the rows held.
    [[nodiscard]] std::vector<double> attend(const std::vector<float>& q) const {
        qkv::sdpa_problem p;
        p.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = k.size() / E, .d_qk = E, .d_v = E};
        p.q = q, p.k = k, p.v = v;
        return qkv::cpu::sdpa_f64(p).output;
    }
};

}  // namespace

TEST_CASE("sequence: a recorded append holds its cache until the run; a refused record changes nothing",
          "[tensor][sequence]") {
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t E = small_cache::E;
    std::mt19937_64 rng(31);
    small_cache c(ctx, 16, 3, rng);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    qkv::vulkan::sdpa_call call(ctx, desc, c.cache);
    const std::vector<float> q = normal(E, rng), k2 = normal(2 * E, rng), v2 = normal(2 * E, rng);
    qkv::vulkan::tensor tq(ctx, {1, 1, 1, E}), out(ctx, {1, 1, 1, E}), wrong(ctx, {1, 1, 1, E + 4});
    qkv::vulkan::tensor tk(ctx, {1, 1, 2, E}), tv(ctx, {1, 1, 2, E});
    tq.upload(q), tk.upload(k2), tv.upload(v2);

    qkv::vulkan::sequence seq(ctx);
    seq.record_append(c.cache, tk, tv, 2);
    CHECK(c.cache.size() == 5);  // calls recorded after it see the rows
    // Until the run the last two rows are not written: every other use of the cache waits.
    qkv::sdpa_problem host = desc;
    host.q = q;
    CHECK_THROWS_AS(ctx.sdpa(host, c.cache), qkv::invalid_argument);
    CHECK_THROWS_AS(c.cache.append(k2, v2, 2), qkv::invalid_argument);
    CHECK_THROWS_AS(c.cache.clear(), qkv::invalid_argument);
    CHECK_THROWS_AS(call.run({.q = &tq, .out = &out}), qkv::invalid_argument);
    {
        qkv::vulkan::sequence other(ctx);
        CHECK_THROWS_AS(other.record_append(c.cache, tk, tv, 2), qkv::invalid_argument);
        CHECK_THROWS_AS(other.record(call, {.q = &tq, .out = &out}), qkv::invalid_argument);
    }
    CHECK(c.cache.size() == 5);
    // Refused for its arguments before recording anything: the sequence is as it was.
    CHECK_THROWS_AS(seq.record(call, {.q = &tq, .out = &wrong}), qkv::invalid_argument);
    CHECK(seq.recorded() == 1);
    seq.record(call, {.q = &tq, .out = &out});
    CHECK(seq.recorded() == 2);
    seq.run();
    CHECK(seq.recorded() == 0);
    c.k.insert(c.k.end(), k2.begin(), k2.end());
    c.v.insert(c.v.end(), v2.begin(), v2.end());
    CHECK(nmse(out.download(), c.attend(q)) <= 1e-10);
    CHECK(ctx.sdpa(host, c.cache).output == out.download());  // free again after the run

    // A sequence ended before its run: its append never happened, so the cache is as before.
    {
        qkv::vulkan::sequence dropped(ctx);
        dropped.record_append(c.cache, tk, tv, 2);
        dropped.record(call, {.q = &tq, .out = &out});
        CHECK(c.cache.size() == 7);
    }
    CHECK(c.cache.size() == 5);
    c.cache.append(k2, v2, 2);  // and free
    CHECK(c.cache.size() == 7);

    // A place of a sequence whose last call was over a cache that is gone since: recording there
    // lets go of the cache's last reference, whose destructor takes the device's lock.
    {
        qkv::vulkan::sequence reused(ctx);
        {
            small_cache gone(ctx, 4, 2, rng);
            qkv::vulkan::sdpa_call over(ctx, desc, gone.cache);
            reused.record(over, {.q = &tq, .out = &out});
            reused.run();
        }
        reused.record(call, {.q = &tq, .out = &out});
        reused.run();
    }
    require_clean(ctx);
}

TEST_CASE("sequence: a record that fails part-way drops the sequence and undoes its appends", "[tensor][sequence]") {
    // An attention_call records its leading barrier before it allocates its verdict words, so a
    // device memory limit between the two fails it part-way. Found by bisection on the limit: the
    // lowest limit at which the record does not fail before recording anything fails part-way.
    // Every outcome must leave a cache whose rows are all written.
    constexpr std::size_t E = small_cache::E, N = 512, D = 32;  // scratch of some 300 KiB
    enum class outcome { objects_do_not_fit, refused_before, part_way, fits };
    const auto attempt = [&](std::uint64_t limit) {
        INFO("device memory limit " << limit);
        auto ctx = qkv_test::make_context({.device_memory_limit = limit});
        std::mt19937_64 rng(7);
        std::optional<small_cache> c;
        std::optional<qkv::vulkan::tensor> tk, tv, x, wq, wk, wv, out;
        std::optional<qkv::vulkan::attention_call> call;
        qkv::attention_problem desc;
        desc.shape = {.batch = 1, .seq = N, .d_in = D, .d_k = D, .d_v = D, .heads = 1, .d_out = 0};
        try {
            c.emplace(ctx, 16, 3, rng);
            const auto make = [&](std::optional<qkv::vulkan::tensor>& t, std::vector<std::size_t> shape) {
                t.emplace(ctx, std::move(shape));
                t->upload(normal(t->elements(), rng));
            };
            make(tk, {1, 1, 2, E}), make(tv, {1, 1, 2, E});
            make(x, {1, N, D}), make(wq, {D, D}), make(wk, {D, D}), make(wv, {D, D}), make(out, {1, N, D});
            call.emplace(ctx, desc);
        } catch (const qkv::vulkan::out_of_memory&) {
            return outcome::objects_do_not_fit;
        }
        const std::vector<float> k2 = tk->download(), v2 = tv->download();
        outcome result = outcome::fits;
        {
            qkv::vulkan::sequence seq(ctx);
            seq.record_append(c->cache, *tk, *tv, 2);
            try {
                seq.record(*call, {.x = &*x, .wq = &*wq, .wk = &*wk, .wv = &*wv, .out = &*out});
            } catch (const qkv::vulkan::out_of_memory&) {
                result = seq.recorded() == 0 ? outcome::part_way : outcome::refused_before;
            }
            if (result == outcome::part_way) CHECK(c->cache.size() == 3);  // the append undone
            if (result != outcome::part_way) CHECK(c->cache.size() == 5);  // the append kept
            seq.run();
        }
        if (c->cache.size() == 5) {
            c->k.insert(c->k.end(), k2.begin(), k2.end());
            c->v.insert(c->v.end(), v2.begin(), v2.end());
        }
        // The rows the cache holds are the rows appended (with room for the host call's scratch).
        call.reset(), x.reset(), wq.reset(), wk.reset(), wv.reset(), out.reset();
        const std::vector<float> one = normal(E, rng);
        qkv::sdpa_problem host;
        host.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
        host.q = one;
        CHECK(nmse(ctx.sdpa(host, c->cache).output, c->attend(one)) <= 1e-10);
        require_clean(ctx);
        return result;
    };
    // Outcomes grow with the limit: objects_do_not_fit, refused_before, part_way, fits. lo: a limit
    // below part_way; hi: one at or above it, found by doubling, then narrowed by bisection.
    std::uint64_t lo = 0, hi = 256 * 1024;
    bool refused_seen = false;
    for (outcome o = attempt(hi); o != outcome::part_way && o != outcome::fits; o = attempt(hi)) {
        refused_seen = refused_seen || o == outcome::refused_before;
        lo = hi, hi *= 2;
        REQUIRE(hi <= 64 * 1024 * 1024);
    }
    const auto narrow = [&](std::uint64_t resolution) {
        while (hi - lo > resolution) {
            const std::uint64_t mid = (lo + hi) / 2;
            const outcome o = attempt(mid);
            refused_seen = refused_seen || o == outcome::refused_before;
            (o == outcome::part_way || o == outcome::fits ? hi : lo) = mid;
        }
    };
    // The part-way window is the verdict words' allocation: 4 KiB on lavapipe, maybe less on a
    // device with finer memory granularity, so a coarse search that lands past it goes on finer.
    narrow(2048);
    outcome last = attempt(hi);
    if (last == outcome::fits) {
        narrow(64);
        last = attempt(hi);
    }
    CHECK(refused_seen);  // the search passed the limits at which the record is refused first
    CHECK(last == outcome::part_way);
}

TEST_CASE("sdpa_call: runs of one call from two threads", "[tensor][sequence]") {
    // The call's run scratch is shared: runs are serialised, each checked before the next begins.
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t E = small_cache::E;
    std::mt19937_64 rng(47);
    small_cache c(ctx, 8, 6, rng);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    qkv::vulkan::sdpa_call call(ctx, desc, c.cache);
    const std::vector<float> q1 = normal(E, rng), q2 = normal(E, rng);
    qkv::vulkan::tensor t1(ctx, {1, 1, 1, E}), t2(ctx, {1, 1, 1, E}), o1(ctx, {1, 1, 1, E}), o2(ctx, {1, 1, 1, E});
    t1.upload(q1), t2.upload(q2);
    const auto runs = [&](qkv::vulkan::tensor& q, qkv::vulkan::tensor& o) {
        for (int i = 0; i < 25; ++i) call.run({.q = &q, .out = &o});
    };
    std::thread other(runs, std::ref(t2), std::ref(o2));
    runs(t1, o1);
    other.join();
    CHECK(nmse(o1.download(), c.attend(q1)) <= 1e-10);
    CHECK(nmse(o2.download(), c.attend(q2)) <= 1e-10);
    require_clean(ctx);
}

TEST_CASE("sequence: more dispatches than one descriptor pool holds", "[tensor][sequence]") {
    // 1,024 descriptor sets a pool: a sequence of many calls takes more pools as it grows.
    auto ctx = qkv_test::make_context({});
    constexpr std::size_t E = small_cache::E, calls = 400;
    std::mt19937_64 rng(43);
    small_cache c(ctx, 8, 5, rng);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    qkv::vulkan::sdpa_call call(ctx, desc, c.cache);
    const std::vector<float> q = normal(E, rng);
    qkv::vulkan::tensor tq(ctx, {1, 1, 1, E});
    tq.upload(q);
    std::vector<qkv::vulkan::tensor> outs;
    for (std::size_t i = 0; i < calls; ++i) outs.emplace_back(ctx, std::vector<std::size_t>{1, 1, 1, E});
    qkv::vulkan::sequence seq(ctx);
    for (int round = 0; round < 2; ++round) {
        for (auto& o : outs) seq.record(call, {.q = &tq, .out = &o});
        seq.run();
        const std::vector<float> first = outs.front().download();
        CHECK(nmse(first, c.attend(q)) <= 1e-10);
        for (auto& o : outs) CHECK(o.download() == first);
    }
    require_clean(ctx);
}

TEST_CASE("attention_call: self-attention over device tensors equals the host call", "[tensor][attention]") {
    auto ctx = qkv_test::make_context({});
    struct spec {
        std::size_t batch, seq, d_in, d, heads, d_out;
        bool biases, causal, mask;
        qkv::implementation impl;
    };
    const spec specs[] = {
        {1, 3, 4, 3, 1, 0, false, false, false, qkv::implementation::fused},
        {2, 17, 12, 16, 2, 8, true, true, false, qkv::implementation::fused},
        {1, 33, 8, 8, 1, 0, true, false, true, qkv::implementation::staged},
    };
    for (const spec& sp : specs) {
        INFO("seq " << sp.seq << " d_in " << sp.d_in << " d " << sp.d << " heads " << sp.heads << " d_out "
                    << sp.d_out);
        std::mt19937_64 rng(sp.seq);
        const std::vector<float> x = normal(sp.batch * sp.seq * sp.d_in, rng), wq = normal(sp.d_in * sp.d, rng, 0.3f),
                                 wk = normal(sp.d_in * sp.d, rng, 0.3f), wv = normal(sp.d_in * sp.d, rng, 0.3f),
                                 bq = normal(sp.d, rng), bk = normal(sp.d, rng), bv = normal(sp.d, rng),
                                 wo = normal(sp.d * sp.d_out, rng), bo = normal(sp.d_out, rng);
        std::vector<std::uint8_t> mask;
        if (sp.mask)
            for (std::size_t i = 0; i < sp.seq * sp.seq; ++i) mask.push_back(i % 5 != 1 ? 1 : 0);
        qkv::attention_problem desc;
        desc.shape = {.batch = sp.batch,
                      .seq = sp.seq,
                      .d_in = sp.d_in,
                      .d_k = sp.d,
                      .d_v = sp.d,
                      .heads = sp.heads,
                      .d_out = sp.d_out};
        desc.options.causal = sp.causal;
        desc.options.implementation = sp.impl;
        desc.mask = mask;
        qkv::attention_problem host = desc;
        host.x = x, host.wq = wq, host.wk = wk, host.wv = wv;
        if (sp.biases) host.bq = bq, host.bk = bk, host.bv = bv;
        if (sp.d_out) host.wo = wo, host.bo = bo;
        const std::vector<double> want = qkv::cpu::attention_f64(host).output;

        const auto upload = [&](const std::vector<float>& v, std::vector<std::size_t> shape) {
            qkv::vulkan::tensor t(ctx, std::move(shape));
            t.upload(v);
            return t;
        };
        qkv::vulkan::tensor tx = upload(x, {sp.batch, sp.seq, sp.d_in}), twq = upload(wq, {sp.d_in, sp.d}),
                            twk = upload(wk, {sp.d_in, sp.d}), twv = upload(wv, {sp.d_in, sp.d}),
                            tbq = upload(bq, {sp.d}), tbk = upload(bk, {sp.d}), tbv = upload(bv, {sp.d}),
                            out(ctx, {sp.batch, sp.seq, sp.d_out ? sp.d_out : sp.d});
        std::optional<qkv::vulkan::tensor> two, tbo;
        if (sp.d_out) two.emplace(upload(wo, {sp.d, sp.d_out})), tbo.emplace(upload(bo, {sp.d_out}));
        qkv::vulkan::attention_call call(ctx, desc);
        CHECK(call.implementation_run() == sp.impl);
        qkv::vulkan::attention_tensors t{.x = &tx, .wq = &twq, .wk = &twk, .wv = &twv, .out = &out};
        if (sp.biases) t.bq = &tbq, t.bk = &tbk, t.bv = &tbv;
        if (sp.d_out) t.wo = &*two, t.bo = &*tbo;
        call.run(t);
        CHECK(nmse(out.download(), want) <= 1e-10);
        CHECK(out.download() == ctx.attention(host).output);  // the same kernels as the host call
        require_clean(ctx);
    }
    // The device's verdicts: a projection beyond float32 is refused; NaN inputs follow the NaN rules.
    qkv::attention_problem desc;
    desc.shape = {.batch = 1, .seq = 5, .d_in = 4, .d_k = 4, .d_v = 4, .heads = 1};
    std::vector<float> x(20, 1e30f), w(16, 1e30f);
    qkv::vulkan::tensor tx(ctx, {1, 5, 4}), tw(ctx, {4, 4}), out(ctx, {1, 5, 4});
    tx.upload(x), tw.upload(w);
    qkv::vulkan::attention_call call(ctx, desc);
    CHECK_THROWS_AS(call.run({.x = &tx, .wq = &tw, .wk = &tw, .wv = &tw, .out = &out}), qkv::vulkan::numeric_overflow);
    x.assign(20, 0.5f);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    w.assign(16, 0.25f);
    tx.upload(x), tw.upload(w);
    CHECK_NOTHROW(call.run({.x = &tx, .wq = &tw, .wk = &tw, .wv = &tw, .out = &out}));

    // Shapes checked before anything they imply is allocated: sizes beyond size_t are refused as
    // arguments, and sizes beyond the device as limits (never std::bad_alloc from the host).
    qkv::attention_problem huge;
    huge.shape = {.batch = std::size_t{1} << 40, .seq = std::size_t{1} << 20, .d_in = 1 << 10, .d_k = 8, .d_v = 8};
    CHECK_THROWS_AS(qkv::vulkan::attention_call(ctx, huge), qkv::invalid_argument);
    huge.shape = {.batch = 1, .seq = std::size_t{1} << 24, .d_in = 1 << 16, .d_k = 8, .d_v = 8, .d_out = 1 << 16};
    CHECK_THROWS_AS(qkv::vulkan::attention_call(ctx, huge), qkv::vulkan::limit_exceeded);
    huge.shape = {.batch = 1, .seq = 3, .d_in = 4, .d_k = 4, .d_v = 4};
    huge.x = x;  // the data comes as tensors
    CHECK_THROWS_AS(qkv::vulkan::attention_call(ctx, huge), qkv::invalid_argument);
    require_clean(ctx);
}
