#include "api/dispatch.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/plan.hpp"
#include "kernels/flash_gpu.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/range_guard.hpp"
#include "kernels/stages.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

void ensure(allocator& alloc, buffer& b, std::uint64_t need, memory_use use, const char* what,
            VkBufferUsageFlags extra_usage = 0) {
    need = std::max<std::uint64_t>(need, 4);
    if (b && b.size() >= need && b.size() <= 2 * need) return;
    b.reset();  // free first: the old buffer's memory is available to the new one
    b = alloc.create((need + 4095) / 4096 * 4096, use, what, extra_usage);
}

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

call_bindings bind(const buffer_cache& bufs, const plan& p) {
    call_bindings b;
    b.qkv = whole(bufs.qkv, p.qkv_bytes);
    b.any_input = part(bufs.inputs, p.x);  // bound where a shader reads nothing
    b.mask_bits = p.mask ? part(bufs.inputs, p.mask_bits) : b.any_input;
    b.additive = p.additive ? part(bufs.inputs, p.additive_mask) : b.any_input;
    b.attn_out = p.d_out ? whole(bufs.concat, p.concat_bytes) : whole(bufs.out, p.out_bytes);
    return b;
}

/// The fused kernels' view of the projected Q|K|V rows: head h of Q, K and V at columns h·d,
/// d_k + h·d, 2·d_k + h·dv of each row; the output's rows are d_v wide, head h at column h·dv.
flash_layout attention_layout(const plan& p) {
    flash_layout l;
    const std::uint32_t N = p.seq, dh = p.d_k / p.heads, dvh = p.d_v / p.heads;
    l.batch = p.batch, l.heads = l.kv_heads = p.heads, l.q_len = l.kv_len = N, l.d = dh, l.dv = dvh;
    l.q = l.k = {N * p.ld, dh, p.ld};
    l.v = {N * p.ld, dvh, p.ld};
    l.o = {N * p.d_v, dvh, p.d_v};
    l.k_off = p.d_k, l.v_off = 2 * p.d_k;
    l.m_bs = p.mask_batched ? N * N : 0, l.a_bs = p.additive_batched ? N * N : 0;
    l.m_hs = 0, l.m_rs = N, l.m_cs = 1;
    l.causal = p.causal, l.mask = p.mask, l.additive = p.additive;
    l.scale = p.scale;
    l.fp16 = p.fp16;
    return l;
}

/// The format of a texel view of Q|K|V: four of its elements (float32, or float16 with fp16).
VkFormat qkv_texel_format(const plan& p) {
    return p.fp16 ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
}

/// Lays the call out and chooses its kernels (plan.hpp); `cpu_plan` is the CPU family's layout.
plan plan_call(const dispatch_environment& env, const attention_problem& problem, flash_cpu_plan& cpu_plan) {
    const device_info& info = env.dev.info();
    const std::uint64_t alignment = std::max<std::uint64_t>(env.dev.limits().minStorageBufferOffsetAlignment, 16);
    plan p = make_plan(problem, info, alignment);
    cpu_plan = plan_flash_cpu(env.dev, attention_layout(p), env.max_fused_keys);
    device_facts facts;
    facts.subgroups = env.dev.subgroups();
    facts.max_fused_keys = env.max_fused_keys;
    facts.fused_tiles_as = env.fused_tiles_as;
    facts.cpu_chunk_keys = cpu_plan.chunk_keys;
    facts.cpu_family_refusal = [&] {
        const flash_cpu_refusal no = check_flash_cpu(env.dev, cpu_plan);
        return family_refusal{no.why, no.limit};
    };
    // QKV_PROJECT_TEXELS=0 keeps the storage-buffer variant (for before/after measurements).
    const char* texels_env = std::getenv("QKV_PROJECT_TEXELS");
    const std::string texels = texels_env ? texels_env : "";
    if (!texels.empty() && texels != "0" && texels != "1")
        throw invalid_argument("QKV_PROJECT_TEXELS=" + texels + ": expected 0 or 1");
    facts.projection_texels = texels != "0" && env.dev.uniform_texel_format(VK_FORMAT_R32G32B32A32_SFLOAT) &&
                              projection_view_bytes(p) >= 16 &&
                              projection_view_bytes(p) / 16 <= env.dev.limits().maxTexelBufferElements;
    // The staged products' views: all of Q|K|V (texels of 4 elements) and all of the scores.
    const std::uint64_t max_texels = env.dev.limits().maxTexelBufferElements;
    facts.staged_texels = env.dev.uniform_texel_format(qkv_texel_format(p)) &&
                          env.dev.uniform_texel_format(VK_FORMAT_R32G32B32A32_SFLOAT) &&
                          std::uint64_t{p.batch} * p.seq * p.ld / 4 <= max_texels && p.scores_bytes / 16 <= max_texels;
    choose_kernels(p, info, facts, problem.options.kernel);
    return p;
}

/// Allocates (or reuses) every buffer of the call. Returns whether inputs and results go through
/// staging buffers: where device memory is host-visible (lavapipe, integrated GPUs) they are
/// mapped directly, which only the allocation itself tells. An allocation failure releases every
/// cached buffer: the failed call keeps nothing, and the next call starts from what it needs.
bool ensure_buffers(dispatch_environment& env, const plan& p, const flash_cpu_plan& cpu_plan) {
    buffer_cache& bufs = env.buffers;
    allocator& alloc = env.alloc;
    try {
        // Texel usage too: the projection's texel variant reads X and the weights through a view.
        ensure(alloc, bufs.inputs, p.inputs_bytes, memory_use::device, "inputs",
               VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        // Texel usage too: the staged products' texel variants read Q|K|V and the scores through views.
        ensure(alloc, bufs.qkv, p.qkv_bytes, memory_use::device, "Q|K|V", VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        if (p.scores_bytes)
            ensure(alloc, bufs.scores, p.scores_bytes, memory_use::device, "scores",
                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        if (p.concat_bytes) ensure(alloc, bufs.concat, p.concat_bytes, memory_use::device, "concatenated heads");
        ensure(alloc, bufs.out, p.out_bytes, memory_use::device, "output");
        prepare_range_guard(alloc, bufs.guard, p);
        bufs.flash_views = {};  // made again when recording, for this call's layout
        if (p.family == kernel_family::cpu)
            ensure(alloc, bufs.flash_texels, cpu_plan.bytes, memory_use::device, "fused-attention texels",
                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        else
            bufs.flash_texels.reset();
        if (p.flash_chunk_keys < p.seq)
            ensure(alloc, bufs.flash_state, std::uint64_t{p.batch} * p.heads * p.seq * 8, memory_use::device,
                   "fused-attention chunk state");
        else
            bufs.flash_state.reset();
        const bool staged_io = env.force_staging || !bufs.inputs.mapped() || !bufs.out.mapped() ||
                               (p.weights_bytes && !bufs.scores.mapped());
        if (staged_io) {
            ensure(alloc, bufs.staging_in, p.inputs_bytes, memory_use::upload, "upload staging");
            ensure(alloc, bufs.staging_out, p.readback_bytes, memory_use::readback, "readback staging");
        } else {
            bufs.staging_in.reset();
            bufs.staging_out.reset();
        }
        return staged_io;
    } catch (const out_of_memory&) {
        bufs = buffer_cache{};
        throw;
    }
}

/// Packs the inputs where the device reads them and records the copy that staged I/O needs.
void upload(executor& exec, const buffer_cache& bufs, const plan& p, const attention_problem& problem, bool staged_io) {
    const buffer& target = staged_io ? bufs.staging_in : bufs.inputs;
    pack_inputs(target.mapped(), p, problem);
    target.flush();
    if (!staged_io) return;
    exec.copy(bufs.staging_in.handle(), 0, bufs.inputs.handle(), 0, p.inputs_bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT);
}

/// Stage 1: Q|K|V = X · [Wq|Wk|Wv] + [bq|bk|bv], one product for all three, then the range guard
/// unless the host has proven its verdicts already (`guard` false).
/// The texel variant reads X and the weights through `view` (RGBA32F, the inputs from offset 0,
/// made here; it must live until the submit), at their element offsets in the inputs.
void record_projection(dispatch_environment& env, const buffer_cache& bufs, const plan& p, const call_bindings& b,
                       buffer_view& view, bool guard) {
    gemm_push g = gemm_push_defaults();
    g.M = p.batch * p.seq, g.N = p.ld, g.K = p.d_in;
    g.a_rs = p.d_in, g.b_rs = p.ld, g.b_cs = 1, g.c_rs = p.ld;
    g.flags = p.bias ? flag_bias : 0;
    const binding bias = p.bias ? part(bufs.inputs, p.b) : b.any_input;
    if (projection_texels(p.project.shader)) {
        view = buffer_view(env.dev, bufs.inputs, VK_FORMAT_R32G32B32A32_SFLOAT, 0, projection_view_bytes(p));
        g.a_off = static_cast<std::uint32_t>(p.x.offset / 4), g.b_off = static_cast<std::uint32_t>(p.w.offset / 4);
        record_gemm(env.exec, env.pipes, p.project, {texel(view.handle()), texel(view.handle()), bias, b.qkv}, g, 1);
    } else {
        record_gemm(env.exec, env.pipes, p.project, {part(bufs.inputs, p.x), part(bufs.inputs, p.w), bias, b.qkv}, g,
                    1);
    }
    env.exec.compute_barrier();
    // Finite inputs too large for float32 / float16: checked here, reported after the submit.
    if (guard) record_range_guard(env.exec, env.pipes, bufs.guard, p, b.qkv);
}

std::uint32_t mask_flags(const plan& p) {
    return (p.causal ? flag_causal : 0) | (p.mask ? flag_mask : 0) | (p.additive ? flag_additive : 0);
}

/// The fused kernel: every (batch, head), every block of query rows, online softmax; one dispatch
/// per key chunk (of the family the plan chose).
void record_fused(dispatch_environment& env, const plan& p, const flash_cpu_plan& cpu_plan, const call_bindings& b) {
    buffer_cache& bufs = env.buffers;
    const flash_layout layout = attention_layout(p);
    const binding state = bufs.flash_state ? whole(bufs.flash_state, bufs.flash_state.size()) : b.any_input;
    const flash_io io{b.qkv, b.mask_bits, b.additive, b.attn_out, state};
    if (p.family == kernel_family::cpu) {
        bufs.flash_views = make_flash_cpu_views(env.dev, bufs.flash_texels, cpu_plan);
        const flash_cpu_texels tx{bufs.flash_texels.handle(), bufs.flash_views.q.handle(), bufs.flash_views.k.handle(),
                                  bufs.flash_views.v.handle()};
        record_flash_cpu(env.exec, env.pipes, layout, cpu_plan, io, tx);
    } else {
        record_flash_gpu(env.exec, env.pipes, layout,
                         plan_flash_gpu(env.dev, layout, env.max_fused_keys, env.fused_tiles_as), io);
    }
}

/// Texel views of Q|K|V and of the scores for the staged products' texel variants, made when
/// recording; they must live until the submit.
struct staged_views {
    buffer_view qkv, scores;
};

/// The staged attention: scores, softmax in place, weights · V into each head's columns.
/// `v_finite`: every input of the projection is finite, so V is (or the call fails its range
/// check): the aggregation's texel variant then needs no zero-weight rule against 0·NaN.
void record_staged(dispatch_environment& env, const buffer_cache& bufs, const plan& p, const call_bindings& b,
                   bool v_finite, staged_views& views) {
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
    const binding scores = whole(bufs.scores, p.scores_bytes);
    const std::uint64_t qkv_view_bytes = std::uint64_t{p.batch} * N * p.ld * (p.fp16 ? 2 : 4);
    if (texel_gemm(p.scores.shader) || texel_gemm(p.aggregate.shader))
        views.qkv = buffer_view(env.dev, bufs.qkv, qkv_texel_format(p), 0, qkv_view_bytes);
    if (texel_gemm(p.scores.shader))
        record_gemm(env.exec, env.pipes, p.scores, {texel(views.qkv.handle()), b.mask_bits, b.additive, scores}, g,
                    p.batch * H);
    else
        record_gemm(env.exec, env.pipes, p.scores, {b.qkv, b.mask_bits, b.additive, scores}, g, p.batch * H);
    env.exec.compute_barrier();
    if (p.softmax == shader_id::softmax_cpu_tx || texel_gemm(p.aggregate.shader))
        views.scores = buffer_view(env.dev, bufs.scores, VK_FORMAT_R32G32B32A32_SFLOAT, 0, p.scores_bytes);
    const binding scores_texels = views.scores ? texel(views.scores.handle()) : binding{};
    record_softmax(env.exec, env.pipes, p.softmax, p.softmax_workgroup, scores, scores_texels, p.batch * H * N, N);
    env.exec.compute_barrier();
    gemm_push a = gemm_push_defaults();
    a.M = N, a.N = dvh, a.K = N, a.heads = H;
    a.a_bs = H * N * N, a.a_hs = N * N, a.a_rs = N;                                   // P
    a.b_off = 2 * p.d_k, a.b_bs = N * p.ld, a.b_hs = dvh, a.b_rs = p.ld, a.b_cs = 1;  // V_h
    a.c_bs = N * p.d_v, a.c_hs = dvh, a.c_rs = p.d_v;
    a.flags = p.causal ? flag_causal : 0;
    if (texel_gemm(p.aggregate.shader)) {
        gemm_step step = p.aggregate;
        step.skip_zero = !v_finite;
        record_gemm(env.exec, env.pipes, step, {scores_texels, texel(views.qkv.handle()), b.attn_out}, a, p.batch * H);
    } else {
        record_gemm(env.exec, env.pipes, p.aggregate, {scores, b.qkv, b.attn_out}, a, p.batch * H);
    }
}

/// The output projection: concat · Wo + bo.
void record_output_projection(dispatch_environment& env, const buffer_cache& bufs, const plan& p,
                              const call_bindings& b) {
    env.exec.compute_barrier();
    gemm_push g = gemm_push_defaults();
    g.M = p.batch * p.seq, g.N = p.d_out, g.K = p.d_v;
    g.a_rs = p.d_v, g.b_rs = p.d_out, g.b_cs = 1, g.c_rs = p.d_out;
    g.flags = p.bo.empty() ? 0 : flag_bias;
    record_gemm(env.exec, env.pipes, p.out_projection,
                {b.attn_out, part(bufs.inputs, p.wo), p.bo.empty() ? b.any_input : part(bufs.inputs, p.bo),
                 whole(bufs.out, p.out_bytes)},
                g, 1);
}

/// Makes the results visible to the host, through the staging buffer where there is one.
void record_download(executor& exec, const buffer_cache& bufs, const plan& p, bool staged_io) {
    if (!staged_io) {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
        return;
    }
    exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_TRANSFER_READ_BIT);
    exec.copy(bufs.out.handle(), 0, bufs.staging_out.handle(), 0, p.out_bytes);
    if (p.weights_bytes) exec.copy(bufs.scores.handle(), 0, bufs.staging_out.handle(), p.out_bytes, p.weights_bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_HOST_READ_BIT);
}

/// The phases' device times from the executor's marks (inputs, projection, attention, output).
void read_phases(const std::vector<double>& m, attention_run& run) {
    if (m.size() < 3) return;
    run.projection_ms = m[1] - m[0];
    run.attention_ms = m[2] - m[1];
    run.output_projection_ms = m.size() >= 4 ? m[3] - m[2] : 0.0;
}

/// The result, copied out of the mapped output (and weights).
attention_output assemble(const buffer_cache& bufs, const plan& p, const attention_problem& problem,
                          const device_info& info, bool staged_io) {
    attention_output result;
    result.shape = problem.shape;
    result.implementation = p.impl;
    result.kernel = p.family;
    result.device = info.name;
    result.output.resize(p.out_bytes / 4);
    if (p.weights_bytes) result.weights.resize(p.weights_bytes / 4);
    if (staged_io) {
        bufs.staging_out.invalidate();
        std::memcpy(result.output.data(), bufs.staging_out.mapped(), p.out_bytes);
        if (p.weights_bytes)
            std::memcpy(result.weights.data(), bufs.staging_out.mapped() + p.out_bytes, p.weights_bytes);
    } else {
        bufs.out.invalidate();
        std::memcpy(result.output.data(), bufs.out.mapped(), p.out_bytes);
        if (p.weights_bytes) {
            bufs.scores.invalidate();
            std::memcpy(result.weights.data(), bufs.scores.mapped(), p.weights_bytes);
        }
    }
    return result;
}

}  // namespace

attention_run run_attention(dispatch_environment& env, const attention_problem& problem) {
    flash_cpu_plan cpu_plan;
    const plan p = plan_call(env, problem, cpu_plan);
    const bool staged_io = ensure_buffers(env, p, cpu_plan);
    const input_facts facts = scan_inputs(problem);  // for the range guard's verdicts
    const bool guard = !range_proven_on_host(p, problem, facts);
    const call_bindings b = bind(env.buffers, p);
    executor& exec = env.exec;
    exec.begin();
    upload(exec, env.buffers, p, problem, staged_io);
    exec.mark();                  // inputs on the device
    buffer_view projection_view;  // the projection's texel view, where it takes the texel variant
    record_projection(env, env.buffers, p, b, projection_view, guard);
    exec.mark();         // projections done
    staged_views views;  // the staged products' texel views, where they take the texel variants
    if (p.impl == implementation::fused)
        record_fused(env, p, cpu_plan, b);
    else
        record_staged(env, env.buffers, p, b, facts.projection_inputs_finite, views);
    exec.mark();  // attention done
    if (p.d_out) {
        record_output_projection(env, env.buffers, p, b);
        exec.mark();  // output projection done
    }
    record_download(exec, env.buffers, p, staged_io);

    attention_run run;
    run.device_ms = exec.submit_and_wait();
    if (guard) check_range_guard(env.buffers.guard, p, problem, facts);  // throws numeric_overflow
    run.range_guard = guard;
    read_phases(exec.marks_ms(), run);
    run.output = assemble(env.buffers, p, problem, env.dev.info(), staged_io);
    check_outputs(run.output, p, facts);  // second line of defence: throws numeric_overflow
    return run;
}

}  // namespace qkv::vulkan::detail
