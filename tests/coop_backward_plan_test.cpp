// The cooperative-matrix family's backward plan (src/kernels/flash_coop_backward_plan.cpp), a pure
// function of a device description, against the fake devices of support/fake_devices.hpp, with and
// without cooperative-matrix shapes: the shape it shares with the forward, the tiles that fit each
// device, the chunks below lavapipe's loop limit, and every refusal.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "contract/score.h"
#include "kernels/flash_backward_plan.hpp"
#include "kernels/flash_coop_backward_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::vulkan::device_type;
using namespace qkv::vulkan::detail;
namespace fd = qkv::test;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

flash_layout layout_of(std::uint32_t d, std::uint32_t dv, std::uint32_t q_len = 113, std::uint32_t kv_len = 300,
                       bool fp16 = true) {
    flash_layout l;
    l.batch = 2, l.heads = 8, l.kv_heads = 2, l.q_len = q_len, l.kv_len = kv_len, l.d = d, l.dv = dv;
    l.fp16 = fp16;
    return l;
}

/// QKV_COOP_UNVERIFIED=1's settings: the family where asked for on the GPUs whose gate has not seen it
/// right (the forward's gate, coop_gates), so that their backward plans are made and checked.
settings unverified_ok() {
    settings s;
    s.coop_unverified = true;
    return s;
}

}  // namespace

TEST_CASE("coop backward plan: the forward's shape, tiles that fit, padded blocks", "[plan][coop][backward]") {
    const settings set = unverified_ok();
    const flash_bwd_request r;
    for (const fd::fake_device& f : fd::fake_devices()) {
        INFO(f.name);
        const device_desc desc = fd::desc_of(f);
        for (const auto& [d, dv] : {std::pair{64u, 64u}, std::pair{1u, 3u}, std::pair{17u, 113u}, std::pair{80u, 48u},
                                    std::pair{128u, 128u}, std::pair{256u, 256u}}) {
            for (const auto& [q_len, kv_len] : {std::pair{1u, 1u}, std::pair{3u, 17u}, std::pair{113u, 300u}}) {
                INFO("d = " << d << ", dv = " << dv << ", L = " << q_len << ", S = " << kv_len);
                const flash_layout l = layout_of(d, dv, q_len, kv_len);
                coop_tiles fwd;
                const coop_verdict forward = check_coop(desc, l, false, set, fwd);
                flash_coop_bwd_plan p;
                const coop_verdict v = check_coop_backward(desc, l, r, set, p);
                if (!forward.why.empty()) {  // no usable shape, extension or size control: the same refusal
                    CHECK(v.why == forward.why);
                    CHECK(v.limit == forward.limit);
                    CHECK_THROWS_AS(plan_flash_coop_backward(desc, l, r, set), qkv::vulkan::error);
                    continue;
                }
                REQUIRE(v.why.empty());
                const coop_bwd_tiles& t = p.tiles;
                CHECK(p.automatic == forward.automatic);
                CHECK(t.m == fwd.m);
                CHECK(t.n == fwd.n);
                CHECK(t.k == fwd.k);
                CHECK(t.lanes == fwd.lanes);
                CHECK(t.required_subgroup == t.lanes);
                // Each width is a K of one product and an N of another; each step likewise.
                const std::uint32_t kn = std::lcm(t.k, t.n);
                CHECK(t.d_pad >= d);
                CHECK(t.d_pad % kn == 0);
                CHECK(t.d_pad % 8 == 0);
                CHECK(t.d_pad < d + std::lcm(kn, 8u));
                CHECK(t.dv_pad >= dv);
                CHECK(t.dv_pad % kn == 0);
                CHECK(t.dv_pad < dv + std::lcm(kn, 8u));
                CHECK(t.dkdv_rows % kn == 0);
                CHECK(t.dq_keys % kn == 0);
                CHECK(t.dkdv_keys() == t.subgroups * t.m);
                CHECK(t.dq_rows() == t.subgroups * t.m);
                CHECK(t.dkdv_shared_bytes() <= f.info.max_shared_memory);
                CHECK(t.dq_shared_bytes() <= f.info.max_shared_memory);
                CHECK(t.wg() <= desc.max_workgroup_x());
                if (f.info.type == device_type::cpu) {
                    CHECK(t.subgroups == 1);
                    CHECK(t.dkdv_rows == kn);
                }
                // Both kernels' blocks divide the padded lengths; the chunks are whole steps.
                CHECK(p.npad_q >= q_len);
                CHECK(p.npad_q % t.dq_rows() == 0);
                CHECK(p.npad_q % t.dkdv_rows == 0);
                CHECK(p.npad_kv >= kv_len);
                CHECK(p.npad_kv % t.dkdv_keys() == 0);
                CHECK(p.npad_kv % t.dq_keys == 0);
                CHECK(p.dkdv_chunk % t.dkdv_rows == 0);
                CHECK(p.dq_chunk % t.dq_keys == 0);
                CHECK(p.dkdv_chunk > 0);
                CHECK(p.dq_chunk > 0);
                CHECK(p.dispatches(l) == 2);  // short sequences: one dispatch of each kernel
                CHECK((p.extras & qkv::contract::BWD_CHECK) != 0u);
                CHECK(p.half);
            }
        }
    }
}

TEST_CASE("coop backward plan: lavapipe's loop limit splits long sequences, GPUs take them whole",
          "[plan][coop][backward]") {
    const settings set = unverified_ok();
    const auto devices = fd::fake_devices();
    const flash_layout l = layout_of(256, 256, 70000, 70000);
    for (const std::size_t i : {fd::lavapipe_26, fd::discrete_32}) {
        INFO(devices[i].name);
        const flash_coop_bwd_plan p = plan_flash_coop_backward(fd::desc_of(devices[i]), l, {}, set);
        const std::uint64_t slots = std::uint64_t{l.group()} * p.npad_q;
        if (devices[i].info.type == device_type::cpu) {
            // At most 65,535 iterations of every loop, each counted as if not unrolled: for an 8 x 8
            // x 8 shape on 8 lanes at d = 256, a dk/dv step of 8 rows runs over 500 of them.
            CHECK(p.dkdv_chunk < slots);
            CHECK(p.dkdv_chunk <= 65535 / 500 * p.tiles.dkdv_rows);
            CHECK(p.dq_chunk < p.npad_kv);
            CHECK(p.dispatches(l) > 2);
        } else {
            CHECK(p.dkdv_chunk == slots);
            CHECK(p.dq_chunk == p.npad_kv);
            CHECK(p.dispatches(l) == 2);
        }
        CHECK(p.dispatches(l) == (p.npad_kv + p.dq_chunk - 1) / p.dq_chunk + (slots + p.dkdv_chunk - 1) / p.dkdv_chunk);
    }
    // The test hook caps both kernels' chunks at whole steps.
    settings hooked;
    hooked.max_fused_keys = 20;
    const flash_layout small = layout_of(64, 64, 113, 300);
    const flash_coop_bwd_plan p = plan_flash_coop_backward(fd::desc_of(devices[fd::lavapipe_26]), small, {}, hooked);
    CHECK(p.dkdv_chunk == 16);
    CHECK(p.dq_chunk == 16);
    CHECK(p.dispatches(small) == (p.npad_kv + 15) / 16 + (small.group() * p.npad_q + 15) / 16);
}

TEST_CASE("coop backward plan: refusals name why, with the right error", "[plan][coop][backward]") {
    const settings set = unverified_ok();
    const auto devices = fd::fake_devices();
    for (const std::size_t i : {fd::discrete_32, fd::xe2_16, fd::lavapipe_26}) {
        INFO(devices[i].name);
        const device_desc desc = fd::desc_of(devices[i]);
        flash_coop_bwd_plan p;
        // The additive mask's gradient: the other family's dS scratch.
        flash_bwd_request mask;
        mask.d_mask = true;
        const coop_verdict m = check_coop_backward(desc, layout_of(64, 64), mask, set, p);
        CHECK(contains(m.why, "additive mask's gradient"));
        CHECK_FALSE(m.limit);
        CHECK_THROWS_AS(plan_flash_coop_backward(desc, layout_of(64, 64), mask, set), qkv::vulkan::unavailable);
        // The sinks' gradient comes from the shared prep and fold kernels: taken.
        flash_bwd_request sinks;
        sinks.d_sinks = true;
        CHECK(check_coop_backward(desc, layout_of(64, 64), sinks, set, p).why.empty());
        // float32 storage, as the forward: never float16 products in secret.
        const coop_verdict fp32 = check_coop_backward(desc, layout_of(64, 64, 113, 300, false), {}, set, p);
        CHECK(contains(fp32.why, "precision fp16"));
        CHECK_THROWS_AS(plan_flash_coop_backward(desc, layout_of(64, 64, 113, 300, false), {}, set),
                        qkv::vulkan::unavailable);
        // Dropout, as the forward.
        flash_layout drop = layout_of(64, 64);
        drop.features |= qkv::contract::SCORE_DROPOUT;
        CHECK(contains(check_coop_backward(desc, drop, {}, set, p).why, "dropout"));
        // Wide heads: a limit.
        CHECK_THROWS_AS(plan_flash_coop_backward(desc, layout_of(257, 64), {}, set), qkv::vulkan::limit_exceeded);
        // Too little shared memory for one subgroup's smallest tiles: a limit naming the bytes.
        device_desc small = desc;
        small.info.max_shared_memory = 4096;
        const coop_verdict s = check_coop_backward(small, layout_of(256, 256), {}, set, p);
        INFO(s.why);
        CHECK(contains(s.why, "bytes of shared memory"));
        CHECK(s.limit);
        // A build without the cooperative-matrix shaders.
        device_desc bare = desc;
        bare.coopmat_shaders = false;
        CHECK(contains(check_coop_backward(bare, layout_of(64, 64), {}, set, p).why, "no cooperative-matrix shaders"));
    }
    // No extension, no size control: refused as the forward is, not a limit.
    for (const std::size_t i : {fd::discrete_64_only, fd::integrated_16, fd::minimal, fd::cpu_4}) {
        INFO(devices[i].name);
        flash_coop_bwd_plan p;
        const coop_verdict v = check_coop_backward(fd::desc_of(devices[i]), layout_of(64, 64), {}, set, p);
        CHECK_FALSE(v.why.empty());
        CHECK_FALSE(v.limit);
        CHECK_THROWS_AS(plan_flash_coop_backward(fd::desc_of(devices[i]), layout_of(64, 64), {}, set),
                        qkv::vulkan::unavailable);
    }
}

TEST_CASE("coop backward plan: the backward's plan with the coop dk/dv kernel (QKV_BACKWARD_COOP=1)",
          "[plan][coop][backward]") {
    const auto devices = fd::fake_devices();
    flash_bwd_request r;
    r.coop = true;
    for (const std::size_t i : {fd::discrete_32, fd::xe2_16, fd::lavapipe_26}) {
        INFO(devices[i].name);
        const device_desc desc = fd::desc_of(devices[i]);
        for (const std::uint32_t hook : {0u, 8u, 20u}) {
            settings set = unverified_ok();
            set.max_fused_keys = hook;
            const flash_layout l = layout_of(17, 113, 45, 53);
            const flash_bwd_plan p = plan_flash_backward(desc, l, r, set);
            REQUIRE(p.coop);
            CHECK_FALSE(p.fused);  // the fused order's dR comes from the scalar kernel
            const coop_bwd_tiles& t = p.coop_tiles;
            CHECK(t.m != 0);
            // Padded and chunked for both dk/dv kernels: the coop one and the scalar careful one.
            CHECK(p.npad_q % t.dkdv_rows == 0);
            CHECK(p.npad_q % p.rps == 0);
            CHECK(p.npad_kv % t.dkdv_keys() == 0);
            CHECK(p.npad_kv % p.dkdv_block() == 0);
            CHECK(p.dkdv_chunk % t.dkdv_rows == 0);
            CHECK(p.dkdv_chunk % p.rps == 0);
            CHECK(p.coop_key_blocks == (l.kv_len + t.dkdv_keys() - 1) / t.dkdv_keys());
            if (hook) CHECK(p.dkdv_chunk <= std::max(hook / 8 * 8, std::lcm(p.rps, t.dkdv_rows)));
        }
        // Where the family's plan refuses, the backward's refuses: never another kernel in secret.
        CHECK_THROWS_AS(plan_flash_backward(desc, layout_of(64, 64, 113, 300, false), r, {}), qkv::vulkan::unavailable);
    }
    CHECK_THROWS_AS(plan_flash_backward(fd::desc_of(devices[fd::cpu_4]), layout_of(64, 64), r, {}),
                    qkv::vulkan::unavailable);
    // Without the request: the scalar kernels alone.
    CHECK_FALSE(plan_flash_backward(fd::desc_of(devices[fd::lavapipe_26]), layout_of(64, 64), {}, {}).coop);
}
