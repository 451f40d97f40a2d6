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

}  // namespace

run_result<varlen_output> run_paged(run_env& env, const paged_problem& problem, const paged_pool& pool,
                                    const paged_append& append) {
    const device& dev = *env.core.dev;
    const std::size_t B = batch_of(problem);
    const std::uint32_t ps = static_cast<std::uint32_t>(problem.page_size);
    std::uint32_t shift = 0;
    while ((1u << shift) < ps) ++shift;

    // The lengths, each sequence's positions (one set of reduced window sides and ALiBi part for
    // the whole call: refused where they would differ), the keys a window leaves.
    // A sequence's keys are its pool keys from cache_leftpad on (`base`); its positions count from there.
    std::vector<std::uint32_t> kv_lens(B), q_lens(B), first(B, 0), base(B, 0);
    std::vector<std::int32_t> offsets(B);
    std::uint32_t longest = 0;
    const bool ragged = !problem.cu_seqlens_q.empty();
    score_positions pos0{};
    for (std::size_t b = 0; b < B; ++b) {
        base[b] = static_cast<std::uint32_t>(paged_first_key(problem, b));
        kv_lens[b] = static_cast<std::uint32_t>(problem.cache_seqlens[b]) - base[b];
        q_lens[b] = ragged ? static_cast<std::uint32_t>(problem.cu_seqlens_q[b + 1] - problem.cu_seqlens_q[b])
                           : static_cast<std::uint32_t>(problem.q_len);
        longest = std::max(longest, kv_lens[b]);
        const score_positions pos = positions_of(sequence_shape_of(problem, b, q_lens[b], kv_lens[b]));
        if (b == 0) pos0 = pos;
        if (pos.window_left != pos0.window_left || pos.window_right != pos0.window_right ||
            pos.alibi_far != pos0.alibi_far)
            throw limit_exceeded(
                "sdpa over a paged K/V pool: sequence " + std::to_string(b) +
                "'s positions need other reduced window sides than sequence 0's (an offset beyond 2^30); run it "
                "on its own");
        offsets[b] = pos.offset;
        if (pos.window_left >= 0) {
            const std::int64_t f = std::int64_t{pos.offset} - pos.window_left;
            first[b] = static_cast<std::uint32_t>(std::clamp<std::int64_t>(f, 0, kv_lens[b]));
        }
    }

    paged_request request;
    request.kv_lens = kv_lens, request.q_lens = q_lens, request.kv_first = first;
    request.q_heads = static_cast<std::uint32_t>(problem.q_heads);
    request.kv_heads = static_cast<std::uint32_t>(problem.kv_heads);
    request.d_qk = static_cast<std::uint32_t>(problem.d_qk), request.d_v = static_cast<std::uint32_t>(problem.d_v);
    request.pool_rows = pool.rows;
    request.kv_blocks = is_quantized(pool.type);
    request.max_chunks = env.set.max_decode_chunks;
    // shared prefixes: where the tables begin with the same pages that every query row sees
    request.block_table = problem.block_table;
    request.max_pages = static_cast<std::uint32_t>(problem.max_pages), request.page_size = ps;
    request.offsets = offsets;
    request.causal = problem.options.causal;
    request.window_left = pos0.window_left, request.window_right = pos0.window_right;
    request.cascade = problem.cascade;
    request.kv_base = base;
    const paged_plan plan = plan_paged(dev.desc(), request, env.set);
    const std::uint64_t total_q = plan.total_q, Hq = problem.q_heads, E = problem.d_qk, Ev = problem.d_v;

    // The overflow rule: q's norms per head over every query row (q as (1, Hq, total_q, E)), K's and
    // V's from the pool's statistics; the values' scale for the longest sequence.
    sdpa_problem whole = sequence_shape_of(problem, 0, static_cast<std::uint32_t>(total_q), std::max(longest, 1u));
    std::vector<float> q_heads_first(problem.q.size());
    for (std::uint64_t t = 0; t < total_q; ++t)
        for (std::uint64_t h = 0; h < Hq; ++h)
            std::memcpy(&q_heads_first[(h * total_q + t) * E], &problem.q[(t * Hq + h) * E], E * sizeof(float));
    whole.q = q_heads_first;
    const sdpa_facts facts = scan_sdpa(whole, *pool.stats);
    const float scale = problem.options.scale ? *problem.options.scale : default_scale(whole.shape);
    check_sdpa_scores(facts, whole.shape, scale, pool.type == element_type::f16);
    const float v_scale = value_scale(facts, std::max(longest, 1u));

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

    // The work words: sequences and shared prefixes, the token -> sequence map, the prefixes' row
    // lists, the items.
    const std::uint64_t entries = plan.sequences.size();
    const std::uint64_t token_base = entries * PAGED_SEQ_WORDS, rows_base = token_base + total_q;
    const std::uint64_t item_base = rows_base + plan.group_tokens.size();
    std::vector<std::uint32_t> words(item_base + plan.items.size() * PAGED_ITEM_WORDS);
    for (std::size_t b = 0; b < B; ++b) {
        const paged_sequence& s = plan.sequences[b];
        std::uint32_t* w = &words[b * PAGED_SEQ_WORDS];
        w[PAGED_SEQ_KV_FIRST] = s.kv_first, w[PAGED_SEQ_KV_LEN] = s.kv_len;
        w[PAGED_SEQ_Q_FIRST] = s.q_first, w[PAGED_SEQ_Q_LEN] = s.q_len;
        w[PAGED_SEQ_CHUNKS] = s.chunks, w[PAGED_SEQ_PART_BASE] = s.part_base;
        w[PAGED_SEQ_OFFSET] = static_cast<std::uint32_t>(offsets[b]);
        w[PAGED_SEQ_TABLE] = static_cast<std::uint32_t>(b);
        w[PAGED_SEQ_KV_BASE] = base[b];
        for (std::uint32_t i = 0; i < s.q_len; ++i) words[token_base + s.q_first + i] = static_cast<std::uint32_t>(b);
    }
    for (const paged_group& g : plan.groups) {
        const paged_sequence& s = plan.sequences[g.entry];
        std::uint32_t* w = &words[std::uint64_t{g.entry} * PAGED_SEQ_WORDS];
        w[PAGED_SEQ_KV_FIRST] = 0, w[PAGED_SEQ_KV_LEN] = s.kv_len;
        w[PAGED_SEQ_Q_FIRST] = static_cast<std::uint32_t>(rows_base + s.q_first), w[PAGED_SEQ_Q_LEN] = s.q_len;
        w[PAGED_SEQ_CHUNKS] = s.chunks;
        w[PAGED_SEQ_TABLE] = g.members.front();
    }
    std::copy(plan.group_tokens.begin(), plan.group_tokens.end(),
              words.begin() + static_cast<std::ptrdiff_t>(rows_base));
    for (std::size_t i = 0; i < plan.items.size(); ++i) {
        const paged_item& it = plan.items[i];
        std::uint32_t* w = &words[item_base + i * PAGED_ITEM_WORDS];
        w[0] = it.seq, w[1] = it.kv_head, w[2] = it.chunk, w[3] = it.row_block;
    }

    // The buffers: q texels, the table, the words, the params in the inputs; partials; out and lse.
    const std::uint64_t align = 256;
    const std::uint64_t q_bytes = total_q * Hq * plan.e4 * 16;
    const std::uint64_t table_at = align_up(q_bytes, align), table_bytes = problem.block_table.size() * 4;
    const std::uint64_t words_at = align_up(table_at + table_bytes, align), words_bytes = words.size() * 4;
    const std::uint64_t params_at = align_up(words_at + words_bytes, align);
    const std::uint64_t params_bytes = score_params_bytes(whole.shape);
    // The appended rows (per K/V head, in the pool's texel form) and their pool rows.
    const bool half = pool.type == element_type::f16;
    const std::uint64_t Hkv = problem.kv_heads, tb = half ? 8 : 16;
    const std::uint64_t new_k_at = align_up(params_at + params_bytes, align), new_k_bytes = Hkv * n_new * plan.e4 * tb;
    const std::uint64_t new_v_at = align_up(new_k_at + new_k_bytes, align), new_v_bytes = Hkv * n_new * plan.ev4 * tb;
    const std::uint64_t rows_at_at = align_up(new_v_at + new_v_bytes, align), rows_at_bytes = n_new * 4;
    const std::uint64_t inputs_bytes = n_new ? rows_at_at + rows_at_bytes : params_at + params_bytes;
    if (n_new) {
        if (!pool.k_store.buffer || !pool.v_store.buffer || is_quantized(pool.type))
            throw error("internal: an append into a paged pool without its storage bindings");
        for (const std::uint64_t bytes : {new_k_bytes, new_v_bytes, pool.k_store.range, pool.v_store.range})
            if (bytes > dev.info().max_storage_buffer_range)
                throw limit_exceeded("sdpa over a paged K/V pool: an append binds " + std::to_string(bytes) +
                                     " bytes (the new rows, or the pool's storage) as one storage buffer, more than " +
                                     dev.info().name + "'s maxStorageBufferRange of " +
                                     std::to_string(dev.info().max_storage_buffer_range));
        const std::uint64_t last_word = std::max(pool.k_word + Hkv * pool.rows * plan.e4 * tb / 4,
                                                 pool.v_word + Hkv * pool.rows * plan.ev4 * tb / 4);
        if (last_word >= (std::uint64_t{1} << 32) || Hkv * n_new * plan.e4 * tb / 4 >= (std::uint64_t{1} << 32) ||
            Hkv * n_new * plan.ev4 * tb / 4 >= (std::uint64_t{1} << 32))
            throw limit_exceeded("sdpa over a paged K/V pool: an append addresses more than 2^32 - 1 words");
    }
    const std::uint64_t out_bytes = total_q * Hq * Ev * 4, lse_at = align_up(out_bytes, align);
    const std::uint64_t lse_bytes = problem.options.return_lse ? Hq * total_q * 4 : 0;
    const device_desc& desc = dev.desc();
    if (total_q * Hq * plan.e4 > desc.max_texel_elements)
        throw limit_exceeded("sdpa over a paged K/V pool: q's " + std::to_string(total_q * Hq * plan.e4) +
                             " texels are more than " + dev.info().name + "'s maxTexelBufferElements of " +
                             std::to_string(desc.max_texel_elements));
    for (const std::uint64_t bytes : {words_bytes, table_bytes, out_bytes, lse_bytes})
        if (bytes > dev.info().max_storage_buffer_range)
            throw limit_exceeded("sdpa over a paged K/V pool: a binding of " + std::to_string(bytes) +
                                 " bytes (the work list, the block table, the output or the lse) is more than " +
                                 dev.info().name + "'s maxStorageBufferRange of " +
                                 std::to_string(dev.info().max_storage_buffer_range));
    buffer_plan buffers;
    buffers.need(role::inputs, std::max<std::uint64_t>(inputs_bytes, 16));
    buffers.need(role::partial_stats, std::max<std::uint64_t>(plan.stats_bytes(), 16));
    buffers.need(role::partial_acc, std::max<std::uint64_t>(plan.acc_bytes(), 16));
    buffers.need(role::out, lse_at + std::max<std::uint64_t>(lse_bytes, 16));
    std::vector<download> downloads;
    if (out_bytes) downloads.push_back({role::out, 0, out_bytes});
    if (lse_bytes) downloads.push_back({role::out, lse_at, lse_bytes});

    run_session session(env, buffers, downloads);
    std::byte* in = session.inputs();
    put_texel_rows(in, problem.q.data(), total_q * Hq, E, plan.e4, false, "sdpa over a paged K/V pool: q");
    std::memcpy(in + table_at, problem.block_table.data(), table_bytes);
    std::memcpy(in + words_at, words.data(), words_bytes);
    const std::uint32_t features = score_features(whole);
    put_score_params(in + params_at, whole, features);
    if (n_new) {
        put_texel_rows(in + new_k_at, append.k.data(), Hkv * n_new, E, plan.e4, half,
                       "sdpa over a paged K/V pool: k_new");
        put_texel_rows(in + new_v_at, append.v.data(), Hkv * n_new, Ev, plan.ev4, half,
                       "sdpa over a paged K/V pool: v_new");
        std::vector<std::uint32_t> rows_at(n_new);
        for (std::uint64_t r = 0; r < n_new; ++r) rows_at[r] = static_cast<std::uint32_t>(append.rows_at[r]);
        std::memcpy(in + rows_at_at, rows_at.data(), rows_at_bytes);
    }
    const buffer& inputs = session.buffers()[role::inputs];
    const buffer_view q_view(dev, inputs, texel_format(false), 0, std::max<std::uint64_t>(q_bytes, 16));
    session.begin();

    const run_buffers& rb = session.buffers();
    const binding params = rb.bind(role::inputs, params_at, params_bytes);
    const binding work = rb.bind(role::inputs, words_at, words_bytes);
    const binding stats = rb.bind(role::partial_stats, 0, std::max<std::uint64_t>(plan.stats_bytes(), 16));
    const binding acc = rb.bind(role::partial_acc, 0, std::max<std::uint64_t>(plan.acc_bytes(), 16));
    const binding o = rb.bind(role::out, 0, std::max<std::uint64_t>(out_bytes, 16));
    const binding lse = lse_bytes ? rb.bind(role::out, lse_at, lse_bytes) : o;
    if (n_new) {
        // Append, then attend: every new row in place before any key is read.
        static_assert(row_matches<paged_append_push, no_spec>(shader_id::paged_append, "sss"));
        const pipeline& copy = session.pipes().get(shader_id::paged_append);
        const binding rows_at = rb.bind(role::inputs, rows_at_at, rows_at_bytes);
        for (const auto& [src_at, src_bytes, texels, store, word] :
             {std::tuple{new_k_at, new_k_bytes, plan.e4, pool.k_store, pool.k_word},
              std::tuple{new_v_at, new_v_bytes, plan.ev4, pool.v_store, pool.v_word}}) {
            paged_append_push a{};
            a.rows = static_cast<std::uint32_t>(n_new);
            a.heads = request.kv_heads;
            a.width = static_cast<std::uint32_t>(texels * tb / 4);
            a.src_off = 0;
            a.dst_off = static_cast<std::uint32_t>(word);
            a.pool_rows = pool.rows;
            a.at_off = 0;
            const std::uint64_t count = Hkv * n_new * a.width;
            const std::uint32_t groups[3] = {
                static_cast<std::uint32_t>(ceil_div(count, PAGED_APPEND_WORKGROUP * PAGED_APPEND_PER_INVOCATION)), 1,
                1};
            session.rec().dispatch(copy, {rb.bind(role::inputs, src_at, src_bytes), store, rows_at}, &a, groups);
        }
        session.rec().compute_barrier();
    }
    if (!plan.items.empty()) {
        paged_push push{};
        push.items = static_cast<std::uint32_t>(plan.items.size());
        push.item_base = static_cast<std::uint32_t>(item_base);
        push.page_shift = shift;
        push.max_pages = static_cast<std::uint32_t>(problem.max_pages);
        push.pool_rows = pool.rows;
        push.chunk = plan.chunk;
        push.scale = scale;
        push.q_heads = request.q_heads, push.kv_heads = request.kv_heads;
        push.v_scale = v_scale;
        push.sequences = static_cast<std::uint32_t>(B);
        push.token_base = static_cast<std::uint32_t>(token_base);
        const bool blocks = is_quantized(pool.type);
        const std::uint32_t kv_format = !blocks                           ? DECODE_KV_TEXELS
                                        : pool.type == element_type::q8_0 ? DECODE_KV_Q8_0
                                                                          : DECODE_KV_Q4_0;
        const decode_spec spec{plan.wg,  plan.rpi,
                               plan.kps, plan.e4,
                               plan.ev4, problem.options.causal ? MASK_FLAG_CAUSAL : 0u,
                               0u,       facts.inputs_finite ? DECODE_VALUES_FINITE : DECODE_VALUES_NONFINITE,
                               features, kv_format,
                               0u,       0u};
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
        const pipeline& kernel = session.pipes().get(id, spec);
        const binding table = rb.bind(role::inputs, table_at, std::max<std::uint64_t>(table_bytes, 4));
        const std::uint32_t groups[3] = {push.items, 1, 1};
        const binding k = blocks ? pool.k_blocks : texel(pool.k), v = blocks ? pool.v_blocks : texel(pool.v);
        session.rec().dispatch(kernel, {texel(q_view.handle()), k, v, table, work, stats, acc, params, params}, &push,
                               groups);
        session.rec().compute_barrier();
    }
    if (total_q != 0) {
        paged_merge_push m{};
        m.total_q = static_cast<std::uint32_t>(total_q);
        m.q_heads = request.q_heads, m.kv_heads = request.kv_heads;
        m.dv = request.d_v, m.dv_stride = plan.ev4 * 4;
        m.token_base = static_cast<std::uint32_t>(token_base);
        static_assert(row_matches<paged_merge_push, no_spec>(shader_id::sdpa_merge_paged, "ssssss"));
        const pipeline& merge = session.pipes().get(shader_id::sdpa_merge_paged);
        const std::uint32_t merge_groups[3] = {static_cast<std::uint32_t>(ceil_div(total_q * Hq * Ev, MERGE_WORKGROUP)),
                                               1, 1};
        session.rec().dispatch(merge, {stats, acc, o, params, lse, work}, &m, merge_groups);
    }
    session.mark();
    run.times = session.submit();
    if (const std::vector<double>& mk = session.exec().marks_ms(); mk.size() >= 2)
        run.times.attention_ms = mk[1] - mk[0];
    if (out_bytes) session.read(0, out.output.data());
    if (lse_bytes) session.read(1, out.lse.data());
    finish_sdpa_output(out.output, facts, v_scale, whole.shape);
    run.output = std::move(out);
    return run;
}

}  // namespace qkv::vulkan::detail
