// qkv::vulkan::sdpa_backward_call: the backward pass planned once and run, recorded into a caller's
// command buffer (interop.cpp) or into a sequence (sequence.cpp), many times over device tensors.
// The same plan and kernels as context::sdpa_backward (run/run_sdpa_backward.cpp); what differs is
// the write step (compute copies of the caller's tensors into the call's inputs), the masks (the
// plan's own constants, uploaded once), the read step (copies of the gradients into the caller's
// tensors) and the check (the overflow rule's device pass and the kernels' verdict, read
// afterwards by recording::check).
#include "qkv/vulkan/sdpa_backward_call.hpp"

#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/context_impl.hpp"
#include "api/planned_call.hpp"
#include "api/recording_impl.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/flash_backward.hpp"
#include "kernels/tensor_ops.hpp"
#include "plan/sdpa_backward_plan.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/vulkan/interop.hpp"
#include "qkv/vulkan/sequence.hpp"
#include "run/io.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan {

using namespace detail;

struct sdpa_backward_call::impl : planned_call {
    sdpa_backward_problem desc;  // its spans point into the vectors below (the masks, the sinks, the slopes)
    std::vector<std::uint8_t> mask;
    std::vector<float> additive, sinks, slopes;
    additive_facts mask_facts;  // the overflow rule's view of `additive`, for every check
    sdpa_backward_plan plan;
    mask_bindings masks;  // where the constants hold the masks and the score params

    [[nodiscard]] element_type type() const {
        return desc.forward.options.precision == precision::fp16 ? element_type::f16 : element_type::f32;
    }
    /// The tensors checked against the call (the lock held): before anything is recorded.
    void check(const sdpa_backward_tensors& t) const;
    /// Records the call over `t` into `rec`, its scratch in `r` (the lock held).
    void record(recorder& rec, recording::impl& r, const sdpa_backward_tensors& t);
};

struct sdpa_backward_call_access {
    static sdpa_backward_call::impl& of(sdpa_backward_call& c) {
        if (!c.impl_) throw qkv::error("qkv::vulkan::sdpa_backward_call used after move");
        return *c.impl_;
    }
};

namespace {

/// The additive mask's shape (its gradient's): mask_shape, or L x S where that is empty.
std::vector<std::size_t> mask_dims(const sdpa_problem& f) {
    return f.mask_shape.empty() ? std::vector<std::size_t>{f.shape.q_len, f.shape.kv_len} : f.mask_shape;
}

/// The shapes of the call's tensors: q (and dq), k (and dk), v (and dv), out (and d_out), lse.
struct tensor_shapes {
    std::vector<std::size_t> q, k, v, out, lse;
    explicit tensor_shapes(const sdpa_shape& s)
        : q{s.batch, s.q_heads, s.q_len, s.d_qk},
          k{s.batch, s.kv_heads, s.kv_len, s.d_qk},
          v{s.batch, s.kv_heads, s.kv_len, s.d_v},
          out{s.batch, s.q_heads, s.q_len, s.d_v},
          lse{s.batch, s.q_heads, s.q_len} {}
};

/// The tensors of the call: present where it needs them, of the right shapes and types, and no
/// tensor it writes overlapping another it touches (nothing is computed in place).
void check_tensors(const sdpa_backward_call::impl& c, const sdpa_backward_tensors& t) {
    const sdpa_shape& s = c.desc.forward.shape;
    const auto expect = [&](const tensor* x, const char* what, std::vector<std::size_t> shape, element_type want) {
        if (!x) throw qkv::invalid_argument(std::string("sdpa_backward_call: no ") + what + " tensor");
        return &expect_tensor(*x, "sdpa_backward_call", what, c.core, shape, want);
    };
    const element_type f32 = element_type::f32;
    const tensor_shapes dims(s);
    const tensor::impl* q = expect(t.q, "q", dims.q, c.type());
    const tensor::impl* k = expect(t.k, "k", dims.k, c.type());
    const tensor::impl* v = expect(t.v, "v", dims.v, c.type());
    const tensor::impl* out = expect(t.out, "out", dims.out, f32);
    const tensor::impl* lse = expect(t.lse, "lse", dims.lse, f32);
    const tensor::impl* d_out = expect(t.d_out, "d_out", dims.out, c.type());
    const tensor::impl* dq = expect(t.dq, "dq", dims.q, f32);
    const tensor::impl* dk = expect(t.dk, "dk", dims.k, f32);
    const tensor::impl* dv = expect(t.dv, "dv", dims.v, f32);
    const auto optional = [&](const tensor* x, bool asked, const char* what, const char* why,
                              std::vector<std::size_t> shape) -> const tensor::impl* {
        if (asked) return expect(x, what, std::move(shape), f32);
        if (x) throw qkv::invalid_argument(std::string("sdpa_backward_call: a ") + what + " tensor, but " + why);
        return nullptr;
    };
    const tensor::impl* d_sinks =
        optional(t.d_sinks, !c.sinks.empty(), "d_sinks", "the description has no sinks", {s.q_heads});
    const tensor::impl* d_mask =
        optional(t.d_additive_mask, c.desc.return_d_additive_mask, "d_additive_mask",
                 "the description's return_d_additive_mask is not set", mask_dims(c.desc.forward));
    refuse_overlap("sdpa_backward_call", {{q, "q"},
                                          {k, "k"},
                                          {v, "v"},
                                          {out, "out"},
                                          {lse, "lse"},
                                          {d_out, "d_out"},
                                          {dq, "dq", true},
                                          {dk, "dk", true},
                                          {dv, "dv", true},
                                          {d_sinks, "d_sinks", true},
                                          {d_mask, "d_additive_mask", true}});
}

}  // namespace

sdpa_backward_call::sdpa_backward_call(context& ctx, const sdpa_backward_problem& description)
    : impl_(std::make_unique<impl>()) {
    impl& c = *impl_;
    context::impl& owner = context_access::of(ctx);
    c.core = owner.core;
    c.set = owner.set;
    c.desc = description;
    validate_description(description);
    require_supported(entry_point::sdpa_backward_call, description);
    const sdpa_problem& f = description.forward;
    c.mask.assign(f.mask.begin(), f.mask.end());
    c.additive.assign(f.additive_mask.begin(), f.additive_mask.end());
    c.sinks.assign(f.sinks.begin(), f.sinks.end());
    c.slopes.assign(f.alibi_slopes.begin(), f.alibi_slopes.end());
    c.desc.forward.mask = c.mask, c.desc.forward.additive_mask = c.additive, c.desc.forward.sinks = c.sinks;
    c.desc.forward.alibi_slopes = c.slopes;
    c.mask_facts = scan_additive(c.additive);
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    const device_desc& dd = c.core->dev->desc();
    c.plan = plan_sdpa_backward(c.desc, dd, c.set);
    // The masks and the score params, once: bits, the additive entries, the params, each at the
    // storage alignment.
    const std::uint64_t bits_bytes = c.mask.empty() ? 0 : mask_bits_bytes(c.mask.size());
    const std::uint64_t add_at = align_up(bits_bytes, dd.storage_alignment), add_bytes = c.additive.size() * 4;
    const std::uint64_t params_at = align_up(add_at + add_bytes, dd.storage_alignment);
    const std::uint64_t params_bytes = score_params_bytes(f.shape);
    c.constants =
        c.core->alloc->create(params_at + params_bytes, memory_use::upload, "sdpa_backward_call masks and params");
    if (bits_bytes) put_mask_bits(c.constants.mapped(), c.mask);
    if (add_bytes) put_floats(c.constants.mapped() + add_at, c.additive);
    put_score_params(c.constants.mapped() + params_at, c.desc.forward, c.plan.forward.features);
    c.constants.flush();
    if (bits_bytes) c.masks.bits = {c.constants.handle(), 0, bits_bytes};
    if (add_bytes) c.masks.additive = {c.constants.handle(), add_at, add_bytes};
    c.masks.params = {c.constants.handle(), params_at, params_bytes};
    // The pipelines, now: the call recorded once, dry, over stand-ins of its tensors.
    const tensor_shapes dims(f.shape);
    const element_type f32 = element_type::f32, in = c.type();
    tensor q = stand_in(c.core, dims.q, in), k = stand_in(c.core, dims.k, in), v = stand_in(c.core, dims.v, in);
    tensor out = stand_in(c.core, dims.out, f32), lse = stand_in(c.core, dims.lse, f32);
    tensor d_out = stand_in(c.core, dims.out, in), dq = stand_in(c.core, dims.q, f32);
    tensor dk = stand_in(c.core, dims.k, f32), dv = stand_in(c.core, dims.v, f32), d_sinks, d_mask;
    sdpa_backward_tensors t{
        .q = &q, .k = &k, .v = &v, .out = &out, .lse = &lse, .d_out = &d_out, .dq = &dq, .dk = &dk, .dv = &dv};
    if (!c.sinks.empty()) d_sinks = stand_in(c.core, {f.shape.q_heads}, f32), t.d_sinks = &d_sinks;
    if (description.return_d_additive_mask) d_mask = stand_in(c.core, mask_dims(f), f32), t.d_additive_mask = &d_mask;
    build_pipelines(c, t);
}

sdpa_backward_call::~sdpa_backward_call() = default;
sdpa_backward_call::sdpa_backward_call(sdpa_backward_call&&) noexcept = default;
sdpa_backward_call& sdpa_backward_call::operator=(sdpa_backward_call&&) noexcept = default;

void sdpa_backward_call::impl::check(const sdpa_backward_tensors& t) const { check_tensors(*this, t); }

void sdpa_backward_call::impl::record(recorder& rec, recording::impl& r, const sdpa_backward_tensors& t) {
    check(t);
    const sdpa_backward_plan& p = plan;
    const sdpa_plan& fp = p.forward;
    const sdpa_shape& s = desc.forward.shape;
    const bool half = type() == element_type::f16;
    const std::uint32_t eb = half ? 2 : 4;
    const auto bound = [](const tensor* x) { return tensor_access::of(*x, "sdpa_backward_call").bind(); };
    const tensor::impl::bound qb = bound(t.q), kb = bound(t.k), vb = bound(t.v);

    r.core = core;
    r.checks = true;
    r.backward = true;
    r.shape = s;
    r.scale = fp.scale;
    r.fp16 = half;
    r.additive = mask_facts;
    run_session session(*core, rec, r.buffers, p.buffers);
    pipeline_set& pipes = *core->pipes;
    const run_buffers& b = r.buffers;
    const std::size_t q_groups = s.batch * s.q_heads, kv_groups = s.batch * s.kv_heads;

    // Earlier compute writes (the caller's, or another recording's) before these reads and writes.
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_UNIFORM_READ_BIT);
    // check: the overflow rule's device pass over q, k and v, and the kernels' verdict after it, in
    // host-visible words (the guard's zeroed here; the kernels set their own)
    r.q_groups = q_groups, r.kv_groups = kv_groups;
    const std::uint64_t guard_bytes = guard_words::bytes(q_groups, kv_groups);
    r.backward_verdict_at = align_up(guard_bytes, 16);
    core->alloc->ensure(r.guard, r.backward_verdict_at + 4 * contract::BWD_VERDICT_WORDS, memory_use::readback,
                        "sdpa_backward_call verdict");
    const binding verdict{r.guard.handle(), 0, guard_bytes};
    rec.fill(r.guard.handle(), 0, guard_bytes, 0);
    rec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    guard_rows g;
    g.q_rows = static_cast<std::uint32_t>(q_groups * s.q_len);
    g.k_rows = static_cast<std::uint32_t>(kv_groups * s.kv_len);
    g.q_len = static_cast<std::uint32_t>(s.q_len);
    g.kv_len = static_cast<std::uint32_t>(s.kv_len);
    g.d = static_cast<std::uint32_t>(s.d_qk), g.dv = static_cast<std::uint32_t>(s.d_v);
    g.q_off = qb.element, g.k_off = kb.element, g.v_off = vb.element;
    g.half = half;
    record_guard(rec, pipes, qb.b, kb.b, vb.b, verdict, &g, nullptr);

    // write: the tensors into the call's inputs, as the plan lays them out
    const binding inputs = b.bind(role::inputs, 0, p.buffers.of(role::inputs));
    const auto copy_in = [&](const tensor::impl::bound& x, const region& at, std::uint32_t bytes_per) {
        record_tensor_copy(rec, pipes, x.b, x.element, inputs, static_cast<std::uint32_t>(at.at / bytes_per),
                           static_cast<std::uint32_t>(at.bytes / bytes_per), bytes_per == 2);
    };
    copy_in(qb, fp.q, eb);
    copy_in(kb, fp.k, eb);
    copy_in(vb, fp.v, eb);
    copy_in(bound(t.d_out), p.d_out, eb);
    copy_in(bound(t.out), p.out, 4);
    copy_in(bound(t.lse), p.lse, 4);
    rec.compute_barrier();

    // record: the kernels, as context::sdpa_backward records them
    flash_bwd_io io;
    io.qkv = b.bind(role::inputs, 0, fp.v.at + fp.v.bytes);
    io.d_out = b.bind(role::inputs, 0, p.d_out.at + p.d_out.bytes);
    io.d_out_element = static_cast<std::uint32_t>(p.d_out.at / eb);
    io.out = b.bind(role::inputs, p.out.at, p.out.bytes);
    io.lse = b.bind(role::inputs, p.lse.at, p.lse.bytes);
    io.mask_bits = masks.bits, io.additive = masks.additive, io.params = masks.params;
    io.dq = b.bind(role::out, p.dq_at, p.dq_count * 4);
    io.dk = b.bind(role::out, p.dk_at, p.dk_count * 4);
    io.dv = b.bind(role::out, p.dv_at, p.dv_count * 4);
    if (p.d_sinks_count) io.d_sinks = b.bind(role::out, p.d_sinks_at, p.d_sinks_count * 4);
    if (p.d_mask_count) io.d_mask = b.bind(role::out, p.d_mask_at, p.d_mask_count * 4);
    io.verdict = binding{r.guard.handle(), r.backward_verdict_at, 4 * contract::BWD_VERDICT_WORDS};
    io.texels = b[role::texels].handle();
    io.scratch = b[role::state].handle();
    if (p.kernels.ds_bytes) io.ds = b.bind(role::scores, 0, p.kernels.ds_bytes);
    if (p.kernels.fused) io.dr = b.bind(role::scores, 0, p.kernels.fused_scratch_bytes());
    r.backward_views = make_flash_bwd_views(*core->dev, io.texels, io.scratch, p.kernels);
    // Only the device knows whether the inputs hold a NaN or Inf: the careful pipelines are
    // recorded too, each running only for its kind of (batch, head).
    record_flash_backward(rec, pipes, fp.layout, p.kernels, io, r.backward_views, false);
    rec.compute_barrier();

    // read: the gradients into the caller's tensors
    const binding out = b.bind(role::out, 0, p.buffers.of(role::out));
    const auto copy_out = [&](tensor* x, std::uint64_t at, std::uint64_t count) {
        const tensor::impl::bound to = bound(x);
        record_tensor_copy(rec, pipes, out, static_cast<std::uint32_t>(at / 4), to.b, to.element,
                           static_cast<std::uint32_t>(count), false);
    };
    copy_out(t.dq, p.dq_at, p.dq_count);
    copy_out(t.dk, p.dk_at, p.dk_count);
    copy_out(t.dv, p.dv_at, p.dv_count);
    if (p.d_sinks_count) copy_out(t.d_sinks, p.d_sinks_at, p.d_sinks_count);
    if (p.d_mask_count) copy_out(t.d_additive_mask, p.d_mask_at, p.d_mask_count);
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_HOST_READ_BIT);
}

void recording::impl::check_backward(bool locked) const {
    std::uint32_t verdict[contract::BWD_VERDICT_WORDS] = {};
    {
        std::unique_lock lock(core->mutex, std::defer_lock);
        if (!locked) lock.lock();
        guard.invalidate();
        words = guard_words::read(guard.mapped(), q_groups, kv_groups);
        std::memcpy(verdict, guard.mapped() + backward_verdict_at, sizeof verdict);
    }
    // As the host path: the overflow rule on the scores the kernels recomputed, then the kernels'
    // verdict (saved tensors that are not the forward's; a non-finite gradient from finite inputs).
    const sdpa_facts facts = facts_from_device(words, nullptr, additive);
    check_sdpa_scores(facts, shape, scale, fp16);
    check_backward_verdict(verdict[0], verdict[1], facts.every_output_defined());
}

void sdpa_backward_call::run(const sdpa_backward_tensors& tensors) {
    run_call(sdpa_backward_call_access::of(*this), tensors, "sdpa_backward_call::run");
}

recording record(sdpa_backward_call& call, VkCommandBuffer cmd, const sdpa_backward_tensors& tensors) {
    return record_call(sdpa_backward_call_access::of(call), cmd, tensors);
}

void sequence::record(sdpa_backward_call& call, const sdpa_backward_tensors& tensors) {
    if (!impl_) throw qkv::error("qkv::vulkan::sequence used after move");
    record_in_sequence(*impl_, sdpa_backward_call_access::of(call), tensors);
}

}  // namespace qkv::vulkan
