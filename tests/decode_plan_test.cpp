// The split-S decode planner (src/kernels/decode_plan.cpp: plan_decode, decode_suits), a pure function
// of the shape and the device description, against the fake devices of support/fake_devices.hpp. No
// Vulkan device needed. The loop counts below are counted from shaders/sdpa_decode.comp, not taken
// from the planner, so that a plan whose bound is wrong fails here.
#include <cstdint>
#include <string>
#include <vector>

#include "contract/decode.h"
#include "contract/mask.h"
#include "kernels/sdpa_decode.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::kernel_family;
using qkv::vulkan::device_info;
using qkv::vulkan::device_type;
using qkv::vulkan::detail::decode_plan;
using qkv::vulkan::detail::decode_request;
using qkv::vulkan::detail::decode_suits;
using qkv::vulkan::detail::plan_decode;

namespace {

namespace fd = qkv::test;
using fake = fd::fake_device;

// llvmpipe ends every loop of an invocation silently after 65,535 iterations in all.
constexpr std::uint64_t lavapipe_loop_limit = 65535;
// The bound decode_plan.cpp keeps each plan's loops within (a quarter of the limit), on every device.
constexpr std::uint64_t loop_budget = 16384;
// The merge shader reads at most this many chunks per row (decode_plan.cpp).
constexpr std::uint32_t max_chunks_total = 4096;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }
bool power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
std::uint64_t log2_of(std::uint64_t v) {
    std::uint64_t n = 0;
    while (v > 1) v /= 2, ++n;
    return n;
}

decode_request request(std::size_t batch, std::size_t q_heads, std::size_t kv_heads, std::size_t q_len,
                       std::size_t kv_len, std::size_t e, std::size_t ev, std::uint32_t masks = 0,
                       kernel_family kernel = kernel_family::automatic, std::uint32_t max_chunks = 0) {
    decode_request r;
    r.shape.batch = batch;
    r.shape.q_heads = q_heads;
    r.shape.kv_heads = kv_heads;
    r.shape.q_len = q_len;
    r.shape.kv_len = kv_len;
    r.shape.d_qk = e;
    r.shape.d_v = ev;
    r.masks = masks;
    r.kernel = kernel;
    r.max_chunks = max_chunks;
    return r;
}

/// Keys per iteration of the kernel's key loop: KPS (cpu), one tile of WG keys (gpu).
std::uint64_t key_step(const decode_plan& p) { return p.family == kernel_family::row_tiles ? p.kps : p.wg; }

/// Loop iterations of one invocation of shaders/sdpa_decode.comp over a chunk of `keys` keys. cpu:
/// the key-step loop alone (every inner loop is unrolled); its wide form (tb > 0) first clears the
/// accumulator (EV4 / TB iterations), then loops over E and Ev TB texels an iteration in every key
/// step (1 + E4 / TB + EV4 / TB). gpu, per tile of WG keys: the tile loop, the score loop over E
/// (a loop past 32 texels),
/// the value loop (WG keys for each of the OUTS outputs an invocation owns), and the row maxima
/// (RPI x gl_NumSubgroups with subgroupMax, at most RPI x WG; log2 WG steps of the shared tree).
std::uint64_t kernel_loops(const decode_plan& p, std::uint64_t keys) {
    if (p.family == kernel_family::row_tiles && p.tb == 0) return ceil_div(keys, p.kps);
    if (p.family == kernel_family::row_tiles)
        return p.ev4 / p.tb + ceil_div(keys, p.kps) * (1 + p.e4 / p.tb + p.ev4 / p.tb);
    const std::uint64_t outs = ceil_div(std::uint64_t{p.rpi} * p.ev4, p.wg);
    const std::uint64_t maxima = p.subgroup ? std::uint64_t{p.rpi} * p.wg : log2_of(p.wg);
    const std::uint64_t scores = p.e4 > 32 ? p.e4 : 0;  // the score loop over E, unrolled up to 32 texels
    return ceil_div(keys, p.wg) * (1 + scores + outs * p.wg + maxima);
}

bool same(const decode_plan& a, const decode_plan& b) {
    return a.family == b.family && a.subgroup == b.subgroup && a.wg == b.wg && a.rpi == b.rpi && a.kps == b.kps &&
           a.e4 == b.e4 && a.ev4 == b.ev4 && a.masks == b.masks && a.groups == b.groups && a.rows == b.rows &&
           a.q_len == b.q_len && a.kv_len == b.kv_len && a.kv_stride == b.kv_stride && a.dv == b.dv &&
           a.row_blocks == b.row_blocks && a.chunk == b.chunk && a.chunks == b.chunks && a.max_loop == b.max_loop &&
           a.tb == b.tb;
}

const char* family_name(kernel_family k) {
    return k == kernel_family::row_tiles ? "cpu" : k == kernel_family::block_tiles ? "gpu" : "automatic";
}

/// Every invariant plan_decode promises for a request it accepts.
void check_plan(const fake& f, const decode_request& r, const decode_plan& p) {
    const qkv::sdpa_shape& s = r.shape;
    const std::uint64_t keys = std::max<std::uint64_t>(s.kv_len, 1);
    const std::uint64_t rows = s.q_heads / s.kv_heads * s.q_len;
    INFO("plan: family " << family_name(p.family) << ", wg " << p.wg << ", rpi " << p.rpi << ", kps " << p.kps
                         << ", subgroup " << p.subgroup << ", row blocks " << p.row_blocks << ", chunk " << p.chunk
                         << " x " << p.chunks << ", max_loop " << p.max_loop);

    // The family follows the request; automatic: cpu on CPU devices, gpu elsewhere.
    const kernel_family expected = r.kernel != kernel_family::automatic ? r.kernel
                                   : f.info.type == device_type::cpu    ? kernel_family::row_tiles
                                                                        : kernel_family::block_tiles;
    CHECK(p.family == expected);

    // The shape, as the shaders read it.
    CHECK(p.rows == rows);
    CHECK(p.groups == s.batch * s.kv_heads);
    CHECK(p.q_len == s.q_len);
    CHECK(p.kv_len == s.kv_len);
    CHECK(p.kv_stride == std::max<std::uint64_t>(r.kv_stride, s.kv_len));
    CHECK(p.dv == s.d_v);
    CHECK(p.e4 == ceil_div(s.d_qk, 4));
    CHECK(p.ev4 == ceil_div(s.d_v, 4));
    CHECK(p.masks == r.masks);

    // The workgroup: within the device, a power of two.
    CHECK(p.wg >= 1);
    CHECK(power_of_two(p.wg));
    CHECK(p.wg <= f.info.max_workgroup_invocations);
    CHECK(power_of_two(p.rpi));
    if (p.family == kernel_family::row_tiles) {
        // One subgroup per workgroup: the device's own size wherever it reports a usable one.
        if (power_of_two(f.info.subgroup_size) && f.info.subgroup_size <= f.info.max_workgroup_invocations)
            CHECK(p.wg == f.info.subgroup_size);
        else
            CHECK(p.wg <= 8);
        // Rows of up to 32 texels unrolled whole; wider ones the wide form, whose loops take tb
        // texels an iteration, dividing both widths (a block of 8 for quantized K/V).
        if (std::max(p.e4, p.ev4) <= 32) {
            CHECK(p.tb == 0);
            CHECK((p.kps == 4 || p.kps == 8));
        } else {
            CHECK((p.tb == 1 || p.tb == 2 || p.tb == 4 || p.tb == 8));
            CHECK(p.e4 % p.tb == 0);
            CHECK(p.ev4 % p.tb == 0);
            if (r.kv_format != qkv::contract::DECODE_KV_TEXELS) CHECK(p.tb == 8);
            CHECK((p.rpi == 1 || p.rpi == 2));
            CHECK(p.rpi * p.kps == 64);
        }
        CHECK(std::uint64_t{p.row_blocks} * p.wg * p.rpi >= rows);  // every row in a block, no empty block
        CHECK(std::uint64_t{p.row_blocks - 1} * p.wg * p.rpi < rows);
    } else {
        CHECK(p.kps == p.wg);  // a tile is one key per invocation
        CHECK(p.tb == 0);
        CHECK(p.rpi <= 8);
        CHECK(std::uint64_t{p.row_blocks} * p.rpi >= rows);
        CHECK(std::uint64_t{p.row_blocks - 1} * p.rpi < rows);
        if (p.subgroup) CHECK(f.info.subgroup_arithmetic);
        // q_sh, p_sh and red_sh within the device's shared memory.
        CHECK(std::uint64_t{p.rpi} * p.e4 * 16 + 2ull * p.rpi * p.wg * 4 <= f.info.max_shared_memory);
    }

    // The split: P chunks of `chunk` keys, a whole number of key steps, covering kv_len with no
    // empty chunk, and no more than the merge reads.
    CHECK(p.chunk >= p.kps);
    CHECK(p.chunk % p.kps == 0);
    CHECK(p.chunks >= 1);
    CHECK(p.chunks <= max_chunks_total);
    CHECK(std::uint64_t{p.chunks} * p.chunk >= keys);
    CHECK(std::uint64_t{p.chunks - 1} * p.chunk < keys);

    // The loops: max_loop bounds the decode kernel's loops in one invocation, within the budget; on
    // a CPU device both shaders stay under llvmpipe's limit.
    CHECK(p.max_loop >= kernel_loops(p, p.chunk));
    CHECK(p.max_loop >= p.chunks);  // the planner counts the merge as one loop over a row's chunks
    CHECK(p.max_loop <= loop_budget);
    if (f.info.type == device_type::cpu) {
        CHECK(p.max_loop < lavapipe_loop_limit);
        CHECK(2ull * p.chunks < lavapipe_loop_limit);  // sdpa_merge.comp's two loops over a row's chunks
    }

    // At most max_chunks chunks, unless the loop budget needs more; then the fewest that keep it. "Needs"
    // by the plan's own bound per key step (max_loop / key steps of a chunk, a true bound by the checks
    // above): the planner's bound is looser than the loops counted here (it counts the subgroupMax
    // variant's RPI x WG maxima loop for the shared-memory tree too), so it may split where the
    // kernel would not pass the budget.
    if (r.max_chunks > 0 && p.chunks > r.max_chunks) {
        const std::uint64_t step = key_step(p);
        const std::uint64_t per_step = p.max_loop / ceil_div(p.chunk, step);
        auto bound = [&](std::uint64_t parts) { return ceil_div(ceil_div(keys, parts), step) * per_step; };
        CHECK(bound(r.max_chunks) > loop_budget);  // max_chunks chunks would pass the budget
        CHECK(bound(p.chunks - 1) > loop_budget);  // and so would one chunk fewer
    }

    // The specialization constants are the plan's.
    const qkv::contract::decode_spec spec = p.spec(qkv::vulkan::detail::decode_values::finite);
    CHECK(spec.wg == p.wg);
    CHECK(spec.rpi == p.rpi);
    CHECK(spec.kps == p.kps);
    CHECK(spec.e4 == p.e4);
    CHECK(spec.ev4 == p.ev4);
    CHECK(spec.masks == p.masks);
    CHECK(spec.subgroup == (p.subgroup ? 1u : 0u));
    CHECK(spec.tb == p.tb);
    CHECK(p.partials() == std::uint64_t{p.groups} * p.rows * p.chunks);
}

/// The message of the limit_exceeded that plan_decode throws for `r` (any other outcome fails).
std::string refusal(const device_info& info, const decode_request& r) {
    try {
        (void)plan_decode(info, r);
    } catch (const qkv::vulkan::limit_exceeded& e) {
        return e.what();
    }
    FAIL("plan_decode accepted a request it cannot run");
    return {};
}

bool mentions(const std::string& message, const char* what) { return message.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("decode plan: every shape on every fake device keeps the kernel's invariants", "[decode_plan]") {
    struct heads {
        std::size_t q, kv;
    };
    for (const fake& f : fd::fake_devices()) {
        for (kernel_family kernel : {kernel_family::automatic, kernel_family::row_tiles, kernel_family::block_tiles}) {
            for (std::size_t batch : {1u, 4u}) {
                for (heads h : {heads{1, 1}, heads{8, 2}, heads{3, 1}}) {
                    for (std::size_t q_len : {1u, 3u, 17u}) {
                        for (std::size_t kv_len : {1u, 3u, 17u, 113u, 1024u, 65537u, 600000u}) {
                            for (std::size_t e : {16u, 64u, 80u, 256u}) {
                                for (std::size_t ev : {16u, 64u, 80u, 256u}) {
                                    for (std::uint32_t masks : {0u, qkv::contract::MASK_FLAG_CAUSAL}) {
                                        for (std::uint32_t max_chunks : {0u, 1u, 4u}) {
                                            const decode_request r = request(batch, h.q, h.kv, q_len, kv_len, e, ev,
                                                                             masks, kernel, max_chunks);
                                            INFO(f.name << ", " << family_name(kernel) << ": B " << batch << ", Hq "
                                                        << h.q << ", Hkv " << h.kv << ", L " << q_len << ", S "
                                                        << kv_len << ", E " << e << ", Ev " << ev << ", masks " << masks
                                                        << ", max_chunks " << max_chunks);
                                            const decode_plan p = plan_decode(f.info, r);
                                            check_plan(f, r, p);
                                            // A pure function: the same request, the same plan.
                                            CHECK(same(p, plan_decode(f.info, r)));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("decode plan: the K/V row stride and the chunk cap", "[decode_plan]") {
    for (const fake& f : fd::fake_devices()) {
        INFO(f.name);
        // A cache longer than its keys: the stride is the cache's, the keys are kv_len.
        decode_request r = request(1, 8, 2, 1, 1000, 64, 64);
        r.kv_stride = 4096;
        const decode_plan p = plan_decode(f.info, r);
        CHECK(p.kv_stride == 4096);
        CHECK(p.kv_len == 1000);
        check_plan(f, r, p);
        // max_chunks = 1: one chunk while the loop budget allows it, more only where it does not.
        const decode_plan one = plan_decode(f.info, request(1, 1, 1, 1, 65537, 64, 64, 0, kernel_family::row_tiles, 1));
        CHECK(one.chunks == 1);  // 8,193 key steps of 8 keys: within the budget
        const decode_plan forced =
            plan_decode(f.info, request(1, 1, 1, 1, 600000, 64, 64, 0, kernel_family::row_tiles, 1));
        CHECK(forced.chunks > 1);  // 75,000 key steps would pass llvmpipe's limit
        CHECK(forced.max_loop < lavapipe_loop_limit);
        // An explicit cap of n chunks gives n where the keys allow it.
        CHECK(plan_decode(f.info, request(1, 1, 1, 1, 4096, 64, 64, 0, kernel_family::automatic, 4)).chunks == 4);
        // A cap above the merge's 4,096 chunks is a cap of 4,096, not a refusal.
        for (std::uint32_t cap : {5000u, 100000u}) {
            const decode_request capped = request(1, 1, 1, 1, 600000, 64, 64, 0, kernel_family::automatic, cap);
            const decode_plan big = plan_decode(f.info, capped);
            CHECK(big.chunks <= max_chunks_total);
            CHECK(big.chunks == plan_decode(f.info, request(1, 1, 1, 1, 600000, 64, 64, 0, kernel_family::automatic,
                                                            max_chunks_total))
                                    .chunks);
            check_plan(f, capped, big);
        }
    }
}

TEST_CASE("decode plan: the merge's output flag by a subgroup vote where the device offers votes and is no CPU",
          "[decode_plan]") {
    const decode_request r = request(1, 8, 2, 1, 1000, 64, 64);
    for (const fake& f : fd::fake_devices()) {
        INFO(f.name);
        for (const bool votes : {false, true}) {
            device_info info = f.info;
            info.subgroup_vote = votes;
            const bool gpu = info.type != device_type::cpu;
            CHECK(plan_decode(info, r).vote == (votes && gpu));
            qkv::vulkan::detail::settings forced;
            forced.decode_vote = true;  // the test hook: a CPU device too, never one without votes
            CHECK(plan_decode(info, r, forced).vote == votes);
        }
    }
}

TEST_CASE("decode plan: wide heads take the cpu kernel's wide form, every K/V format, every width to 4,096",
          "[decode_plan]") {
    for (const fake& f : fd::fake_devices()) {
        for (kernel_family kernel : {kernel_family::automatic, kernel_family::row_tiles, kernel_family::block_tiles}) {
            for (std::uint32_t format :
                 {qkv::contract::DECODE_KV_TEXELS, qkv::contract::DECODE_KV_Q8_0, qkv::contract::DECODE_KV_Q4_0}) {
                for (const auto& [e, ev] : {std::pair<std::size_t, std::size_t>{576, 512},
                                            {1024, 1024},
                                            {4096, 4096},
                                            {4096, 128},
                                            {128, 4096},
                                            {160, 96}}) {
                    for (const auto& [hq, q_len] : {std::pair<std::size_t, std::size_t>{1, 1}, {16, 1}, {32, 3}}) {
                        for (std::size_t kv_len : {1u, 113u, 8192u, 600000u}) {
                            decode_request r =
                                request(1, hq, 1, q_len, kv_len, e, ev, qkv::contract::MASK_FLAG_CAUSAL, kernel);
                            r.kv_format = format;
                            INFO(f.name << ", " << family_name(kernel) << ", format " << format << ": E " << e
                                        << ", Ev " << ev << ", Hq " << hq << ", L " << q_len << ", S " << kv_len);
                            decode_plan p;
                            try {
                                p = plan_decode(f.info, r);
                            } catch (const qkv::vulkan::limit_exceeded& refused) {
                                // Only the gpu kernel refuses some of these: Q of E = 4,096 in its
                                // shared memory, or Ev = 4,096 at 600,000 keys in more chunks than
                                // the merge reads (its value loop counts Ev per tile).
                                INFO(refused.what());
                                CHECK((kernel == kernel_family::block_tiles ||
                                       (kernel == kernel_family::automatic && f.info.type != device_type::cpu)));
                                CHECK((mentions(refused.what(), "shared memory") ||
                                       mentions(refused.what(), "chunks; at most 4096")));
                                continue;
                            }
                            check_plan(f, r, p);
                            if (p.family == kernel_family::row_tiles) CHECK(p.tb == 8);  // every width here divides
                        }
                    }
                }
            }
        }
        // Widths of an odd number of texels (E = 4 x odd): one texel an iteration, still within
        // the loop budget.
        for (std::size_t e : {4092u, 300u, 1028u}) {
            const decode_request r = request(1, 4, 1, 1, 65536, e, e, 0, kernel_family::row_tiles);
            const decode_plan p = plan_decode(f.info, r);
            INFO(f.name << ": E " << e);
            check_plan(f, r, p);
            CHECK(p.tb == 1);
        }
    }
}

TEST_CASE("decode plan: requests the kernels cannot run are refused with limit_exceeded", "[decode_plan]") {
    for (const fake& f : fd::fake_devices()) {
        INFO(f.name);
        for (kernel_family kernel : {kernel_family::automatic, kernel_family::row_tiles, kernel_family::block_tiles}) {
            INFO(family_name(kernel));
            // Head widths above the kernel's 4,096.
            std::string m = refusal(f.info, request(1, 1, 1, 1, 100, 4097, 64, 0, kernel));
            INFO(m);
            CHECK(mentions(m, "head widths of at most 4,096"));
            CHECK(mentions(m, "d_qk = 4097"));
            m = refusal(f.info, request(1, 1, 1, 1, 100, 64, 5000, 0, kernel));
            CHECK(mentions(m, "head widths of at most 4,096"));
            CHECK(mentions(m, "d_v = 5000"));
            // More query rows per K/V head (G x q_len) than 65,535.
            m = refusal(f.info, request(1, 8, 1, 8192, 100, 64, 64, 0, kernel));
            CHECK(mentions(m, "65,535 query rows"));
            CHECK(mentions(m, "G x q_len = 65536"));
            // 2^31 keys.
            m = refusal(f.info, request(1, 1, 1, 1, std::size_t{1} << 31, 64, 64, 0, kernel));
            CHECK(mentions(m, "2^31 keys"));
            CHECK(mentions(m, "kv_len = 2147483648"));
            // More rows in all (B x Hkv x G x q_len) than 2^24, each K/V head's within its limit:
            // the message names this limit and the count, not the per-head one.
            m = refusal(f.info, request(512, 1, 1, 40000, 100, 64, 64, 0, kernel));
            CHECK(mentions(m, "2^24 = 16,777,216 query rows in all"));
            CHECK(mentions(m, "= 20480000"));
            CHECK_FALSE(mentions(m, "per K/V head"));
        }
        // More chunks than the merge reads: 2^31 - 1 keys at 131,072 keys per cpu chunk.
        const std::string m = refusal(f.info, request(1, 1, 1, 1, 0x7fffffffu, 16, 16, 0, kernel_family::row_tiles, 0));
        INFO(m);
        CHECK(mentions(m, "kv_len = 2147483647"));
        CHECK(mentions(m, "at most 4096"));
    }
    // The gpu kernel's Q rows and score tiles in shared memory: d_qk = 4,096 needs 16 KiB for one row's
    // queries alone, more than the minimal device's 16,384 bytes.
    const fake minimal = fd::fake_devices()[fd::minimal];
    const std::string m = refusal(minimal.info, request(1, 1, 1, 1, 100, 4096, 64, 0, kernel_family::block_tiles));
    INFO(m);
    CHECK(mentions(m, "shared memory"));
    CHECK(mentions(m, "d_qk = 4096"));
    // The same width on a device with 48 KiB fits, one row per workgroup.
    const fake nv = fd::fake_devices()[fd::discrete_32];
    const decode_plan wide = plan_decode(nv.info, request(1, 1, 1, 1, 100, 4096, 64, 0, kernel_family::block_tiles));
    CHECK(wide.rpi == 1);
    check_plan(nv, request(1, 1, 1, 1, 100, 4096, 64, 0, kernel_family::block_tiles), wide);
}

TEST_CASE("decode_suits: few query rows per K/V head, many keys, no weights", "[decode_plan]") {
    auto shape = [](std::size_t q_heads, std::size_t kv_heads, std::size_t q_len, std::size_t kv_len) {
        return request(2, q_heads, kv_heads, q_len, kv_len, 64, 64).shape;
    };
    CHECK(decode_suits(shape(1, 1, 1, 65536), false));   // one decode step
    CHECK(decode_suits(shape(32, 8, 16, 1024), false));  // G x L = 64 rows, 1,024 keys: both at the edge
    CHECK(decode_suits(shape(3, 1, 3, 600000), false));
    CHECK_FALSE(decode_suits(shape(1, 1, 1, 65536), true));     // weights: only the fused kernels return them
    CHECK_FALSE(decode_suits(shape(1, 1, 17, 65536), false));   // more than 16 queries: prefill, fused
    CHECK_FALSE(decode_suits(shape(40, 8, 16, 65536), false));  // G x L = 80 rows
    CHECK_FALSE(decode_suits(shape(1, 1, 1, 1023), false));     // too few keys to split
    CHECK_FALSE(decode_suits(shape(8, 0, 1, 65536), false));    // no K/V heads: not a problem to plan
}
