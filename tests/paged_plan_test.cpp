// The batched paged decode's planner (src/kernels/paged_plan.cpp: plan_paged), a pure function of
// the lengths, the shapes and the device description, against the fake devices of
// support/fake_devices.hpp. No Vulkan device needed. Coverage, balance and the limits are counted
// here from the work list, not taken from the planner's own sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
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

TEST_CASE("paged plan: every contiguous share of the work list holds its share of the work", "[paged_plan]") {
    // A CPU device's threads each take one contiguous range of the workgroups (llvmpipe: T ranges of
    // items / T, the remainder after them), so every such range must hold about a T-th of the key
    // steps wherever the long sequences sit in the batch: within 5 % and one item.
    batch one_long;
    for (std::uint32_t i = 0; i < 63; ++i) one_long.kv.push_back(17 + i), one_long.q.push_back(1);
    one_long.kv.insert(one_long.kv.begin() + 5, 32768), one_long.q.push_back(1);
    one_long.pool_rows = 40000;
    batch sorted = log_uniform(64, 16, 32768, 11);  // the long sequences all in the first half
    std::sort(sorted.kv.begin(), sorted.kv.end(), std::greater<>());
    for (const batch& x : {log_uniform(64, 16, 32768, 7), log_uniform(64, 16, 2048, 3), one_long, sorted})
        for (const fd::fake_device& f : fd::fake_devices()) {
            INFO(f.name);
            const paged_plan p = plan_paged(fd::desc_of(f), x.request());
            check_cover(p, x);
            std::vector<std::uint64_t> steps;
            for (const paged_item& it : p.items) steps.push_back(ceil_div(p.item_keys(it), p.kps));
            const std::uint64_t total = std::accumulate(steps.begin(), steps.end(), std::uint64_t{0});
            const std::uint64_t biggest = *std::max_element(steps.begin(), steps.end());
            for (const std::size_t threads : {2u, 3u, 4u, 8u}) {
                INFO(threads << " threads, " << steps.size() << " items");
                const std::size_t per = steps.size() / threads;
                for (std::size_t t = 0; t < threads; ++t) {
                    const auto from = steps.begin() + static_cast<std::ptrdiff_t>(t * per);
                    const std::uint64_t got =
                        std::accumulate(from, from + static_cast<std::ptrdiff_t>(per), std::uint64_t{0});
                    const double share =
                        static_cast<double>(total) * static_cast<double>(per) / static_cast<double>(steps.size());
                    CHECK(static_cast<double>(got) <= share * 1.05 + static_cast<double>(biggest));
                    CHECK(static_cast<double>(got) >= share * 0.95 - static_cast<double>(biggest));
                }
            }
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
    // A q8_0 / q4_0 pool is read from its blocks' storage buffers (which the kv_cache bounds), not
    // through a texel view: the texel limit is not its.
    paged_request blocks = pool.request();
    blocks.kv_blocks = true;
    CHECK(try_plan_paged(desc, blocks).refusal.empty());
}

namespace {

/// A batch whose block table gives sequence b the pages `tables[b]` (page_size rows each),
/// bottom-right causal (off' = S_b - L_b).
struct shared_batch {
    batch x;
    std::vector<std::int32_t> table, offsets;
    std::uint32_t page_size = 16, max_pages = 0;
    bool causal = true;
    std::int32_t window_left = -1;
    bool cascade = true;
    std::vector<std::uint32_t> kv_base;  ///< empty, or per sequence its first pool key (cache_leftpad)

    shared_batch(std::vector<std::uint32_t> kv, std::vector<std::uint32_t> q,
                 const std::vector<std::vector<std::int32_t>>& tables, std::uint32_t ps)
        : page_size(ps) {
        x.kv = std::move(kv), x.q = std::move(q);
        x.hq = 8, x.hkv = 2, x.d = x.dv = 32;
        for (const auto& t : tables)
            max_pages = std::max<std::uint32_t>(max_pages, static_cast<std::uint32_t>(t.size()));
        max_pages = std::max<std::uint32_t>(max_pages, 1);
        table.assign(tables.size() * max_pages, -1);
        std::int32_t most = 0;
        for (std::size_t b = 0; b < tables.size(); ++b)
            for (std::size_t j = 0; j < tables[b].size(); ++j) {
                table[b * max_pages + j] = tables[b][j];
                most = std::max(most, tables[b][j]);
            }
        x.pool_rows = std::uint64_t{page_size} * static_cast<std::uint64_t>(most + 1);
        for (std::size_t b = 0; b < x.kv.size(); ++b)
            offsets.push_back(static_cast<std::int32_t>(x.kv[b]) - static_cast<std::int32_t>(x.q[b]));
    }
    [[nodiscard]] paged_request request() const {
        paged_request r = x.request();
        r.block_table = table, r.max_pages = max_pages, r.page_size = page_size;
        r.offsets = offsets, r.causal = causal, r.window_left = window_left, r.cascade = cascade;
        r.kv_base = kv_base;
        return r;
    }
};

/// Every (sequence, K/V head, row) of the batch sees each of its keys [0, S_b) exactly once, from
/// its own items or its groups' prefix items, each partial slot 0..P_b-1 filled exactly once, and
/// every prefix item reads keys of pages its members all list. The groups form a tree: a node's
/// keys begin where its parent's end, its members are some of its parent's, and its tail is its
/// chunks and its parent's tail.
void check_cascade_cover(const paged_plan& p, const shared_batch& sb) {
    const batch& x = sb.x;
    REQUIRE(p.refusal.empty());
    const std::size_t B = x.kv.size();
    REQUIRE(p.batch == B);
    REQUIRE(p.sequences.size() == B + p.groups.size());
    for (std::size_t i = 0; i < p.groups.size(); ++i) {
        const auto& g = p.groups[i];
        const auto& e = p.sequences[g.entry];
        CHECK(g.entry == B + i);
        CHECK(g.members.size() >= 2);
        CHECK(std::is_sorted(g.members.begin(), g.members.end()));
        CHECK(e.kv_first == g.first);
        CHECK(e.kv_len == g.prefix);
        CHECK(g.first < g.prefix);
        CHECK(g.prefix % sb.page_size == 0);
        if (g.parent == qkv::vulkan::detail::paged_group::root) {
            CHECK(g.first == 0);
            CHECK(g.depth == 1);
            CHECK(e.tail == e.chunks);
        } else {
            REQUIRE(g.parent < i);  // preorder
            const auto& up = p.groups[g.parent];
            CHECK(g.first == up.prefix);
            CHECK(g.depth == up.depth + 1);
            CHECK(e.tail == e.chunks + p.sequences[up.entry].tail);
            for (const std::uint32_t b : g.members)
                CHECK(std::find(up.members.begin(), up.members.end(), b) != up.members.end());
        }
        for (const std::uint32_t b : g.members)  // its pages are each member's
            for (std::uint32_t j = 0; j < g.prefix / sb.page_size; ++j)
                CHECK(sb.table[std::size_t{b} * sb.max_pages + j] ==
                      sb.table[std::size_t{g.members[0]} * sb.max_pages + j]);
    }
    const std::uint32_t G = x.hq / x.hkv;
    std::vector<std::uint32_t> seq_of;  // the sequence of each query row
    for (std::size_t b = 0; b < B; ++b)
        for (std::uint32_t i = 0; i < x.q[b]; ++i) seq_of.push_back(static_cast<std::uint32_t>(b));
    // per (sequence, head, row of the sequence): the keys seen and the slots written
    std::map<std::tuple<std::size_t, std::uint32_t, std::uint32_t>, std::vector<std::uint32_t>> keys, slots;
    for (const paged_item& it : p.items) {
        const auto& s = p.sequences[it.seq];
        REQUIRE(it.chunk < s.own_chunks);
        const std::uint64_t begin = s.kv_first + std::uint64_t{it.chunk} * p.chunk;
        const std::uint64_t end = begin + p.item_keys(it);
        CHECK(end - begin <= p.chunk);
        CHECK(ceil_div(end - begin, p.kps) <= p.max_loop);
        const std::uint32_t block = p.wg * p.rpi;
        for (std::uint32_t r = it.row_block * block; r < std::min(s.rows, (it.row_block + 1) * block); ++r) {
            std::size_t b = it.seq;
            std::uint32_t row = r, slot = it.chunk;
            if (it.seq >= B) {  // a shared prefix: the row's own sequence
                const std::uint32_t t = p.group_tokens[s.q_first + r % s.q_len];
                b = seq_of[t];
                row = (r / s.q_len) * x.q[b] + (t - p.sequences[b].q_first);
                slot = p.sequences[b].chunks - s.tail + it.chunk;
                for (std::uint64_t j = begin; j < end; ++j)  // the prefix's page is the member's
                    CHECK(
                        sb.table[b * sb.max_pages + j / sb.page_size] ==
                        sb.table[std::size_t{p.groups[it.seq - B].members.front()} * sb.max_pages + j / sb.page_size]);
            }
            for (std::uint64_t j = begin; j < end; ++j)
                keys[{b, it.kv_head, row}].push_back(static_cast<std::uint32_t>(j));
            slots[{b, it.kv_head, row}].push_back(slot);
        }
    }
    for (std::size_t b = 0; b < B; ++b) {
        if (x.q[b] == 0) continue;
        for (std::uint32_t h = 0; h < x.hkv; ++h)
            for (std::uint32_t row = 0; row < G * x.q[b]; ++row) {
                std::vector<std::uint32_t> k = keys[{b, h, row}], sl = slots[{b, h, row}];
                std::sort(k.begin(), k.end());
                std::sort(sl.begin(), sl.end());
                REQUIRE(k.size() == x.kv[b]);
                for (std::uint32_t j = 0; j < x.kv[b]; ++j) CHECK(k[j] == j);
                REQUIRE(sl.size() == p.sequences[b].chunks);
                for (std::uint32_t c = 0; c < sl.size(); ++c) CHECK(sl[c] == c);
            }
    }
}

}  // namespace

TEST_CASE("paged plan: shared prefixes form groups, each prefix planned once for its members", "[paged_plan]") {
    const auto desc = fd::desc_of(fd::fake_devices()[fd::cpu_8]);
    // 0, 1, 2 share pages 7, 8; 3 shares page 7 only; 4 stands alone; 5 and 6 share pages 20, 21
    // (ragged queries); 7 has no queries though it lists page 20.
    shared_batch sb({40, 33, 100, 20, 50, 40, 33, 30}, {1, 1, 1, 1, 1, 3, 1, 0},
                    {{7, 8, 9},
                     {7, 8, 10},
                     {7, 8, 11, 12, 13, 14, 15},
                     {7, 16},
                     {17, 18, 19},
                     {20, 21, 23},
                     {20, 21, 24},
                     {20, 22}},
                    16);
    const paged_plan p = plan_paged(desc, sb.request());
    INFO(p.cascade);
    check_cascade_cover(p, sb);
    REQUIRE(p.groups.size() == 3);
    CHECK(p.groups[0].members == std::vector<std::uint32_t>{0, 1, 2, 3});
    CHECK(p.groups[0].prefix == 16);                                    // sequence 3 shares only the first page
    CHECK(p.groups[1].members == std::vector<std::uint32_t>{0, 1, 2});  // and 0, 1, 2 the second too
    CHECK(p.groups[1].parent == 0);
    CHECK(p.groups[1].first == 16);
    CHECK(p.groups[1].prefix == 32);
    CHECK(p.groups[2].members == std::vector<std::uint32_t>{5, 6});
    CHECK(p.groups[2].prefix == 32);
    CHECK(p.sequences[p.groups[2].entry].q_len == 4);  // 3 + 1 rows stacked
    CHECK(p.sequences[p.groups[2].entry].rows == 16);  // G = 4
    CHECK(p.sequences[4].kv_first == 0);
    CHECK(p.sequences[3].kv_first == 16);
    CHECK(p.sequences[0].kv_first == 32);
    CHECK(p.cascade.find("3 shared prefixes for 6 sequences, 2 levels") != std::string::npos);
    // without 3, the first group shares two pages
    shared_batch two = sb;
    two.table[3 * two.max_pages] = 30;
    two.x.pool_rows = 31 * 16;
    const paged_plan p2 = plan_paged(desc, two.request());
    check_cascade_cover(p2, two);
    REQUIRE(p2.groups.size() == 2);
    CHECK(p2.groups[0].prefix == 32);
    // a fixed split (max_chunks = 1) and a forced small chunk still cover every key once
    shared_batch one = sb;
    one.x.max_chunks = 1;
    check_cascade_cover(plan_paged(desc, one.request()), one);
    for (const auto& lanes : {fd::discrete_32, fd::cpu_8, fd::minimal}) {
        // page size 1: whole pages are single keys. All four share keys [0, 60), three of them
        // [60, 62): on every device the 60 keys pay (the rows of four stacked in at most as many
        // blocks, 8 steps each), the 2 keys below them not (one step, their blocks each full or
        // stacked into as many).
        std::vector<std::vector<std::int32_t>> tables(4);
        for (std::int32_t j = 0; j < 60; ++j)
            for (auto& t : tables) t.push_back(j);
        for (std::size_t b = 0; b < 3; ++b) tables[b].insert(tables[b].end(), {60, 61});
        tables[0].push_back(70), tables[1].push_back(71), tables[2].push_back(72);
        tables[3].insert(tables[3].end(), {80, 81, 82, 83});
        shared_batch page1({63, 63, 63, 64}, {2, 1, 1, 1}, tables, 1);
        const paged_plan pp = plan_paged(fd::desc_of(fd::fake_devices()[lanes]), page1.request());
        INFO(pp.cascade);
        check_cascade_cover(pp, page1);
        REQUIRE(!pp.groups.empty());
        CHECK(pp.groups[0].prefix == 60);
        CHECK(pp.groups[0].members == std::vector<std::uint32_t>{0, 1, 2, 3});
    }
}

TEST_CASE("paged plan: no cascade where a rule hides the prefix, a group of one, or the caller says so",
          "[paged_plan]") {
    const auto desc = fd::desc_of(fd::fake_devices()[fd::cpu_8]);
    const std::vector<std::vector<std::int32_t>> tables{{0, 1, 2}, {0, 1, 3}, {4, 5}};
    const shared_batch base({40, 40, 20}, {1, 1, 1}, tables, 16);
    const auto none = [&](const shared_batch& sb, const std::string& why) {
        const paged_plan p = plan_paged(desc, sb.request());
        INFO(p.cascade);
        CHECK(p.groups.empty());
        CHECK(p.sequences.size() == sb.x.kv.size());
        CHECK(p.cascade.find(why) != std::string::npos);
        check_cascade_cover(p, sb);
    };
    REQUIRE(plan_paged(desc, base.request()).groups.size() == 1);
    shared_batch w = base;
    w.window_left = 30;  // the last query (position 39) does not see key 0
    none(w, "no cascade: the window's left side keeps sequence 0's first page from some of its queries");
    w.window_left = 39;  // it does
    CHECK(plan_paged(desc, w.request()).groups.size() == 1);
    shared_batch top = base;
    top.offsets = {0, 0, 0};  // top-left alignment: query 0 sees key 0 only
    none(top, "the causal alignment keeps sequence 0's first page");
    top.offsets = {31, 31, 0};  // query 0 at position 31 sees the whole first two pages
    const paged_plan pt = plan_paged(desc, top.request());
    REQUIRE(pt.groups.size() == 1);
    CHECK(pt.groups[0].prefix == 32);
    shared_batch off = base;
    off.cascade = false;
    none(off, "no cascade: turned off for this call");
    shared_batch pad = base;
    pad.kv_base = {0, 3, 0};  // sequence 1's keys start at its pages' key 3: they are not the prefix's
    none(pad, "no cascade: cache_leftpad moves sequence 1's first key");
    shared_batch lone = base;
    lone.table[1 * lone.max_pages] = 6, lone.x.pool_rows = 7 * 16;
    none(lone, "no two sequences with queries begin with the same whole page");
    shared_batch noq = base;
    noq.x.q = {1, 0, 1};  // the other member has no queries
    none(noq, "no two sequences");
    shared_batch short_seq = base;
    short_seq.x.kv = {40, 10, 20};  // sequence 1 has less than a page of keys
    short_seq.offsets = {38, 8, 19};
    none(short_seq, "no two sequences");
    shared_batch rows = base;
    rows.x.hq = rows.x.hkv = 1, rows.x.d = rows.x.dv = 4;
    rows.x.kv = {40000, 40000, 20}, rows.x.q = {35000, 35000, 1};
    rows.offsets = {5000, 5000, 19};
    rows.table.assign(3 * 2500, -1);
    rows.max_pages = 2500;
    for (std::size_t j = 0; j < 2500; ++j) {
        rows.table[j] = static_cast<std::int32_t>(j);
        rows.table[2500 + j] = j == 0 ? 0 : static_cast<std::int32_t>(3000 + j);
    }
    rows.table[5000] = 2600, rows.table[5001] = 2601;
    rows.x.pool_rows = 5600 * 16;
    const paged_plan pr = plan_paged(desc, rows.request());
    CHECK(pr.groups.empty());
    CHECK(pr.cascade.find("stacks 70000 query rows per K/V head") != std::string::npos);
}

TEST_CASE("paged plan: nested shared prefixes form a tree of depth 1, 2 and 3, disjoint groups beside it",
          "[paged_plan][cascade]") {
    const auto desc = fd::desc_of(fd::fake_devices()[fd::cpu_8]);
    // A system prompt (pages 0, 1) shared by 0..5 and 8, a few-shot prefix (pages 2, 3) by 0..3, a
    // third level (pages 4, 5) by 0 and 1; 6 and 7 a disjoint group (pages 40, 41); 8 is the system prompt
    // and nothing more (its keys all shared); 9 has no keys, 10 no queries (both list page 0); 11
    // and 12 share page 23, but not at their start (no cascade); 13 stands alone.
    shared_batch sb({110, 100, 70, 65, 40, 40, 45, 33, 32, 0, 30, 30, 31, 20},
                    {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1},
                    {{0, 1, 2, 3, 4, 5, 10},
                     {0, 1, 2, 3, 4, 5, 11},
                     {0, 1, 2, 3, 12},
                     {0, 1, 2, 3, 13},
                     {0, 1, 14},
                     {0, 1, 15},
                     {40, 41, 16},
                     {40, 41, 17},
                     {0, 1},
                     {0},
                     {0, 1},
                     {22, 23},
                     {24, 23},
                     {25, 26}},
                    16);
    const paged_plan p = plan_paged(desc, sb.request());
    INFO(p.cascade);
    check_cascade_cover(p, sb);
    REQUIRE(p.groups.size() == 4);
    CHECK(p.groups[0].members == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 8});
    CHECK((p.groups[0].first == 0 && p.groups[0].prefix == 32 && p.groups[0].depth == 1));
    CHECK(p.groups[1].members == std::vector<std::uint32_t>{0, 1, 2, 3});
    CHECK((p.groups[1].first == 32 && p.groups[1].prefix == 64 && p.groups[1].parent == 0 && p.groups[1].depth == 2));
    CHECK(p.groups[2].members == std::vector<std::uint32_t>{0, 1});
    CHECK((p.groups[2].first == 64 && p.groups[2].prefix == 96 && p.groups[2].parent == 1 && p.groups[2].depth == 3));
    CHECK(p.groups[3].members == std::vector<std::uint32_t>{6, 7});
    CHECK((p.groups[3].first == 0 && p.groups[3].prefix == 32 && p.groups[3].depth == 1));
    CHECK(p.cascade.find("4 shared prefixes for 9 sequences, 3 levels") != std::string::npos);
    // the members keep the keys past their deepest node; 8 keeps none, but its slots are the root's
    CHECK(p.sequences[0].kv_first == 96);
    CHECK(p.sequences[2].kv_first == 64);
    CHECK(p.sequences[4].kv_first == 32);
    CHECK(p.sequences[8].kv_first == 32);
    CHECK(p.sequences[8].own_chunks == 0);
    CHECK(p.sequences[8].chunks == p.sequences[p.groups[0].entry].chunks);
    for (const std::uint32_t b : {9u, 10u, 11u, 12u, 13u}) CHECK(p.sequences[b].kv_first == 0);
    // a pure function: equal requests, equal plans (the merge's order with them)
    const paged_plan again = plan_paged(desc, sb.request());
    REQUIRE(again.items.size() == p.items.size());
    for (std::size_t i = 0; i < p.items.size(); ++i)
        CHECK((again.items[i].seq == p.items[i].seq && again.items[i].chunk == p.items[i].chunk &&
               again.items[i].kv_head == p.items[i].kv_head && again.items[i].row_block == p.items[i].row_block));
    CHECK(again.group_tokens == p.group_tokens);
    // long sequences, a tree of depth 3, split into chunks by the device's target or a fixed count:
    // every key still covered once, every slot filled once
    shared_batch wide({800, 700, 600, 500, 400, 400}, {1, 2, 1, 3, 1, 1}, {{0}, {0}, {0}, {0}, {0}, {0}}, 16);
    wide.max_pages = 50;
    wide.table.assign(6 * 50, -1);
    for (std::size_t b = 0; b < 6; ++b) {
        const std::size_t shared = b < 2 ? 6 : b < 4 ? 4 : 2;
        for (std::size_t j = 0; j < ceil_div(wide.x.kv[b], 16); ++j)
            wide.table[b * 50 + j] =
                j < shared ? static_cast<std::int32_t>(j) : static_cast<std::int32_t>(100 + 60 * b + j);
    }
    wide.x.pool_rows = 16 * 500;
    for (const std::uint32_t chunks : {0u, 3u, 40u}) {
        shared_batch c = wide;
        c.x.max_chunks = chunks;
        const paged_plan pc = plan_paged(desc, c.request());
        INFO(pc.cascade);
        check_cascade_cover(pc, c);
        REQUIRE(pc.groups.size() == 3);
        CHECK(pc.groups[2].depth == 3);
    }
}

TEST_CASE("paged plan: a level too small to pay is left to its members or its children (the cost rule)",
          "[paged_plan][cascade]") {
    // cpu_8: 8 lanes, one row each (the most rows of a sequence, 8, fill one block), 8 keys a step.
    // A node's stacked rows cost ceil(rows / 8) blocks of (its steps + 2) against each member's own
    // blocks of its steps.
    const auto desc = fd::desc_of(fd::fake_devices()[fd::cpu_8]);
    // 0, 1 (4 rows each: G = 4, one query) and 2, 3 (8 rows: two queries) share page 0; 0 and 1
    // also page 1. Page 0 alone (2 steps) for all four: 3 x 4 = 12 against 4 x 2 = 8, left to the
    // children; 0 and 1 over both pages (4 steps): 1 x 6 against 2 x 4, cascaded, keys from 0.
    shared_batch sb({50, 50, 40, 40}, {1, 1, 2, 2}, {{0, 1, 2, 3}, {0, 1, 4, 5}, {0, 6, 7}, {0, 8, 9}}, 16);
    const paged_plan p = plan_paged(desc, sb.request());
    INFO(p.cascade);
    check_cascade_cover(p, sb);
    REQUIRE(p.groups.size() == 1);
    CHECK(p.groups[0].members == std::vector<std::uint32_t>{0, 1});
    CHECK((p.groups[0].first == 0 && p.groups[0].prefix == 32 && p.groups[0].depth == 1));
    CHECK(p.sequences[2].kv_first == 0);
    CHECK(p.cascade.find("the shared keys [0, 16) of sequences 0.. (4) cost 12 key steps stacked against 8 apart") !=
          std::string::npos);
    // full blocks gain nothing stacked: two sequences of 8 rows each over 4 pages, never cascaded
    shared_batch full({80, 80}, {2, 2}, {{0, 1, 2, 3, 4}, {0, 1, 2, 3, 5}}, 16);
    const paged_plan pf = plan_paged(desc, full.request());
    INFO(pf.cascade);
    check_cascade_cover(pf, full);
    CHECK(pf.groups.empty());
    CHECK(pf.cascade.find("no cascade: the shared keys [0, 64) of sequences 0.. (2) cost 20 key steps stacked "
                          "against 16 apart: left to the members") != std::string::npos);
    // the same two with one query each (4 rows): one block for both, 10 against 16, cascaded
    full.x.q = {1, 1};
    full.offsets = {79, 79};
    CHECK(plan_paged(desc, full.request()).groups.size() == 1);
    // a tie is left to the members: one page (2 steps) for two sequences of 4 rows, 4 against 4
    shared_batch tie({40, 40}, {1, 1}, {{0, 1, 2}, {0, 3, 4}}, 16);
    const paged_plan pt = plan_paged(desc, tie.request());
    INFO(pt.cascade);
    check_cascade_cover(pt, tie);
    CHECK(pt.groups.empty());
    CHECK(pt.cascade.find("cost 4 key steps stacked against 4 apart") != std::string::npos);
}

TEST_CASE("paged plan: the Vulkan tests' prefix tree of depth 3 cascades every level on a lavapipe-like device",
          "[paged_plan][cascade]") {
    // paged_vulkan_test.cpp's "nested shared prefixes" batch of depth 3 (its pages renumbered): one
    // query each, 4 query heads per K/V head, pages of 16.
    std::vector<std::vector<std::int32_t>> tables{{0, 1, 2, 3, 4, 5, 6, 7, 8},
                                                  {0, 1, 2, 3, 4, 5, 20, 21},
                                                  {0, 1, 2, 3, 22, 23, 24},
                                                  {0, 1, 2, 3, 25},
                                                  {0, 1, 26, 27},
                                                  {0, 1, 28},
                                                  {0, 1},
                                                  {},
                                                  {30, 31, 32},
                                                  {30, 31, 33},
                                                  {34, 35}};
    shared_batch sb({130, 120, 100, 77, 50, 33, 32, 0, 40, 37, 25}, std::vector<std::uint32_t>(11, 1), tables, 16);
    sb.x.d = 24, sb.x.dv = 17;
    const paged_plan p = plan_paged(fd::desc_of(fd::fake_devices()[fd::cpu_8]), sb.request());
    INFO(p.cascade);
    check_cascade_cover(p, sb);
    REQUIRE(p.groups.size() == 4);
    CHECK(p.groups[0].members == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6});
    CHECK(p.groups[1].members == std::vector<std::uint32_t>{0, 1, 2, 3});
    CHECK(p.groups[2].members == std::vector<std::uint32_t>{0, 1});
    CHECK(p.groups[2].depth == 3);
    CHECK(p.groups[3].members == std::vector<std::uint32_t>{8, 9});
    // its window of 90 keys: 0, 1, 2 see no first page, the rest keep the top level
    shared_batch w = sb;
    w.window_left = 90;
    const paged_plan pw = plan_paged(fd::desc_of(fd::fake_devices()[fd::cpu_8]), w.request());
    INFO(pw.cascade);
    check_cascade_cover(pw, w);
    REQUIRE(pw.groups.size() == 2);
    CHECK(pw.groups[0].members == std::vector<std::uint32_t>{3, 4, 5, 6});
    CHECK(pw.groups[1].members == std::vector<std::uint32_t>{8, 9});
}

TEST_CASE("paged plan: nested shared prefixes deeper than the plan cascades are left to their members",
          "[paged_plan][cascade]") {
    // Sequence k of 19 lists the shared pages 0 .. 2(19 - k) - 1, then one of its own: a chain of 18
    // levels of two pages each (level l shared by sequences 0 .. 18 - l), each paying by the cost
    // rule. The plan cascades the first 16 and leaves the rest to the members.
    std::vector<std::vector<std::int32_t>> tables(19);
    std::vector<std::uint32_t> kv(19);
    for (std::size_t k = 0; k < 19; ++k) {
        for (std::int32_t j = 0; j < static_cast<std::int32_t>(2 * (19 - k)); ++j) tables[k].push_back(j);
        tables[k].push_back(static_cast<std::int32_t>(100 + k));
        kv[k] = static_cast<std::uint32_t>(tables[k].size() * 16);
    }
    shared_batch sb(kv, std::vector<std::uint32_t>(19, 1), tables, 16);
    const paged_plan p = plan_paged(fd::desc_of(fd::fake_devices()[fd::cpu_8]), sb.request());
    INFO(p.cascade);
    check_cascade_cover(p, sb);
    REQUIRE(p.groups.size() == 16);
    CHECK(p.groups.back().depth == 16);
    CHECK(p.groups.back().prefix == 16 * 32);
    CHECK(p.sequences[0].kv_first == 16 * 32);  // its keys past the 16th level are its own
    CHECK(p.cascade.find("16 shared prefixes for 19 sequences, 16 levels") != std::string::npos);
    CHECK(p.cascade.find("nest deeper than 16 levels: left to the members") != std::string::npos);
}
