// qkv::vulkan::sdpa_call: scaled dot-product attention planned once and run, or recorded into a
// caller's command buffer (interop.cpp), many times over device tensors. The same plans and record
// steps as context::sdpa (run/run.hpp); what differs is the write step (compute copies of the
// caller's tensors into the call's inputs, instead of host packing), the masks (the plan's own
// constants, uploaded once), and the check (the overflow rule's device pass, read afterwards).
#include "qkv/vulkan/sdpa_call.hpp"
#include "qkv/vulkan/sequence.hpp"

#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "api/context_impl.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/recording_impl.hpp"
#include "api/sdpa_call_impl.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/tensor_ops.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/kv_layout.hpp"
#include "qkv/vulkan/interop.hpp"
#include "run/io.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan {

using namespace detail;

namespace {

/// The tensors of a problem of `shape`: present where the call needs them (q, out; k and v without
/// a cache; lse and weights where the options return them), of the right element counts and types.
void check_tensors(const sdpa_call::impl& c, const sdpa_shape& s, const sdpa_tensors& t) {
    const auto expect = [&](const tensor* x, const char* what, std::vector<std::size_t> shape, element_type want) {
        if (!x) throw qkv::invalid_argument(std::string("sdpa_call: no ") + what + " tensor");
        return &expect_tensor(*x, "sdpa_call", what, c.core, shape, want);
    };
    const sdpa_options& o = c.desc.options;
    const tensor::impl* q = expect(t.q, "q", {s.batch, s.q_heads, s.q_len, s.d_qk}, c.q_type());
    const tensor::impl *k = nullptr, *v = nullptr;
    if (!c.cache) {
        k = expect(t.k, "k", {s.batch, s.kv_heads, s.kv_len, s.d_qk}, c.kv_type());
        v = expect(t.v, "v", {s.batch, s.kv_heads, s.kv_len, s.d_v}, c.kv_type());
    } else if (t.k || t.v) {
        throw qkv::invalid_argument("sdpa_call: k and v come from the kv_cache; leave them null");
    }
    const tensor::impl* out = expect(t.out, "out", {s.batch, s.q_heads, s.q_len, s.d_v}, element_type::f32);
    const auto optional = [&](const tensor* x, bool asked, const char* what, const char* option,
                              std::vector<std::size_t> shape) -> const tensor::impl* {
        if (asked) return expect(x, what, std::move(shape), element_type::f32);
        if (x)
            throw qkv::invalid_argument(std::string("sdpa_call: an ") + what + " tensor, but the description's " +
                                        option + " is not set");
        return nullptr;
    };
    const tensor::impl* lse = optional(t.lse, o.return_lse, "lse", "options.return_lse", {s.batch, s.q_heads, s.q_len});
    const tensor::impl* weights = optional(t.weights, o.return_weights, "weights", "options.return_weights",
                                           {s.batch, s.q_heads, s.q_len, s.kv_len});
    // A cache's storage is read too (f32 / f16 caches: tensors, perhaps in the caller's buffer).
    const tensor::impl* ck = c.cache && !c.cache->blocks() ? &tensor_access::of(c.cache->k, "sdpa_call") : nullptr;
    const tensor::impl* cv = c.cache && !c.cache->blocks() ? &tensor_access::of(c.cache->v, "sdpa_call") : nullptr;
    refuse_overlap("sdpa_call", {{q, "q"},
                                 {k, "k"},
                                 {v, "v"},
                                 {ck, "cache's k"},
                                 {cv, "cache's v"},
                                 {out, "out", true},
                                 {lse, "lse", true},
                                 {weights, "weights", true}});
}

}  // namespace

sdpa_call::sdpa_call(context& ctx, const sdpa_problem& description) : sdpa_call(ctx, description, nullptr) {}

sdpa_call::sdpa_call(context& ctx, const sdpa_problem& description, kv_cache& cache)
    : sdpa_call(ctx, description, &cache) {}

sdpa_call::sdpa_call(context& ctx, const sdpa_problem& description, kv_cache* cache) : impl_(std::make_unique<impl>()) {
    impl& c = *impl_;
    context::impl& owner = context_access::of(ctx);
    c.core = owner.core;
    c.set = owner.set;
    c.desc = description;
    if (!description.q.empty() || !description.k.empty() || !description.v.empty())
        throw qkv::invalid_argument(
            "sdpa_call: the description's q, k and v spans must be empty (the data comes as tensors)");
    c.mask.assign(description.mask.begin(), description.mask.end());
    c.additive.assign(description.additive_mask.begin(), description.additive_mask.end());
    c.desc.mask = c.mask, c.desc.additive_mask = c.additive;
    c.mask_facts = scan_additive(c.additive);
    if (cache) {
        c.cache = kv_cache_access::of(*cache);
        if (c.cache->core != c.core)
            throw qkv::invalid_argument("sdpa_call: the cache was created from another context");
        const sdpa_shape& s = c.desc.shape;
        check_cache_fit(s, c.desc.options, c.cache->layout, "sdpa_call");
        if (s.kv_len == 0 && (!c.mask.empty() || !c.additive.empty()))
            throw qkv::invalid_argument(
                "sdpa_call: masks need a fixed kv_len; with kv_len 0 (the cache's size at each call) use causal");
        std::vector<feature> asked = features_of(c.desc);
        for (const feature f : features_of(c.cache->type)) asked.push_back(f);
        require_supported(entry_point::sdpa_call_decode, asked);
        sdpa_problem p = c.desc;
        if (p.shape.kv_len == 0) p.shape.kv_len = 1;  // validated as for one key: the masks are checked above
        validate_description(p);
    } else {
        require_supported(entry_point::sdpa_call, c.desc);
        validate_description(c.desc);
    }
    c.sinks.assign(description.sinks.begin(), description.sinks.end());
    c.desc.sinks = c.sinks;
    c.alibi_slopes.assign(description.alibi_slopes.begin(), description.alibi_slopes.end());
    c.desc.alibi_slopes = c.alibi_slopes;
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    const device_desc& dd = c.core->dev->desc();
    if (!cache) {
        // Quantized K and V are read as the float32 values their blocks hold (tensor_widen.comp,
        // exactly qkv::dequantize's): the call is planned over those.
        sdpa_problem planned = c.desc;
        if (is_quantized(c.kv_type())) planned.options.kv_type = element_type::f32;
        c.plan = plan_sdpa(planned, dd, c.set);
        if (c.widen()) {
            const sdpa_shape& s = c.desc.shape;
            const std::uint64_t align = dd.storage_alignment / 4;  // in floats
            c.widened_k = align_up(c.q_type() == element_type::f32 ? 0 : s.batch * s.q_heads * s.q_len * s.d_qk, align);
            c.widened_v = align_up(
                c.widened_k + (c.kv_type() == element_type::f32 ? 0 : s.batch * s.kv_heads * s.kv_len * s.d_qk), align);
            const std::uint64_t end =
                c.widened_v + (c.kv_type() == element_type::f32 ? 0 : s.batch * s.kv_heads * s.kv_len * s.d_v);
            c.plan.buffers.need(role::widened, end * 4);
        }
    }
    // The masks and the score params, once: bits, the additive entries, the params, each at the
    // storage alignment.
    const std::uint64_t bits_bytes = c.mask.empty() ? 0 : mask_bits_bytes(c.mask.size());
    const std::uint64_t add_at = align_up(bits_bytes, dd.storage_alignment), add_bytes = c.additive.size() * 4;
    const std::uint64_t params_at = align_up(add_at + add_bytes, dd.storage_alignment);
    const std::uint64_t params_bytes = score_params_bytes(c.desc.shape);
    c.constants = c.core->alloc->create(params_at + params_bytes, memory_use::upload, "sdpa_call masks and params");
    if (bits_bytes) put_mask_bits(c.constants.mapped(), c.mask);
    if (add_bytes) put_floats(c.constants.mapped() + add_at, c.additive);
    put_score_params(c.constants.mapped() + params_at, c.desc, score_features(c.desc));
    c.constants.flush();
    if (bits_bytes) c.masks.bits = {c.constants.handle(), 0, bits_bytes};
    if (add_bytes) c.masks.additive = {c.constants.handle(), add_at, add_bytes};
    c.masks.params = {c.constants.handle(), params_at, params_bytes};
    // The pipelines, now. Against a cache, those of the rows it holds now (none held: at the first
    // record, as the kernels depend on them).
    if (c.cache && c.cache->size == 0) return;
    const sdpa_shape& s = c.cache ? c.current().shape : c.desc.shape;
    const element_type f32 = element_type::f32;
    tensor q = stand_in(c.core, {s.batch, s.q_heads, s.q_len, s.d_qk}, c.q_type());
    tensor out = stand_in(c.core, {s.batch, s.q_heads, s.q_len, s.d_v}, f32), k, v, lse, weights;
    sdpa_tensors t{.q = &q, .out = &out};
    if (!c.cache) {
        k = stand_in(c.core, {s.batch, s.kv_heads, s.kv_len, s.d_qk}, c.kv_type());
        v = stand_in(c.core, {s.batch, s.kv_heads, s.kv_len, s.d_v}, c.kv_type());
        t.k = &k, t.v = &v;
    }
    if (c.desc.options.return_lse) lse = stand_in(c.core, {s.batch, s.q_heads, s.q_len}, f32), t.lse = &lse;
    if (c.desc.options.return_weights)
        weights = stand_in(c.core, {s.batch, s.q_heads, s.q_len, s.kv_len}, f32), t.weights = &weights;
    if (!c.cache) {
        build_pipelines(c, t);
        return;
    }
    // Over a cache, both decode kernels a record may take: for finite values, and gated.
    for (const decode_values values : {decode_values::finite, decode_values::gated}) {
        c.planning = values;
        build_pipelines(c, t);
    }
    c.planning.reset();
}

sdpa_call::~sdpa_call() = default;
sdpa_call::sdpa_call(sdpa_call&&) noexcept = default;
sdpa_call& sdpa_call::operator=(sdpa_call&&) noexcept = default;

kernel_family sdpa_call::kernel() const {
    if (!impl_) throw qkv::error("qkv::vulkan::sdpa_call used after move");
    if (!impl_->cache) return impl_->plan.kernel();
    std::lock_guard lock(impl_->core->mutex);
    return plan_sdpa_cache(impl_->current(), impl_->cache->desc(), impl_->core->dev->desc(), impl_->set).kernel();
}

sdpa_problem sdpa_call::impl::check(const sdpa_tensors& t) const {
    // Against a cache, the one check of a call against it, with the rows it holds now.
    sdpa_problem problem = cache ? check_against_cache(desc, cache->layout, cache->size, "sdpa_call", true) : desc;
    check_tensors(*this, problem.shape, t);
    return problem;
}

void sdpa_call::impl::record(recorder& rec, recording::impl& r, const sdpa_tensors& t) {
    const sdpa_problem problem = check(t);
    const sdpa_shape& s = problem.shape;
    const device_desc& dd = core->dev->desc();
    const sdpa_plan p = cache ? plan_sdpa_cache(problem, cache->desc(), dd, set) : plan;
    const tensor::impl& q = tensor_access::of(*t.q, "sdpa_call");
    const tensor::impl& out = tensor_access::of(*t.out, "sdpa_call");
    const tensor::impl::bound ob = out.bind();

    r.core = core;
    r.checks = true;
    r.shape = s;
    r.scale = p.scale;
    r.fp16 = p.q_fp16 || p.kv_fp16;
    r.additive = mask_facts;
    r.cache = cache;
    run_session session(*core, rec, r.buffers, p.buffers);
    pipeline_set& pipes = *core->pipes;
    const run_buffers& b = r.buffers;
    const buffer& inputs = b[role::inputs];
    const std::size_t q_groups = s.batch * s.q_heads, kv_groups = s.batch * s.kv_heads;

    // check: the overflow rule's device pass (below) writes into verdict words zeroed first.
    r.q_groups = q_groups, r.kv_groups = kv_groups;
    core->alloc->ensure(r.guard, guard_words::bytes(q_groups, kv_groups), memory_use::readback, "sdpa_call verdict");
    const binding verdict{r.guard.handle(), 0, guard_words::bytes(q_groups, kv_groups)};
    r.zero_verdict(rec, verdict.range);
    // read: the tensors as the kernels take them: in place where q, k and v share a type (f32, or
    // f16), else (widen()) each float16 or quantized one first as float32 into role::widened.
    tensor::impl::bound qb = q.bind(), kb = qb, vb = qb;
    if (!cache) {
        kb = tensor_access::of(*t.k, "sdpa_call").bind();
        vb = tensor_access::of(*t.v, "sdpa_call").bind();
    }
    const bool widened = widen();
    bool half = q_type() == element_type::f16;  // the tensors as read are float16
    if (widened) {
        const binding to = b.bind(role::widened, 0, p.buffers.of(role::widened));
        const auto widen_one = [&](tensor::impl::bound& x, element_type type, std::uint64_t at, std::size_t rows,
                                   std::size_t cols) {
            if (type == element_type::f32) return;
            record_tensor_widen(rec, pipes, x.b, x.byte, type, to, at, rows, cols);
            x = {to, static_cast<std::uint32_t>(at), at * 4};
        };
        widen_one(qb, q_type(), 0, q_groups * s.q_len, s.d_qk);
        widen_one(kb, kv_type(), widened_k, kv_groups * s.kv_len, s.d_qk);
        widen_one(vb, kv_type(), widened_v, kv_groups * s.kv_len, s.d_v);
        half = false;
        rec.compute_barrier();
    }
    const std::uint32_t eb = half ? 2 : 4;

    const device& dev = *core->dev;
    const decode_plan& d = p.decode;
    // The decode route reads a q that qkv allocated in place (a texel view of it: rows of whole
    // texels, the plan's element type, an offset the device accepts for a view; a caller's buffer
    // may lack the texel usage, so a wrapped q is packed), and writes the output straight into
    // `out` where its offset is one a storage binding accepts. Otherwise they go through the
    // call's own buffers, as the fused route's always do.
    const bool q_direct = !p.fused() && !q.wrapped && qb.b.buffer == q.handle && std::uint64_t{d.e4} * 4 == s.d_qk &&
                          half == p.q_fp16 && q.offset % dd.texel_alignment == 0;
    const bool out_direct = !p.fused() && ob.element == 0 && d.out_bytes() == out.bytes;

    // check: the overflow rule's device pass over the tensors as read (a cache's rows: its
    // statistics), into the zeroed verdict words.
    guard_rows g;
    g.q_rows = static_cast<std::uint32_t>(q_groups * s.q_len);
    g.q_len = static_cast<std::uint32_t>(s.q_len);
    g.kv_len = static_cast<std::uint32_t>(s.kv_len);
    g.d = static_cast<std::uint32_t>(s.d_qk), g.dv = static_cast<std::uint32_t>(s.d_v);
    g.q_off = qb.element;
    g.half = half;
    if (!cache) {
        g.k_rows = static_cast<std::uint32_t>(kv_groups * s.kv_len);
        g.k_off = kb.element, g.v_off = vb.element;
    }
    // The rows pass goes first only where a kernel reads its flags (a decode over the caller's V
    // gates on them); otherwise it joins the output pass after the kernels: in the merge's
    // dispatch on the decode route, in one guard dispatch on the fused route.
    const bool rows_first = !p.fused() && !cache;
    if (rows_first) record_guard_rows(rec, pipes, qb.b, kb.b, vb.b, verdict, g);

    // write: the tensors into the call's inputs, as the plan lays them out
    bool wrote = rows_first;
    if (p.fused()) {
        record_tensor_copy(rec, pipes, qb.b, qb.element, b.bind(role::inputs, 0, inputs.size()),
                           static_cast<std::uint32_t>(p.q.at / eb), static_cast<std::uint32_t>(p.q.bytes / eb), half);
        record_tensor_copy(rec, pipes, kb.b, kb.element, b.bind(role::inputs, 0, inputs.size()),
                           static_cast<std::uint32_t>(p.k.at / eb), static_cast<std::uint32_t>(p.k.bytes / eb), half);
        record_tensor_copy(rec, pipes, vb.b, vb.element, b.bind(role::inputs, 0, inputs.size()),
                           static_cast<std::uint32_t>(p.v.at / eb), static_cast<std::uint32_t>(p.v.bytes / eb), half);
        wrote = true;
    } else {
        const auto pack = [&](const tensor::impl::bound& src, const region& at, std::uint32_t groups,
                              std::uint32_t rows, std::uint64_t width, std::uint32_t w4, bool texels_half) {
            texel_pack tp;
            tp.groups = groups, tp.rows = rows, tp.width = static_cast<std::uint32_t>(width), tp.w4 = w4;
            tp.src_off = src.element;
            tp.at = static_cast<std::uint32_t>(at.at / (texels_half ? 8 : 16));
            tp.stride = rows;
            tp.half = half;
            tp.texels_half = texels_half;
            record_texel_pack(rec, pipes, src.b, b.bind(role::inputs, 0, inputs.size()),
                              b.bind(role::partial_stats, 0, 16), tp);
            wrote = true;
        };
        // q: row z·R + r of the groups is exactly q's row (GQA heads of a K/V head are consecutive).
        if (!q_direct) pack(qb, p.q, d.groups, d.rows, s.d_qk, d.e4, p.q_fp16);
        if (!cache) {
            pack(kb, p.k, d.groups, d.kv_len, s.d_qk, d.e4, p.kv_fp16);
            pack(vb, p.v, d.groups, d.kv_len, s.d_v, d.ev4, p.kv_fp16);
        }
    }
    if (wrote) rec.compute_barrier();

    // record: the route's kernels, as context::sdpa records them
    const mask_bindings& m = masks;
    if (p.fused()) {
        record_fused_sdpa(session, p, m, r.flash_views);
    } else {
        if (q_direct)
            r.views.emplace_back(dev, q.handle, texel_format(p.q_fp16), q.offset, p.q.bytes);
        else
            r.views.emplace_back(dev, inputs, texel_format(p.q_fp16), p.q.at, p.q.bytes);
        VkBufferView kv = VK_NULL_HANDLE, vv = VK_NULL_HANDLE;
        binding k_blocks{}, v_blocks{};
        if (cache && cache->blocks()) {
            k_blocks = {cache->k_blocks.handle(), 0, cache->k_blocks.size()};
            v_blocks = {cache->v_blocks.handle(), 0, cache->v_blocks.size()};
        } else if (cache) {
            kv = cache->k_view.handle(), vv = cache->v_view.handle();
        } else {
            r.views.emplace_back(dev, inputs, texel_format(p.kv_fp16), p.k.at, p.k.bytes);
            r.views.emplace_back(dev, inputs, texel_format(p.kv_fp16), p.v.at, p.v.bytes);
            kv = r.views[1].handle(), vv = r.views[2].handle();
        }
        // The values accumulate unscaled (the check refuses sums beyond float32). Whether V holds a
        // NaN or Inf: against a cache with no append pending (every append has completed, so its
        // statistics are final), the host knows, and records the kernel for finite values where
        // they are, as a host call does (check() then refuses a non-finite output). Otherwise only
        // the device knows (the guard's flags: this call's pass, or the cache's appends recorded
        // before this call in the same command buffer): the gated kernel reads them and takes the
        // careful path for non-finite values.
        decode_values values = decode_values::gated;
        if (planning)
            values = *planning;
        else if (cache && cache->pending_in == nullptr && cache->rows_finite())
            values = decode_values::finite;
        r.read_finite = values == decode_values::finite;
        const binding gate = cache ? binding{cache->stats.handle(), 0, 16} : binding{r.guard.handle(), 0, 16};
        const binding direct_out = out_direct ? binding{out.handle, out.offset, out.bytes} : binding{};
        // The same rows as float16 storage, for the cooperative-matrix family.
        decode_rows rows = cache ? cache->rows() : decode_rows{};
        if (q_direct)
            rows.q = qb.b, rows.q_off = qb.element;
        else
            rows.q = rows_binding(inputs.handle(), p.q.at, p.q.bytes),
            rows.q_off = static_cast<std::uint32_t>(p.q.at / 2);
        if (!cache) {
            rows.k = rows_binding(inputs.handle(), p.k.at, p.k.bytes),
            rows.k_off = static_cast<std::uint32_t>(p.k.at / 2);
            rows.v = rows_binding(inputs.handle(), p.v.at, p.v.bytes),
            rows.v_off = static_cast<std::uint32_t>(p.v.at / 2);
        }
        // check: the merge runs the guard's output pass over what it writes, in its own dispatch,
        // instead of a guard dispatch after it; q's rows pass, where it did not go first, runs in
        // the decode kernel as it reads q's texels where they hold q's values exactly (every
        // float16 value is a float32 one; a float32 q packed as float16 texels is not), else in
        // the merge too.
        const merge_guard in_merge{.q = qb.b,
                                   .result = verdict,
                                   .q_rows = rows_first ? 0u : g.q_rows,
                                   .d = g.d,
                                   .q_off = g.q_off,
                                   .half = half && !rows_first,
                                   .q_texels = half || !p.q_fp16};
        record_decode_sdpa(session, p, problem, r.views[0].handle(), kv, vv, m, 1.0f, values, k_blocks, v_blocks, gate,
                           direct_out, rows, &in_merge);
    }
    // The copies below read what the kernels wrote.
    const bool copies = !out_direct || p.lse_count || p.weights;
    if (copies) rec.compute_barrier();

    // read: the output (and the lse, the weights, where asked) into the caller's tensors; the
    // output pass of the check (with the rows pass where it did not go first)
    const std::uint32_t out_count = static_cast<std::uint32_t>(p.out_count);
    const guard_output result_check = out_direct ? guard_output{ob.b, ob.element, out_count}
                                                 : guard_output{b.bind(role::out, 0, p.out_count * 4), 0, out_count};
    if (!out_direct)
        record_tensor_copy(rec, pipes, b.bind(role::out, 0, p.out_count * 4), 0, ob.b, ob.element, out_count, false);
    if (p.lse_count) {
        const tensor::impl::bound lb = tensor_access::of(*t.lse, "sdpa_call").bind();
        record_tensor_copy(rec, pipes, b.bind(role::out, 0, p.lse_at + p.lse_count * 4),
                           static_cast<std::uint32_t>(p.lse_at / 4), lb.b, lb.element,
                           static_cast<std::uint32_t>(p.lse_count), false);
    }
    if (p.weights) {
        const tensor::impl::bound wb = tensor_access::of(*t.weights, "sdpa_call").bind();
        record_tensor_copy(rec, pipes, b.bind(role::scores, 0, p.weights_count * 4), 0, wb.b, wb.element,
                           static_cast<std::uint32_t>(p.weights_count), false);
    }
    if (p.fused()) {
        // The copies' writes before the guard binds q, k and v: a caller's tensors may share the
        // bound window (from the storage-offset alignment below each) with the output.
        rec.compute_barrier();
        record_guard(rec, pipes, qb.b, kb.b, vb.b, verdict, rows_first ? nullptr : &g, &result_check);
    }
    r.verdict_to_host(rec);
}

void sdpa_call::run(const sdpa_tensors& tensors) { run_call(sdpa_call_access::of(*this), tensors, "sdpa_call::run"); }

}  // namespace qkv::vulkan
