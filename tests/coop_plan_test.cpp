// The cooperative-matrix family's plans (src/kernels/flash_coop_plan.cpp and the hooks in the sdpa,
// decode and attention plans), pure functions of a device description, against the fake devices
// of support/fake_devices.hpp, whose cooperative-matrix lists are those of the drivers they stand
// for: the shape taken from each list, the tiles that fit, the per-driver gates, every refusal, and
// where the automatic choice takes the family.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "kernels/flash_coop_plan.hpp"
#include "plan/attention_plan.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::kernel_family;
using qkv::vulkan::device_type;
using namespace qkv::vulkan::detail;
namespace fd = qkv::test;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A fused layout of float16 (or float32) Q, K and V of these widths and heads.
flash_layout layout_of(std::uint32_t d, std::uint32_t dv, bool fp16 = true, std::uint32_t heads = 8,
                       std::uint32_t kv_heads = 2) {
    flash_layout l;
    l.batch = 1, l.heads = heads, l.kv_heads = kv_heads, l.q_len = 113, l.kv_len = 300, l.d = d, l.dv = dv;
    l.fp16 = fp16;
    return l;
}

/// What each fake device should give for an fp16 call: the shape (0: refused), whether the
/// automatic choice may take the family, and whether its gate refuses the family there as not seen
/// right (coop_gate_effect::unverified: the shape and tiles are those given with
/// QKV_COOP_UNVERIFIED=1).
struct expectation {
    std::uint32_t m = 0, n = 0, k = 0, lanes = 0;
    bool automatic = false;
    const char* refusal = nullptr;  ///< a part of the refusal's text
    bool unverified = false;
};

/// The settings of QKV_COOP_UNVERIFIED=1: the family where asked for on the GPUs its gate has not
/// seen it right on, so that their shapes and tiles are planned and checked.
settings unverified_ok() {
    settings s;
    s.coop_unverified = true;
    return s;
}

expectation expected(std::size_t index) {
    switch (index) {
        // The GPUs: refused unless QKV_COOP_UNVERIFIED=1, then where asked for only (the GPU gate).
        case fd::discrete_32:  // NVIDIA: 16x16x16 is the largest of 16x16x16, 16x8x16, 16x8x8
            return {16, 16, 16, 32, false, nullptr, true};
        case fd::discrete_64:  // RADV on RDNA3: wave32, the smallest size it lets a pipeline require
            return {16, 16, 16, 32, false, nullptr, true};
        case fd::xe2_16:
            return {8, 16, 16, 16, false, nullptr, true};
        case fd::amd_proprietary:  // its own gate too
            return {16, 16, 16, 32, false, nullptr, true};
        case fd::lavapipe_26:  // emulated: where asked for only
            return {8, 8, 8, 8, false};
        case fd::integrated_16:
            return {0, 0, 0, 0, false, "VK_EXT_subgroup_size_control"};
        case fd::cpu_8:
            return {0, 0, 0, 0, false, "subgroupShuffleXor"};
        case fd::cpu_16:
            return {0, 0, 0, 0, false, "LP_NATIVE_VECTOR_WIDTH=512"};
        default:  // no extension
            return {0, 0, 0, 0, false, "does not offer VK_KHR_cooperative_matrix"};
    }
}

/// Each fake device, its description and what this file expects of it.
struct device_case {
    fd::fake_device device;
    device_desc desc;
    expectation e;
};

std::vector<device_case> device_cases() {
    const auto devices = fd::fake_devices();
    std::vector<device_case> cases;
    for (std::size_t i = 0; i < devices.size(); ++i)
        cases.push_back({devices[i], fd::desc_of(devices[i]), expected(i)});
    return cases;
}

/// A problem of this shape; its spans only have the sizes (a plan never reads data).
struct sized_problem {
    std::vector<float> q, k, v;
    qkv::sdpa_problem p;
    sized_problem(std::size_t b, std::size_t hq, std::size_t hkv, std::size_t L, std::size_t S, std::size_t E,
                  std::size_t Ev, qkv::precision precision = qkv::precision::fp16,
                  kernel_family kernel = kernel_family::automatic)
        : q(b * hq * L * E), k(b * hkv * S * E), v(b * hkv * S * Ev) {
        p.shape = {.batch = b, .q_heads = hq, .kv_heads = hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
        p.q = q, p.k = k, p.v = v;
        p.options.precision = precision;
        p.options.kernel = kernel;
    }
};

}  // namespace

TEST_CASE("coop plan: the shape comes from each device's own list, the tiles fit it", "[plan][coop]") {
    const settings set = unverified_ok();
    for (const auto& [f, desc, e] : device_cases()) {
        INFO(f.name);
        if (e.unverified) {  // without QKV_COOP_UNVERIFIED=1: refused as not seen right, saying how to try it
            coop_tiles t;
            const coop_verdict v = check_coop(desc, layout_of(64, 64), false, settings{}, t);
            CHECK(contains(v.why, "QKV_COOP_UNVERIFIED=1"));
            CHECK(contains(v.why, "wrong results"));
            CHECK_FALSE(v.limit);
        }
        for (const bool split : {false, true}) {
            for (const auto& [d, dv] : {std::pair{64u, 64u}, std::pair{1u, 3u}, std::pair{17u, 113u},
                                        std::pair{80u, 48u}, std::pair{128u, 128u}, std::pair{256u, 256u}}) {
                INFO((split ? "split-K decode" : "fused") << ", d = " << d << ", dv = " << dv);
                coop_tiles t;
                const coop_verdict v = check_coop(desc, layout_of(d, dv), split, set, t);
                if (e.m == 0) {
                    CHECK(contains(v.why, e.refusal));
                    CHECK_FALSE(v.limit);
                    continue;
                }
                REQUIRE(v.why.empty());
                CHECK(v.automatic == e.automatic);
                CHECK(t.m == e.m);
                CHECK(t.n == e.n);
                CHECK(t.k == e.k);
                CHECK(t.lanes == e.lanes);
                CHECK(t.required_subgroup == t.lanes);
                // The tiles fit the device and the kernel's arithmetic.
                CHECK(t.shared_bytes() <= f.info.max_shared_memory);
                CHECK(t.wg() <= desc.max_workgroup_x());
                CHECK(t.subgroups == (split || f.info.type == device_type::cpu ? 1u : 4u));
                CHECK(t.bc % std::lcm(std::lcm(t.m, t.n), t.k) == 0);
                CHECK(t.d_pad >= d);
                CHECK(t.d_pad % t.k == 0);
                CHECK(t.d_pad % 8 == 0);
                CHECK(t.d_pad < d + std::lcm(t.k, 8u));
                CHECK(t.dv_pad >= dv);
                CHECK(t.dv_pad % t.n == 0);
                CHECK(t.dv_pad % 8 == 0);
                const std::uint32_t rows = t.row_tiles * t.m;  // per subgroup: lanes share rows, or own several
                CHECK((t.lanes % rows == 0 || rows % t.lanes == 0));
                CHECK(t.n % (t.lanes >= rows ? t.lanes / rows : 1) == 0);
                const auto spec = t.spec(0, split, true);
                CHECK(spec.wg == t.wg());
                CHECK(spec.split == (split ? 1u : 0u));
            }
        }
    }
}

TEST_CASE("coop plan: a build without the shaders refuses the family on every device", "[plan][coop]") {
    const settings set;
    for (const fd::fake_device& f : fd::fake_devices()) {
        INFO(f.name);
        device_desc desc = fd::desc_of(f);
        desc.coopmat_shaders = false;  // built without a glslang for GL_KHR_cooperative_matrix
        coop_tiles t;
        for (const bool split : {false, true}) {
            const coop_verdict v = check_coop(desc, layout_of(64, 64), split, set, t);
            CHECK(contains(v.why, "no cooperative-matrix shaders"));
            CHECK_FALSE(v.limit);
        }
        const sized_problem asked(2, 8, 2, 37, 300, 64, 64, qkv::precision::fp16, kernel_family::coopmat);
        CHECK_THROWS_AS(plan_sdpa(asked.p, desc, set), qkv::vulkan::unavailable);
        const sized_problem automatic(2, 8, 2, 37, 300, 64, 64);
        CHECK(plan_sdpa(automatic.p, desc, set).family != kernel_family::coopmat);
    }
}

TEST_CASE("coop plan: float32 calls, wide heads and many heads are refused, naming why", "[plan][coop]") {
    const settings set = unverified_ok();
    for (const auto& [f, desc, e] : device_cases()) {
        INFO(f.name);
        coop_tiles t;
        // float32 Q, K or V: FlashAttention's rule (fp16 and bf16 only), never float16 products in secret
        const coop_verdict fp32 = check_coop(desc, layout_of(64, 64, false), false, set, t);
        CHECK_FALSE(fp32.why.empty());
        if (e.m) {
            CHECK(contains(fp32.why, "precision fp16"));
            const coop_verdict wide = check_coop(desc, layout_of(257, 64), false, set, t);
            CHECK(contains(wide.why, "head widths up to 256"));
            CHECK(wide.limit);
            const coop_verdict heads = check_coop(desc, layout_of(64, 64, true, 70000, 70000), false, set, t);
            CHECK(contains(heads.why, "65,535 query heads"));
            CHECK(heads.limit);
        }
    }
}

TEST_CASE("coop plan: the per-driver gates, one table", "[plan][coop]") {
    std::set<std::string> names;
    for (const coop_gate& g : coop_gates()) {
        CHECK(names.insert(g.name).second);
        CHECK(std::string(g.reason).size() > 40);
    }
    const auto devices = fd::fake_devices();
    const auto applies = [&](std::size_t index, const char* name) {
        for (const coop_gate& g : coop_gates())
            if (std::string(g.name) == name) return g.applies(fd::desc_of(devices[index]));
        FAIL("no gate named " << name);
        return false;
    };
    CHECK(applies(fd::lavapipe_26, "lavapipe (llvmpipe)"));
    CHECK_FALSE(applies(fd::lavapipe_26, "lavapipe (llvmpipe) with vectors of other than 8 lanes"));
    CHECK(applies(fd::cpu_16, "lavapipe (llvmpipe) with vectors of other than 8 lanes"));
    CHECK(applies(fd::amd_proprietary, "AMD's proprietary driver and AMDVLK"));
    CHECK_FALSE(applies(fd::discrete_64, "AMD's proprietary driver and AMDVLK"));  // RADV
    CHECK(applies(fd::integrated_16, "Intel before Xe2"));
    CHECK_FALSE(applies(fd::xe2_16, "Intel before Xe2"));
    for (const std::size_t gpu : {fd::discrete_32, fd::discrete_64, fd::xe2_16, fd::amd_proprietary})
        CHECK(applies(gpu, "a GPU"));
    CHECK_FALSE(applies(fd::lavapipe_26, "a GPU"));
    for (const coop_gate& g : coop_gates())
        if (std::string(g.name) != "a GPU") CHECK_FALSE(g.applies(fd::desc_of(devices[fd::discrete_32])));
}

TEST_CASE("coop plan: QKV_COOP_TILES overrides the subgroups and keys per tile", "[plan][coop]") {
    const auto devices = fd::fake_devices();
    settings set = unverified_ok();
    set.coop_subgroups = 2, set.coop_keys = 32;
    coop_tiles t;
    REQUIRE(check_coop(fd::desc_of(devices[fd::discrete_32]), layout_of(64, 64), false, set, t).why.empty());
    CHECK(t.subgroups == 2);
    CHECK(t.bc == 32);
    set.coop_keys = 8;  // not a multiple of 16
    CHECK_THROWS_AS(check_coop(fd::desc_of(devices[fd::discrete_32]), layout_of(64, 64), false, set, t),
                    qkv::invalid_argument);
}

TEST_CASE("coop plan: QKV_COOP_ISOLATE builds the careful path and names the step taken off the matrix units",
          "[plan][coop]") {
    const auto devices = fd::fake_devices();
    settings set = unverified_ok();
    coop_tiles t;
    REQUIRE(check_coop(fd::desc_of(devices[fd::discrete_32]), layout_of(64, 64), false, set, t).why.empty());
    CHECK(t.spec(0, false, false).careful == qkv::contract::COOP_CAREFUL_NONE);
    CHECK(t.spec(0, false, true).careful == qkv::contract::COOP_CAREFUL_NONFINITE);
    set.coop_isolate = coop_isolate_mode::pv;
    REQUIRE(check_coop(fd::desc_of(devices[fd::discrete_32]), layout_of(64, 64), false, set, t).why.empty());
    for (const bool careful : {false, true})
        CHECK(t.spec(0, false, careful).careful == qkv::contract::COOP_CAREFUL_EVERY_TILE);
    set.coop_isolate = coop_isolate_mode::rescale;
    REQUIRE(check_coop(fd::desc_of(devices[fd::discrete_32]), layout_of(64, 64), false, set, t).why.empty());
    for (const bool careful : {false, true})
        CHECK(t.spec(0, true, careful).careful == qkv::contract::COOP_CAREFUL_STAGED_RESCALE);
}

TEST_CASE("coop plan: sdpa's fused route takes the family where it may, and only for fp16", "[plan][coop][sdpa]") {
    const settings set = unverified_ok();
    for (const auto& [f, desc, e] : device_cases()) {
        INFO(f.name);
        // Prefill (the fused route): 3 query rows per K/V head would decode; 37 do not.
        const sized_problem half(2, 8, 2, 37, 300, 64, 48);
        const sdpa_plan p = plan_sdpa(half.p, desc, set);
        REQUIRE(p.fused());
        if (e.m && e.automatic) {
            CHECK(p.family == kernel_family::coopmat);
            CHECK(p.coop.tiles.m == e.m);
            CHECK(p.coop.chunk_keys == 300);  // one dispatch on a GPU
            CHECK(p.coop.tiles.vec4 == 1);    // widths, strides and offsets are multiples of 4
        } else {
            CHECK(p.family != kernel_family::coopmat);
        }
        // fp32: never automatically, and refused where asked for
        const sized_problem single(2, 8, 2, 37, 300, 64, 48, qkv::precision::fp32);
        CHECK(plan_sdpa(single.p, desc, set).family != kernel_family::coopmat);
        const sized_problem asked32(2, 8, 2, 37, 300, 64, 48, qkv::precision::fp32, kernel_family::coopmat);
        CHECK_THROWS_AS(plan_sdpa(asked32.p, desc, set), qkv::vulkan::unavailable);
        // Asked for: it runs wherever it can, gates or not; elsewhere a typed refusal.
        const sized_problem asked(2, 8, 2, 37, 300, 17, 113, qkv::precision::fp16, kernel_family::coopmat);
        if (e.unverified) {  // the GPU gate without QKV_COOP_UNVERIFIED=1: never automatic, refused where asked for
            CHECK(plan_sdpa(half.p, desc, settings{}).family != kernel_family::coopmat);
            CHECK_THROWS_AS(plan_sdpa(asked.p, desc, settings{}), qkv::vulkan::unavailable);
        }
        if (e.m) {
            const sdpa_plan c = plan_sdpa(asked.p, desc, set);
            CHECK(c.family == kernel_family::coopmat);
            CHECK(c.kernel() == kernel_family::coopmat);
            CHECK(c.coop.tiles.vec4 == 0);  // E = 17
        } else {
            CHECK_THROWS_AS(plan_sdpa(asked.p, desc, set), qkv::vulkan::unavailable);
        }
        // fp16 Q with K/V stored otherwise: the binding holds float32, refused.
        sized_problem q8(2, 8, 2, 37, 300, 64, 64, qkv::precision::fp16, kernel_family::coopmat);
        q8.p.options.kv_type = qkv::element_type::q8_0;
        CHECK_THROWS_AS(plan_sdpa(q8.p, desc, set), qkv::vulkan::unavailable);
        // Attention dropout: the family does not draw its mask, so never automatically, and
        // refused (naming dropout) where asked for.
        sized_problem dropped(2, 8, 2, 37, 300, 64, 48);
        dropped.p.options.dropout_p = 0.1f;
        CHECK(plan_sdpa(dropped.p, desc, set).family != kernel_family::coopmat);
        dropped.p.options.kernel = kernel_family::coopmat;
        if (e.m) {
            CHECK_THROWS_WITH(plan_sdpa(dropped.p, desc, set), Catch::Matchers::Contains("dropout"));
            CHECK_THROWS_AS(plan_sdpa(dropped.p, desc, set), qkv::vulkan::unavailable);
        }
    }
}

TEST_CASE("coop plan: CPU devices split long key ranges under lavapipe's loop limit", "[plan][coop]") {
    const auto devices = fd::fake_devices();
    const device_desc lvp = fd::desc_of(devices[fd::lavapipe_26]);
    for (const auto& [d, S] : {std::pair{64u, 600000u}, std::pair{256u, 1000000u}, std::pair{8u, 2000000u}}) {
        INFO("d = " << d << ", S = " << S);
        const sized_problem big(1, 1, 1, 37, S, d, d, qkv::precision::fp16, kernel_family::coopmat);  // fused: L > 16
        const sdpa_plan p = plan_sdpa(big.p, lvp, {});
        REQUIRE(p.family == kernel_family::coopmat);
        CHECK(p.coop.chunk_keys < S);
        CHECK(p.coop.chunk_keys % p.coop.tiles.bc == 0);
        CHECK(p.coop.chunk_keys / p.coop.tiles.bc * coop_loops_per_tile(p.coop.tiles) < 65535);
        CHECK(p.coop.dispatches(S) <= 5);
        CHECK(p.state_bytes > 0);  // the statistics are handed between the dispatches
    }
    // A GPU takes every key in one dispatch; the test hook caps it.
    const device_desc nv = fd::desc_of(devices[fd::discrete_32]);
    const sized_problem big(1, 1, 1, 37, 600000, 64, 64, qkv::precision::fp16, kernel_family::coopmat);
    CHECK(plan_sdpa(big.p, nv, unverified_ok()).coop.chunk_keys == 600000);
    settings capped = unverified_ok();
    capped.max_fused_keys = 100;
    const sized_problem some(1, 1, 1, 37, 1000, 64, 64, qkv::precision::fp16, kernel_family::coopmat);
    const sdpa_plan c = plan_sdpa(some.p, nv, capped);
    CHECK(c.coop.chunk_keys <= 100);
    CHECK(c.coop.chunk_keys % c.coop.tiles.bc == 0);  // whole tiles
}

TEST_CASE("coop plan: decode packs a K/V head's query heads into M and splits the keys", "[plan][coop][decode]") {
    const auto devices = fd::fake_devices();
    const device_desc nv = fd::desc_of(devices[fd::discrete_32]);
    // Llama-3-like decode: 32 query heads over 8 K/V heads, one query row, 4,096 keys; the family
    // asked for (the GPU gate keeps it from the automatic choice) with QKV_COOP_UNVERIFIED=1.
    const sized_problem step(1, 32, 8, 1, 4096, 128, 128, qkv::precision::fp16, kernel_family::coopmat);
    const settings open = unverified_ok();
    CHECK(plan_sdpa(sized_problem(1, 32, 8, 1, 4096, 128, 128).p, nv, open).decode.family ==
          kernel_family::block_tiles);
    const sdpa_plan p = plan_sdpa(step.p, nv, open);
    REQUIRE_FALSE(p.fused());
    CHECK(p.decode.family == kernel_family::coopmat);
    CHECK(p.kernel() == kernel_family::coopmat);
    CHECK(p.decode.rows == 4);        // G·L rows of one group ...
    CHECK(p.decode.row_blocks == 1);  // ... in one M-tile of 16
    CHECK(p.decode.coop.subgroups == 1);
    CHECK(p.decode.chunks > 1);
    CHECK(p.decode.chunk % p.decode.coop.bc == 0);
    CHECK(std::uint64_t{p.decode.chunk} * p.decode.chunks >= 4096);
    // On lavapipe the cpu decode stays the automatic choice; asked for, the family decodes there too.
    const device_desc lvp = fd::desc_of(devices[fd::lavapipe_26]);
    CHECK(plan_sdpa(sized_problem(1, 32, 8, 1, 4096, 128, 128).p, lvp, {}).decode.family == kernel_family::row_tiles);
    const sized_problem asked(1, 32, 8, 1, 4096, 128, 128, qkv::precision::fp16, kernel_family::coopmat);
    const sdpa_plan c = plan_sdpa(asked.p, lvp, {});
    REQUIRE_FALSE(c.fused());
    CHECK(c.decode.family == kernel_family::coopmat);
    CHECK(c.decode.max_loop <= 16384);
    // fp32 decodes keep the scalar kernels
    const sized_problem single(1, 32, 8, 1, 4096, 128, 128, qkv::precision::fp32);
    CHECK(plan_sdpa(single.p, nv, {}).decode.family == kernel_family::block_tiles);
    // A cache of float16 rows, and a quantized one (the family reads float16 only).
    CHECK(plan_sdpa_cache(step.p, {4096, qkv::element_type::f16}, nv, open).decode.family == kernel_family::coopmat);
    sized_problem quant(1, 32, 8, 1, 4096, 128, 128);
    quant.p.options.kv_type = qkv::element_type::q8_0;
    CHECK(plan_sdpa_cache(quant.p, {4096, qkv::element_type::q8_0}, nv, open).decode.family ==
          kernel_family::block_tiles);
}

TEST_CASE("coop plan: attention's fused kernel takes the family, its products stay the gpu family's",
          "[plan][coop][attention]") {
    const auto devices = fd::fake_devices();
    const device_desc nv = fd::desc_of(devices[fd::discrete_32]);
    std::vector<float> x(2 * 113 * 64), w(64 * 64);
    qkv::attention_problem pr;
    pr.shape = {.batch = 2, .seq = 113, .d_in = 64, .d_k = 64, .d_v = 64, .heads = 2};
    pr.x = x, pr.wq = w, pr.wk = w, pr.wv = w;
    pr.options.precision = qkv::precision::fp16;
    CHECK(plan_attention(pr, nv, {}).family == kernel_family::block_tiles);  // the GPU gate
    pr.options.kernel = kernel_family::coopmat;
    CHECK_THROWS_AS(plan_attention(pr, nv, {}), qkv::vulkan::unavailable);
    const settings open = unverified_ok();
    const plan p = plan_attention(pr, nv, open);
    CHECK(p.impl == qkv::implementation::fused);
    CHECK(p.family == kernel_family::coopmat);
    CHECK(p.project.shader == shader_id::project_f16);
    CHECK(p.coop.tiles.m == 16);
    // The staged implementation has no cooperative-matrix products: asked for, refused.
    pr.options.kernel = kernel_family::coopmat;
    pr.options.implementation = qkv::implementation::staged;
    CHECK_THROWS_AS(plan_attention(pr, nv, open), qkv::vulkan::unavailable);
    // fp32: the gpu family
    pr.options = {};
    pr.options.implementation = qkv::implementation::fused;
    CHECK(plan_attention(pr, nv, {}).family == kernel_family::block_tiles);
}
