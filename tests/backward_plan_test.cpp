// The backward pass's plans (src/kernels/flash_backward.cpp: plan_flash_backward; src/api/
// sdpa_backward_plan.cpp: plan_sdpa_backward), pure functions of the problem's shapes and options,
// a device description and the settings, against the fake devices of support/fake_devices.hpp:
// tiles, padding, the chunks that keep every loop below lavapipe's limit, the buffers and their
// regions, and the refusals.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "contract/score.h"
#include "plan/sdpa_backward_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using namespace qkv::vulkan::detail;

namespace {

using qkv::test::desc_of;
using qkv::test::fake_devices;

/// A backward problem of this shape; its spans only have the sizes (a plan never reads data).
struct sized_backward {
    std::vector<float> q, k, v, d_out, out, lse, additive, sinks;
    qkv::sdpa_backward_problem b;
    sized_backward(std::size_t batch, std::size_t hq, std::size_t hkv, std::size_t L, std::size_t S, std::size_t E,
                   std::size_t Ev, const qkv::sdpa_options& options = {})
        : q(batch * hq * L * E),
          k(batch * hkv * S * E),
          v(batch * hkv * S * Ev),
          d_out(batch * hq * L * Ev),
          out(batch * hq * L * Ev),
          lse(batch * hq * L) {
        b.forward.shape = {
            .batch = batch, .q_heads = hq, .kv_heads = hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
        b.forward.q = q, b.forward.k = k, b.forward.v = v, b.forward.options = options;
        b.d_out = d_out, b.out = out, b.lse = lse;
    }
};

bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

TEST_CASE("backward plan: tiles, padding and chunks on every device", "[plan][backward]") {
    for (const auto& f : fake_devices()) {
        const device_desc d = desc_of(f);
        INFO(f.name);
        for (const std::size_t E : {16u, 64u, 80u, 128u, 576u}) {
            sized_backward s(2, 8, 2, 113, 1000, E, E, {.causal = true, .dropout_p = 0.1f});
            const sdpa_backward_plan p = plan_sdpa_backward(s.b, d, {});
            const flash_bwd_plan& k = p.kernels;
            INFO("E " << E);
            // One subgroup per workgroup, the device's own size (never assumed).
            CHECK(k.wg <= d.max_workgroup_x());
            CHECK(power_of_two(k.wg));
            // Dropout: whole Philox blocks per dq step; a lane's keys within one block or whole blocks.
            CHECK(k.kps % 4 == 0);
            CHECK((k.kpi == 1 || k.kpi == 2 || k.kpi == 4 || k.kpi == 8));
            CHECK(power_of_two(k.rpi));
            // Padding: the dq block and the dk/dv step divide the query rows; the key steps and the
            // dk/dv block divide the keys.
            CHECK(k.npad_q % k.dq_block() == 0);
            CHECK(k.npad_q % k.rps == 0);
            CHECK(k.npad_q >= 113);
            CHECK(k.npad_kv % k.kps == 0);
            CHECK(k.npad_kv % k.dkdv_block() == 0);
            CHECK(k.npad_kv >= 1000);
            // Every loop of one dispatch below 65,535 iterations (llvmpipe's limit).
            CHECK(k.dq_chunk / k.kps < 65535);
            CHECK(k.dkdv_chunk / k.rps + 3 * 4 + 1 < 65535);
            CHECK(k.fold_chunk < 65535);
            CHECK(k.dq_chunk % k.kps == 0);
            CHECK(k.dkdv_chunk % k.rps == 0);
            // The shuffle variants only where a workgroup is one subgroup of a CPU device.
            if (f.info.type != qkv::vulkan::device_type::cpu) CHECK(!k.shuffle);
            // Texel regions aligned for views, in order, within the buffer.
            for (const std::uint64_t at : {k.q_at, k.k_at, k.v_at, k.do_at}) CHECK(at % d.texel_alignment == 0);
            CHECK(k.q_at >= k.flags_bytes);
            CHECK(k.do_at >= k.q_at + k.q_texels * k.texel_bytes());  // Q, dO side by side (paired())
            CHECK(k.k_at >= k.do_at + k.do_texels * k.texel_bytes());
            CHECK(k.v_at >= k.k_at + k.k_texels * k.texel_bytes());
            CHECK(k.texel_bytes_total == k.v_at + k.v_texels * k.texel_bytes());
            if (k.paired()) CHECK(2 * k.rps <= k.wg);
        }
    }
}

TEST_CASE("backward plan: buffers, regions and downloads", "[plan][backward]") {
    const device_desc d = desc_of(fake_devices()[qkv::test::cpu_8]);
    sized_backward s(2, 4, 2, 17, 29, 16, 8, {.causal = true});
    s.additive.assign(4 * 17 * 29, 0.f);
    s.sinks.assign(4, 0.f);
    s.b.forward.additive_mask = s.additive;
    s.b.forward.mask_shape = {4, 17, 29};
    s.b.forward.sinks = s.sinks;
    s.b.return_d_additive_mask = true;
    const sdpa_backward_plan p = plan_sdpa_backward(s.b, d, {});
    // Inputs: the forward's, then dO, out, lse, each aligned and after the last.
    CHECK(p.d_out.at >= p.forward.params.at + p.forward.params.bytes);
    CHECK(p.out.at >= p.d_out.at + p.d_out.bytes);
    CHECK(p.lse.at >= p.out.at + p.out.bytes);
    for (const region& r : {p.d_out, p.out, p.lse}) CHECK(r.at % d.storage_alignment == 0);
    CHECK(p.buffers.of(role::inputs) == p.lse.at + p.lse.bytes);
    // Outputs: dq, dk, dv, the sinks' and the mask's gradients, the verdict; downloaded in that order.
    CHECK(p.dq_count == 2 * 4 * 17 * 16);
    CHECK(p.dk_count == 2 * 2 * 29 * 16);
    CHECK(p.dv_count == 2 * 2 * 29 * 8);
    CHECK(p.d_sinks_count == 4);
    CHECK(p.d_mask_count == 4 * 17 * 29);
    REQUIRE(p.downloads.size() == 6);
    CHECK(p.downloads[0].offset == p.dq_at);
    CHECK(p.downloads[4].offset == p.d_mask_at);
    CHECK(p.downloads[5].bytes == 4 * qkv::contract::BWD_VERDICT_WORDS);
    // The mask's gradient: (Hq, L, S) summed over the batch; the sinks' over batch and rows.
    CHECK(p.kernels.mask.used);
    CHECK(p.kernels.mask.outputs() == 4 * 17 * 29);
    CHECK(p.kernels.mask.terms() == 2);
    CHECK(p.kernels.sinks.outputs() == 4);
    CHECK(p.kernels.sinks.terms() == 2 * 17);
    CHECK(p.kernels.ds_bytes == std::uint64_t{2} * 4 * 17 * 29 * 4);
    CHECK(p.buffers.of(role::scores) == p.kernels.ds_bytes);
    // Without them, no fold and no dS scratch.
    sized_backward plain(1, 2, 2, 5, 7, 16, 16);
    const sdpa_backward_plan q = plan_sdpa_backward(plain.b, d, {});
    CHECK(!q.kernels.mask.used);
    CHECK(!q.kernels.sinks.used);
    CHECK(q.kernels.ds_bytes == 0);
    CHECK(q.downloads.size() == 4);
}

TEST_CASE("backward plan: the test hook cuts every loop into chunks", "[plan][backward]") {
    const device_desc d = desc_of(fake_devices()[qkv::test::cpu_8]);
    sized_backward s(1, 4, 1, 45, 53, 16, 16);
    settings set;
    set.max_fused_keys = 8;
    const sdpa_backward_plan p = plan_sdpa_backward(s.b, d, set);
    CHECK(p.kernels.dq_chunk == 8);
    CHECK(p.kernels.dkdv_chunk == 8);
    CHECK(p.kernels.fold_chunk == 8);
    CHECK(p.kernels.dispatches(p.layout()) > 2);
}

TEST_CASE("backward plan: refusals name the limit", "[plan][backward]") {
    const device_desc d = desc_of(fake_devices()[qkv::test::cpu_8]);
    // Positions the kernels form in 32 bits.
    sized_backward far(1, 1, 1, 4, 4, 16, 16, {.position_offset = std::int64_t{1} << 31});
    CHECK_THROWS_AS(plan_sdpa_backward(far.b, d, {}), qkv::vulkan::limit_exceeded);
    // A mask gradient whose dS scratch exceeds one binding.
    device_desc small = d;
    small.info.max_storage_buffer_range = 1 << 20;
    sized_backward wide(1, 1, 1, 600, 600, 16, 16);
    std::vector<float> additive(600 * 600);
    wide.b.forward.additive_mask = additive;
    wide.b.return_d_additive_mask = true;
    CHECK_THROWS_WITH(plan_sdpa_backward(wide.b, small, {}), Catch::Contains("maxStorageBufferRange"));
    // Without RGBA32F uniform texel buffers.
    device_desc no_texels = d;
    no_texels.texels_rgba32f = false;
    sized_backward s(1, 1, 1, 4, 4, 16, 16);
    CHECK_THROWS_WITH(plan_sdpa_backward(s.b, no_texels, {}), Catch::Contains("uniform texel buffers"));
}

TEST_CASE("backward plan: the fused order where it applies, the two-kernel order elsewhere", "[plan][backward]") {
    for (const auto& f : fake_devices()) {
        const device_desc d = desc_of(f);
        INFO(f.name);
        sized_backward s(2, 4, 2, 113, 17, 64, 64, {.causal = true});
        const sdpa_backward_plan p = plan_sdpa_backward(s.b, d, {});
        const flash_bwd_plan& k = p.kernels;
        // Taken exactly where the shuffle variants run (dq from dR shares K by shuffles).
        CHECK(k.fused == k.shuffle);
        if (!k.fused) {
            CHECK(k.fused_scratch_bytes() == 0);
            CHECK((k.extras & qkv::contract::BWD_STORE_DR) == 0);
            continue;
        }
        // The dR scratch: every (batch, query head)'s key blocks of padded rows, then the check's sums.
        CHECK(k.key_blocks == (17 + k.dkdv_block() - 1) / k.dkdv_block());
        CHECK(k.dr_bytes == std::uint64_t{2} * 4 * k.key_blocks * k.npad_q * k.dkdv_block() * 4);
        CHECK(k.dr_sums_at >= k.dr_bytes);
        CHECK(k.dr_sums_at % d.storage_alignment == 0);
        CHECK(k.dr_sums_bytes == std::uint64_t{2} * 4 * k.key_blocks * k.npad_q * 16);
        CHECK(k.dkdv_block() % 4 == 0);
        CHECK((k.extras & qkv::contract::BWD_STORE_DR) != 0);
        CHECK(p.buffers.of(role::scores) == k.fused_scratch_bytes());
        // One dq dispatch (every key block in one walk) beside dk/dv's chunks.
        CHECK(k.dispatches(p.forward.layout) == 1 + (2 * k.npad_q + k.dkdv_chunk - 1) / k.dkdv_chunk);
        // The setting, the mask's gradient and the budget each keep the two-kernel order.
        settings off;
        off.backward_fused = false;
        CHECK(!plan_sdpa_backward(s.b, d, off).kernels.fused);
        sized_backward m(1, 1, 1, 3, 5, 16, 16);
        m.additive.assign(3 * 5, 0.f);
        m.b.forward.additive_mask = m.additive;
        m.b.forward.mask_shape = {3, 5};
        m.b.return_d_additive_mask = true;
        CHECK(!plan_sdpa_backward(m.b, d, {}).kernels.fused);
        sized_backward one(1, 1, 1, 4096, 4096, 64, 64);  // one head at N = 4096: within it
        const sdpa_backward_plan o = plan_sdpa_backward(one.b, d, {});
        CHECK(o.kernels.fused);
        CHECK(o.kernels.fused_heads == 1);
        CHECK(o.kernels.fused_scratch_bytes() <= fused_budget);
        // One (batch, head) whose dR alone passes the budget: the two-kernel order.
        sized_backward huge(1, 1, 1, 16384, 16384, 64, 64);
        const sdpa_backward_plan h = plan_sdpa_backward(huge.b, d, {});
        CHECK(!h.kernels.fused);
        CHECK(h.buffers.of(role::scores) == 0);
    }
}

namespace {

/// The fused order's chunks of `k` for `l`: every (batch, query head) once, in order, each chunk
/// fused_heads or fewer, within one K/V head's group where smaller than a group; the scratch one
/// chunk's, within the budget and the device's storage range.
void check_fused_chunks(const flash_bwd_plan& k, const flash_layout& l, const device_desc& d) {
    REQUIRE(k.fused);
    const std::vector<flash_bwd_plan::head_chunk> chunks = k.fused_chunks(l);
    std::uint32_t next = 0;
    std::uint32_t most = 0;
    for (const auto& c : chunks) {
        CHECK(c.first == next);
        CHECK(c.count >= 1);
        CHECK(c.count <= k.fused_heads);
        if (k.fused_heads < l.group()) CHECK(c.first / l.group() == (c.first + c.count - 1) / l.group());
        if (k.fused_heads >= l.group()) CHECK(k.fused_heads % l.group() == 0);
        next = c.first + c.count;
        most = std::max(most, c.count);
    }
    CHECK(next == l.q_batches());
    CHECK(most == k.fused_heads);
    const std::uint64_t head_floats = std::uint64_t{k.key_blocks} * k.npad_q * k.dkdv_block();
    CHECK(k.dr_bytes == k.fused_heads * head_floats * 4);
    CHECK(k.dr_sums_bytes == std::uint64_t{k.fused_heads} * k.key_blocks * k.npad_q * 16);
    CHECK(k.fused_scratch_bytes() <= fused_budget);
    CHECK(k.dr_bytes <= d.info.max_storage_buffer_range);
    CHECK(k.dr_sums_bytes <= d.info.max_storage_buffer_range);
    // One dq dispatch per chunk beside dk/dv's row chunks over its heads' slots.
    std::uint32_t dispatches = 0;
    for (const auto& c : chunks)
        dispatches +=
            1 + static_cast<std::uint32_t>((std::uint64_t{std::min(c.count, l.group())} * k.npad_q + k.dkdv_chunk - 1) /
                                           k.dkdv_chunk);
    CHECK(k.dispatches(l) == dispatches);
}

}  // namespace

TEST_CASE("backward plan: the fused order in chunks of heads within its scratch budget", "[plan][backward]") {
    for (const auto& f : fake_devices()) {
        const device_desc d = desc_of(f);
        INFO(f.name);
        sized_backward probe(1, 1, 1, 64, 64, 64, 64);
        if (!plan_sdpa_backward(probe.b, d, {}).kernels.fused) continue;  // no shuffles: never fused
        // Sixteen heads at N = 4096 (`qkv bench --backward --heads 16`): whole heads per chunk,
        // chunks of equal size (the last fewer), the scratch one chunk's.
        sized_backward many(1, 16, 16, 4096, 4096, 64, 64);
        const sdpa_backward_plan m = plan_sdpa_backward(many.b, d, {});
        const flash_layout lm = m.forward.layout;
        check_fused_chunks(m.kernels, lm, d);
        const std::size_t n = m.kernels.fused_chunks(lm).size();
        CHECK(n > 1);
        CHECK(m.kernels.fused_heads == (16 + n - 1) / n);
        CHECK(m.buffers.of(role::scores) == m.kernels.fused_scratch_bytes());
        // GQA whose one K/V head's group passes the budget: parts of a group per chunk.
        sized_backward gqa(2, 16, 2, 4096, 4096, 64, 64, {.causal = true});
        const sdpa_backward_plan g = plan_sdpa_backward(gqa.b, d, {});
        check_fused_chunks(g.kernels, g.forward.layout, d);
        CHECK(g.kernels.fused_heads < 8);
        // GQA whose groups fit: whole groups per chunk.
        sized_backward small_groups(3, 8, 4, 2048, 2048, 64, 64);
        const sdpa_backward_plan sg = plan_sdpa_backward(small_groups.b, d, {});
        check_fused_chunks(sg.kernels, sg.forward.layout, d);
        CHECK(sg.kernels.fused_heads % 2 == 0);
        // A device with a smaller storage range: smaller chunks.
        device_desc narrow = d;
        narrow.info.max_storage_buffer_range = 128u << 20;
        const sdpa_backward_plan nm = plan_sdpa_backward(many.b, narrow, {});
        check_fused_chunks(nm.kernels, nm.forward.layout, narrow);
        CHECK(nm.kernels.fused_heads < m.kernels.fused_heads);
        // The test hook: at most so many heads per chunk, whole groups or parts of one.
        sized_backward s(2, 6, 2, 17, 113, 16, 16);
        for (const std::uint32_t at_most : {1u, 2u, 3u, 5u, 6u, 100u}) {
            INFO("at most " << at_most << " heads");
            settings set;
            set.max_fused_heads = at_most;
            const sdpa_backward_plan c = plan_sdpa_backward(s.b, d, set);
            check_fused_chunks(c.kernels, c.forward.layout, d);
            const std::uint32_t want = at_most == 1 ? 1 : at_most == 2 ? 2 : at_most < 6 ? 3 : at_most < 12 ? 6 : 12;
            CHECK(c.kernels.fused_heads == want);
        }
        // Without the hook a small problem is one chunk.
        const sdpa_backward_plan one = plan_sdpa_backward(s.b, d, {});
        CHECK(one.kernels.fused_chunks(one.forward.layout).size() == 1);
        CHECK(one.kernels.fused_heads == 12);
    }
}

TEST_CASE("backward plan: kernel coopmat takes the cooperative-matrix kernels or is refused",
          "[plan][backward][coop]") {
    const auto devices = fake_devices();
    for (const std::size_t i : {qkv::test::discrete_32, qkv::test::xe2_16, qkv::test::lavapipe_26}) {
        INFO(devices[i].name);
        const device_desc d = desc_of(devices[i]);
        sized_backward asked(
            2, 8, 2, 37, 300, 64, 64,
            {.causal = true, .precision = qkv::precision::fp16, .kernel = qkv::kernel_family::coopmat});
        // On a GPU the family's gate refuses it unless QKV_COOP_UNVERIFIED=1 (coop_gates).
        settings open;
        open.coop_unverified = true;
        if (devices[i].info.type != qkv::vulkan::device_type::cpu)
            CHECK_THROWS_AS(plan_sdpa_backward(asked.b, d, {}), qkv::vulkan::unavailable);
        const sdpa_backward_plan p = plan_sdpa_backward(asked.b, d, open);
        CHECK(p.kernels.coop);
        CHECK_FALSE(p.kernels.fused);
        // The automatic choice keeps the other family's kernels (the matrix ones are not measured
        // on a GPU yet).
        sized_backward automatic(2, 8, 2, 37, 300, 64, 64, {.causal = true, .precision = qkv::precision::fp16});
        CHECK_FALSE(plan_sdpa_backward(automatic.b, d, open).kernels.coop);
        // Dropout is refused by name, as the family's forward refuses it.
        sized_backward dropout(
            2, 8, 2, 37, 300, 64, 64,
            {.precision = qkv::precision::fp16, .kernel = qkv::kernel_family::coopmat, .dropout_p = 0.1f});
        CHECK_THROWS_AS(plan_sdpa_backward(dropout.b, d, open), qkv::vulkan::unavailable);
    }
    for (const std::size_t i : {qkv::test::cpu_4, qkv::test::integrated_16, qkv::test::minimal}) {
        INFO(devices[i].name);
        sized_backward asked(1, 2, 1, 17, 33, 64, 64,
                             {.precision = qkv::precision::fp16, .kernel = qkv::kernel_family::coopmat});
        CHECK_THROWS_AS(plan_sdpa_backward(asked.b, desc_of(devices[i]), {}), qkv::vulkan::unavailable);
    }
}
