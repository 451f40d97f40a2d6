// The batched paged decode's planner (src/kernels/paged_plan.cpp: plan_paged), a pure function of
// the lengths, the shapes and the device description, against the fake devices of
// support/fake_devices.hpp. No Vulkan device needed. Coverage, balance and the limits are counted
// here from the work list, not taken from the planner's own sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/decode_plan.hpp"
#include "kernels/paged_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::vulkan::detail::paged_item;
using qkv::vulkan::detail::paged_plan;
using qkv::vulkan::detail::paged_request;
using qkv::vulkan::detail::plan_paged;
using qkv::vulkan::detail::try_plan_paged;

namespace {

namespace fd = qkv::test;

// llvmpipe ends every loop of an invocation silently after 65,535 iterations; the plans keep a
// quarter of it. The merge reads at most 4,096 partials per row.
constexpr std::uint64_t loop_budget = 16384;
constexpr std::uint32_t max_chunks_total = 4096;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

struct batch {
    std::vector<std::uint32_t> kv, q, first;
    std::uint32_t hq = 32, hkv = 8, d = 128, dv = 128;
    std::uint64_t pool_rows = 1;
    std::uint32_t max_chunks = 0;
    [[nodiscard]] paged_request request() const {
        paged_request r;
        r.kv_lens = kv, r.q_lens = q, r.kv_first = first;
        r.q_heads = hq, r.kv_heads = hkv, r.d_qk = d, r.d_v = dv;
        r.pool_rows = pool_rows;
        r.max_chunks = max_chunks;
        return r;
    }
};

/// B lengths log-uniform in [lo, hi] from a seed (as qkv bench --serve draws them), one query each.
batch log_uniform(std::size_t b, double lo, double hi, std::uint32_t seed) {
    batch x;
    std::mt19937 gen(seed);
    std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
    for (std::size_t i = 0; i < b; ++i) {
        x.kv.push_back(static_cast<std::uint32_t>(std::lround(std::exp(u(gen)))));
        x.q.push_back(1);
        x.pool_rows += x.kv.back();
    }
    return x;
}

/// Every (sequence, K/V head, row block) sees each of its keys [first, S_b) in exactly one item,
/// whose chunk is its place in the merge order; chunks are at most plan.chunk keys, the partial
/// slots are disjoint and inside the plan's count; the loops stay within the budget.
void check_cover(const paged_plan& p, const batch& x) {
    REQUIRE(p.refusal.empty());
    REQUIRE(p.sequences.size() == x.kv.size());
    REQUIRE(p.chunk % p.kps == 0);
    std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::vector<std::uint32_t>> seen;
    for (const paged_item& it : p.items) {
        REQUIRE(it.seq < x.kv.size());
        REQUIRE(it.kv_head < x.hkv);
        const auto& s = p.sequences[it.seq];
        REQUIRE(it.chunk < s.chunks);
        REQUIRE(it.row_block < s.row_blocks);
        const std::uint64_t keys = p.item_keys(it);
        CHECK(keys >= 1);
        CHECK(keys <= p.chunk);
        seen[{it.seq, it.kv_head, it.row_block}].push_back(it.chunk);
        // the kernel's key loop: ceil(keys / KPS) steps, within the budget and the plan's bound
        CHECK(ceil_div(keys, p.kps) <= p.max_loop);
    }
    CHECK(p.max_loop <= loop_budget);
    std::uint64_t parts = 0, q_first = 0;
    for (std::size_t b = 0; b < x.kv.size(); ++b) {
        const auto& s = p.sequences[b];
        const std::uint32_t first = x.first.empty() ? 0 : std::min(x.first[b], x.kv[b]);
        CHECK(s.q_first == q_first);
        q_first += x.q[b];
        CHECK(s.rows == x.hq / x.hkv * x.q[b]);
        CHECK(s.row_blocks == ceil_div(s.rows, std::uint64_t{p.wg} * p.rpi));
        CHECK(s.chunks <= max_chunks_total);
        const std::uint64_t want = x.q[b] == 0 ? 0 : ceil_div(x.kv[b] - first, p.chunk);
        CHECK(s.chunks == want);
        if (s.chunks) CHECK(s.part_base == parts);
        parts += std::uint64_t{x.hkv} * s.rows * s.chunks;
        for (std::uint32_t h = 0; h < x.hkv; ++h)
            for (std::uint32_t blk = 0; blk < s.row_blocks; ++blk) {
                std::vector<std::uint32_t> chunks = seen[{static_cast<std::uint32_t>(b), h, blk}];
                std::sort(chunks.begin(), chunks.end());
                REQUIRE(chunks.size() == s.chunks);
                for (std::uint32_t c = 0; c < s.chunks; ++c) CHECK(chunks[c] == c);
            }
    }
    CHECK(p.partials == parts);
    CHECK(p.total_q == q_first);
}

/// Key steps in all against the per-sequence work (each sequence's keys by whole steps, once per
/// K/V head and row block): the split adds at most one partial step per chunk.
double work_ratio(const paged_plan& p, const batch& x) {
    std::uint64_t split = 0, whole = 0;
    for (const paged_item& it : p.items) split += ceil_div(p.item_keys(it), p.kps);
    for (std::size_t b = 0; b < x.kv.size(); ++b)
        if (x.q[b] != 0) whole += std::uint64_t{x.hkv} * p.sequences[b].row_blocks * ceil_div(x.kv[b], p.kps);
    return static_cast<double>(split) / static_cast<double>(whole);
}

}  // namespace

TEST_CASE("paged plan: the serving batch (B = 64, log-uniform [16, 32768]) on every device", "[paged_plan]") {
    const batch x = log_uniform(64, 16, 32768, 7);
    const std::uint32_t longest = *std::max_element(x.kv.begin(), x.kv.end());
    for (const fd::fake_device& f : fd::fake_devices()) {
        INFO(f.name);
        const paged_plan p = plan_paged(fd::desc_of(f), x.request());
        check_cover(p, x);
        // one subgroup per workgroup, the lanes never assumed
        if (f.info.subgroup_size) CHECK(p.wg == f.info.subgroup_size);
        // K and V shared by shuffles only where the device has them (a CPU device's)
        if (!f.info.subgroup_shuffle) CHECK(!p.shuffle);
        // the longest sequence is split across many workgroups; no item holds more than a chunk,
        // and the chunk is well below the longest sequence
        const auto at = static_cast<std::size_t>(std::max_element(x.kv.begin(), x.kv.end()) - x.kv.begin());
        CHECK(p.sequences[at].chunks >= 4);
        CHECK(p.chunk * 4 <= longest + p.kps * 4);
        // no padding waste: within 1.25x of the per-sequence work
        CHECK(work_ratio(p, x) <= 1.25);
        // bit-deterministic: the same plan for the same request
        const paged_plan again = plan_paged(fd::desc_of(f), x.request());
        REQUIRE(again.items.size() == p.items.size());
        CHECK(std::equal(
            p.items.begin(), p.items.end(), again.items.begin(), [](const paged_item& a, const paged_item& b) {
                return a.seq == b.seq && a.kv_head == b.kv_head && a.chunk == b.chunk && a.row_block == b.row_block;
            }));
    }
}

TEST_CASE("paged plan: one 32K sequence among 63 short ones is split, the short ones stay whole", "[paged_plan]") {
    batch x;
    for (int i = 0; i < 63; ++i) x.kv.push_back(17), x.q.push_back(1);
    x.kv.insert(x.kv.begin() + 20, 32768), x.q.push_back(1);
    x.pool_rows = 32768 + 63 * 17;
    for (const fd::fake_device& f : fd::fake_devices()) {
        INFO(f.name);
        const paged_plan p = plan_paged(fd::desc_of(f), x.request());
        check_cover(p, x);
        CHECK(p.sequences[20].chunks >= 8);
        for (std::size_t b = 0; b < x.kv.size(); ++b)
            if (b != 20) CHECK(p.sequences[b].chunks == 1);
        // the long sequence's largest item is at most an eighth of it
        std::uint64_t biggest = 0;
        for (const paged_item& it : p.items) biggest = std::max(biggest, p.item_keys(it));
        CHECK(biggest * 8 <= 32768 + p.kps * 8);
        CHECK(work_ratio(p, x) <= 1.25);
    }
}

TEST_CASE("paged plan: odd shapes, empty sequences, ragged queries, windows, a fixed split", "[paged_plan]") {
    const fd::fake_device lavapipe = fd::fake_devices()[fd::cpu_8];
    batch x;
    x.hq = 6, x.hkv = 3, x.d = 17, x.dv = 113;
    x.kv = {1, 0, 3, 113, 17, 0, 5000};
    x.q = {1, 3, 0, 17, 2, 0, 4};
    x.pool_rows = 6000;
    const paged_plan p = plan_paged(fd::desc_of(lavapipe), x.request());
    check_cover(p, x);
    CHECK(p.sequences[1].chunks == 0);  // queries, no keys: the merge writes zeros
    CHECK(p.sequences[2].chunks == 0);  // no queries: nothing
    CHECK(p.e4 == 5);
    CHECK(p.ev4 == 29);
    // a window: only the keys [first, S_b) are cut
    batch w = x;
    w.first = {0, 0, 0, 100, 0, 0, 4990};
    const paged_plan pw = plan_paged(fd::desc_of(lavapipe), w.request());
    check_cover(pw, w);
    CHECK(pw.sequences[6].chunks == 1);
    // max_chunks = 1: no split
    batch one = log_uniform(16, 16, 32768, 3);
    one.max_chunks = 1;
    const paged_plan p1 = plan_paged(fd::desc_of(lavapipe), one.request());
    check_cover(p1, one);
    for (const auto& s : p1.sequences) CHECK(s.chunks == 1);
    // many queries per sequence: several row blocks
    batch many;
    many.hq = 8, many.hkv = 1, many.d = many.dv = 64;
    many.kv = {300, 40};
    many.q = {16, 3};
    many.pool_rows = 340;
    const paged_plan pm = plan_paged(fd::desc_of(lavapipe), many.request());
    check_cover(pm, many);
    CHECK(pm.sequences[0].row_blocks > 1);
}

TEST_CASE("paged plan: the limits are refused with their values", "[paged_plan]") {
    const auto desc = fd::desc_of(fd::fake_devices()[fd::cpu_8]);
    batch wide;
    wide.kv = {10}, wide.q = {1}, wide.d = 256, wide.dv = 256;
    CHECK_THROWS_MATCHES(
        plan_paged(desc, wide.request()), qkv::vulkan::limit_exceeded,
        Catch::Matchers::Message("the paged decode kernel takes head widths of at most 128 (d_qk = 256, d_v = 256)"));
    batch rows;
    rows.kv = {10}, rows.q = {70000}, rows.hq = rows.hkv = 1, rows.d = rows.dv = 4;
    CHECK(!try_plan_paged(desc, rows.request()).refusal.empty());
    CHECK(try_plan_paged(desc, rows.request()).items.empty());
    batch big;
    big.kv = {0x7fffffffu}, big.q = {1}, big.hq = big.hkv = 1, big.d = big.dv = 4;
    const paged_plan pb = try_plan_paged(desc, big.request());
    CHECK(pb.refusal.find("chunks") != std::string::npos);
    batch pool;
    pool.kv = {16}, pool.q = {1}, pool.pool_rows = std::uint64_t{1} << 30;
    CHECK(try_plan_paged(desc, pool.request()).refusal.find("texel") != std::string::npos);
}
