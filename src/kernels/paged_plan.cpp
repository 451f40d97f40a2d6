#include "kernels/paged_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/decode_plan.hpp"
#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The paged kernel keeps every texel of a row in registers (shaders/sdpa_decode.comp's unrolled
// cpu form): head widths up to this many texels.
constexpr std::uint32_t paged_unrolled_texels = 32;

// What an item costs besides its key steps (q's rows read, the partial states written), in key
// steps, for the balance of the work list.
constexpr std::uint64_t paged_item_overhead_steps = 2;

/// Items of a batch cut into chunks of `chunk` keys.
std::uint64_t items_for(const std::vector<paged_sequence>& seqs, std::uint32_t kv_heads, std::uint64_t chunk) {
    std::uint64_t n = 0;
    for (const paged_sequence& s : seqs)
        if (s.rows != 0 && s.kv_len > s.kv_first)
            n += std::uint64_t{kv_heads} * s.row_blocks * ceil_div(s.kv_len - s.kv_first, chunk);
    return n;
}

/// The keys [0, n) that every query row of a sequence sees by the causal rule and the window (its
/// rows at positions off .. off + L - 1), and the rule that cut n below the sequence's keys.
std::pair<std::int64_t, const char*> seen_by_all(const paged_request& r, std::size_t b) {
    const std::int64_t off = r.offsets[b], L = r.q_lens[b];
    std::int64_t n = r.kv_lens[b];
    const char* rule = "";
    if (r.window_left >= 0 && off + L - 1 > r.window_left) return {0, "the window's left side"};
    if (r.causal && off + 1 < n) n = std::max<std::int64_t>(off + 1, 0), rule = "the causal alignment";
    if (r.window_right >= 0 && off + r.window_right + 1 < n)
        n = std::max<std::int64_t>(off + r.window_right + 1, 0), rule = "the window's right side";
    return {n, rule};
}

/// The groups of sequences sharing their first whole pages, each a prefix every query row of every
/// member sees; `why` says what decided.
std::vector<paged_group> find_groups(const paged_request& r, std::uint32_t group, std::string& why) {
    std::vector<paged_group> groups;
    const std::size_t B = r.kv_lens.size();
    if (!r.cascade) {
        why = "no cascade: turned off for this call";
        return groups;
    }
    if (r.block_table.empty() || r.page_size == 0 || r.max_pages == 0 || r.offsets.size() != B ||
        r.block_table.size() < B * std::size_t{r.max_pages}) {
        why = "no cascade: no block table";
        return groups;
    }
    const auto page = [&](std::size_t b, std::size_t j) { return r.block_table[b * r.max_pages + j]; };
    // Candidates by first page, in batch order: sequences with queries and a whole page seen by all.
    std::vector<std::pair<std::int32_t, std::vector<std::uint32_t>>> by_page;
    std::vector<std::uint32_t> whole(B, 0);
    std::string cut;
    for (std::size_t b = 0; b < B; ++b) {
        if (r.q_lens[b] == 0 || r.kv_lens[b] < r.page_size) continue;
        if (!r.kv_base.empty() && r.kv_base[b] != 0) {  // its keys start past its first page's first row
            if (cut.empty()) cut = "no cascade: cache_leftpad moves sequence " + std::to_string(b) + "'s first key";
            continue;
        }
        const auto [n, rule] = seen_by_all(r, b);
        whole[b] = static_cast<std::uint32_t>(n / r.page_size);
        if (whole[b] == 0) {
            if (cut.empty())
                cut = "no cascade: " + std::string(rule) + " keeps sequence " + std::to_string(b) +
                      "'s first page from some of its queries";
            continue;
        }
        const std::int32_t first = page(b, 0);
        auto it = std::find_if(by_page.begin(), by_page.end(), [&](const auto& e) { return e.first == first; });
        if (it == by_page.end()) by_page.push_back({first, {}}), it = by_page.end() - 1;
        it->second.push_back(static_cast<std::uint32_t>(b));
    }
    std::string big;
    for (auto& [first, members] : by_page) {
        if (members.size() < 2) continue;
        std::uint32_t pages = whole[members[0]];
        for (const std::uint32_t b : members) {
            std::uint32_t same = 0;
            while (same < std::min(pages, whole[b]) && page(b, same) == page(members[0], same)) ++same;
            pages = same;
        }
        std::uint64_t rows = 0;
        for (const std::uint32_t b : members) rows += std::uint64_t{group} * r.q_lens[b];
        if (rows > 0xffffu) {
            if (big.empty())
                big = "no cascade: the group of sequence " + std::to_string(members[0]) + " stacks " +
                      std::to_string(rows) + " query rows per K/V head (the kernel takes at most 65,535)";
            continue;
        }
        groups.push_back({pages * r.page_size, 0, std::move(members)});
    }
    if (!groups.empty()) {
        std::size_t n = 0;
        for (const paged_group& g : groups) n += g.members.size();
        why = "cascade: " + std::to_string(groups.size()) + " shared prefixes for " + std::to_string(n) + " sequences";
    } else if (!big.empty()) {
        why = big;
    } else if (!cut.empty()) {
        why = cut;
    } else {
        why = "no cascade: no two sequences with queries begin with the same whole page";
    }
    return groups;
}

/// The items reordered so that the work is spread evenly along the list: a CPU device's threads
/// each take one contiguous range of the workgroups (llvmpipe's compute thread pool divides the
/// grid into equal counts, without stealing), so every such range should hold its share of the
/// key steps, wherever the long sequences sit in the batch. From the items sorted by cost
/// (largest first, then in list order), each place takes the largest left while that keeps the
/// running sum within half its cost of the even line, else the smallest left: any range of n
/// places holds n times the mean within about one item's cost. A pure function: equal requests
/// give equal orders (and the merge's order, which the results depend on, is the chunks', not the
/// items').
void balance_items(paged_plan& p) {
    const std::size_t n = p.items.size();
    if (n < 2) return;
    std::vector<std::uint64_t> cost(n);
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < n; ++i) {
        cost[i] = ceil_div(p.item_keys(p.items[i]), p.kps) + paged_item_overhead_steps;
        total += cost[i];
    }
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
    std::vector<paged_item> placed;
    placed.reserve(n);
    std::size_t lo = 0, hi = n;  // the items left: order[lo, hi), largest first
    std::uint64_t prefix = 0;
    for (std::size_t at = 0; at < n; ++at) {
        const std::uint64_t big = cost[order[lo]];
        // prefix + big <= total·(at + 1) / n + big / 2, times 2n (in double: the products may pass
        // 2^64; the same inputs give the same comparisons)
        const double nd = static_cast<double>(n), bigd = static_cast<double>(big);
        const bool take_big = 2.0 * (static_cast<double>(prefix) + bigd) * nd <=
                              2.0 * static_cast<double>(total) * static_cast<double>(at + 1) + bigd * nd;
        const std::size_t pick = take_big ? order[lo++] : order[--hi];
        prefix += cost[pick];
        placed.push_back(p.items[pick]);
    }
    p.items = std::move(placed);
}

}  // namespace

std::uint64_t paged_plan::item_keys(const paged_item& item) const {
    const paged_sequence& s = sequences[item.seq];
    const std::uint64_t begin = std::uint64_t{s.kv_first} + std::uint64_t{item.chunk} * chunk;
    return std::min<std::uint64_t>(s.kv_len, begin + chunk) - std::min<std::uint64_t>(s.kv_len, begin);
}

paged_plan try_plan_paged(const device_desc& desc, const paged_request& r, const settings& set) {
    const device_info& info = desc.info;
    paged_plan p;
    const auto refuse = [&p](std::string why) {
        p.refusal = std::move(why);
        p.items.clear();
        return p;
    };
    if (r.kv_lens.size() != r.q_lens.size() || (!r.kv_first.empty() && r.kv_first.size() != r.kv_lens.size()) ||
        (!r.kv_base.empty() && r.kv_base.size() != r.kv_lens.size()))
        return refuse("internal: a paged plan whose lengths disagree");
    if (r.kv_heads == 0 || r.q_heads % r.kv_heads != 0 || r.d_qk == 0 || r.d_v == 0)
        return refuse("internal: a paged plan without its heads or widths");
    p.e4 = static_cast<std::uint32_t>(ceil_div(r.d_qk, 4));
    p.ev4 = static_cast<std::uint32_t>(ceil_div(r.d_v, 4));
    if (std::max(p.e4, p.ev4) > paged_unrolled_texels)
        return refuse("the paged decode kernel takes head widths of at most " +
                      std::to_string(paged_unrolled_texels * 4) + " (d_qk = " + std::to_string(r.d_qk) +
                      ", d_v = " + std::to_string(r.d_v) + ")");
    const std::uint64_t pool_texels = r.pool_rows * r.kv_heads * std::max(p.e4, p.ev4);
    if (!r.kv_blocks && pool_texels > desc.max_texel_elements)
        return refuse("the paged decode kernel reads the pool through one texel view of at most " +
                      std::to_string(desc.max_texel_elements) + " texels on this device (the pool has " +
                      std::to_string(pool_texels) + ")");
    const std::uint32_t group = r.q_heads / r.kv_heads;

    // One subgroup per workgroup (never assumed: 8 where the device reports none usable), rows per
    // lane as the decode's cpu form.
    const std::uint32_t max_wg = std::max<std::uint32_t>(info.max_workgroup_invocations, 1);
    p.wg = info.subgroup_size;
    if (!power_of_two(p.wg) || p.wg > max_wg) {
        p.wg = 8;
        while (p.wg > max_wg) p.wg /= 2;
    }
    std::uint64_t most_rows = 0;
    for (const std::uint32_t l : r.q_lens) most_rows = std::max<std::uint64_t>(most_rows, std::uint64_t{group} * l);
    if (most_rows > 0xffffu)
        return refuse("the paged decode kernel takes at most 65,535 query rows per K/V head (G x L_b = " +
                      std::to_string(most_rows) + ")");
    // The shared prefixes (their stacked rows count for the rows per invocation too).
    p.groups = find_groups(r, group, p.cascade);
    for (const paged_group& g : p.groups) {
        std::uint64_t rows = 0;
        for (const std::uint32_t b : g.members) rows += std::uint64_t{group} * r.q_lens[b];
        most_rows = std::max(most_rows, rows);
    }
    const std::uint32_t widest = std::max(p.e4, p.ev4);
    p.rpi = 1;
    while (p.rpi * p.wg < most_rows && p.rpi * 2 * widest <= 32) p.rpi *= 2;
    p.kps = p.rpi <= 2 ? 8 : 4;
    p.shuffle = cpu_shuffle(info, p.wg, set);
    const std::uint32_t block = p.wg * p.rpi;

    // The sequences: their rows and keys.
    std::uint32_t longest = 0;
    p.sequences.resize(r.kv_lens.size());
    for (std::size_t b = 0; b < r.kv_lens.size(); ++b) {
        paged_sequence& s = p.sequences[b];
        if (r.kv_lens[b] > 0x7fffffffu)
            return refuse("the paged decode kernel takes at most 2^31 keys per sequence (sequence " +
                          std::to_string(b) + " has " + std::to_string(r.kv_lens[b]) + ")");
        if (p.total_q + r.q_lens[b] > 0x7fffffffu)
            return refuse("the paged decode kernel takes at most 2^31 query rows in all");
        s.q_first = static_cast<std::uint32_t>(p.total_q);
        s.q_len = r.q_lens[b];
        p.total_q += s.q_len;
        s.kv_len = r.kv_lens[b];
        s.kv_first = r.kv_first.empty() ? 0 : std::min(r.kv_first[b], s.kv_len);
        s.rows = group * s.q_len;
        s.row_blocks = static_cast<std::uint32_t>(ceil_div(s.rows, block));
        if (s.rows != 0) longest = std::max(longest, s.kv_len - s.kv_first);
    }
    p.batch = static_cast<std::uint32_t>(r.kv_lens.size());

    // The shared prefixes: one more entry each, its rows the members' queries stacked; the members
    // keep the keys past it.
    for (paged_group& g : p.groups) {
        g.entry = static_cast<std::uint32_t>(p.sequences.size());
        paged_sequence e;
        e.kv_len = g.prefix;
        e.q_first = static_cast<std::uint32_t>(p.group_tokens.size());
        for (const std::uint32_t b : g.members) {
            paged_sequence& s = p.sequences[b];
            s.kv_first = g.prefix;
            for (std::uint32_t i = 0; i < s.q_len; ++i) p.group_tokens.push_back(s.q_first + i);
            e.q_len += s.q_len;
        }
        e.rows = group * e.q_len;
        e.row_blocks = static_cast<std::uint32_t>(ceil_div(e.rows, block));
        p.sequences.push_back(e);
    }

    // The chunk: the smallest multiple of the step, no shorter than the device's least useful chunk
    // (or the longest sequence), whose items stay within the target: the device's, and at least
    // twice the items of the unsplit batch, so that the longest sequences are split while short ones
    // stay whole. Then the loop limit (a longest chunk) and the merge's (the most chunks).
    const bool cpu = info.type == device_type::cpu;
    const std::uint64_t step = p.kps;
    const std::uint64_t max_chunk = std::max<std::uint64_t>(step, std::uint64_t{decode_loop_budget} * step);
    const std::uint64_t min_chunk = cpu ? decode_min_chunk_cpu : decode_min_chunk_gpu;
    const std::uint64_t whole = ceil_div(std::max<std::uint32_t>(longest, 1), step) * step;
    std::uint64_t chunk = whole;
    if (longest != 0) {
        const std::uint64_t base = items_for(p.sequences, r.kv_heads, whole);
        const std::uint64_t target =
            std::max<std::uint64_t>(cpu ? decode_target_groups_cpu : decode_target_groups_gpu, 2 * base);
        std::uint64_t lo = std::min(whole, ceil_div(min_chunk, step) * step), hi = whole;
        if (r.max_chunks) lo = std::max(lo, ceil_div(ceil_div(longest, r.max_chunks), step) * step);
        lo = std::min(lo, hi);
        // items_for falls as the chunk grows: the smallest chunk within the target, by bisection
        // over multiples of the step
        while (lo < hi) {
            const std::uint64_t mid = (lo / step + (hi / step - lo / step) / 2) * step;
            if (items_for(p.sequences, r.kv_heads, mid) <= target)
                hi = mid;
            else
                lo = mid + step;
        }
        chunk = std::min(lo, max_chunk);
        // a member's chunks are its own and its prefix's: ceil(a/c) + ceil(b/c) <= ceil((a+b)/c) + 1
        const std::uint32_t most = decode_max_chunks_total - (p.groups.empty() ? 0 : 1);
        chunk = std::max(chunk, ceil_div(ceil_div(longest, most), step) * step);
        if (chunk > max_chunk)
            return refuse("the paged decode kernel would split a sequence of " + std::to_string(longest) +
                          " keys into more than " + std::to_string(decode_max_chunks_total) + " chunks");
    }
    p.chunk = static_cast<std::uint32_t>(chunk);

    // The partial states and the work list, made in the order (sequence, K/V head, chunk, row
    // block), the group prefixes last, then balanced (balance_items). A member's slots are its own
    // chunks', then its prefix's.
    for (paged_sequence& s : p.sequences)
        s.own_chunks = s.chunks = s.rows == 0 ? 0 : static_cast<std::uint32_t>(ceil_div(s.kv_len - s.kv_first, chunk));
    for (const paged_group& g : p.groups)
        for (const std::uint32_t b : g.members) p.sequences[b].chunks += p.sequences[g.entry].chunks;
    std::uint64_t parts = 0;
    for (std::size_t b = 0; b < p.sequences.size(); ++b) {
        paged_sequence& s = p.sequences[b];
        if (b < p.batch) {
            if (parts > 0xffffffffu) return refuse("the paged decode kernel takes at most 2^32 partial states");
            s.part_base = static_cast<std::uint32_t>(parts);
            parts += std::uint64_t{r.kv_heads} * s.rows * s.chunks;
            p.max_chunks = std::max(p.max_chunks, s.chunks);
        }
        for (std::uint32_t h = 0; h < r.kv_heads; ++h)
            for (std::uint32_t c = 0; c < s.own_chunks; ++c)
                for (std::uint32_t blk = 0; blk < s.row_blocks; ++blk)
                    p.items.push_back({static_cast<std::uint32_t>(b), h, c, blk});
    }
    p.partials = parts;
    if (parts > 0xffffffffu || p.acc_bytes() > info.max_storage_buffer_range)
        return refuse("the paged decode kernel's partial states (" + std::to_string(p.acc_bytes()) +
                      " bytes) pass the device's largest storage buffer (" +
                      std::to_string(info.max_storage_buffer_range) + " bytes)");
    if (p.items.size() > 0xffffffffu) return refuse("the paged decode kernel takes at most 2^32 work items");
    balance_items(p);
    p.max_loop = std::max<std::uint32_t>(static_cast<std::uint32_t>(ceil_div(chunk, step)), p.max_chunks);
    return p;
}

paged_plan plan_paged(const device_desc& desc, const paged_request& request, const settings& set) {
    paged_plan p = try_plan_paged(desc, request, set);
    if (!p.refusal.empty()) throw limit_exceeded(p.refusal);
    return p;
}

}  // namespace qkv::vulkan::detail
