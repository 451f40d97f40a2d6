// run_paged: the batched paged decode (kernels/paged_plan.hpp, contract/paged.h) of a paged batch
// against a pool kept on the device in a kv_cache of one batch: one dispatch over the plan's work
// list, the keys read through the block table, then the merge of each row's partials in a fixed
// order. The pool's rows are texels (f32, f16) or ggml's q8_0 / q4_0 blocks, which the kernel
// dequantizes as the decode against a cache does (shaders/kv_blocks.glsl). The overflow rule as
// the decode's against a cache: q's norms from the host, K's and V's from the cache's statistics.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/paged_plan.hpp"
#include "kernels/score_positions.hpp"
#include "qkv/vulkan/error.hpp"
#include "run/run.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

/// Sequence b's SDPA problem as far as its shape goes (its positions, the score params).
sdpa_problem sequence_shape_of(const paged_problem& p, std::size_t b, std::uint32_t q_len, std::uint32_t kv_len) {
    sdpa_problem s;
    s.shape = {.batch = 1,
               .q_heads = p.q_heads,
               .kv_heads = p.kv_heads,
               .q_len = q_len,
               .kv_len = kv_len,
               .d_qk = p.d_qk,
               .d_v = p.d_v};
    (void)b;
    s.options = p.options;
    s.sinks = p.sinks;
    s.alibi_slopes = p.alibi_slopes;
    return s;
}

/// The limits of a paged append (before anything is recorded).
void check_paged_append(const device& dev, const paged_pool& pool, std::uint64_t Hkv, std::uint64_t n, std::uint32_t e4,
                        std::uint32_t ev4) {
    if (!pool.k_store.buffer || !pool.v_store.buffer || is_quantized(pool.type))
        throw error("internal: an append into a paged pool without its storage bindings");
    const std::uint64_t tb = pool.type == element_type::f16 ? 8 : 16;
    for (const std::uint64_t bytes : {Hkv * n * e4 * tb, Hkv * n * ev4 * tb, pool.k_store.range, pool.v_store.range})
        if (bytes > dev.info().max_storage_buffer_range)
            throw limit_exceeded("sdpa over a paged K/V pool: an append binds " + std::to_string(bytes) +
                                 " bytes (the new rows, or the pool's storage) as one storage buffer, more than " +
                                 dev.info().name + "'s maxStorageBufferRange of " +
                                 std::to_string(dev.info().max_storage_buffer_range));
    const std::uint64_t last_word =
        std::max(pool.k_word + Hkv * pool.rows * e4 * tb / 4, pool.v_word + Hkv * pool.rows * ev4 * tb / 4);
    if (last_word >= (std::uint64_t{1} << 32) || Hkv * n * e4 * tb / 4 >= (std::uint64_t{1} << 32) ||
        Hkv * n * ev4 * tb / 4 >= (std::uint64_t{1} << 32))
        throw limit_exceeded("sdpa over a paged K/V pool: an append addresses more than 2^32 - 1 words");
}

}  // namespace

void record_paged_append(recorder& rec, pipeline_set& pipes, const device& dev, const paged_pool& pool,
                         std::uint64_t kv_heads, std::uint64_t n, std::uint32_t e4, std::uint32_t ev4, binding k_rows,
                         binding v_rows, binding rows_at) {
    check_paged_append(dev, pool, kv_heads, n, e4, ev4);
    const std::uint64_t tb = pool.type == element_type::f16 ? 8 : 16;
    static_assert(row_matches<paged_append_push, no_spec>(shader_id::paged_append, "sss"));
    const pipeline& copy = pipes.get(shader_id::paged_append);
    for (const auto& [src, texels, store, word] :
         {std::tuple{k_rows, e4, pool.k_store, pool.k_word}, std::tuple{v_rows, ev4, pool.v_store, pool.v_word}}) {
        paged_append_push a{};
        a.rows = static_cast<std::uint32_t>(n);
        a.heads = static_cast<std::uint32_t>(kv_heads);
        a.width = static_cast<std::uint32_t>(texels * tb / 4);
        a.src_off = 0;
        a.dst_off = static_cast<std::uint32_t>(word);
        a.pool_rows = pool.rows;
        a.at_off = 0;
        const std::uint64_t count = kv_heads * n * a.width;
        const std::uint32_t groups[3] = {
            static_cast<std::uint32_t>(ceil_div(count, PAGED_APPEND_WORKGROUP * PAGED_APPEND_PER_INVOCATION)), 1, 1};
        rec.dispatch(copy, {src, store, rows_at}, &a, groups);
    }
}

void record_block_append(recorder& rec, const block_source& k, const block_source& v, const paged_pool& pool,
                         std::uint64_t kv_heads, std::uint64_t k_row_bytes, std::uint64_t v_row_bytes,
                         std::span<const std::size_t> rows_at) {
    if (!pool.k_blocks.buffer || !pool.v_blocks.buffer || !is_quantized(pool.type))
        throw error("internal: a block append into a paged pool without its blocks");
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    const std::uint64_t n = rows_at.size();
    for (const auto& [src, row_bytes, store] :
         {std::tuple{k, k_row_bytes, pool.k_blocks}, std::tuple{v, v_row_bytes, pool.v_blocks}}) {
        // One region per run of rows consecutive both in the pool and in the source.
        const bool runs = src.row_stride == row_bytes;
        std::vector<VkBufferCopy> regions;
        for (std::uint64_t h = 0; h < kv_heads; ++h)
            for (std::uint64_t r = 0; r < n;) {
                std::uint64_t end = r + 1;
                while (runs && end < n && rows_at[end] == rows_at[end - 1] + 1) ++end;
                regions.push_back({src.at + h * src.head_stride + r * src.row_stride,
                                   store.offset + (h * pool.rows + rows_at[r]) * row_bytes, (end - r) * row_bytes});
                r = end;
            }
        rec.copy(src.buffer, store.buffer, regions);
    }
    rec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT);
}

void record_paged_rotary(recorder& rec, pipeline_set& pipes, binding texels, binding angles, binding positions,
                         const paged_rotary& r) {
    if (r.rows == 0 || r.rotary_dim == 0) return;
    static_assert(row_matches<paged_rotary_push, no_spec>(shader_id::paged_rotary, "sss"));
    paged_rotary_push p{};
    p.rows = r.rows, p.w4 = r.w4, p.at = r.at;
    p.half_texels = r.half ? 1u : 0u;
    p.rotary_half = r.rotary_dim / 2;
    p.interleaved = r.interleaved ? 1u : 0u;
    p.pos_off = 0, p.pos_div = r.pos_div, p.pos_mod = r.pos_mod;
    p.cos_off = r.cos_off, p.sin_off = r.sin_off;
    const std::uint32_t groups[3] = {static_cast<std::uint32_t>(ceil_div(r.rows, PAGED_ROTARY_WORKGROUP)), 1, 1};
    rec.dispatch(pipes.get(shader_id::paged_rotary), {texels, angles, positions}, &p, groups);
}

void record_paged_table(recorder& rec, pipeline_set& pipes, const paged_table_bindings& b, const paged_table_check& c) {
    static_assert(row_matches<paged_table_push, no_spec>(shader_id::paged_table, "sssssss"));
    const pipeline& kernel = pipes.get(shader_id::paged_table);
    for (const std::uint32_t mode : {PAGED_TABLE_LENGTHS, PAGED_TABLE_CHECK, PAGED_TABLE_MAP}) {
        if (mode == PAGED_TABLE_LENGTHS && !c.device_lengths) continue;
        const std::uint64_t count = mode == PAGED_TABLE_CHECK     ? std::uint64_t{c.sequences} * c.max_pages
                                    : mode == PAGED_TABLE_LENGTHS ? std::uint64_t{c.sequences}
                                                                  : std::uint64_t{c.n};
        if (count == 0) continue;
        if (count >= (std::uint64_t{1} << 32))
            throw limit_exceeded("a paged call's block table of " + std::to_string(count) +
                                 " entries checked on the device: more than 2^32 - 1");
        paged_table_push p{};
        p.mode = mode, p.count = static_cast<std::uint32_t>(count);
        p.max_pages = c.max_pages, p.page_shift = c.page_shift, p.num_pages = c.num_pages;
        p.new_rows = c.new_rows, p.lengths = c.device_lengths ? 1u : 0u;
        p.offset_rule = c.bottom_right ? PAGED_OFFSET_BOTTOM_RIGHT : PAGED_OFFSET_KEEP;
        const std::uint32_t groups[3] = {static_cast<std::uint32_t>(ceil_div(count, PAGED_TABLE_WORKGROUP)), 1, 1};
        rec.dispatch(kernel, {b.table, b.spans, b.at_in, b.at_out, b.flag, b.lengths, b.work}, &p, groups);
        rec.compute_barrier();
    }
}

void record_paged_positions(recorder& rec, pipeline_set& pipes, const paged_table_bindings& b, std::uint32_t count) {
    if (count == 0) return;
    paged_table_push p{};
    p.mode = PAGED_TABLE_POSITIONS, p.count = count, p.lengths = 1;
    const std::uint32_t groups[3] = {static_cast<std::uint32_t>(ceil_div(count, PAGED_TABLE_WORKGROUP)), 1, 1};
    rec.dispatch(pipes.get(shader_id::paged_table), {b.table, b.spans, b.at_in, b.at_out, b.flag, b.lengths, b.work},
                 &p, groups);
    rec.compute_barrier();
}

void record_paged_claim(recorder& rec, pipeline_set& pipes, binding rows, binding claims, binding flag,
                        std::uint32_t n) {
    if (n == 0) return;
    static_assert(row_matches<paged_claim_push, no_spec>(shader_id::paged_claim, "sss"));
    const pipeline& kernel = pipes.get(shader_id::paged_claim);
    for (const std::uint32_t mode : {PAGED_CLAIM_CLEAR, PAGED_CLAIM_TAKE, PAGED_CLAIM_DROP}) {
        paged_claim_push p{};
        p.mode = mode, p.count = n;
        const std::uint32_t groups[3] = {static_cast<std::uint32_t>(ceil_div(n, PAGED_CLAIM_WORKGROUP)), 1, 1};
        rec.dispatch(kernel, {rows, claims, flag}, &p, groups);
        rec.compute_barrier();
    }
}

paged_layout plan_paged_call(const device& dev, const settings& set, const paged_problem& problem,
                             std::uint32_t pool_rows, element_type pool_type, bool bounds) {
    const std::size_t B = batch_of(problem);
    const std::uint32_t ps = static_cast<std::uint32_t>(problem.page_size);
    paged_layout l;
    while ((1u << l.page_shift) < ps) ++l.page_shift;

    // The lengths, each sequence's positions (one set of reduced window sides and ALiBi part for
    // the whole call: refused where they would differ), the keys a window leaves.
    // A sequence's keys are its pool keys from cache_leftpad on (`base`); its positions count from there.
    std::vector<std::uint32_t> kv_lens(B), q_lens(B), first(B, 0), base(B, 0);
    std::vector<std::int32_t> offsets(B);
    const bool ragged = !problem.cu_seqlens_q.empty();
    score_positions pos0{};
    for (std::size_t b = 0; b < B; ++b) {
        base[b] = static_cast<std::uint32_t>(paged_first_key(problem, b));
        kv_lens[b] = static_cast<std::uint32_t>(problem.cache_seqlens[b]) - base[b];
        q_lens[b] = ragged ? static_cast<std::uint32_t>(problem.cu_seqlens_q[b + 1] - problem.cu_seqlens_q[b])
                           : static_cast<std::uint32_t>(problem.q_len);
        l.longest = std::max(l.longest, kv_lens[b]);
        const score_positions pos = positions_of(sequence_shape_of(problem, b, q_lens[b], kv_lens[b]));
        if (b == 0) pos0 = pos;
        if (pos.window_left != pos0.window_left || pos.window_right != pos0.window_right ||
            pos.alibi_far != pos0.alibi_far)
            throw limit_exceeded(
                "sdpa over a paged K/V pool: sequence " + std::to_string(b) +
                "'s positions need other reduced window sides than sequence 0's (an offset beyond 2^30); run it "
                "on its own");
        offsets[b] = pos.offset;
        if (bounds && std::uint64_t{kv_lens[b]} + base[b] + q_lens[b] > SCORE_POSITION_LIMIT)
            throw limit_exceeded("sdpa over a paged K/V pool: with the lengths on the device, sequence " +
                                 std::to_string(b) + "'s bound of " + std::to_string(kv_lens[b] + base[b]) +
                                 " keys (its table row's) and " + std::to_string(q_lens[b]) +
                                 " queries pass the kernels' positions of 2^30");
        if (pos.window_left >= 0 && !bounds) {
            const std::int64_t f = std::int64_t{pos.offset} - pos.window_left;
            first[b] = static_cast<std::uint32_t>(std::clamp<std::int64_t>(f, 0, kv_lens[b]));
        }
    }

    paged_request request;
    request.kv_lens = kv_lens, request.q_lens = q_lens, request.kv_first = first;
    request.q_heads = static_cast<std::uint32_t>(problem.q_heads);
    request.kv_heads = static_cast<std::uint32_t>(problem.kv_heads);
    request.d_qk = static_cast<std::uint32_t>(problem.d_qk), request.d_v = static_cast<std::uint32_t>(problem.d_v);
    request.pool_rows = pool_rows;
    request.kv_blocks = is_quantized(pool_type);
    request.max_chunks = set.max_decode_chunks;
    // shared prefixes: where the tables begin with the same pages that every query row sees
    request.block_table = problem.block_table;
    request.max_pages = static_cast<std::uint32_t>(problem.max_pages), request.page_size = ps;
    request.offsets = offsets;
    request.causal = problem.options.causal;
    request.window_left = pos0.window_left, request.window_right = pos0.window_right;
    request.cascade = problem.cascade && !bounds;
    request.kv_base = base;
    l.plan = plan_paged(dev.desc(), request, set);
    const paged_plan& plan = l.plan;
    l.total_q = plan.total_q;
    const std::uint64_t total_q = plan.total_q, Hq = problem.q_heads, Ev = problem.d_v;
    l.whole = sequence_shape_of(problem, 0, static_cast<std::uint32_t>(total_q), std::max(l.longest, 1u));

    // The work words: sequences and shared prefixes, the token -> sequence map, the prefixes' row
    // lists, the items.
    const std::uint64_t entries = plan.sequences.size();
    l.token_base = entries * PAGED_SEQ_WORDS;
    const std::uint64_t rows_base = l.token_base + total_q;
    l.item_base = rows_base + plan.group_tokens.size();
    std::vector<std::uint32_t>& words = l.words;
    words.assign(l.item_base + plan.items.size() * PAGED_ITEM_WORDS, 0u);
    for (std::size_t b = 0; b < B; ++b) {
        const paged_sequence& s = plan.sequences[b];
        std::uint32_t* w = &words[b * PAGED_SEQ_WORDS];
        w[PAGED_SEQ_KV_FIRST] = s.kv_first, w[PAGED_SEQ_KV_LEN] = s.kv_len;
        w[PAGED_SEQ_Q_FIRST] = s.q_first, w[PAGED_SEQ_Q_LEN] = s.q_len;
        w[PAGED_SEQ_CHUNKS] = s.chunks, w[PAGED_SEQ_PART_BASE] = s.part_base;
        w[PAGED_SEQ_OFFSET] = static_cast<std::uint32_t>(offsets[b]);
        w[PAGED_SEQ_TABLE] = static_cast<std::uint32_t>(b);
        w[PAGED_SEQ_KV_BASE] = base[b];
        for (std::uint32_t i = 0; i < s.q_len; ++i) words[l.token_base + s.q_first + i] = static_cast<std::uint32_t>(b);
    }
    for (const paged_group& g : plan.groups) {
        const paged_sequence& s = plan.sequences[g.entry];
        std::uint32_t* w = &words[std::uint64_t{g.entry} * PAGED_SEQ_WORDS];
        w[PAGED_SEQ_KV_FIRST] = s.kv_first, w[PAGED_SEQ_KV_LEN] = s.kv_len;
        w[PAGED_SEQ_Q_FIRST] = static_cast<std::uint32_t>(rows_base + s.q_first), w[PAGED_SEQ_Q_LEN] = s.q_len;
        w[PAGED_SEQ_CHUNKS] = s.chunks, w[PAGED_SEQ_PART_BASE] = s.tail;
        w[PAGED_SEQ_TABLE] = g.members.front();
    }
    std::copy(plan.group_tokens.begin(), plan.group_tokens.end(),
              words.begin() + static_cast<std::ptrdiff_t>(rows_base));
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
        const paged_item& it = plan.items[i];
        std::uint32_t* w = &words[l.item_base + i * PAGED_ITEM_WORDS];
        w[0] = it.seq, w[1] = it.kv_head, w[2] = it.chunk, w[3] = it.row_block;
    }

    // The buffers: q texels, the table, the words, the params in the inputs; partials; out and lse.
    const std::uint64_t align = 256;
    l.q_bytes = total_q * Hq * plan.e4 * 16;
    l.table_at = align_up(l.q_bytes, align), l.table_bytes = problem.block_table.size() * 4;
    l.words_at = align_up(l.table_at + l.table_bytes, align), l.words_bytes = words.size() * 4;
    l.params_at = align_up(l.words_at + l.words_bytes, align);
    l.params_bytes = score_params_bytes(l.whole.shape);
    l.out_bytes = total_q * Hq * Ev * 4, l.lse_at = align_up(l.out_bytes, align);
    l.lse_bytes = problem.options.return_lse ? Hq * total_q * 4 : 0;
    const device_desc& desc = dev.desc();
    if (total_q * Hq * plan.e4 > desc.max_texel_elements)
        throw limit_exceeded("sdpa over a paged K/V pool: q's " + std::to_string(total_q * Hq * plan.e4) +
                             " texels are more than " + dev.info().name + "'s maxTexelBufferElements of " +
                             std::to_string(desc.max_texel_elements));
    for (const std::uint64_t bytes : {l.words_bytes, l.table_bytes, l.out_bytes, l.lse_bytes})
        if (bytes > dev.info().max_storage_buffer_range)
            throw limit_exceeded("sdpa over a paged K/V pool: a binding of " + std::to_string(bytes) +
                                 " bytes (the work list, the block table, the output or the lse) is more than " +
                                 dev.info().name + "'s maxStorageBufferRange of " +
                                 std::to_string(dev.info().max_storage_buffer_range));
    l.buffers.need(role::inputs, l.params_at + l.params_bytes);
    l.buffers.need(role::partial_stats, std::max<std::uint64_t>(plan.stats_bytes(), 16));
    l.buffers.need(role::partial_acc, std::max<std::uint64_t>(plan.acc_bytes(), 16));
    l.buffers.need(role::out, l.lse_at + std::max<std::uint64_t>(l.lse_bytes, 16));
    return l;
}

void put_paged_words(std::byte* to, const paged_layout& l, const paged_problem& problem, std::uint64_t from) {
    std::memcpy(to + (l.table_at - from), problem.block_table.data(), l.table_bytes);
    std::memcpy(to + (l.words_at - from), l.words.data(), l.words_bytes);
    put_score_params(to + (l.params_at - from), l.whole, score_features(l.whole));
}

void record_paged(recorder& rec, pipeline_set& pipes, const paged_layout& l, const paged_problem& problem,
                  const paged_pool& pool, const paged_bindings& b, float scale, float v_scale, std::uint32_t values) {
    const paged_plan& plan = l.plan;
    const std::uint32_t q_heads = static_cast<std::uint32_t>(problem.q_heads);
    const std::uint32_t kv_heads = static_cast<std::uint32_t>(problem.kv_heads);
    if (!plan.items.empty()) {
        paged_push push{};
        push.items = static_cast<std::uint32_t>(plan.items.size());
        push.item_base = static_cast<std::uint32_t>(l.item_base);
        push.page_shift = l.page_shift;
        push.max_pages = static_cast<std::uint32_t>(problem.max_pages);
        push.pool_rows = pool.rows;
        push.chunk = plan.chunk;
        push.scale = scale;
        push.q_heads = q_heads, push.kv_heads = kv_heads;
        push.v_scale = v_scale;
        push.sequences = static_cast<std::uint32_t>(batch_of(problem));
        push.token_base = static_cast<std::uint32_t>(l.token_base);
        const bool blocks = is_quantized(pool.type);
        const std::uint32_t kv_format = !blocks                           ? DECODE_KV_TEXELS
                                        : pool.type == element_type::q8_0 ? DECODE_KV_Q8_0
                                                                          : DECODE_KV_Q4_0;
        const decode_spec spec{plan.wg,   plan.rpi, plan.kps,
                               plan.e4,   plan.ev4, problem.options.causal ? MASK_FLAG_CAUSAL : 0u,
                               0u,        values,   score_features(l.whole),
                               kv_format, 0u,       0u};
        static_assert(row_matches<paged_push, decode_spec>(shader_id::sdpa_decode_paged, "tttssssss") &&
                          row_matches<paged_push, decode_spec>(shader_id::sdpa_decode_paged_shuffle, "tttssssss"),
                      "Q, K and V are uniform texel buffers, the rest storage buffers");
        static_assert(
            row_matches<paged_push, decode_spec>(shader_id::sdpa_decode_paged_blocks, "tssssssss") &&
                row_matches<paged_push, decode_spec>(shader_id::sdpa_decode_paged_shuffle_blocks, "tssssssss"),
            "Q a uniform texel buffer, K's and V's blocks and the rest storage buffers");
        const shader_id id =
            blocks ? (plan.shuffle ? shader_id::sdpa_decode_paged_shuffle_blocks : shader_id::sdpa_decode_paged_blocks)
                   : (plan.shuffle ? shader_id::sdpa_decode_paged_shuffle : shader_id::sdpa_decode_paged);
        if (blocks && (!pool.k_blocks.buffer || !pool.v_blocks.buffer))
            throw error("internal: a paged decode over a quantized pool without its blocks' bindings");
        const pipeline& kernel = pipes.get(id, spec);
        const std::uint32_t groups[3] = {push.items, 1, 1};
        const binding k = blocks ? pool.k_blocks : texel(pool.k), v = blocks ? pool.v_blocks : texel(pool.v);
        rec.dispatch(kernel, {b.q, k, v, b.table, b.work, b.stats, b.acc, b.params, b.gate}, &push, groups);
        rec.compute_barrier();
    }
    if (l.total_q == 0) return;
    paged_merge_push m{};
    m.total_q = static_cast<std::uint32_t>(l.total_q);
    m.q_heads = q_heads, m.kv_heads = kv_heads;
    m.dv = static_cast<std::uint32_t>(problem.d_v), m.dv_stride = plan.ev4 * 4;
    m.token_base = static_cast<std::uint32_t>(l.token_base);
    static_assert(row_matches<paged_merge_push, no_spec>(shader_id::sdpa_merge_paged, "ssssss"));
    const pipeline& merge = pipes.get(shader_id::sdpa_merge_paged);
    const std::uint32_t merge_groups[3] = {
        static_cast<std::uint32_t>(ceil_div(l.total_q * problem.q_heads * problem.d_v, MERGE_WORKGROUP)), 1, 1};
    rec.dispatch(merge, {b.stats, b.acc, b.out, b.params, b.lse, b.work}, &m, merge_groups);
}

run_result<varlen_output> run_paged(run_env& env, const paged_problem& problem, const paged_pool& pool,
                                    const paged_append& append) {
    const device& dev = *env.core.dev;
    const paged_layout l = plan_paged_call(dev, env.set, problem, pool.rows, pool.type);
    const std::uint64_t total_q = l.total_q, Hq = problem.q_heads, E = problem.d_qk, Ev = problem.d_v;

    // The overflow rule: q's norms per head over every query row (q as (1, Hq, total_q, E)), K's and
    // V's from the pool's statistics; the values' scale for the longest sequence.
    sdpa_problem whole = l.whole;
    std::vector<float> q_heads_first(problem.q.size());
    for (std::uint64_t t = 0; t < total_q; ++t)
        for (std::uint64_t h = 0; h < Hq; ++h)
            std::memcpy(&q_heads_first[(h * total_q + t) * E], &problem.q[(t * Hq + h) * E], E * sizeof(float));
    whole.q = q_heads_first;
    const sdpa_facts facts = scan_sdpa(whole, *pool.stats);
    const float scale = problem.options.scale ? *problem.options.scale : default_scale(whole.shape);
    check_sdpa_scores(facts, whole.shape, scale, pool.type == element_type::f16);
    const float v_scale = value_scale(facts, std::max(l.longest, 1u));

    varlen_output out;
    out.device = dev.info().name;
    out.output.assign(total_q * Hq * Ev, 0.0f);
    if (problem.options.return_lse) out.lse.assign(Hq * total_q, -std::numeric_limits<float>::infinity());
    run_result<varlen_output> run;
    const std::uint64_t n_new = append.rows_at.size();
    if (total_q == 0 && n_new == 0) {
        run.output = std::move(out);
        return run;
    }

    // The appended rows (per K/V head, in the pool's texel form, or its blocks) and their pool rows,
    // after the params.
    const paged_plan& plan = l.plan;
    const std::uint64_t align = 256;
    const bool half = pool.type == element_type::f16, blocks = is_quantized(pool.type);
    const std::uint64_t Hkv = problem.kv_heads, tb = half ? 8 : 16;
    const std::uint64_t k_row_bytes = blocks ? bytes_for(pool.type, E) : plan.e4 * tb,
                        v_row_bytes = blocks ? bytes_for(pool.type, Ev) : plan.ev4 * tb;
    const std::uint64_t new_k_at = align_up(l.params_at + l.params_bytes, align),
                        new_k_bytes = Hkv * n_new * k_row_bytes;
    const std::uint64_t new_v_at = align_up(new_k_at + new_k_bytes, align), new_v_bytes = Hkv * n_new * v_row_bytes;
    if (n_new && blocks &&
        (!pool.k_blocks.buffer || !pool.v_blocks.buffer || append.k_blocks.size() != new_k_bytes ||
         append.v_blocks.size() != new_v_bytes))
        throw error("internal: an append into a q8_0 / q4_0 paged pool without its blocks");
    const std::uint64_t rows_at_at = align_up(new_v_at + new_v_bytes, align), rows_at_bytes = n_new * 4;
    const std::uint64_t inputs_bytes = n_new ? rows_at_at + rows_at_bytes : l.params_at + l.params_bytes;
    if (n_new && !blocks) check_paged_append(dev, pool, Hkv, n_new, plan.e4, plan.ev4);
    buffer_plan buffers = l.buffers;
    buffers.need(role::inputs, std::max<std::uint64_t>(inputs_bytes, 16));
    std::vector<download> downloads;
    if (l.out_bytes) downloads.push_back({role::out, 0, l.out_bytes});
    if (l.lse_bytes) downloads.push_back({role::out, l.lse_at, l.lse_bytes});
    run_session session(env, buffers, downloads);
    std::byte* in = session.inputs();
    put_texel_rows(in, problem.q.data(), total_q * Hq, E, l.plan.e4, false, "sdpa over a paged K/V pool: q");
    put_paged_words(in, l, problem);
    if (n_new && blocks) {
        std::memcpy(in + new_k_at, append.k_blocks.data(), new_k_bytes);
        std::memcpy(in + new_v_at, append.v_blocks.data(), new_v_bytes);
    } else if (n_new) {  // checked for float16 overflow by the caller (context.cpp), with its message
        put_texel_rows(in + new_k_at, append.k.data(), Hkv * n_new, E, plan.e4, half,
                       "sdpa over a paged K/V pool: k_new", 1.0f, half_check::done);
        put_texel_rows(in + new_v_at, append.v.data(), Hkv * n_new, Ev, plan.ev4, half,
                       "sdpa over a paged K/V pool: v_new", 1.0f, half_check::done);
    }
    if (n_new) {
        std::vector<std::uint32_t> rows_at(n_new);
        for (std::uint64_t r = 0; r < n_new; ++r) rows_at[r] = static_cast<std::uint32_t>(append.rows_at[r]);
        std::memcpy(in + rows_at_at, rows_at.data(), rows_at_bytes);
    }
    const buffer& inputs = session.buffers()[role::inputs];
    const buffer_view q_view(dev, inputs, texel_format(false), 0, std::max<std::uint64_t>(l.q_bytes, 16));
    session.begin();

    const run_buffers& rb = session.buffers();
    paged_bindings b;
    b.q = texel(q_view.handle());
    b.table = rb.bind(role::inputs, l.table_at, std::max<std::uint64_t>(l.table_bytes, 4));
    b.work = rb.bind(role::inputs, l.words_at, l.words_bytes);
    b.params = rb.bind(role::inputs, l.params_at, l.params_bytes);
    b.gate = b.params;  // not read: the values' finiteness is the host's
    b.stats = rb.bind(role::partial_stats, 0, std::max<std::uint64_t>(l.plan.stats_bytes(), 16));
    b.acc = rb.bind(role::partial_acc, 0, std::max<std::uint64_t>(l.plan.acc_bytes(), 16));
    b.out = rb.bind(role::out, 0, std::max<std::uint64_t>(l.out_bytes, 16));
    b.lse = l.lse_bytes ? rb.bind(role::out, l.lse_at, l.lse_bytes) : b.out;
    if (n_new && blocks)  // Append, then attend (transfer copies: the blocks' rows may end mid-word).
        record_block_append(session.rec(), {rb[role::inputs].handle(), new_k_at, n_new * k_row_bytes, k_row_bytes},
                            {rb[role::inputs].handle(), new_v_at, n_new * v_row_bytes, v_row_bytes}, pool, Hkv,
                            k_row_bytes, v_row_bytes, append.rows_at);
    if (n_new && !blocks) {
        // Append, then attend: every new row in place before any key is read.
        record_paged_append(session.rec(), session.pipes(), dev, pool, Hkv, n_new, plan.e4, plan.ev4,
                            rb.bind(role::inputs, new_k_at, new_k_bytes), rb.bind(role::inputs, new_v_at, new_v_bytes),
                            rb.bind(role::inputs, rows_at_at, rows_at_bytes));
        session.rec().compute_barrier();
    }
    record_paged(session.rec(), session.pipes(), l, problem, pool, b, scale, v_scale,
                 facts.inputs_finite ? DECODE_VALUES_FINITE : DECODE_VALUES_NONFINITE);
    session.mark();
    run.times = session.submit();
    if (const std::vector<double>& mk = session.exec().marks_ms(); mk.size() >= 2)
        run.times.attention_ms = mk[1] - mk[0];
    if (l.out_bytes) session.read(0, out.output.data());
    if (l.lse_bytes) session.read(l.out_bytes ? 1 : 0, out.lse.data());
    finish_sdpa_output(out.output, facts, v_scale, whole.shape);
    run.output = std::move(out);
    return run;
}

}  // namespace qkv::vulkan::detail
