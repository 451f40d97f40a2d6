// qkv::vulkan::attention_call: self-attention planned once and run, recorded, or sequenced over
// device tensors. The same plan and record steps as context::attention (run_attention.cpp); the
// write step copies the caller's tensors into the plan's inputs layout with compute dispatches,
// the range guard always runs on the device (the host never sees the data), and the inputs'
// finiteness comes from the overflow guard's rows pass (sdpa_guard.comp), read by check().
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "api/attention_call_impl.hpp"
#include "api/context_impl.hpp"
#include "api/recording_impl.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/range_guard.hpp"
#include "kernels/tensor_ops.hpp"
#include "plan/attention_plan.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/vulkan/interop.hpp"
#include "run/io.hpp"
#include "run/run.hpp"

namespace qkv::vulkan {

using namespace detail;

attention_call::attention_call(context& ctx, const attention_problem& description) : impl_(std::make_unique<impl>()) {
    impl& c = *impl_;
    context::impl& owner = context_access::of(ctx);
    c.core = owner.core;
    c.set = owner.set;
    const attention_shape& s = description.shape;
    if (!description.x.empty() || !description.wq.empty() || !description.wk.empty() || !description.wv.empty() ||
        !description.bq.empty() || !description.bk.empty() || !description.bv.empty() || !description.wo.empty() ||
        !description.bo.empty())
        throw qkv::invalid_argument(
            "attention_call: the description's x, weight and bias spans must be empty (the data comes as tensors)");
    require_supported(entry_point::attention_call, description);
    c.desc = description;
    c.mask.assign(description.mask.begin(), description.mask.end());
    c.additive.assign(description.additive_mask.begin(), description.additive_mask.end());
    c.desc.mask = c.mask, c.desc.additive_mask = c.additive;
    validate_description(c.desc);  // before any size the shape implies is allocated
    // The plan reads the shape, and of the data only whether the biases are there (never their
    // values, so one element says so): they always are (absent ones are zeros on the device), and
    // bo with an output projection.
    static constexpr float present[1] = {0.0f};
    attention_problem planning = c.desc;
    planning.bq = present, planning.bk = present, planning.bv = present;
    if (s.d_out) planning.bo = present;
    c.mask_facts = scan_additive(c.additive);
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    c.p = plan_attention(planning, c.core->dev->desc(), c.set);
    if (c.p.mask || c.p.additive) {
        const std::uint64_t end = c.p.additive ? c.p.additive_mask.offset + c.p.additive_mask.size
                                               : c.p.mask_bits.offset + c.p.mask_bits.size;
        c.constants = c.core->alloc->create(end, memory_use::upload, "attention_call masks");
        if (c.p.mask) put_mask_bits(c.constants.mapped() + c.p.mask_bits.offset, c.mask);
        if (c.p.additive) put_floats(c.constants.mapped() + c.p.additive_mask.offset, c.additive);
        c.constants.flush();
    }
    // The pipelines, now (the biases' presence changes no kernel: absent ones are zeros).
    const element_type f32 = element_type::f32;
    tensor x = stand_in(c.core, {s.batch, s.seq, s.d_in}, f32), wq = stand_in(c.core, {s.d_in, s.d_k}, f32),
           wk = stand_in(c.core, {s.d_in, s.d_k}, f32), wv = stand_in(c.core, {s.d_in, s.d_v}, f32),
           out = stand_in(c.core, {s.batch, s.seq, s.out_width()}, f32), wo;
    attention_tensors t{.x = &x, .wq = &wq, .wk = &wk, .wv = &wv, .out = &out};
    if (s.d_out) wo = stand_in(c.core, {s.d_v, s.d_out}, f32), t.wo = &wo;
    build_pipelines(c, t);
}

attention_call::~attention_call() = default;
attention_call::attention_call(attention_call&&) noexcept = default;
attention_call& attention_call::operator=(attention_call&&) noexcept = default;

implementation attention_call::implementation_run() const {
    if (!impl_) throw qkv::error("qkv::vulkan::attention_call used after move");
    return impl_->p.impl;
}
kernel_family attention_call::kernel() const {
    if (!impl_) throw qkv::error("qkv::vulkan::attention_call used after move");
    return impl_->p.family;
}

attention_call::impl::checked_tensors attention_call::impl::check(const attention_tensors& t) const {
    const attention_shape& s = desc.shape;
    // The tensors: present where they must be, of the description's sizes, float32, on this device.
    const auto checked = [&](const tensor* x, const char* what, std::vector<std::size_t> shape,
                             bool required) -> const tensor::impl* {
        if (!x) {
            if (required) throw qkv::invalid_argument(std::string("attention_call: no ") + what + " tensor");
            return nullptr;
        }
        return &expect_tensor(*x, "attention_call", what, core, shape, element_type::f32);
    };
    const tensor::impl* tx = checked(t.x, "x", {s.batch, s.seq, s.d_in}, true);
    const tensor::impl *twq = checked(t.wq, "wq", {s.d_in, s.d_k}, true),
                       *twk = checked(t.wk, "wk", {s.d_in, s.d_k}, true),
                       *twv = checked(t.wv, "wv", {s.d_in, s.d_v}, true);
    const tensor::impl *tbq = checked(t.bq, "bq", {s.d_k}, false), *tbk = checked(t.bk, "bk", {s.d_k}, false),
                       *tbv = checked(t.bv, "bv", {s.d_v}, false);
    const tensor::impl *two = checked(t.wo, "wo", {s.d_v, s.d_out}, s.d_out > 0),
                       *tbo = checked(t.bo, "bo", {s.d_out}, false);
    if (!s.d_out && (t.wo || t.bo)) throw qkv::invalid_argument("attention_call: wo or bo without shape.d_out");
    const tensor::impl* tout = checked(t.out, "out", {s.batch, s.seq, s.out_width()}, true);
    refuse_overlap("attention_call", {{tx, "x"},
                                      {twq, "wq"},
                                      {twk, "wk"},
                                      {twv, "wv"},
                                      {tbq, "bq"},
                                      {tbk, "bk"},
                                      {tbv, "bv"},
                                      {two, "wo"},
                                      {tbo, "bo"},
                                      {tout, "out", true}});
    return {tx, twq, twk, twv, tbq, tbk, tbv, two, tbo, tout};
}

void attention_call::impl::record(recorder& rec, recording::impl& r, const attention_tensors& t) {
    const attention_shape& s = desc.shape;
    const auto [tx, twq, twk, twv, tbq, tbk, tbv, two, tbo, tout] = check(t);
    const auto bind = [](const tensor::impl* x) {
        return x ? std::optional{x->bind()} : std::optional<tensor::impl::bound>{};
    };
    const auto x = bind(tx), wq = bind(twq), wk = bind(twk), wv = bind(twv), bq = bind(tbq), bk = bind(tbk),
               bv = bind(tbv), wo = bind(two), bo = bind(tbo), out = bind(tout);

    r.core = core;
    r.attention = std::make_unique<plan>(p);
    r.additive = mask_facts;
    buffer_plan buffers;
    std::vector<download> downloads;
    attention_buffers(p, buffers, downloads);
    run_session session(*core, rec, r.buffers, buffers);
    pipeline_set& pipes = *core->pipes;
    const run_buffers& b = r.buffers;
    const binding inputs = b.bind(role::inputs, 0, p.inputs_bytes);
    const auto u32 = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };

    // Earlier compute writes (the caller's, or another recording's) before these reads and writes.
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_UNIFORM_READ_BIT);
    // The verdict words: the projection inputs' flags at 0, the output projection inputs' after;
    // the bias regions zeroed (absent biases are zeros).
    const std::uint64_t align = core->dev->desc().storage_alignment;
    const std::uint64_t region = align_up(4 * (contract::GUARD_HEADER_WORDS + s.batch + 8), align);
    r.output_flags_at = region;
    core->alloc->ensure(r.guard, 2 * region, memory_use::readback, "attention_call verdict");
    const binding flags_in{r.guard.handle(), 0, region}, flags_out{r.guard.handle(), region, region};
    rec.fill(r.guard.handle(), 0, 2 * region, 0);
    if (p.bias) rec.fill(b[role::inputs].handle(), p.b.offset, p.b.size, 0);
    if (!p.bo.empty()) rec.fill(b[role::inputs].handle(), p.bo.offset, p.bo.size, 0);
    rec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);

    // check: the inputs' finiteness (the rows pass's flags; its norms are not used here)
    guard_rows g;
    g.q_rows = u32(s.batch * s.seq), g.q_len = u32(s.seq), g.d = u32(s.d_in), g.q_off = x->element;
    record_guard_rows(rec, pipes, x->b, x->b, x->b, flags_in, g);
    g = {};
    g.q_rows = g.k_rows = u32(s.d_in), g.q_len = g.kv_len = u32(s.d_in), g.d = u32(s.d_k), g.dv = u32(s.d_v);
    g.q_off = wq->element, g.k_off = wk->element, g.v_off = wv->element;
    record_guard_rows(rec, pipes, wq->b, wk->b, wv->b, flags_in, g);
    for (const auto& [bias, width] : {std::pair{bq, s.d_k}, std::pair{bk, s.d_k}, std::pair{bv, s.d_v}})
        if (bias) {
            g = {};
            g.q_rows = 1, g.d = u32(width), g.q_off = bias->element;
            record_guard_rows(rec, pipes, bias->b, bias->b, bias->b, flags_in, g);
        }
    if (wo) {
        g = {};
        g.q_rows = u32(s.d_v), g.q_len = u32(s.d_v), g.d = u32(s.d_out), g.q_off = wo->element;
        record_guard_rows(rec, pipes, wo->b, wo->b, wo->b, flags_out, g);
        if (bo) {
            g.q_rows = 1, g.q_len = 1, g.q_off = bo->element;
            record_guard_rows(rec, pipes, bo->b, bo->b, bo->b, flags_out, g);
        }
    }

    // write: the tensors into the plan's inputs layout ([Wq | Wk | Wv] side by side, ld wide)
    record_tensor_copy(rec, pipes, x->b, x->element, inputs, u32(p.x.offset / 4), u32(p.x.size / 4), false);
    record_block_copy(rec, pipes, wq->b, wq->element, u32(s.d_k), inputs, u32(p.w.offset / 4), p.ld, u32(s.d_in),
                      u32(s.d_k));
    record_block_copy(rec, pipes, wk->b, wk->element, u32(s.d_k), inputs, u32(p.w.offset / 4 + s.d_k), p.ld,
                      u32(s.d_in), u32(s.d_k));
    record_block_copy(rec, pipes, wv->b, wv->element, u32(s.d_v), inputs, u32(p.w.offset / 4 + 2 * s.d_k), p.ld,
                      u32(s.d_in), u32(s.d_v));
    const std::uint32_t b0 = u32(p.b.offset / 4);
    if (bq) record_tensor_copy(rec, pipes, bq->b, bq->element, inputs, b0, u32(s.d_k), false);
    if (bk) record_tensor_copy(rec, pipes, bk->b, bk->element, inputs, b0 + u32(s.d_k), u32(s.d_k), false);
    if (bv) record_tensor_copy(rec, pipes, bv->b, bv->element, inputs, b0 + u32(2 * s.d_k), u32(s.d_v), false);
    if (wo) record_tensor_copy(rec, pipes, wo->b, wo->element, inputs, u32(p.wo.offset / 4), u32(p.wo.size / 4), false);
    if (bo) record_tensor_copy(rec, pipes, bo->b, bo->element, inputs, u32(p.bo.offset / 4), u32(s.d_out), false);
    const binding masks{constants.handle(), 0, constants.size()};
    if (p.mask)
        record_tensor_copy(rec, pipes, masks, u32(p.mask_bits.offset / 4), inputs, u32(p.mask_bits.offset / 4),
                           u32(p.mask_bits.size / 4), false);
    if (p.additive)
        record_tensor_copy(rec, pipes, masks, u32(p.additive_mask.offset / 4), inputs, u32(p.additive_mask.offset / 4),
                           u32(p.additive_mask.size / 4), false);
    rec.compute_barrier();

    // record: the attention's steps, the range guard always on the device
    prepare_range_guard(*core->alloc, r.buffers.guard, p);
    record_attention(session, p, /*guard=*/true, /*v_finite=*/false, r.attention_views);
    rec.compute_barrier();

    // read: the output into the caller's tensor; its finiteness
    const std::uint32_t count = u32(p.out_bytes / 4);
    record_tensor_copy(rec, pipes, b.bind(role::out, 0, p.out_bytes), 0, out->b, out->element, count, false);
    record_guard_output(rec, pipes, b.bind(role::out, 0, p.out_bytes), 0, count, flags_in);
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_HOST_READ_BIT);
}

void attention_call::run(const attention_tensors& tensors) {
    run_call(attention_call_access::of(*this), tensors, "attention_call::run");
}

}  // namespace qkv::vulkan
