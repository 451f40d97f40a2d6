#include "dispatch.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "flash_gpu.hpp"
#include "plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "range_guard.hpp"
#include "stages.hpp"

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

/// Which family of the fused kernel runs (run_options::kernel):
///   asked for   device         runs
///   automatic   CPU            cpu, or gpu where the cpu family cannot run here
///   automatic   GPU, other     gpu
///   cpu         any            cpu, or a typed error saying why it cannot
///   gpu         any            gpu (shaders/flash.comp)
kernel_family choose_family(kernel_family asked, const device& dev, const flash_cpu_plan& cpu_plan) {
    if (asked == kernel_family::gpu) return kernel_family::gpu;
    if (asked == kernel_family::automatic && dev.info().type != device_type::cpu) return kernel_family::gpu;
    const flash_cpu_refusal no = check_flash_cpu(dev, cpu_plan);
    if (no.why.empty()) return kernel_family::cpu;
    if (asked == kernel_family::automatic) return kernel_family::gpu;
    if (no.limit) throw limit_exceeded(no.why);
    throw unavailable(no.why);
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

}  // namespace

attention_output run_attention(dispatch_environment& env, const attention_problem& problem) {
    const device_info& info = env.dev.info();
    const std::uint64_t alignment = std::max<std::uint64_t>(env.dev.limits().minStorageBufferOffsetAlignment, 16);
    const plan p = make_plan(problem, info, alignment);
    buffer_cache& bufs = env.buffers;
    allocator& alloc = env.alloc;

    // ---- buffers (reused between calls of similar size) ----
    // An allocation failure releases every cached buffer: the failed call keeps nothing, and the
    // next call starts from what it needs.
    bool staged_io = false;
    const bool fused = p.impl == implementation::fused;
    const flash_layout layout = attention_layout(p);
    const flash_cpu_plan cpu_plan = plan_flash_cpu(env.dev, layout, env.max_fused_keys);
    const kernel_family family =
        fused ? choose_family(
                    // The GPU-tile test hook (context_options::fused_tiles_as) is for the gpu family.
                    env.fused_tiles_as && problem.options.kernel == kernel_family::automatic ? kernel_family::gpu
                                                                                             : problem.options.kernel,
                    env.dev, cpu_plan)
              : kernel_family::automatic;
    const bool cpu_family = family == kernel_family::cpu;
    const flash_gpu_plan gpu_plan = fused && !cpu_family
                                        ? plan_flash_gpu(env.dev, layout, env.max_fused_keys, env.fused_tiles_as)
                                        : flash_gpu_plan{};
    const std::uint32_t flash_chunk = !fused ? p.seq : cpu_family ? cpu_plan.chunk_keys : gpu_plan.chunk_keys;
    const std::uint32_t dispatches_per_chunk = cpu_family ? 2 : 1;  // flash_cpu: plain and careful pipelines
    if ((p.seq + flash_chunk - 1) / flash_chunk * dispatches_per_chunk > 1000)
        throw limit_exceeded("the fused kernel would need " +
                             std::to_string((p.seq + flash_chunk - 1) / flash_chunk * dispatches_per_chunk) +
                             " dispatches of " + std::to_string(flash_chunk) + " keys each for seq = " +
                             std::to_string(p.seq) + " on " + info.name + " (at most 1000 per call)");
    try {
        ensure(alloc, bufs.inputs, p.inputs_bytes, memory_use::device, "inputs");
        ensure(alloc, bufs.qkv, p.qkv_bytes, memory_use::device, "Q|K|V");
        if (p.scores_bytes) ensure(alloc, bufs.scores, p.scores_bytes, memory_use::device, "scores");
        if (p.concat_bytes) ensure(alloc, bufs.concat, p.concat_bytes, memory_use::device, "concatenated heads");
        ensure(alloc, bufs.out, p.out_bytes, memory_use::device, "output");
        prepare_range_guard(alloc, bufs.guard, p);
        bufs.flash_views = {};  // made again below, for this call's layout
        if (cpu_family)
            ensure(alloc, bufs.flash_texels, cpu_plan.bytes, memory_use::device, "fused-attention texels",
                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        else
            bufs.flash_texels.reset();
        if (flash_chunk < p.seq)
            ensure(alloc, bufs.flash_state, std::uint64_t{p.batch} * p.heads * p.seq * 8, memory_use::device,
                   "fused-attention chunk state");
        else
            bufs.flash_state.reset();
        // Where device memory is host-visible (lavapipe, integrated GPUs) inputs and results are
        // mapped directly; otherwise they go through staging buffers and copies in the same submit.
        staged_io = env.force_staging || !bufs.inputs.mapped() || !bufs.out.mapped() ||
                    (p.weights_bytes && !bufs.scores.mapped());
        if (staged_io) {
            ensure(alloc, bufs.staging_in, p.inputs_bytes, memory_use::upload, "upload staging");
            ensure(alloc, bufs.staging_out, p.readback_bytes, memory_use::readback, "readback staging");
        } else {
            bufs.staging_in.reset();
            bufs.staging_out.reset();
        }
    } catch (const out_of_memory&) {
        bufs = buffer_cache{};
        throw;
    }

    // ---- upload ----
    const input_facts facts = scan_inputs(problem);  // for the range guard's verdicts
    const buffer& upload = staged_io ? bufs.staging_in : bufs.inputs;
    pack_inputs(upload.mapped(), p, problem);
    upload.flush();

    // ---- record ----
    executor& exec = env.exec;
    pipeline_set& pipes = env.pipes;
    exec.begin();
    if (staged_io) {
        exec.copy(bufs.staging_in.handle(), 0, bufs.inputs.handle(), 0, p.inputs_bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                     VK_ACCESS_SHADER_READ_BIT);
    }
    exec.mark();  // inputs on the device
    const std::uint32_t N = p.seq, H = p.heads, B = p.batch;
    const bool cpu = cpu_kernels(info, problem.options.kernel);  // family of the matrix products
    const std::uint32_t dh = p.d_k / H, dvh = p.d_v / H;
    const binding qkv = whole(bufs.qkv, p.qkv_bytes);
    const binding any_input = part(bufs.inputs, p.x);  // bound where a shader reads nothing

    {  // Stage 1: Q|K|V = X · [Wq|Wk|Wv] + [bq|bk|bv], one product for all three.
        gemm_push g;
        g.M = B * N, g.N = p.ld, g.K = p.d_in;
        g.a_rs = p.d_in, g.b_rs = p.ld, g.b_cs = 1, g.c_rs = p.ld;
        g.flags = p.bias ? flag_bias : 0;
        record_gemm(exec, pipes, info, cpu, p.fp16 ? shader_id::project_f16 : shader_id::project,
                    {part(bufs.inputs, p.x), part(bufs.inputs, p.w), p.bias ? part(bufs.inputs, p.b) : any_input, qkv},
                    g, 1);
        exec.compute_barrier();
        // Finite inputs too large for float32 / float16: checked here, reported after the submit.
        record_range_guard(exec, pipes, bufs.guard, p, qkv);
        exec.mark();  // projections done
    }
    const buffer& attn_out = p.d_out ? bufs.concat : bufs.out;
    const std::uint64_t attn_out_bytes = p.d_out ? p.concat_bytes : p.out_bytes;
    const std::uint32_t mask_flags =
        (p.causal ? flag_causal : 0) | (p.mask ? flag_mask : 0) | (p.additive ? flag_additive : 0);
    const binding mask_bits = p.mask ? part(bufs.inputs, p.mask_bits) : any_input;
    const binding additive = p.additive ? part(bufs.inputs, p.additive_mask) : any_input;
    if (p.impl == implementation::fused) {
        // One dispatch: every (batch, head), every block of query rows, online softmax.
        const binding state = bufs.flash_state ? whole(bufs.flash_state, bufs.flash_state.size()) : any_input;
        const flash_io io{qkv, mask_bits, additive, whole(attn_out, attn_out_bytes), state};
        if (cpu_family) {
            bufs.flash_views = make_flash_cpu_views(env.dev, bufs.flash_texels, cpu_plan);
            const flash_cpu_texels tx{bufs.flash_texels.handle(), bufs.flash_views.q.handle(),
                                      bufs.flash_views.k.handle(), bufs.flash_views.v.handle()};
            record_flash_cpu(exec, pipes, layout, cpu_plan, io, tx);
        } else {
            record_flash_gpu(exec, pipes, layout, gpu_plan, io);
        }
    } else {
        // Stage 2: scores of every (batch, head): Q_h · K_hᵀ · scale, masked.
        gemm_push g;
        g.M = N, g.N = N, g.K = dh, g.heads = H;
        g.a_off = 0, g.a_bs = N * p.ld, g.a_hs = dh, g.a_rs = p.ld;                  // Q_h
        g.b_off = p.d_k, g.b_bs = N * p.ld, g.b_hs = dh, g.b_rs = 1, g.b_cs = p.ld;  // K_hᵀ
        g.c_bs = H * N * N, g.c_hs = N * N, g.c_rs = N;
        g.scale = p.scale;
        g.flags = mask_flags;
        g.mask_bs = p.mask_batched ? N * N : 0;
        g.add_bs = p.additive_batched ? N * N : 0;
        const binding scores = whole(bufs.scores, p.scores_bytes);
        record_gemm(exec, pipes, info, cpu, p.fp16 ? shader_id::scores_f16 : shader_id::scores,
                    {qkv, mask_bits, additive, scores}, g, B * H);
        exec.compute_barrier();
        // Stage 3: softmax of every row, in place.
        record_softmax(exec, pipes, info, scores, B * H * N, N);
        exec.compute_barrier();
        // Stage 4: weights · V_h into the head's columns of the output.
        gemm_push a;
        a.M = N, a.N = dvh, a.K = N, a.heads = H;
        a.a_bs = H * N * N, a.a_hs = N * N, a.a_rs = N;                                   // P
        a.b_off = 2 * p.d_k, a.b_bs = N * p.ld, a.b_hs = dvh, a.b_rs = p.ld, a.b_cs = 1;  // V_h
        a.c_bs = N * p.d_v, a.c_hs = dvh, a.c_rs = p.d_v;
        a.flags = p.causal ? flag_causal : 0;
        record_gemm(exec, pipes, info, cpu, p.fp16 ? shader_id::aggregate_f16 : shader_id::aggregate,
                    {scores, qkv, whole(attn_out, attn_out_bytes)}, a, B * H);
    }
    exec.mark();    // attention done
    if (p.d_out) {  // Output projection: concat · Wo + bo.
        exec.compute_barrier();
        gemm_push g;
        g.M = B * N, g.N = p.d_out, g.K = p.d_v;
        g.a_rs = p.d_v, g.b_rs = p.d_out, g.b_cs = 1, g.c_rs = p.d_out;
        g.flags = p.bo.empty() ? 0 : flag_bias;
        record_gemm(exec, pipes, info, cpu, shader_id::project,
                    {whole(bufs.concat, p.concat_bytes), part(bufs.inputs, p.wo),
                     p.bo.empty() ? any_input : part(bufs.inputs, p.bo), whole(bufs.out, p.out_bytes)},
                    g, 1);
        exec.mark();  // output projection done
    }
    // ---- download ----
    if (staged_io) {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_TRANSFER_READ_BIT);
        exec.copy(bufs.out.handle(), 0, bufs.staging_out.handle(), 0, p.out_bytes);
        if (p.weights_bytes)
            exec.copy(bufs.scores.handle(), 0, bufs.staging_out.handle(), p.out_bytes, p.weights_bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
    } else {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
    }
    env.device_ms = exec.submit_and_wait();
    check_range_guard(bufs.guard, p, problem, facts);  // throws numeric_overflow
    if (const std::vector<double>& m = exec.marks_ms(); m.size() >= 3) {
        env.projection_ms = m[1] - m[0];
        env.attention_ms = m[2] - m[1];
        env.output_projection_ms = m.size() >= 4 ? m[3] - m[2] : 0.0;
    }

    attention_output result;
    result.shape = problem.shape;
    result.implementation = p.impl;
    result.kernel = family;
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
    check_outputs(result, p, facts);  // second line of defence: throws numeric_overflow
    return result;
}

}  // namespace qkv::vulkan::detail
