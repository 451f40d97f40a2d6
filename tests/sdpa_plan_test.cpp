// The sdpa and decode plans (src/plan/sdpa_plan.cpp: plan_sdpa, plan_sdpa_cache), pure functions of
// the problem's shapes and options, a device description and the settings, against the fake
// devices of support/fake_devices.hpp: the route (fused or decode), the family, the buffers.
#include <cstdint>
#include <vector>

#include "contract/score.h"
#include "plan/sdpa_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::kernel_family;
using qkv::vulkan::device_type;
using namespace qkv::vulkan::detail;

namespace {

using qkv::test::desc_of;
using qkv::test::fake_devices;

/// A problem of this shape; its spans only have the sizes (a plan never reads data).
struct sized_problem {
    std::vector<float> q, k, v;
    std::vector<std::uint8_t> mask;
    qkv::sdpa_problem p;
    sized_problem(std::size_t b, std::size_t hq, std::size_t hkv, std::size_t L, std::size_t S, std::size_t E,
                  std::size_t Ev, bool with_mask = false)
        : q(b * hq * L * E), k(b * hkv * S * E), v(b * hkv * S * Ev) {
        p.shape = {.batch = b, .q_heads = hq, .kv_heads = hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
        p.q = q, p.k = k, p.v = v;
        if (with_mask) {
            mask.assign(L * S, 1);
            p.mask = mask;
        }
    }
};

/// The regions of the inputs buffer do not overlap, each starts aligned, and the buffer holds them.
void check_regions(const sdpa_plan& p, const device_desc& d) {
    const region all[] = {p.q, p.k, p.v, p.mask_bits, p.additive, p.params};
    std::uint64_t end = 0;
    for (const region& r : all) {
        if (r.bytes == 0) continue;
        CHECK(r.at >= end);
        CHECK(r.at % 16 == 0);
        end = r.at + r.bytes;
    }
    if (p.mask_bits.bytes) CHECK(p.mask_bits.at % d.storage_alignment == 0);
    CHECK(p.params.at % d.storage_alignment == 0);  // the score params: always, a storage binding
    CHECK(p.params.bytes ==
          qkv::contract::SCORE_PARAMS_HEAD_OFFSET + 8 * std::uint64_t{p.fused() ? p.layout.heads : p.decode.q_heads});
    if (!p.fused())
        for (const region& r : {p.q, p.k, p.v})
            if (r.bytes) CHECK(r.at % d.texel_alignment == 0);
    CHECK(p.buffers.of(role::inputs) == end);
    REQUIRE_FALSE(p.downloads.empty());
    CHECK(p.downloads[0].from == role::out);
    CHECK(p.downloads[0].bytes == p.out_count * 4);
    CHECK(p.buffers.of(role::out) >= p.out_count * 4);
}

}  // namespace

TEST_CASE("sdpa plan: decode shapes take the decode route, others the fused kernels", "[plan][sdpa]") {
    const settings set;
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        const device_desc d = desc_of(f);
        // One query row per head of 8 against 4096 keys: decode.
        const sized_problem decode(1, 8, 2, 1, 4096, 64, 64, true);
        const sdpa_plan p = plan_sdpa(decode.p, d, set);
        CHECK(p.route == sdpa_route::decode);
        CHECK(p.kernel() == (f.info.type == device_type::cpu ? kernel_family::row_tiles : kernel_family::block_tiles));
        CHECK(p.decode.refusal.empty());
        CHECK(p.buffers.of(role::partial_acc) == p.decode.acc_bytes());
        CHECK(p.buffers.of(role::texels) == 0);
        check_regions(p, d);
        // The same call again: the same plan (nothing but its arguments decides it).
        const sdpa_plan again = plan_sdpa(decode.p, d, set);
        CHECK(again.route == p.route);
        CHECK(again.decode.chunks == p.decode.chunks);
        CHECK(again.buffers.bytes == p.buffers.bytes);
        // Many query rows, few keys: the fused kernels, of the device's family.
        const sized_problem square(2, 4, 2, 113, 113, 32, 16);
        const sdpa_plan s = plan_sdpa(square.p, d, set);
        CHECK(s.route == sdpa_route::fused);
        CHECK(s.family == (f.info.type == device_type::cpu ? kernel_family::row_tiles : kernel_family::block_tiles));
        CHECK(s.buffers.of(role::texels) == (s.cpu_family() ? s.cpu.bytes : 0));
        check_regions(s, d);
        // The weights, or a test hook of the fused kernels, keep a decode shape on the fused route.
        sized_problem weights(1, 8, 2, 1, 4096, 64, 64);
        weights.p.options.return_weights = true;
        const sdpa_plan w = plan_sdpa(weights.p, d, set);
        CHECK(w.route == sdpa_route::fused);
        REQUIRE(w.downloads.size() == 2);
        CHECK(w.downloads[1].bytes == w.weights_count * 4);
        CHECK(w.weights_count == 4096 * 8);
        settings hooked;
        hooked.max_fused_keys = 512;
        CHECK(plan_sdpa(decode.p, d, hooked).route == sdpa_route::fused);
    }
}

TEST_CASE("sdpa plan: where the decode kernels cannot run, the plan says so instead of throwing", "[plan][sdpa]") {
    const settings set;
    const sized_problem decode(1, 8, 2, 1, 4096, 64, 64);
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        // No RGBA32F texel buffers: the fused gpu family takes it; against a cache: unavailable.
        device_desc no_texels = desc_of(f);
        no_texels.texels_rgba32f = no_texels.texels_rgba16f = false;
        const sdpa_plan p = plan_sdpa(decode.p, no_texels, set);
        CHECK(p.route == sdpa_route::fused);
        CHECK(p.family == kernel_family::block_tiles);
        sized_problem cached = decode;
        cached.p.k = {}, cached.p.v = {};
        CHECK_THROWS_AS(plan_sdpa_cache(cached.p, {4096, qkv::element_type::f32}, no_texels, set),
                        qkv::vulkan::unavailable);
        // Too few texels for K: fused from the host; limit_exceeded against a cache too large for Q.
        device_desc few = desc_of(f);
        few.max_texel_elements = 1000;
        CHECK(plan_sdpa(decode.p, few, set).route == sdpa_route::fused);
        few.max_texel_elements = 10;
        CHECK_THROWS_AS(plan_sdpa_cache(cached.p, {4096, qkv::element_type::f32}, few, set),
                        qkv::vulkan::limit_exceeded);
        // A cache: always decode, K and V not in the inputs.
        const sdpa_plan c = plan_sdpa_cache(cached.p, {8192, qkv::element_type::f16}, desc_of(f), set);
        CHECK(c.route == sdpa_route::decode);
        CHECK(c.kv_fp16);
        CHECK(c.k.bytes == 0);
        CHECK(c.v.bytes == 0);
        CHECK(c.decode.kv_stride == 8192);
        check_regions(c, desc_of(f));
    }
}

TEST_CASE("sdpa plan: the rules beyond PyTorch's SDPA, their params and the lse", "[plan][sdpa]") {
    const settings set;
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        const device_desc d = desc_of(f);
        for (const std::size_t L : {1u, 113u}) {  // decode, fused
            sized_problem p(2, 8, 2, L, 4096, 64, 64);
            std::vector<float> sinks(8, 0.5f);
            p.p.sinks = sinks;
            p.p.options.window_left = 1000, p.p.options.window_right = 0;
            p.p.options.softcap = 30.0f;
            p.p.options.alibi_max_bias = 8.0f;
            p.p.options.return_lse = true;
            p.p.options.alignment = qkv::causal_alignment::bottom_right;
            const sdpa_plan s = plan_sdpa(p.p, d, set);
            CHECK(s.route == (L == 1 ? sdpa_route::decode : sdpa_route::fused));
            CHECK(s.features == (qkv::contract::SCORE_SOFTCAP | qkv::contract::SCORE_ALIBI |
                                 qkv::contract::SCORE_WINDOW | qkv::contract::SCORE_SINKS | qkv::contract::SCORE_LSE));
            CHECK(s.params.bytes == score_params_bytes(p.p.shape));
            check_regions(s, d);
            // The lse: B·Hq·L floats after the output, downloaded last.
            CHECK(s.lse_count == 2 * 8 * L);
            CHECK(s.lse_at >= s.out_count * 4);
            CHECK(s.buffers.of(role::out) == s.lse_at + s.lse_count * 4);
            CHECK(s.downloads[s.lse_download()].offset == s.lse_at);
            CHECK(s.downloads[s.lse_download()].bytes == s.lse_count * 4);
            if (s.fused()) {
                CHECK(s.layout.features == s.features);
            } else {
                CHECK(s.decode.features == s.features);
                // Only the keys some row may see are split: [S - 1 - 1000, S) for L = 1 bottom-right.
                CHECK(s.decode.kv_first == 4096 - 1 - 1000);
                CHECK(s.decode.kv_end == 4096);
                CHECK(std::uint64_t{s.decode.chunk} * s.decode.chunks >= 1001);
                CHECK(std::uint64_t{s.decode.chunk} * (s.decode.chunks - 1) < 1001);
            }
        }
        // No rule: no feature, params still placed (the kernels bind them), no lse download.
        const sized_problem plain(1, 4, 4, 17, 113, 32, 32);
        const sdpa_plan q = plan_sdpa(plain.p, d, set);
        CHECK(q.features == 0);
        CHECK(q.lse_count == 0);
        CHECK(q.downloads.size() == 1);
        check_regions(q, d);
        // A window that no row reaches: the decode splits no key.
        sized_problem none(1, 4, 4, 1, 4096, 64, 64);
        none.p.options.window_left = 0, none.p.options.window_right = 0;  // top-left, row 0: key 0 only
        const sdpa_plan n = plan_sdpa(none.p, d, set);
        if (!n.fused()) CHECK(n.decode.kv_end - n.decode.kv_first == 1);
    }
}

TEST_CASE("sdpa plan: K/V storage types on both routes, wide heads on the fused one", "[plan][sdpa]") {
    const settings set;
    using qkv::element_type;
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        const device_desc d = desc_of(f);
        for (const element_type t : {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0}) {
            INFO(qkv::to_string(t));
            // decode: K and V stored as the type (blocks: bytes_for per row)
            sized_problem dec(1, 8, 2, 1, 4096, 64, 32);
            dec.p.options.kv_type = t;
            const sdpa_plan p = plan_sdpa(dec.p, d, set);
            REQUIRE(p.route == sdpa_route::decode);
            CHECK(p.kv_type == t);
            CHECK(p.kv_blocks() == qkv::is_quantized(t));
            if (p.kv_blocks()) {
                CHECK(p.k.bytes == 2 * 4096 * qkv::bytes_for(t, 64));
                CHECK(p.v.bytes == 2 * 4096 * qkv::bytes_for(t, 32));
            } else {
                CHECK(p.k.bytes == 2 * 4096 * 16 * (t == element_type::f16 ? 8 : 16));
            }
            check_regions(p, d);
            // fused: float32 uploads of what the type stores (rounded on the host), unless Q and K/V are f16
            sized_problem fus(1, 8, 2, 113, 300, 64, 32);
            fus.p.options.kv_type = t;
            const sdpa_plan q = plan_sdpa(fus.p, d, set);
            REQUIRE(q.fused());
            CHECK_FALSE(q.layout.fp16);
            CHECK(q.round_kv == (t != element_type::f32));
            CHECK_FALSE(q.round_q);
            fus.p.options.precision = qkv::precision::fp16;
            const sdpa_plan h = plan_sdpa(fus.p, d, set);
            CHECK(h.layout.fp16 == (t == element_type::f16));
            CHECK(h.round_q == (t != element_type::f16));
        }
        // E = 576, Ev = 512 on the fused route (tiles within the device's shared memory)
        const sized_problem wide(1, 2, 1, 40, 300, 576, 512);
        const sdpa_plan w = plan_sdpa(wide.p, d, set);
        CHECK(w.fused());
        if (!w.cpu_family()) CHECK(w.gpu.tiles.shared_bytes() <= f.info.max_shared_memory);
        const sized_problem wider(1, 2, 1, 40, 300, 608, 512);
        CHECK_THROWS_AS(plan_sdpa(wider.p, d, set), qkv::vulkan::limit_exceeded);
    }
}

TEST_CASE("sdpa plan: fp16 stores Q, K and V as float16 on both routes", "[plan][sdpa]") {
    const settings set;
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        for (const std::size_t L : {1u, 113u}) {  // decode, fused
            sized_problem half(1, 4, 4, L, 4096, 64, 64);
            half.p.options.precision = qkv::precision::fp16;
            const sdpa_plan p = plan_sdpa(half.p, desc_of(f), set);
            CHECK(p.route == (L == 1 ? sdpa_route::decode : sdpa_route::fused));
            CHECK(p.q_fp16);
            CHECK(p.kv_fp16);
            if (p.fused())
                CHECK(p.q.bytes == half.q.size() * 2);
            else
                CHECK(p.q.bytes == p.decode.q_texels() * 8);  // RGBA16F texels
            device_desc no16 = desc_of(f);
            no16.info.fp16_storage = false;
            CHECK_THROWS_AS(plan_sdpa(half.p, no16, set), qkv::vulkan::unavailable);
        }
    }
}

TEST_CASE("sdpa plan: positions past 32 bits are planned; q_len + kv_len past 2^30 is refused, named",
          "[plan][sdpa][positions]") {
    const settings set;
    constexpr std::int64_t two30 = std::int64_t{1} << 30, two31 = std::int64_t{1} << 31, two62 = std::int64_t{1} << 62;
    for (const auto& f : fake_devices()) {
        INFO(f.name);
        const device_desc d = desc_of(f);
        // A plan reads shapes and options only: no data needed.
        qkv::sdpa_problem p;
        p.shape = {.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 17, .kv_len = 113, .d_qk = 32, .d_v = 32};
        for (const std::int64_t off : {two31 - 1, two31, two31 + 1, -two31, two62, -two62}) {
            INFO("position_offset " << off);
            p.options = {.causal = true,
                         .window_left = two62,
                         .window_right = two30,
                         .alibi_max_bias = 8.0f,
                         .position_offset = off};
            const sdpa_plan s = plan_sdpa(p, d, set);
            REQUIRE(s.fused());
            CHECK(s.layout.causal_offset == (off > 0 ? 1 << 30 : -(1 << 30)));
        }
        p.shape = {.q_len = std::size_t{1} << 29, .kv_len = (std::size_t{1} << 29) + 1, .d_qk = 1, .d_v = 1};
        for (const qkv::sdpa_options& o : {qkv::sdpa_options{.causal = true}, qkv::sdpa_options{.window_left = 4},
                                           qkv::sdpa_options{.alibi_max_bias = 8.0f}}) {
            p.options = o;
            CHECK_THROWS_WITH(plan_sdpa(p, d, set),
                              Catch::Contains("q_len + kv_len (1073741825)") && Catch::Contains("at most 2^30"));
        }
        // Without a positional rule positions play no part: whatever else refuses, not that.
        p.options = {};
        try {
            (void)plan_sdpa(p, d, set);
        } catch (const qkv::vulkan::limit_exceeded& e) {
            CHECK_THAT(e.what(), !Catch::Contains("q_len + kv_len"));
        }
    }
}
