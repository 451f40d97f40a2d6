// qkv::vulkan::paged_call: the batched decode against a paged K/V pool, over device tensors. The
// same plan, work words and kernels as context::sdpa(paged_problem, kv_cache) (run/run_paged.cpp:
// plan_paged_call, put_paged_words, record_paged); what differs is the write step (q packed from
// the caller's tensor into texels on the device, the table and the work words written by the host
// into the recording's own memory when it is recorded) and the check (q's norms by the overflow
// rule's device pass, read afterwards, as an sdpa_call over a cache does).
#include "qkv/vulkan/paged_call.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "api/context_impl.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/paged_call_impl.hpp"
#include "api/recording_impl.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/tensor_ops.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "run/io.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan {

using namespace detail;

namespace {

/// Whether the tensors give the step's batch (else it is the description's).
bool own_batch(const paged_tensors& t) {
    return !t.block_table.empty() || !t.cache_seqlens.empty() || !t.cu_seqlens_q.empty() ||
           !t.cache_batch_idx.empty() || !t.cache_leftpad.empty();
}

/// The step as a paged problem: the description's shapes and options with the tensors' batch (or
/// the description's own).
paged_problem step_of(const paged_problem& desc, const paged_tensors& t) {
    paged_problem p = desc;
    if (own_batch(t)) {
        p.block_table = t.block_table;
        p.cache_seqlens = t.cache_seqlens;
        p.cu_seqlens_q = t.cu_seqlens_q;
        p.cache_batch_idx = t.cache_batch_idx;
        p.cache_leftpad = t.cache_leftpad;
    }
    if (p.cache_seqlens.empty() && !t.cache_seqlens_tensor)
        throw qkv::invalid_argument(
            "paged_call: no batch: give the step's block_table and cache_seqlens with the tensors (or in the "
            "description)");
    return p;
}

std::uint64_t total_q_of(const paged_problem& p) {
    return p.cu_seqlens_q.empty() ? std::uint64_t{batch_of(p)} * p.q_len
                                  : static_cast<std::uint64_t>(p.cu_seqlens_q.back());
}

}  // namespace

paged_call::paged_call(context& ctx, const paged_problem& description, kv_cache& pool)
    : impl_(std::make_unique<impl>()) {
    impl& c = *impl_;
    context::impl& owner = context_access::of(ctx);
    c.core = owner.core;
    c.set = owner.set;
    c.cache = kv_cache_access::of(pool);
    if (c.cache->core != c.core) throw qkv::invalid_argument("paged_call: the pool was created from another context");
    std::vector<feature> asked = features_of(description);
    for (const feature f : features_of(c.cache->type)) asked.push_back(f);  // the pool's storage
    require_supported(entry_point::paged_call, asked);
    if (!description.q.empty() || !description.k_pages.empty() || !description.v_pages.empty())
        throw qkv::invalid_argument(
            "paged_call: the description's q, k_pages and v_pages must be empty (q comes as a tensor, K and V "
            "from the pool)");
    if (!description.k_new.empty() || !description.v_new.empty())
        throw qkv::invalid_argument(
            "paged_call: the description's k_new and v_new must be empty (the new rows come as tensors; its "
            "new_rows says how many)");
    if (description.new_rows != 0) {
        require_supported(entry_point::paged_append, features_of(c.cache->type));
        if (c.cache->blocks() && description.rotary_dim != 0)
            throw qkv::invalid_argument(
                "paged_call: a rotary embedding with appends into a " + std::string(to_string(c.cache->type)) +
                " pool: the new keys come as ggml's blocks, and turning them needs their values before they are "
                "quantized; turn k_new before quantizing it, or append host rows (context::sdpa(problem, pool) "
                "turns, then quantizes)");
        if (c.cache->texels_only())
            throw limit_exceeded("paged_call: the pool's K or V passes " + c.core->dev->info().name +
                                 "'s maxStorageBufferRange of " +
                                 std::to_string(c.core->dev->info().max_storage_buffer_range) +
                                 " bytes; appends write it as one storage buffer");
    }
    c.desc = description;
    c.block_table.assign(description.block_table.begin(), description.block_table.end());
    c.cache_seqlens.assign(description.cache_seqlens.begin(), description.cache_seqlens.end());
    c.cu_seqlens_q.assign(description.cu_seqlens_q.begin(), description.cu_seqlens_q.end());
    c.cache_batch_idx.assign(description.cache_batch_idx.begin(), description.cache_batch_idx.end());
    c.cache_leftpad.assign(description.cache_leftpad.begin(), description.cache_leftpad.end());
    c.rotary_cos.assign(description.rotary_cos.begin(), description.rotary_cos.end());
    c.rotary_sin.assign(description.rotary_sin.begin(), description.rotary_sin.end());
    c.sinks.assign(description.sinks.begin(), description.sinks.end());
    c.alibi_slopes.assign(description.alibi_slopes.begin(), description.alibi_slopes.end());
    c.desc.block_table = c.block_table, c.desc.cache_seqlens = c.cache_seqlens, c.desc.cu_seqlens_q = c.cu_seqlens_q;
    c.desc.cache_batch_idx = c.cache_batch_idx, c.desc.cache_leftpad = c.cache_leftpad;
    c.desc.sinks = c.sinks, c.desc.alibi_slopes = c.alibi_slopes;
    c.desc.rotary_cos = c.rotary_cos, c.desc.rotary_sin = c.rotary_sin;
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    if (!c.rotary_cos.empty()) {  // the rotary tables on the device once: cos, then sin
        const std::uint64_t bytes = c.rotary_cos.size() * 4;
        c.constants = c.core->alloc->create(2 * bytes, memory_use::upload, "paged_call rotary tables");
        std::memcpy(c.constants.mapped(), c.rotary_cos.data(), bytes);
        std::memcpy(c.constants.mapped() + bytes, c.rotary_sin.data(), bytes);
        c.constants.flush();
    }
    if (c.cache_seqlens.empty()) {
        // No step yet: the shapes and options alone, as for a batch of one empty sequence.
        paged_problem p = c.desc;
        const std::vector<std::int32_t> table(p.max_pages, 0), none{0}, rows{0, 0};
        p.block_table = table, p.cache_seqlens = none, p.num_pages = 1;
        p.cache_batch_idx = {}, p.cache_leftpad = {};
        if (!p.cu_seqlens_q.empty()) p.cu_seqlens_q = rows;
        validate_without_data(p);
        return;
    }
    // The description's step: checked against the pool now, planned once, its pipelines built.
    const paged_problem step = c.cache->check_pool(c.desc, false);
    c.planned = c.plan(step);
    const std::uint64_t total_q = c.planned->layout.total_q;
    const auto Hq = step.q_heads;
    tensor q = c.desc.cu_seqlens_q.empty()
                   ? stand_in(c.core, {batch_of(step), step.q_len, Hq, step.d_qk}, element_type::f32)
                   : stand_in(c.core, {total_q, Hq, step.d_qk}, element_type::f32);
    tensor out = c.desc.cu_seqlens_q.empty()
                     ? stand_in(c.core, {batch_of(step), step.q_len, Hq, step.d_v}, element_type::f32)
                     : stand_in(c.core, {total_q, Hq, step.d_v}, element_type::f32);
    tensor lse, k_new, v_new;
    paged_tensors t{.q = &q, .out = &out};
    if (step.options.return_lse) lse = stand_in(c.core, {Hq, total_q}, element_type::f32), t.lse = &lse;
    if (step.new_rows != 0) {
        k_new = stand_in(c.core, {batch_of(step), step.new_rows, step.kv_heads, step.d_qk}, c.cache->type);
        v_new = stand_in(c.core, {batch_of(step), step.new_rows, step.kv_heads, step.d_v}, c.cache->type);
        t.k_new = &k_new, t.v_new = &v_new;
    }
    build_pipelines(c, t);
}

paged_call::~paged_call() = default;
paged_call::paged_call(paged_call&&) noexcept = default;
paged_call& paged_call::operator=(paged_call&&) noexcept = default;

paged_step paged_call::impl::plan(const paged_problem& step, bool table_here, bool bounds) const {
    paged_step s;
    s.resolved = std::make_shared<basic_resolved_pages<float>>(resolve_pages_without_data(step, table_here));
    s.layout = plan_paged_call(*core->dev, set, s.resolved->problem, static_cast<std::uint32_t>(cache->layout.capacity),
                               cache->type, bounds);
    return s;
}

paged_problem paged_call::impl::check(const paged_tensors& t) const {
    // The one check of a batch against the pool, with the pages it holds now. A table on the
    // device: its size here (placeholder entries), its entries checked on the device.
    paged_problem asked = step_of(desc, t);
    // Lengths on the device: the step checked and planned at each sequence's bound (its table row's
    // keys less the new rows); the device checks the lengths, and the table's entries they reach.
    const tensor::impl* lengths = nullptr;
    if (t.cache_seqlens_tensor) {
        if (!t.cache_seqlens.empty())
            throw qkv::invalid_argument(
                "paged_call: a cache_seqlens span and a cache_seqlens_tensor: give the lengths one way");
        if (desc.cascade)
            throw qkv::invalid_argument(
                "paged_call: a cache_seqlens_tensor with the description's cascade: shared prefixes are found from "
                "the lengths on the host, and device lengths are not read back; set cascade = false (or give the "
                "lengths as a span)");
        if (desc.new_rows != 0 && cache->blocks())
            throw qkv::invalid_argument(
                "paged_call: a cache_seqlens_tensor with appends into a q8_0 / q4_0 pool: give the lengths as a span");
        const std::size_t B = tensor_access::of(*t.cache_seqlens_tensor, "paged_call").elements;
        lengths = &expect_tensor(*t.cache_seqlens_tensor, "paged_call", "cache_seqlens", core,
                                 {std::max<std::size_t>(B, 1)}, element_type::i32);
        require_usage(*lengths, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "VK_BUFFER_USAGE_TRANSFER_SRC_BIT", "paged_call",
                      "cache_seqlens (copied on the device)");
        const std::uint64_t capacity = std::uint64_t{asked.max_pages} * asked.page_size;
        if (capacity > contract::SCORE_POSITION_LIMIT)
            throw limit_exceeded("paged_call: a cache_seqlens_tensor with table rows of " + std::to_string(capacity) +
                                 " keys (max_pages x page_size): with the lengths on the device, at most 2^30");
        if (capacity < asked.new_rows)
            throw qkv::invalid_argument("paged_call: " + std::to_string(asked.new_rows) +
                                        " new rows per sequence, and a table row holds " + std::to_string(capacity) +
                                        " keys (max_pages x page_size)");
        const std::size_t bound = capacity - asked.new_rows;
        for (std::size_t b = 0; b < asked.cache_leftpad.size(); ++b)
            if (asked.cache_leftpad[b] > 0 && static_cast<std::size_t>(asked.cache_leftpad[b]) > bound)
                throw qkv::invalid_argument("paged_call: cache_leftpad[" + std::to_string(b) +
                                            "] = " + std::to_string(asked.cache_leftpad[b]) +
                                            " is past every length a table row of " + std::to_string(capacity) +
                                            " keys leaves with " + std::to_string(asked.new_rows) + " new rows");
        if (asked.new_rows != 0 && !asked.cache_batch_idx.empty()) {
            std::vector<std::int32_t> rows(asked.cache_batch_idx.begin(), asked.cache_batch_idx.end());
            std::sort(rows.begin(), rows.end());
            if (std::adjacent_find(rows.begin(), rows.end()) != rows.end())
                throw qkv::invalid_argument(
                    "paged_call: appends with a cache_seqlens_tensor and a cache_batch_idx naming one table row "
                    "twice: where its sequences' rows go depends on lengths read on the device; give the lengths "
                    "as a span");
        }
        lengths_placeholder.assign(B, static_cast<std::int32_t>(bound));
        asked.cache_seqlens = lengths_placeholder;
    }
    const tensor::impl* table = nullptr;
    std::span<const std::int32_t> host_table;  // a host table checked on the device (device lengths)
    if (lengths && !t.block_table_tensor) {
        host_table = asked.block_table;
        table_placeholder.assign(host_table.size(), 0);
        asked.block_table = table_placeholder;
    }
    if (t.block_table_tensor) {
        if (!t.block_table.empty())
            throw qkv::invalid_argument(
                "paged_call: a block_table span and a block_table_tensor: give the table one way");
        if (desc.cascade)
            throw qkv::invalid_argument(
                "paged_call: a block_table_tensor with the description's cascade: shared prefixes are found in a "
                "host table, and a device table is not read back; set cascade = false (or give the table as a span)");
        if (desc.new_rows != 0 && cache->blocks())
            throw qkv::invalid_argument(
                "paged_call: a block_table_tensor with appends into a q8_0 / q4_0 pool: give the table as a span");
        const std::size_t B = batch_of(asked), M = std::max<std::size_t>(asked.max_pages, 1);
        const std::size_t given = tensor_access::of(*t.block_table_tensor, "paged_call").elements;
        const std::size_t rows = asked.cache_batch_idx.empty() ? B : std::max<std::size_t>(given / M, 1);
        table = &expect_tensor(*t.block_table_tensor, "paged_call", "block_table", core, {rows, M}, element_type::i32);
        require_usage(*table, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "VK_BUFFER_USAGE_TRANSFER_SRC_BIT", "paged_call",
                      "the block table (copied row by row on the device)");
        if (rows * M * desc.page_size > 0xfffffffeu)
            throw limit_exceeded("paged_call: a block_table_tensor of " + std::to_string(rows) + " x " +
                                 std::to_string(M) + " pages of " + std::to_string(desc.page_size) +
                                 " rows addresses more than 2^32 - 2 keys");
        table_placeholder.assign(rows * M, 0);
        asked.block_table = table_placeholder;
    }
    paged_problem p = cache->check_pool(asked, false);
    if (lengths && !t.block_table_tensor) p.block_table = host_table;  // its entries checked on the device
    const std::uint64_t total_q = total_q_of(p), Hq = p.q_heads;
    const bool ragged = !p.cu_seqlens_q.empty();
    const auto expect = [&](const tensor* x, const char* what, std::vector<std::size_t> shape) {
        if (!x) throw qkv::invalid_argument(std::string("paged_call: no ") + what + " tensor");
        return &expect_tensor(*x, "paged_call", what, core, shape, element_type::f32);
    };
    const tensor::impl* q = expect(t.q, "q",
                                   ragged ? std::vector<std::size_t>{total_q, Hq, p.d_qk}
                                          : std::vector<std::size_t>{batch_of(p), p.q_len, Hq, p.d_qk});
    const tensor::impl* out = expect(t.out, "out",
                                     ragged ? std::vector<std::size_t>{total_q, Hq, p.d_v}
                                            : std::vector<std::size_t>{batch_of(p), p.q_len, Hq, p.d_v});
    const tensor::impl* lse = nullptr;
    if (p.options.return_lse)
        lse = expect(t.lse, "lse", {Hq, total_q});
    else if (t.lse)
        throw qkv::invalid_argument("paged_call: an lse tensor, but the description's options.return_lse is not set");
    const tensor::impl *k_new = nullptr, *v_new = nullptr;
    if (p.new_rows != 0) {
        const std::size_t B = batch_of(p);
        if (!t.k_new || !t.v_new)
            throw qkv::invalid_argument("paged_call: the description appends; no k_new or v_new tensor");
        k_new = &expect_tensor(*t.k_new, "paged_call", "k_new", core, {B, p.new_rows, p.kv_heads, p.d_qk}, cache->type);
        v_new = &expect_tensor(*t.v_new, "paged_call", "v_new", core, {B, p.new_rows, p.kv_heads, p.d_v}, cache->type);
        if (cache->blocks())  // their blocks are copied into the pages by transfer copies
            for (const auto& [x, what] : {std::pair{k_new, "k_new"}, std::pair{v_new, "v_new"}})
                require_usage(*x, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "VK_BUFFER_USAGE_TRANSFER_SRC_BIT", "paged_call",
                              what);
        if (B * p.new_rows * p.kv_heads > 0x7fffffffu)
            throw limit_exceeded("paged_call: " + std::to_string(B * p.new_rows * p.kv_heads) +
                                 " new rows (B x new_rows x kv_heads) are more than the append's 2^31 - 1");
        if (cache->blocks() && B * p.new_rows * p.kv_heads * std::max(p.d_qk, p.d_v) >= (std::uint64_t{1} << 32))
            throw limit_exceeded("paged_call: the new rows' values, read as float32 for the overflow rule, are " +
                                 std::to_string(B * p.new_rows * p.kv_heads * std::max(p.d_qk, p.d_v)) +
                                 " of K or of V, more than 2^32 - 1");
    } else if (t.k_new || t.v_new) {
        throw qkv::invalid_argument("paged_call: k_new or v_new tensors, but the description's new_rows is 0");
    }
    const tensor::impl* ck = !cache->blocks() ? &tensor_access::of(cache->k, "paged_call") : nullptr;
    const tensor::impl* cv = !cache->blocks() ? &tensor_access::of(cache->v, "paged_call") : nullptr;
    refuse_overlap("paged_call", {{q, "q"},
                                  {table, "block_table"},
                                  {lengths, "cache_seqlens"},
                                  {k_new, "k_new"},
                                  {v_new, "v_new"},
                                  {ck, "pool's k", p.new_rows != 0},
                                  {cv, "pool's v", p.new_rows != 0},
                                  {out, "out", true},
                                  {lse, "lse", true}});
    return p;
}

void paged_call::impl::record(recorder& rec, recording::impl& r, const paged_tensors& t) {
    const paged_problem step = check(t);
    const device& dev = *core->dev;
    const bool device_table = t.block_table_tensor != nullptr;
    // Lengths on the device: the plan's are bounds, the device writes each sequence's words from
    // the tensor; the table (either kind) is then checked there, as a device table is.
    const bool device_lengths = t.cache_seqlens_tensor != nullptr;
    const bool on_device = device_table || device_lengths;
    const paged_step planned_now =
        !on_device && !own_batch(t) && planned ? *planned : plan(step, !on_device, device_lengths);
    const paged_layout& l = planned_now.layout;
    // The attention without appends or cache_batch_idx (its table's rows the sequences', its
    // lengths the ones after the append), and where each new row goes.
    const paged_problem& problem = planned_now.resolved->problem;
    const std::vector<std::size_t>& rows_at = planned_now.resolved->rows_at;
    const std::uint64_t n_new = rows_at.size(), Hkv = problem.kv_heads;
    const std::uint64_t total_q = l.total_q, Hq = problem.q_heads;
    const tensor::impl& q = tensor_access::of(*t.q, "paged_call");
    const tensor::impl& out = tensor_access::of(*t.out, "paged_call");

    // check: what the verdict needs; q's norms are per (token, head) row, folded to heads there.
    r.core = core;
    r.checks = true;
    r.shape = l.whole.shape;
    r.scale = problem.options.scale ? *problem.options.scale : default_scale(l.whole.shape);
    r.fp16 = cache->type == element_type::f16;
    r.additive = {};
    r.cache = cache;
    r.q_rows_per_head = total_q;
    r.q_groups = total_q * Hq, r.kv_groups = problem.kv_heads;
    const std::uint64_t verdict_bytes = guard_words::bytes(r.q_groups, r.kv_groups);
    // The device checks' flag words after the verdict (at an offset any storage binding may take).
    const std::uint64_t flag_at = align_up(verdict_bytes, 256);
    const std::uint64_t guard_bytes = on_device ? flag_at + contract::PAGED_FLAG_WORDS * 4 : verdict_bytes;
    core->alloc->ensure(r.guard, guard_bytes, memory_use::readback, "paged_call verdict");
    const binding verdict{r.guard.handle(), 0, verdict_bytes};
    r.table_check = on_device, r.table_flag_at = flag_at, r.table_page_size = problem.page_size;
    // The table, the work words and the score params: host data of this recording, in its scratch,
    // then the new rows' pool rows.
    const std::uint64_t align = 256;
    // With a rotary embedding, the positions of the new keys (B·new_rows) and of q's rows (total_q).
    const bool rotary = step.rotary_dim != 0;
    const std::uint64_t rows_at_at = align_up(l.params_at + l.params_bytes - l.table_at, align);
    // With device lengths, (sequence, position at length 0) pairs the device turns into positions.
    const std::uint64_t pos_words = device_lengths ? 2 : 1;
    const std::uint64_t k_pos_at = align_up(rows_at_at + n_new * 4, align);
    const std::uint64_t q_pos_at = align_up(k_pos_at + n_new * 4 * pos_words, align);
    const std::uint64_t words_bytes = rotary  ? q_pos_at + std::max<std::uint64_t>(total_q, 1) * 4 * pos_words
                                      : n_new ? rows_at_at + n_new * 4
                                              : l.params_at + l.params_bytes - l.table_at;
    // A device table: each sequence's first and end column of the table (the entries it reads or
    // writes), for the device's check.
    const std::uint64_t spans_at = align_up(words_bytes, align), spans_bytes = batch_of(problem) * 8;
    core->alloc->ensure(r.scratch, on_device ? spans_at + spans_bytes : words_bytes, memory_use::upload,
                        "paged_call work list");
    put_paged_words(r.scratch.mapped(), l, problem, l.table_at);
    const auto put_word = [&](std::uint64_t at, std::size_t value) {
        const auto word = static_cast<std::uint32_t>(value);  // a pool row or position, below 2^31
        std::memcpy(r.scratch.mapped() + at, &word, 4);
    };
    // The new rows' keys: pool rows (a host table), keys in the table (a device table), or with
    // device lengths keys at length 0, to which the device adds the sequence's length.
    const std::size_t table_keys = problem.max_pages * problem.page_size;
    for (std::uint64_t i = 0; i < n_new; ++i)
        put_word(rows_at_at + i * 4,
                 device_lengths ? (i / step.new_rows) * table_keys + i % step.new_rows : rows_at[i]);
    if (device_table && !device_lengths) {
        const std::size_t ps = problem.page_size;
        for (std::size_t x = 0; x < batch_of(problem); ++x) {
            const std::size_t end = paged_end_key(problem, x);
            put_word(spans_at + x * 8, end == 0 ? 0 : paged_first_key(problem, x) / ps);
            put_word(spans_at + x * 8 + 4, (end + ps - 1) / ps);
        }
    }
    if (rotary) {
        const std::size_t B = batch_of(step), n = step.new_rows;
        // A position, or with device lengths the pair (sequence, position less its length).
        const auto put_position = [&](std::uint64_t at, std::uint64_t row, std::size_t x, std::size_t i, bool query) {
            const std::size_t position = paged_rotary_position(step, x, i, query);
            if (!device_lengths) return put_word(at + row * 4, position);
            put_word(at + row * 8, x);
            put_word(at + row * 8 + 4, position - static_cast<std::size_t>(step.cache_seqlens[x]));
        };
        for (std::size_t x = 0; x < B; ++x)
            for (std::size_t i = 0; i < n; ++i) put_position(k_pos_at, x * n + i, x, i, false);
        std::uint64_t token = 0;
        for (std::size_t x = 0; x < B; ++x) {
            const std::size_t L = step.cu_seqlens_q.empty()
                                      ? step.q_len
                                      : static_cast<std::size_t>(step.cu_seqlens_q[x + 1] - step.cu_seqlens_q[x]);
            for (std::size_t i = 0; i < L; ++i) put_position(q_pos_at, token++, x, i, true);
        }
    }
    r.scratch.flush();
    const binding angles{constants.handle(), 0, rotary ? constants.size() : 0};
    paged_rotary turn;
    turn.half = cache->half(), turn.interleaved = step.rotary_interleaved;
    turn.rotary_dim = static_cast<std::uint32_t>(step.rotary_dim);
    turn.sin_off = static_cast<std::uint32_t>(rotary_cos.size());
    // The new rows in the pool's texel form per K/V head (Hkv, B·new_rows), after q's texels.
    const bool f16 = cache->half();
    const std::uint64_t tb = f16 ? 8 : 16;
    const std::uint64_t new_k_at = align_up(std::max<std::uint64_t>(l.q_bytes, 16), align);
    const std::uint64_t new_k_bytes = Hkv * n_new * l.plan.e4 * tb;
    const std::uint64_t new_v_at = align_up(new_k_at + new_k_bytes, align);
    const std::uint64_t new_v_bytes = Hkv * n_new * l.plan.ev4 * tb;
    // A q8_0 / q4_0 pool's: the values the new blocks hold as float32 (B·new_rows, Hkv, E / Ev),
    // for the overflow rule, after the texels.
    const bool blocks = cache->blocks();
    const std::uint64_t wide_k_at = align_up(new_v_at + new_v_bytes, align);
    const std::uint64_t wide_v_at = align_up(wide_k_at + n_new * Hkv * problem.d_qk * 4, align);
    const std::uint64_t wide_end = wide_v_at + n_new * Hkv * problem.d_v * 4;
    const std::uint64_t rows_end = blocks ? wide_end : new_v_at + new_v_bytes;
    // A device table's new rows mapped to pool rows on the device, after the new rows, then the
    // sequences' rows of the table.
    const std::uint64_t at_out_at = align_up(rows_end, align);
    const std::uint64_t table_copy_at = align_up(at_out_at + n_new * 4, align);
    // Device lengths: the work words copied where the device writes each sequence's from its length,
    // the spans it writes, the rotary positions it writes (the new keys', then q's).
    const std::uint64_t work_copy_at = align_up(table_copy_at + std::max<std::uint64_t>(l.table_bytes, 4), align);
    const std::uint64_t spans_copy_at = align_up(work_copy_at + l.words_bytes, align);
    const std::uint64_t k_pos_copy_at = align_up(spans_copy_at + spans_bytes, align);
    const std::uint64_t q_pos_copy_at = align_up(k_pos_copy_at + std::max<std::uint64_t>(n_new, 1) * 4, align);
    const std::uint64_t lengths_copy_at = align_up(q_pos_copy_at + std::max<std::uint64_t>(total_q, 1) * 4, align);
    const std::uint64_t lengths_bytes = batch_of(problem) * 4;
    // With appends through a device table or lengths, a claim word per pool row of the step's pages
    // (the device's check that no two new rows write one pool row), after them.
    const bool claim = on_device && n_new != 0;
    const std::uint64_t claims_at = align_up(lengths_copy_at + lengths_bytes, align);
    const std::uint64_t claims_bytes = claim ? (std::uint64_t{step.num_pages} << l.page_shift) * 4 : 0;
    if (claims_bytes > dev.info().max_storage_buffer_range)
        throw limit_exceeded(
            "paged_call: the check of appends through a device table or lengths binds a word per "
            "pool row, " +
            std::to_string(claims_bytes) + " bytes, more than " + dev.info().name + "'s maxStorageBufferRange of " +
            std::to_string(dev.info().max_storage_buffer_range));
    detail::buffer_plan buffers = l.buffers;
    if (n_new) buffers.need(role::inputs, rows_end);
    if (device_table) buffers.need(role::inputs, table_copy_at + std::max<std::uint64_t>(l.table_bytes, 4));
    if (device_lengths) buffers.need(role::inputs, lengths_copy_at + lengths_bytes);
    if (claim) buffers.need(role::inputs, claims_at + claims_bytes);
    paged_pool pool = cache->pool(nullptr);
    if (n_new && !blocks) cache->bind_stores(pool);
    run_session session(*core, rec, r.buffers, buffers);
    const run_buffers& b = r.buffers;
    r.zero_verdict(rec, guard_bytes);  // with the device checks' flag
    // A device table: each sequence's row of it copied into the call's table binding (row b, as
    // the work words name it), when the commands run, then checked (and the new rows mapped) there.
    // Device lengths: the lengths and the work words copied likewise, the words then written from
    // the lengths there.
    const binding table_copy = b.bind(role::inputs, table_copy_at, std::max<std::uint64_t>(l.table_bytes, 4));
    const binding host_table{r.scratch.handle(), 0, std::max<std::uint64_t>(l.table_bytes, 4)};
    const binding host_work{r.scratch.handle(), l.words_at - l.table_at, l.words_bytes};
    const binding work = device_lengths ? b.bind(role::inputs, work_copy_at, l.words_bytes) : host_work;
    const binding lengths_copy = b.bind(role::inputs, lengths_copy_at, lengths_bytes);
    if (on_device) {
        rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                    VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
        if (device_table) {
            const tensor::impl& ti = tensor_access::of(*t.block_table_tensor, "paged_call");
            const std::uint64_t row_bytes = std::uint64_t{problem.max_pages} * 4;
            std::vector<VkBufferCopy> regions;
            for (std::size_t x = 0; x < batch_of(step); ++x)
                regions.push_back(
                    {ti.offset + paged_table_row(step, x) * row_bytes, table_copy.offset + x * row_bytes, row_bytes});
            rec.copy(ti.handle, table_copy.buffer, regions);
        }
        if (device_lengths) {
            rec.copy(host_work.buffer, work.buffer, {{host_work.offset, work.offset, l.words_bytes}});
            const tensor::impl& li = tensor_access::of(*t.cache_seqlens_tensor, "paged_call");
            rec.copy(li.handle, lengths_copy.buffer, {{li.offset, lengths_copy.offset, lengths_bytes}});
        }
        rec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                    VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    }
    binding append_at{r.scratch.handle(), rows_at_at, n_new * 4};
    binding k_positions{r.scratch.handle(), k_pos_at, n_new * 4},
        q_positions{r.scratch.handle(), q_pos_at, total_q * 4};
    if (on_device) {
        const binding flag{r.guard.handle(), flag_at, 4};
        paged_table_bindings checks;
        checks.table = device_table ? table_copy : host_table;
        checks.spans = device_lengths ? b.bind(role::inputs, spans_copy_at, spans_bytes)
                                      : binding{r.scratch.handle(), spans_at, spans_bytes};
        checks.flag = flag;
        checks.at_in = n_new ? append_at : checks.spans;  // the new rows' keys in the table (host words)
        if (n_new) append_at = b.bind(role::inputs, at_out_at, n_new * 4);
        checks.at_out = n_new ? append_at : flag;
        checks.lengths = checks.work = flag;  // bound, unread
        paged_table_check c;
        c.sequences = static_cast<std::uint32_t>(batch_of(problem));
        c.max_pages = static_cast<std::uint32_t>(problem.max_pages);
        c.page_shift = l.page_shift;
        c.num_pages = static_cast<std::uint32_t>(step.num_pages);
        c.n = static_cast<std::uint32_t>(n_new);
        if (device_lengths) {
            checks.lengths = lengths_copy, checks.work = work;
            c.device_lengths = true;
            c.new_rows = static_cast<std::uint32_t>(step.new_rows);
            c.bottom_right = !step.options.position_offset && step.options.alignment == causal_alignment::bottom_right;
        }
        record_paged_table(rec, *core->pipes, checks, c);
        if (claim)  // two new rows into one pool row: flagged, and then no row mapped
            record_paged_claim(rec, *core->pipes, append_at, b.bind(role::inputs, claims_at, claims_bytes),
                               {r.guard.handle(), flag_at, contract::PAGED_FLAG_WORDS * 4}, c.n);
        if (device_lengths && rotary) {  // the positions at the device lengths, after the lengths' check
            paged_table_bindings pos = checks;
            pos.at_in = {r.scratch.handle(), k_pos_at, n_new * 8};
            pos.at_out = k_positions = b.bind(role::inputs, k_pos_copy_at, n_new * 4);
            record_paged_positions(rec, *core->pipes, pos, static_cast<std::uint32_t>(n_new));
            pos.at_in = {r.scratch.handle(), q_pos_at, total_q * 8};
            pos.at_out = q_positions = b.bind(role::inputs, q_pos_copy_at, total_q * 4);
            record_paged_positions(rec, *core->pipes, pos, static_cast<std::uint32_t>(total_q));
        }
    }
    if (n_new) {
        // Append, then attend. The new rows packed per K/V head into texels, their facts folded into
        // the pool's statistics (the overflow rule, V's gate word), then written to their rows.
        const binding k_rows = b.bind(role::inputs, new_k_at, new_k_bytes);
        const binding v_rows = b.bind(role::inputs, new_v_at, new_v_bytes);
        const binding stats_all{cache->stats.handle(), 0, cache->stats.size()};
        const tensor::impl& k_in = tensor_access::of(*t.k_new, "paged_call");
        const tensor::impl& v_in = tensor_access::of(*t.v_new, "paged_call");
        tensor::impl::bound kb = k_in.bind(), vb = v_in.bind();
        if (blocks) {  // the values the blocks hold, as float32 (exactly qkv::dequantize's), then as floats are
            const std::uint64_t k_count = n_new * Hkv * problem.d_qk, v_count = n_new * Hkv * problem.d_v;
            const binding k_wide = b.bind(role::inputs, wide_k_at, k_count * 4);
            const binding v_wide = b.bind(role::inputs, wide_v_at, v_count * 4);
            record_tensor_widen(rec, *core->pipes, kb.b, kb.byte, cache->type, k_wide, 0, n_new * Hkv, problem.d_qk);
            record_tensor_widen(rec, *core->pipes, vb.b, vb.byte, cache->type, v_wide, 0, n_new * Hkv, problem.d_v);
            kb = {k_wide, 0, 0}, vb = {v_wide, 0, 0};
            rec.compute_barrier();
        }
        for (const auto& [src, dst, width, texels] :
             {std::tuple{kb, k_rows, problem.d_qk, l.plan.e4}, std::tuple{vb, v_rows, problem.d_v, l.plan.ev4}}) {
            texel_pack tp;  // (B·new_rows, Hkv, width) as Hkv groups of B·new_rows rows
            tp.groups = static_cast<std::uint32_t>(Hkv);
            tp.rows = static_cast<std::uint32_t>(n_new);
            tp.width = static_cast<std::uint32_t>(width), tp.w4 = texels;
            tp.src_off = src.element, tp.at = 0, tp.stride = tp.rows;
            tp.group_stride = tp.width, tp.row_stride = static_cast<std::uint32_t>(Hkv * width);
            tp.half = f16, tp.texels_half = f16;
            record_texel_pack(rec, *core->pipes, src.b, dst, b.bind(role::partial_stats, 0, 16), tp);
        }
        rec.compute_barrier();
        if (rotary) {  // the new keys turned at their positions, per K/V head: row h·(B·n) + x is key x
            paged_rotary k_turn = turn;
            k_turn.rows = static_cast<std::uint32_t>(Hkv * n_new), k_turn.w4 = l.plan.e4;
            k_turn.pos_mod = static_cast<std::uint32_t>(n_new);
            record_paged_rotary(rec, *core->pipes, k_rows, angles, k_positions, k_turn);
            rec.compute_barrier();
        }
        guard_rows g;
        g.q_rows = 0;
        g.k_rows = static_cast<std::uint32_t>(Hkv * n_new);
        g.q_len = 1, g.kv_len = static_cast<std::uint32_t>(n_new);
        g.d = l.plan.e4 * 4, g.dv = l.plan.ev4 * 4;  // whole texels: the padding is zeros
        g.half = f16;
        record_guard_rows(rec, *core->pipes, k_rows, k_rows, v_rows, stats_all, g);
        if (blocks) {  // the blocks as they are, row (x, i, h) of the tensor to pool row rows_at[x·n + i] of head h
            const std::uint64_t kr = cache->k_row_bytes, vr = cache->v_row_bytes;
            record_block_append(rec, {k_in.handle, k_in.offset, kr, Hkv * kr}, {v_in.handle, v_in.offset, vr, Hkv * vr},
                                pool, Hkv, kr, vr, rows_at);
        } else {
            record_paged_append(rec, *core->pipes, dev, pool, Hkv, n_new, l.plan.e4, l.plan.ev4, k_rows, v_rows,
                                append_at);
        }
        rec.compute_barrier();
    }
    if (total_q == 0) {  // no query rows (no tensor has none: not reached past check): nothing to do
        r.checks = false;
        return;
    }

    // write: q's rows (token, head) as texel rows into the inputs
    const tensor::impl::bound qb = q.bind();
    texel_pack tp;
    tp.groups = 1, tp.rows = static_cast<std::uint32_t>(total_q * Hq);
    tp.width = static_cast<std::uint32_t>(problem.d_qk), tp.w4 = l.plan.e4;
    tp.src_off = qb.element, tp.at = 0, tp.stride = tp.rows;
    record_texel_pack(rec, *core->pipes, qb.b, b.bind(role::inputs, 0, l.q_bytes), b.bind(role::partial_stats, 0, 16),
                      tp);
    rec.compute_barrier();
    if (rotary) {  // q's rows (token, head) turned at their token's position
        paged_rotary q_turn = turn;
        q_turn.half = false;  // q's texels are RGBA32F
        q_turn.rows = tp.rows, q_turn.w4 = l.plan.e4;
        q_turn.pos_div = static_cast<std::uint32_t>(Hq), q_turn.pos_mod = static_cast<std::uint32_t>(total_q);
        record_paged_rotary(rec, *core->pipes, b.bind(role::inputs, 0, l.q_bytes), angles, q_positions, q_turn);
        rec.compute_barrier();
    }

    // record: the paged kernels, as the host call records them. V's finiteness as for an sdpa_call
    // over a cache: the host's where no append is pending, else the pool's gate word.
    const bool finite = n_new == 0 && cache->pending_in == nullptr && cache->rows_finite();
    r.read_finite = finite;
    r.views.emplace_back(dev, b[role::inputs], texel_format(false), 0, l.q_bytes);
    paged_bindings pb;
    pb.q = texel(r.views.back().handle());
    pb.table = device_table ? table_copy : host_table;
    pb.work = work;
    pb.params = {r.scratch.handle(), l.params_at - l.table_at, l.params_bytes};
    pb.gate = {cache->stats.handle(), 0, 16};  // after this call's own append, where it has one
    pb.stats = b.bind(role::partial_stats, 0, std::max<std::uint64_t>(l.plan.stats_bytes(), 16));
    pb.acc = b.bind(role::partial_acc, 0, std::max<std::uint64_t>(l.plan.acc_bytes(), 16));
    pb.out = b.bind(role::out, 0, l.out_bytes);
    pb.lse = l.lse_bytes ? b.bind(role::out, l.lse_at, l.lse_bytes) : pb.out;
    record_paged(rec, *core->pipes, l, problem, pool, pb, r.scale, 1.0f,
                 finite ? contract::DECODE_VALUES_FINITE : contract::DECODE_VALUES_GATED);
    rec.compute_barrier();

    // read: out (and lse) into the caller's tensors; then the check's passes over q and the output
    const tensor::impl::bound ob = out.bind();
    const auto out_count = static_cast<std::uint32_t>(l.out_bytes / 4);
    record_tensor_copy(rec, *core->pipes, pb.out, 0, ob.b, ob.element, out_count, false);
    if (l.lse_bytes) {
        const tensor::impl::bound lb = tensor_access::of(*t.lse, "paged_call").bind();
        record_tensor_copy(rec, *core->pipes, pb.lse, 0, lb.b, lb.element, static_cast<std::uint32_t>(l.lse_bytes / 4),
                           false);
    }
    // The copies' writes before the guard binds q: a caller's tensors may share the bound window.
    rec.compute_barrier();
    guard_rows g;
    g.q_rows = tp.rows, g.q_len = 1, g.kv_len = 1;
    g.d = static_cast<std::uint32_t>(problem.d_qk), g.dv = static_cast<std::uint32_t>(problem.d_v);
    g.q_off = qb.element;
    binding q_read = qb.b;
    if (rotary) {  // the norms of q as the decode read it: turned (the tables may scale), in texels
        q_read = b.bind(role::inputs, 0, l.q_bytes);
        g.d = l.plan.e4 * 4, g.q_off = 0;  // whole texels: the padding is zeros
    }
    const guard_output result_check{pb.out, 0, out_count};
    record_guard(rec, *core->pipes, q_read, q_read, q_read, verdict, &g, &result_check);
    r.verdict_to_host(rec);
}

void paged_call::run(const paged_tensors& tensors) {
    run_call(paged_call_access::of(*this), tensors, "paged_call::run");
}

}  // namespace qkv::vulkan
