// The batched paged decode (qkv/runtime/paged.hpp against a device-resident pool): its plan, a
// pure function of the sequences' lengths, the shapes and the device description (part of
// qkv_plan: no Vulkan; tests/paged_plan_test.cpp runs it against fake devices).
//
// The work of a batch is a list of items (sequence b, K/V head, chunk of keys, block of rows), one
// workgroup each, in one dispatch. Every sequence's keys are cut into chunks of one size, chosen
// for the whole batch FlashInfer-style: the smallest chunk (a multiple of the keys per step, no
// shorter than the device's least useful chunk) whose item count stays within a target, so that
// one long sequence among short ones is split across many workgroups and no workgroup holds more
// than one chunk of keys. Each item writes one partial softmax state per row; the merge combines a
// row's partials in the fixed order 0..P_b-1, so equal inputs give identical bits.
//
// Shared prefixes (cascade attention, FlashInfer's idea): sequences whose block tables begin with
// the same pages, where every query row of each sees all of those pages' keys (the causal rule and
// the window, from each sequence's positions), form a group. Groups nest: the block tables' prefix
// tree of page runs (a system prompt shared by all, a few-shot prefix shared by some of them, then
// each sequence's own pages) gives one node per run that two or more sequences share, its keys
// those past its parent's. Each node is one more entry of the work list, after the B sequences: its
// rows are the queries of all its members stacked (G x the members' L_b per K/V head), so each
// chunk of its K/V is read once for the group. A node is cascaded only where a cost rule says it
// pays (cost_of_cascade in paged_plan.cpp: stacked rows fill row blocks the members would leave
// part empty); one that does not leaves its keys to its children and members. Each member's own
// items cover only its keys past its deepest node; the nodes' partial states land in the member's
// own slots after those of its own chunks, deepest node first, the root's last, so the merge is
// unchanged and combines them in one fixed order (equal inputs, equal bits). Score rules that
// depend on positions use each row's own (its sequence's offset and length); sinks are the
// merge's, once per row. The result is the one without cascade up to rounding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/settings.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// What a paged decode call asks for.
struct paged_request {
    std::span<const std::uint32_t> kv_lens;   ///< S_b: sequence b's keys (cache_seqlens, with any appended rows)
    std::span<const std::uint32_t> q_lens;    ///< L_b: sequence b's queries
    std::span<const std::uint32_t> kv_first;  ///< empty, or the first key some row of b may see (a window)
    std::uint32_t q_heads = 1, kv_heads = 1, d_qk = 0, d_v = 0;
    std::uint64_t pool_rows = 0;  ///< num_pages x page_size: rows of the pool (per K/V head)
    /// The pool's rows are q8_0 / q4_0 blocks in storage buffers (the kv_cache bounds them by
    /// maxStorageBufferRange), not texels: no texel view of the pool to bound.
    bool kv_blocks = false;
    /// 0: the split is chosen for the device; n > 0: at most n chunks per sequence (1 = no split),
    /// unless the per-invocation loop limit needs more.
    std::uint32_t max_chunks = 0;

    // ---- shared prefixes: where the plan looks for them (an empty block_table: nowhere) ----
    std::span<const std::int32_t> block_table;  ///< B x max_pages page indices
    std::uint32_t max_pages = 0, page_size = 0;
    std::span<const std::int32_t> offsets;  ///< off' per sequence: its row i is at position i + off'
    bool causal = false;
    std::int32_t window_left = -1, window_right = -1;  ///< the reduced sides (score_positions), -1: none
    bool cascade = true;                               ///< false: no shared prefixes (the caller's choice)
    /// Empty, or per sequence the pool key of its key 0 (cache_leftpad): one above 0 shares no prefix.
    std::span<const std::uint32_t> kv_base;
};

/// One sequence's part of the plan: a sequence of the batch, or (after the B of them) a group's
/// shared prefix, whose rows are its members' queries (group_tokens[q_first .. q_first + q_len)).
struct paged_sequence {
    std::uint32_t kv_first = 0, kv_len = 0;  ///< the keys [kv_first, kv_len) the chunks cover
    std::uint32_t q_first = 0, q_len = 0;    ///< its queries: rows q_first .. q_first + q_len - 1 of q
    std::uint32_t rows = 0;                  ///< R_b = G x L_b rows per K/V head
    std::uint32_t chunks = 0;                ///< P_b (0: no keys or no queries; the merge writes zeros)
    std::uint32_t own_chunks = 0;            ///< chunks of its own items: P_b less its prefixes'
    /// A shared prefix's: its chunks and those of the prefixes enclosing it. Its partial state for
    /// chunk c of a member's row is that row's slot P_b - tail + c.
    std::uint32_t tail = 0;
    std::uint32_t part_base = 0;   ///< first partial state: (kv head x R_b + row) x P_b + chunk after it
    std::uint32_t row_blocks = 0;  ///< blocks of wg x rpi rows per K/V head
};

/// One workgroup's work.
struct paged_item {
    std::uint32_t seq = 0, kv_head = 0, chunk = 0, row_block = 0;
};

/// A group of sequences sharing their first pages: a node of the prefix tree.
struct paged_group {
    static constexpr std::uint32_t root = 0xffffffffu;  ///< the parent of a top-level node
    std::uint32_t first = 0;                            ///< keys before it: its parent's prefix (0 at the top)
    std::uint32_t prefix = 0;                           ///< its keys are [first, prefix): whole pages
    std::uint32_t entry = 0;                            ///< its entry in paged_plan::sequences (B + its index)
    std::uint32_t parent = root;                        ///< the node (index in paged_plan::groups) it nests in, or root
    std::uint32_t depth = 1;                            ///< 1 at the top, its parent's + 1 below
    std::vector<std::uint32_t> members;                 ///< its sequences, in batch order
};

struct paged_plan {
    std::uint32_t wg = 8;   ///< invocations per workgroup (one subgroup)
    std::uint32_t rpi = 1;  ///< rows per invocation
    std::uint32_t kps = 8;  ///< keys per step
    bool shuffle = false;   ///< K and V rows shared by subgroupShuffle (cpu_shuffle in gemm_tiles.hpp)
    std::uint32_t e4 = 1, ev4 = 1;
    std::uint32_t chunk = 0;       ///< keys per chunk, every sequence's (a multiple of kps)
    std::uint32_t max_chunks = 0;  ///< the most chunks of any sequence
    std::uint32_t max_loop = 0;    ///< an upper bound of the loop iterations of one invocation
    std::uint64_t partials = 0;    ///< partial states in all
    std::uint64_t total_q = 0;     ///< query rows in all (sum of L_b)
    std::vector<paged_sequence> sequences;
    /// The work list, one workgroup each, in an order that spreads the key steps evenly along it
    /// (every contiguous range holds its share: a CPU device's threads take contiguous ranges).
    std::vector<paged_item> items;
    std::uint32_t batch = 0;                  ///< B: entries of `sequences` past it are group prefixes
    std::vector<paged_group> groups;          ///< the shared prefixes, a tree in preorder (none: no cascade)
    std::vector<std::uint32_t> group_tokens;  ///< each group's members' query rows, group after group
    /// What decided the cascade: its groups, or the rule that kept it from running.
    std::string cascade;
    /// Why the kernel cannot run this request (a limit, named with its value); empty when it can.
    std::string refusal;

    [[nodiscard]] std::uint64_t stats_bytes() const { return partials * 8; }
    [[nodiscard]] std::uint64_t acc_bytes() const { return partials * ev4 * 16; }
    /// Key steps of item i's chunk: the work it does (tests: the balance).
    [[nodiscard]] std::uint64_t item_keys(const paged_item& item) const;
};

/// Plans a paged decode call: a pure function. Where the request cannot be run, the plan's refusal
/// says why.
paged_plan try_plan_paged(const device_desc& desc, const paged_request& request, const settings& set = {});
/// The same, throwing limit_exceeded with the refusal.
paged_plan plan_paged(const device_desc& desc, const paged_request& request, const settings& set = {});

}  // namespace qkv::vulkan::detail
