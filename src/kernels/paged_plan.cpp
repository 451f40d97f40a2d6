#include "kernels/paged_plan.hpp"

#include <algorithm>
#include <map>
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

// The most levels of nested shared prefixes cascaded (a member's slots grow by one chunk per level
// at most, within the merge's decode_max_chunks_total); deeper nodes are left to their members.
constexpr std::uint32_t paged_max_cascade_depth = 16;

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

/// The cost rule of a shared prefix's node: cascading keys [first, prefix) for its members pays
/// when the items of the members' query rows stacked, each counted as one item of the keys' steps
/// plus an item's overhead (paged_item_overhead_steps) per block of `block` rows, cost fewer key
/// steps than the members' own rows reading those keys in their own row blocks. On a device that
/// runs a block of rows for the price of a full one, this is where stacking fills blocks that each
/// member would leave part empty. A tie is left to the members: on lavapipe a level of one page
/// shared by two sequences (a tie) measured no faster cascaded (bench/RESULTS.md).
struct cascade_cost {
    std::uint64_t stacked = 0, apart = 0;
    [[nodiscard]] bool pays() const { return stacked < apart; }
};
cascade_cost cost_of_cascade(std::uint64_t keys, const std::vector<std::uint64_t>& member_rows, std::uint64_t block,
                             std::uint64_t kps) {
    const std::uint64_t steps = ceil_div(keys, kps);
    std::uint64_t rows = 0, apart_blocks = 0;
    for (const std::uint64_t m : member_rows) rows += m, apart_blocks += ceil_div(m, block);
    return {ceil_div(rows, block) * (steps + paged_item_overhead_steps), apart_blocks * steps};
}

/// The prefix tree of the batch's block tables, its nodes the shared prefixes cascaded (preorder,
/// members in batch order), and what decided.
class prefix_tree {
public:
    prefix_tree(const paged_request& r, std::uint32_t group, std::uint64_t block, std::uint64_t kps)
        : r_(r), group_(group), block_(block), kps_(kps) {}

    std::vector<paged_group> find(std::string& why) {
        const std::size_t B = r_.kv_lens.size();
        if (!r_.cascade) {
            why = "no cascade: turned off for this call";
            return {};
        }
        if (r_.block_table.empty() || r_.page_size == 0 || r_.max_pages == 0 || r_.offsets.size() != B ||
            r_.block_table.size() < B * std::size_t{r_.max_pages}) {
            why = "no cascade: no block table";
            return {};
        }
        // Candidates: sequences with queries and a whole page seen by all their rows.
        whole_.assign(B, 0);
        std::vector<std::uint32_t> all;
        for (std::size_t b = 0; b < B; ++b) {
            if (r_.q_lens[b] == 0 || r_.kv_lens[b] < r_.page_size) continue;
            if (!r_.kv_base.empty() && r_.kv_base[b] != 0) {  // its keys start past its first page's first row
                if (cut_.empty())
                    cut_ = "no cascade: cache_leftpad moves sequence " + std::to_string(b) + "'s first key";
                continue;
            }
            const auto [n, rule] = seen_by_all(r_, b);
            whole_[b] = static_cast<std::uint32_t>(std::min<std::int64_t>(n / r_.page_size, r_.max_pages));
            if (whole_[b] == 0) {
                if (cut_.empty())
                    cut_ = "no cascade: " + std::string(rule) + " keeps sequence " + std::to_string(b) +
                           "'s first page from some of its queries";
                continue;
            }
            all.push_back(static_cast<std::uint32_t>(b));
        }
        if (all.size() >= 2) grow(all);
        if (!nodes_.empty()) {
            std::vector<bool> in(B, false);
            std::uint32_t depth = 0;
            for (const paged_group& g : nodes_) {
                depth = std::max(depth, g.depth);
                for (const std::uint32_t b : g.members) in[b] = true;
            }
            why = "cascade: " + std::to_string(nodes_.size()) + " shared prefixes for " +
                  std::to_string(std::count(in.begin(), in.end(), true)) + " sequences, " + std::to_string(depth) +
                  (depth == 1 ? " level" : " levels");
            if (!cheap_.empty()) why += "; " + cheap_;
            if (!deep_.empty()) why += "; " + deep_;
        } else if (!big_.empty()) {
            why = big_;
        } else if (!cheap_.empty()) {
            why = "no cascade: " + cheap_;
        } else if (!deep_.empty()) {
            why = "no cascade: " + deep_;
        } else if (!cut_.empty()) {
            why = cut_;
        } else {
            why = "no cascade: no two sequences with queries begin with the same whole page";
        }
        return std::move(nodes_);
    }

private:
    [[nodiscard]] std::int32_t page(std::size_t b, std::size_t j) const { return r_.block_table[b * r_.max_pages + j]; }

    /// A run of the tree to weigh: members (batch order, two or more) that all list the same page
    /// `at`, under the last cascaded node `parent` whose keys end at `first`.
    struct part {
        std::vector<std::uint32_t> members;
        std::uint32_t at = 0, first = 0, parent = paged_group::root, depth = 1;
    };

    /// The members split by their page `at`, in order of first appearance: the parts of two or more.
    [[nodiscard]] std::vector<std::vector<std::uint32_t>> split(const std::vector<std::uint32_t>& members,
                                                                std::uint32_t at) const {
        std::vector<std::vector<std::uint32_t>> parts;
        std::map<std::int32_t, std::size_t> index;
        for (const std::uint32_t b : members) {
            const auto [it, added] = index.try_emplace(page(b, at), parts.size());
            if (added) parts.emplace_back();
            parts[it->second].push_back(b);
        }
        std::erase_if(parts, [](const std::vector<std::uint32_t>& m) { return m.size() < 2; });
        return parts;
    }

    /// The tree from the candidates, in preorder without recursion (each level of it has fewer
    /// members than its parent, but a batch may be long): a part's node is the run of pages all
    /// its members list from `at`; it is cascaded where the rules allow, else its keys pass to its
    /// children (their keys then begin at `first`) and its members. Then the part's members with
    /// pages past the run, split by their next page, are the next parts to weigh.
    void grow(const std::vector<std::uint32_t>& candidates) {
        std::vector<part> todo;
        const auto push_parts = [&](const std::vector<std::uint32_t>& members, std::uint32_t at, std::uint32_t first,
                                    std::uint32_t parent, std::uint32_t depth) {
            std::vector<std::vector<std::uint32_t>> parts = split(members, at);
            for (auto it = parts.rbegin(); it != parts.rend(); ++it)  // the first part on top
                todo.push_back({std::move(*it), at, first, parent, depth});
        };
        push_parts(candidates, 0, 0, paged_group::root, 1);
        while (!todo.empty()) {
            const part t = std::move(todo.back());
            todo.pop_back();
            std::uint32_t end = whole_[t.members[0]];
            for (const std::uint32_t b : t.members) end = std::min(end, whole_[b]);
            std::uint32_t e = t.at + 1;
            while (e < end && std::all_of(t.members.begin(), t.members.end(),
                                          [&](std::uint32_t b) { return page(b, e) == page(t.members[0], e); }))
                ++e;
            const std::uint32_t prefix = e * r_.page_size;
            std::vector<std::uint64_t> rows;
            std::uint64_t stacked = 0;
            for (const std::uint32_t b : t.members)
                rows.push_back(std::uint64_t{group_} * r_.q_lens[b]), stacked += rows.back();
            const cascade_cost cost = cost_of_cascade(prefix - t.first, rows, block_, kps_);
            std::uint32_t first = t.first, parent = t.parent, depth = t.depth;
            if (stacked > 0xffffu) {
                if (big_.empty())
                    big_ = "no cascade: the group of sequence " + std::to_string(t.members[0]) + " stacks " +
                           std::to_string(stacked) + " query rows per K/V head (the kernel takes at most 65,535)";
            } else if (t.depth > paged_max_cascade_depth) {
                if (deep_.empty())
                    deep_ = "the shared keys [" + std::to_string(t.first) + ", " + std::to_string(prefix) +
                            ") of sequences " + std::to_string(t.members[0]) + ".. nest deeper than " +
                            std::to_string(paged_max_cascade_depth) + " levels: left to the members";
            } else if (!cost.pays()) {
                if (cheap_.empty())
                    cheap_ = "the shared keys [" + std::to_string(t.first) + ", " + std::to_string(prefix) +
                             ") of sequences " + std::to_string(t.members[0]) + ".. (" +
                             std::to_string(t.members.size()) + ") cost " + std::to_string(cost.stacked) +
                             " key steps stacked against " + std::to_string(cost.apart) + " apart: left to the members";
            } else {
                parent = static_cast<std::uint32_t>(nodes_.size());
                nodes_.push_back({t.first, prefix, 0, t.parent, t.depth, t.members});
                first = prefix, depth = t.depth + 1;
            }
            std::vector<std::uint32_t> deeper;
            for (const std::uint32_t b : t.members)
                if (whole_[b] > e) deeper.push_back(b);
            if (deeper.size() >= 2) push_parts(deeper, e, first, parent, depth);
        }
    }

    const paged_request& r_;
    std::uint32_t group_;
    std::uint64_t block_, kps_;
    std::vector<std::uint32_t> whole_;  ///< per sequence: its whole pages that every row of it sees
    std::vector<paged_group> nodes_;
    std::string cut_, big_, cheap_, deep_;  ///< the first rule that kept some sequence or node out
};

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
    const std::uint32_t widest = std::max(p.e4, p.ev4);
    const auto rows_per_lane = [&](std::uint64_t rows) {
        std::uint32_t rpi = 1;
        while (rpi * p.wg < rows && rpi * 2 * widest <= 32) rpi *= 2;
        return rpi;
    };
    // The shared prefixes, a tree whose nodes the cost rule weighs at the sequences' own block and
    // step (their stacked rows then count for the rows per invocation too).
    {
        const std::uint32_t rpi = rows_per_lane(most_rows);
        p.groups = prefix_tree(r, group, std::uint64_t{p.wg} * rpi, rpi <= 2 ? 8 : 4).find(p.cascade);
    }
    std::uint32_t depth = 0;
    for (const paged_group& g : p.groups) {
        std::uint64_t rows = 0;
        for (const std::uint32_t b : g.members) rows += std::uint64_t{group} * r.q_lens[b];
        most_rows = std::max(most_rows, rows);
        depth = std::max(depth, g.depth);
    }
    p.rpi = rows_per_lane(most_rows);
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

    // The shared prefixes: one more entry each (preorder: a node after its parent), its rows the
    // members' queries stacked, its keys those past its parent's; the members keep the keys past
    // their deepest node.
    for (paged_group& g : p.groups) {
        g.entry = static_cast<std::uint32_t>(p.sequences.size());
        paged_sequence e;
        e.kv_first = g.first, e.kv_len = g.prefix;
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
        // a member's chunks are its own and its prefixes': ceil(a/c) + ceil(b/c) <= ceil((a+b)/c) + 1
        // per level
        const std::uint32_t most = decode_max_chunks_total - depth;
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
    // A prefix's tail: its chunks and its ancestors'; a member's slots are its own chunks', then its
    // deepest prefix's, its parent's, .. the root's (preorder: a parent's tail is known first, and a
    // member's last node is its deepest).
    std::vector<std::uint32_t> deepest(p.batch, paged_group::root);
    for (std::size_t i = 0; i < p.groups.size(); ++i) {
        const paged_group& g = p.groups[i];
        paged_sequence& e = p.sequences[g.entry];
        e.tail = e.chunks + (g.parent == paged_group::root ? 0 : p.sequences[p.groups[g.parent].entry].tail);
        for (const std::uint32_t b : g.members) deepest[b] = static_cast<std::uint32_t>(i);
    }
    for (std::uint32_t b = 0; b < p.batch; ++b)
        if (deepest[b] != paged_group::root) p.sequences[b].chunks += p.sequences[p.groups[deepest[b]].entry].tail;
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
