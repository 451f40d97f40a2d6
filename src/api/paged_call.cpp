// qkv::vulkan::paged_call: the batched decode against a paged K/V pool, over device tensors. The
// same plan, work words and kernels as context::sdpa(paged_problem, kv_cache) (run/run_paged.cpp:
// plan_paged_call, put_paged_words, record_paged); what differs is the write step (q packed from
// the caller's tensor into texels on the device, the table and the work words written by the host
// into the recording's own memory when it is recorded) and the check (q's norms by the overflow
// rule's device pass, read afterwards, as an sdpa_call over a cache does).
#include "qkv/vulkan/paged_call.hpp"

#include <cstring>
#include <mutex>
#include <string>
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

/// The step as a paged problem: the description's shapes and options with the tensors' batch (or
/// the description's own).
paged_problem step_of(const paged_problem& desc, const paged_tensors& t) {
    paged_problem p = desc;
    if (!t.block_table.empty() || !t.cache_seqlens.empty() || !t.cu_seqlens_q.empty()) {
        p.block_table = t.block_table;
        p.cache_seqlens = t.cache_seqlens;
        p.cu_seqlens_q = t.cu_seqlens_q;
    }
    if (p.cache_seqlens.empty())
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
    if (description.new_rows != 0 || description.rotary_dim != 0 || !description.cache_batch_idx.empty() ||
        !description.cache_leftpad.empty())
        throw qkv::invalid_argument(
            "paged_call: appends (new_rows), rotary embedding, cache_batch_idx and cache_leftpad are not taken over "
            "tensors yet; context::sdpa(problem, pool) takes them (or append with sequence::record_append)");
    c.desc = description;
    c.block_table.assign(description.block_table.begin(), description.block_table.end());
    c.cache_seqlens.assign(description.cache_seqlens.begin(), description.cache_seqlens.end());
    c.cu_seqlens_q.assign(description.cu_seqlens_q.begin(), description.cu_seqlens_q.end());
    c.sinks.assign(description.sinks.begin(), description.sinks.end());
    c.alibi_slopes.assign(description.alibi_slopes.begin(), description.alibi_slopes.end());
    c.desc.block_table = c.block_table, c.desc.cache_seqlens = c.cache_seqlens, c.desc.cu_seqlens_q = c.cu_seqlens_q;
    c.desc.sinks = c.sinks, c.desc.alibi_slopes = c.alibi_slopes;
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    if (c.cache_seqlens.empty()) {
        // No step yet: the shapes and options alone, as for a batch of one empty sequence.
        paged_problem p = c.desc;
        const std::vector<std::int32_t> table(p.max_pages, 0), none{0}, rows{0, 0};
        p.block_table = table, p.cache_seqlens = none, p.num_pages = 1;
        if (!p.cu_seqlens_q.empty()) p.cu_seqlens_q = rows;
        validate_without_data(p);
        return;
    }
    // The description's step: checked against the pool now, planned once, its pipelines built.
    const paged_problem step = c.cache->check_pool(c.desc, false);
    c.planned =
        plan_paged_call(*c.core->dev, c.set, step, static_cast<std::uint32_t>(c.cache->layout.capacity), c.cache->type);
    const std::uint64_t total_q = c.planned->total_q;
    const auto Hq = step.q_heads;
    tensor q = c.desc.cu_seqlens_q.empty()
                   ? stand_in(c.core, {batch_of(step), step.q_len, Hq, step.d_qk}, element_type::f32)
                   : stand_in(c.core, {total_q, Hq, step.d_qk}, element_type::f32);
    tensor out = c.desc.cu_seqlens_q.empty()
                     ? stand_in(c.core, {batch_of(step), step.q_len, Hq, step.d_v}, element_type::f32)
                     : stand_in(c.core, {total_q, Hq, step.d_v}, element_type::f32);
    tensor lse;
    paged_tensors t{.q = &q, .out = &out};
    if (step.options.return_lse) lse = stand_in(c.core, {Hq, total_q}, element_type::f32), t.lse = &lse;
    build_pipelines(c, t);
}

paged_call::~paged_call() = default;
paged_call::paged_call(paged_call&&) noexcept = default;
paged_call& paged_call::operator=(paged_call&&) noexcept = default;

paged_problem paged_call::impl::check(const paged_tensors& t) const {
    // The one check of a batch against the pool, with the pages it holds now.
    const paged_problem p = cache->check_pool(step_of(desc, t), false);
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
    const tensor::impl* ck = !cache->blocks() ? &tensor_access::of(cache->k, "paged_call") : nullptr;
    const tensor::impl* cv = !cache->blocks() ? &tensor_access::of(cache->v, "paged_call") : nullptr;
    refuse_overlap("paged_call",
                   {{q, "q"}, {ck, "pool's k"}, {cv, "pool's v"}, {out, "out", true}, {lse, "lse", true}});
    return p;
}

void paged_call::impl::record(recorder& rec, recording::impl& r, const paged_tensors& t) {
    const paged_problem problem = check(t);
    const device& dev = *core->dev;
    const bool own_step = t.block_table.empty() && t.cache_seqlens.empty() && t.cu_seqlens_q.empty();
    const paged_layout l =
        own_step && planned
            ? *planned
            : plan_paged_call(dev, set, problem, static_cast<std::uint32_t>(cache->layout.capacity), cache->type);
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
    core->alloc->ensure(r.guard, verdict_bytes, memory_use::readback, "paged_call verdict");
    const binding verdict{r.guard.handle(), 0, verdict_bytes};
    // The table, the work words and the score params: host data of this recording, in its scratch.
    const std::uint64_t words_bytes = l.params_at + l.params_bytes - l.table_at;
    core->alloc->ensure(r.scratch, words_bytes, memory_use::upload, "paged_call work list");
    put_paged_words(r.scratch.mapped(), l, problem, l.table_at);
    r.scratch.flush();
    run_session session(*core, rec, r.buffers, l.buffers);
    const run_buffers& b = r.buffers;
    const bool qkv_submits = !r.rec;
    if (qkv_submits) {
        std::memset(r.guard.mapped(), 0, verdict.range);
        r.guard.flush();
    } else {
        rec.fill(r.guard.handle(), 0, verdict.range, 0);
    }
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_UNIFORM_READ_BIT);
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

    // record: the paged kernels, as the host call records them. V's finiteness as for an sdpa_call
    // over a cache: the host's where no append is pending, else the pool's gate word.
    const bool finite = cache->pending_in == nullptr && cache->rows_finite();
    r.read_finite = finite;
    r.views.emplace_back(dev, b[role::inputs], texel_format(false), 0, l.q_bytes);
    paged_bindings pb;
    pb.q = texel(r.views.back().handle());
    pb.table = {r.scratch.handle(), 0, std::max<std::uint64_t>(l.table_bytes, 4)};
    pb.work = {r.scratch.handle(), l.words_at - l.table_at, l.words_bytes};
    pb.params = {r.scratch.handle(), l.params_at - l.table_at, l.params_bytes};
    pb.gate = {cache->stats.handle(), 0, 16};
    pb.stats = b.bind(role::partial_stats, 0, std::max<std::uint64_t>(l.plan.stats_bytes(), 16));
    pb.acc = b.bind(role::partial_acc, 0, std::max<std::uint64_t>(l.plan.acc_bytes(), 16));
    pb.out = b.bind(role::out, 0, l.out_bytes);
    pb.lse = l.lse_bytes ? b.bind(role::out, l.lse_at, l.lse_bytes) : pb.out;
    record_paged(rec, *core->pipes, l, problem, cache->pool(nullptr), pb, r.scale, 1.0f,
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
    const guard_output result_check{pb.out, 0, out_count};
    record_guard(rec, *core->pipes, qb.b, qb.b, qb.b, verdict, &g, &result_check);
    if (!qkv_submits)
        rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                    VK_ACCESS_HOST_READ_BIT);
}

void paged_call::run(const paged_tensors& tensors) {
    if (!impl_) throw qkv::error("qkv::vulkan::paged_call used after move");
    run_call(*impl_, tensors, "paged_call::run");
}

}  // namespace qkv::vulkan
