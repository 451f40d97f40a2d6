#include "kernels/paged_plan.hpp"

#include <algorithm>
#include <string>

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

/// Items of a batch cut into chunks of `chunk` keys.
std::uint64_t items_for(const std::vector<paged_sequence>& seqs, std::uint32_t kv_heads, std::uint64_t chunk) {
    std::uint64_t n = 0;
    for (const paged_sequence& s : seqs)
        if (s.rows != 0 && s.kv_len > s.kv_first)
            n += std::uint64_t{kv_heads} * s.row_blocks * ceil_div(s.kv_len - s.kv_first, chunk);
    return n;
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
    if (r.kv_lens.size() != r.q_lens.size() || (!r.kv_first.empty() && r.kv_first.size() != r.kv_lens.size()))
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
    if (pool_texels > desc.max_texel_elements)
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
        chunk = std::max(chunk, ceil_div(ceil_div(longest, decode_max_chunks_total), step) * step);
        if (chunk > max_chunk)
            return refuse("the paged decode kernel would split a sequence of " + std::to_string(longest) +
                          " keys into more than " + std::to_string(decode_max_chunks_total) + " chunks");
    }
    p.chunk = static_cast<std::uint32_t>(chunk);

    // The partial states and the work list, in the order (sequence, K/V head, chunk, row block).
    std::uint64_t parts = 0;
    for (std::size_t b = 0; b < p.sequences.size(); ++b) {
        paged_sequence& s = p.sequences[b];
        s.chunks = s.rows == 0 ? 0 : static_cast<std::uint32_t>(ceil_div(s.kv_len - s.kv_first, chunk));
        if (parts > 0xffffffffu) return refuse("the paged decode kernel takes at most 2^32 partial states");
        s.part_base = static_cast<std::uint32_t>(parts);
        parts += std::uint64_t{r.kv_heads} * s.rows * s.chunks;
        p.max_chunks = std::max(p.max_chunks, s.chunks);
        for (std::uint32_t h = 0; h < r.kv_heads; ++h)
            for (std::uint32_t c = 0; c < s.chunks; ++c)
                for (std::uint32_t blk = 0; blk < s.row_blocks; ++blk)
                    p.items.push_back({static_cast<std::uint32_t>(b), h, c, blk});
    }
    p.partials = parts;
    if (parts > 0xffffffffu || p.acc_bytes() > info.max_storage_buffer_range)
        return refuse("the paged decode kernel's partial states (" + std::to_string(p.acc_bytes()) +
                      " bytes) pass the device's largest storage buffer (" +
                      std::to_string(info.max_storage_buffer_range) + " bytes)");
    if (p.items.size() > 0xffffffffu) return refuse("the paged decode kernel takes at most 2^32 work items");
    p.max_loop = std::max<std::uint32_t>(static_cast<std::uint32_t>(ceil_div(chunk, step)), p.max_chunks);
    return p;
}

paged_plan plan_paged(const device_desc& desc, const paged_request& request, const settings& set) {
    paged_plan p = try_plan_paged(desc, request, set);
    if (!p.refusal.empty()) throw limit_exceeded(p.refusal);
    return p;
}

}  // namespace qkv::vulkan::detail
