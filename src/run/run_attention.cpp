// run_attention: self-attention from X and the weights (context::attention): the projection,
// the range guard where the host could not prove the range, the fused kernel or the staged
// scores/softmax/aggregation, the output projection; in the run skeleton's steps (run/run.hpp).
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/flash_coop.hpp"
#include "kernels/flash_cpu.hpp"
#include "kernels/flash_gpu.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/range_guard.hpp"
#include "kernels/stages.hpp"
#include "plan/attention_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "run/run.hpp"

namespace qkv::vulkan::detail {
namespace {

void put(std::byte* base, const range& r, const void* data, std::size_t bytes) {
    if (bytes) std::memcpy(base + r.offset, data, bytes);
}

/// Writes every input into the packed layout of `p` at `base`.
void pack_inputs(std::byte* base, const plan& p, const attention_problem& problem) {
    const attention_shape& s = problem.shape;
    put(base, p.x, problem.x.data(), problem.x.size_bytes());
    // [Wq | Wk | Wv] side by side: one product computes Q, K and V in one pass over X.
    auto* w = reinterpret_cast<float*>(base + p.w.offset);
    for (std::size_t k = 0; k < s.d_in; ++k) {
        float* row = w + k * p.ld;
        std::memcpy(row, problem.wq.data() + k * s.d_k, s.d_k * 4);
        std::memcpy(row + s.d_k, problem.wk.data() + k * s.d_k, s.d_k * 4);
        std::memcpy(row + 2 * s.d_k, problem.wv.data() + k * s.d_v, s.d_v * 4);
    }
    if (p.bias) {
        auto* b = reinterpret_cast<float*>(base + p.b.offset);
        std::fill(b, b + p.ld, 0.0f);
        if (!problem.bq.empty()) std::memcpy(b, problem.bq.data(), s.d_k * 4);
        if (!problem.bk.empty()) std::memcpy(b + s.d_k, problem.bk.data(), s.d_k * 4);
        if (!problem.bv.empty()) std::memcpy(b + 2 * s.d_k, problem.bv.data(), s.d_v * 4);
    }
    put(base, p.wo, problem.wo.data(), problem.wo.size_bytes());
    put(base, p.bo, problem.bo.data(), problem.bo.size_bytes());
    if (p.mask) {
        auto* bits = reinterpret_cast<std::uint32_t*>(base + p.mask_bits.offset);
        std::fill(bits, bits + p.mask_bits.size / 4, 0u);
        for (std::size_t i = 0; i < problem.mask.size(); ++i)
            if (problem.mask[i]) bits[i / 32] |= 1u << (i % 32);
    }
    put(base, p.additive_mask, problem.additive_mask.data(), problem.additive_mask.size_bytes());
}

binding part(const buffer& b, const range& r) { return {b.handle(), r.offset, r.size}; }
binding whole(const buffer& b, std::uint64_t size) { return {b.handle(), 0, size}; }

/// The bindings every stage shares.
struct call_bindings {
    binding qkv, any_input, mask_bits, additive, attn_out;
};

call_bindings bind(const run_buffers& bufs, const plan& p) {
    call_bindings b;
    b.qkv = whole(bufs[role::qkv], p.qkv_bytes);
    b.any_input = part(bufs[role::inputs], p.x);  // bound where a shader reads nothing
    b.mask_bits = p.mask ? part(bufs[role::inputs], p.mask_bits) : b.any_input;
    b.additive = p.additive ? part(bufs[role::inputs], p.additive_mask) : b.any_input;
    b.attn_out = p.d_out ? whole(bufs[role::concat], p.concat_bytes) : whole(bufs[role::out], p.out_bytes);
    return b;
}

/// Stage 1: Q|K|V = X · [Wq|Wk|Wv] + [bq|bk|bv], one product for all three, then the range guard
/// unless the host has proven its verdicts already (`guard` false).
/// The texel variant reads X and the weights through `view` (RGBA32F, the inputs from offset 0,
/// made here; it must live until the submit), at their element offsets in the inputs.
void record_projection(const run_session& s, const plan& p, const call_bindings& b, buffer_view& view, bool guard) {
    const run_buffers& bufs = s.buffers();
    gemm_push g = gemm_push_defaults();
    g.M = p.batch * p.seq, g.N = p.ld, g.K = p.d_in;
    g.a_rs = p.d_in, g.b_rs = p.ld, g.b_cs = 1, g.c_rs = p.ld;
    g.flags = p.bias ? flag_bias : 0;
    const binding bias = p.bias ? part(bufs[role::inputs], p.b) : b.any_input;
    if (projection_texels(p.project.shader)) {
        view = buffer_view(s.dev(), bufs[role::inputs], VK_FORMAT_R32G32B32A32_SFLOAT, 0, projection_view_bytes(p));
        g.a_off = static_cast<std::uint32_t>(p.x.offset / 4), g.b_off = static_cast<std::uint32_t>(p.w.offset / 4);
        record_gemm(s.rec(), s.pipes(), p.project, {texel(view.handle()), texel(view.handle()), bias, b.qkv}, g, 1);
    } else {
        record_gemm(s.rec(), s.pipes(), p.project,
                    {part(bufs[role::inputs], p.x), part(bufs[role::inputs], p.w), bias, b.qkv}, g, 1);
    }
    s.rec().compute_barrier();
    // Finite inputs too large for float32 / float16: checked here, reported after the submit.
    if (guard) record_range_guard(s.rec(), s.pipes(), bufs.guard, p, b.qkv);
}

std::uint32_t mask_flags(const plan& p) {
    return (p.causal ? flag_causal : 0) | (p.mask ? flag_mask : 0) | (p.additive ? flag_additive : 0);
}

/// The fused kernel: every (batch, head), every block of query rows, online softmax; one dispatch
/// per key chunk (of the family the plan chose).
/// `v_finite`: every input of the projection is finite, so V is (or the call fails its range check).
void record_fused(const run_session& s, const plan& p, const call_bindings& b, bool v_finite, flash_cpu_views& views) {
    const run_buffers& bufs = s.buffers();
    const binding state = bufs[role::state] ? bufs.bind(role::state, 0, bufs[role::state].size()) : b.any_input;
    const flash_io io{b.qkv, b.mask_bits, b.additive, b.attn_out, state};
    if (p.family == kernel_family::row_tiles) {
        views = make_flash_cpu_views(s.dev(), bufs[role::texels], p.cpu);
        const flash_cpu_texels tx{bufs[role::texels].handle(), views.q.handle(), views.k.handle(), views.v.handle()};
        record_flash_cpu(s.rec(), s.pipes(), p.layout, p.cpu, io, tx);
    } else if (p.family == kernel_family::coopmat) {
        record_flash_coop(s.rec(), s.pipes(), p.layout, p.coop, io, false, v_finite);
    } else {
        record_flash_gpu(s.rec(), s.pipes(), p.layout, p.gpu, io);
    }
}

/// The staged attention: scores, softmax in place, weights · V into each head's columns.
/// `v_finite`: every input of the projection is finite, so V is (or the call fails its range
/// check): the aggregation's texel variant then needs no zero-weight rule against 0·NaN.
void record_staged(const run_session& s, const plan& p, const call_bindings& b, bool v_finite, staged_views& views) {
    const run_buffers& bufs = s.buffers();
    const std::uint32_t N = p.seq, H = p.heads, dh = p.d_k / H, dvh = p.d_v / H;
    gemm_push g = gemm_push_defaults();
    g.M = N, g.N = N, g.K = dh, g.heads = H;
    g.a_off = 0, g.a_bs = N * p.ld, g.a_hs = dh, g.a_rs = p.ld;                  // Q_h
    g.b_off = p.d_k, g.b_bs = N * p.ld, g.b_hs = dh, g.b_rs = 1, g.b_cs = p.ld;  // K_hᵀ
    g.c_bs = H * N * N, g.c_hs = N * N, g.c_rs = N;
    g.scale = p.scale;
    g.flags = mask_flags(p);
    g.mask_bs = p.mask_batched ? N * N : 0;
    g.add_bs = p.additive_batched ? N * N : 0;
    const binding scores = whole(bufs[role::scores], p.scores_bytes);
    const std::uint64_t qkv_view_bytes = std::uint64_t{p.batch} * N * p.ld * (p.fp16 ? 2 : 4);
    if (texel_gemm(p.scores.shader) || texel_gemm(p.aggregate.shader))
        views.qkv = buffer_view(s.dev(), bufs[role::qkv], texel_format(p.fp16), 0, qkv_view_bytes);
    if (texel_gemm(p.scores.shader))
        record_gemm(s.rec(), s.pipes(), p.scores, {texel(views.qkv.handle()), b.mask_bits, b.additive, scores}, g,
                    p.batch * H);
    else
        record_gemm(s.rec(), s.pipes(), p.scores, {b.qkv, b.mask_bits, b.additive, scores}, g, p.batch * H);
    s.rec().compute_barrier();
    if (p.softmax == shader_id::softmax_cpu_tx || texel_gemm(p.aggregate.shader))
        views.scores = buffer_view(s.dev(), bufs[role::scores], VK_FORMAT_R32G32B32A32_SFLOAT, 0, p.scores_bytes);
    const binding scores_texels = views.scores ? texel(views.scores.handle()) : binding{};
    record_softmax(s.rec(), s.pipes(), p.softmax, p.softmax_workgroup, scores, scores_texels, p.batch * H * N, N);
    s.rec().compute_barrier();
    gemm_push a = gemm_push_defaults();
    a.M = N, a.N = dvh, a.K = N, a.heads = H;
    a.a_bs = H * N * N, a.a_hs = N * N, a.a_rs = N;                                   // P
    a.b_off = 2 * p.d_k, a.b_bs = N * p.ld, a.b_hs = dvh, a.b_rs = p.ld, a.b_cs = 1;  // V_h
    a.c_bs = N * p.d_v, a.c_hs = dvh, a.c_rs = p.d_v;
    a.flags = p.causal ? flag_causal : 0;
    if (texel_gemm(p.aggregate.shader)) {
        gemm_step step = p.aggregate;
        step.skip_zero = !v_finite;
        record_gemm(s.rec(), s.pipes(), step, {scores_texels, texel(views.qkv.handle()), b.attn_out}, a, p.batch * H);
    } else {
        record_gemm(s.rec(), s.pipes(), p.aggregate, {scores, b.qkv, b.attn_out}, a, p.batch * H);
    }
}

/// The output projection: concat · Wo + bo.
void record_output_projection(const run_session& s, const plan& p, const call_bindings& b) {
    const run_buffers& bufs = s.buffers();
    s.rec().compute_barrier();
    gemm_push g = gemm_push_defaults();
    g.M = p.batch * p.seq, g.N = p.d_out, g.K = p.d_v;
    g.a_rs = p.d_v, g.b_rs = p.d_out, g.b_cs = 1, g.c_rs = p.d_out;
    g.flags = p.bo.empty() ? 0 : flag_bias;
    record_gemm(s.rec(), s.pipes(), p.out_projection,
                {b.attn_out, part(bufs[role::inputs], p.wo),
                 p.bo.empty() ? b.any_input : part(bufs[role::inputs], p.bo), whole(bufs[role::out], p.out_bytes)},
                g, 1);
}

/// The phases' device times from the executor's marks (inputs, projection, attention, output).
void read_phases(const std::vector<double>& m, phase_times& t) {
    if (m.size() < 3) return;
    t.projection_ms = m[1] - m[0];
    t.attention_ms = m[2] - m[1];
    t.output_projection_ms = m.size() >= 4 ? m[3] - m[2] : 0.0;
}

}  // namespace

void attention_buffers(const plan& p, buffer_plan& b, std::vector<download>& d) {
    b.need(role::inputs, p.inputs_bytes);
    b.need(role::qkv, p.qkv_bytes);
    b.need(role::scores, p.scores_bytes);
    b.need(role::concat, p.concat_bytes);
    b.need(role::out, p.out_bytes);
    b.need(role::state, p.flash_chunk_keys < p.seq ? std::uint64_t{p.batch} * p.heads * p.seq * 8 : 0);
    b.need(role::texels, p.family == kernel_family::row_tiles ? p.cpu.bytes : 0);
    d = {{role::out, 0, p.out_bytes}};
    if (p.weights_bytes) d.push_back({role::scores, 0, p.weights_bytes});
}

void record_attention(const run_session& s, const plan& p, bool guard, bool v_finite, attention_views& views) {
    const call_bindings b = bind(s.buffers(), p);
    const bool host = !s.recording();
    record_projection(s, p, b, views.projection, guard);
    if (host) s.mark();  // projections done
    if (p.impl == implementation::fused)
        record_fused(s, p, b, v_finite, views.flash);
    else
        record_staged(s, p, b, v_finite, views.staged);
    if (host) s.mark();  // attention done
    if (p.d_out) {
        record_output_projection(s, p, b);
        if (host) s.mark();  // output projection done
    }
}

run_result<attention_output> run_attention(run_env& env, const attention_problem& problem) {
    // plan
    const plan p = plan_attention(problem, env.core.dev->desc(), env.set);
    buffer_plan buffers;
    std::vector<download> downloads;
    attention_buffers(p, buffers, downloads);
    // check: finiteness, and whether the host proves the range (else the device guard runs)
    const input_facts facts = scan_inputs(problem);
    const bool guard = !range_proven_on_host(p, problem, facts);
    // prepare, write
    run_session s(env, buffers, downloads);
    if (guard) prepare_range_guard(*env.core.alloc, env.buffers.guard, p);
    pack_inputs(s.inputs(), p, problem);
    // record
    s.begin();
    attention_views views;  // texel views made while recording: they live until the submit
    record_attention(s, p, guard, facts.projection_inputs_finite, views);
    run_result<attention_output> run;
    run.times = s.submit();
    // read: the guard's verdicts, the result, the second line of defence
    if (guard) check_range_guard(env.buffers.guard, p, &problem, facts);  // throws numeric_overflow
    run.times.device_range_check = guard;
    read_phases(s.exec().marks_ms(), run.times);
    attention_output& out = run.output;
    out.shape = problem.shape;
    out.implementation = p.impl;
    out.kernel = p.family;
    out.device = s.dev().info().name;
    out.output.resize(p.out_bytes / 4);
    out.weights.resize(p.weights_bytes / 4);
    s.read(0, out.output.data());
    if (p.weights_bytes) {
        s.read(1, out.weights.data());
        // The kernels mark a masked weight -0.0 (shaders/values.glsl); the caller gets 0, as PyTorch.
        for (float& w : out.weights)
            if (w == 0.0f) w = 0.0f;
    }
    check_outputs(out, p, facts);  // throws numeric_overflow
    return run;
}

}  // namespace qkv::vulkan::detail
