#include "plan/attention_plan.hpp"

#include <algorithm>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

std::string mib(std::uint64_t bytes) {
    const double m = static_cast<double>(bytes) / (1024.0 * 1024.0);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f MiB", m);
    return buf;
}

void check_range(const char* what, std::uint64_t bytes, const device_info& info, const char* advice) {
    if (bytes > info.max_storage_buffer_range)
        throw limit_exceeded(std::string(what) + " needs " + std::to_string(bytes) + " bytes (" + mib(bytes) +
                             "), more than this device's maxStorageBufferRange of " +
                             std::to_string(info.max_storage_buffer_range) + " bytes (" +
                             mib(info.max_storage_buffer_range) + ")" + advice);
}

}  // namespace

plan make_plan(const attention_problem& problem, const device_info& info, std::uint64_t storage_alignment) {
    const attention_shape& s = problem.shape;
    const run_options& o = problem.options;
    plan p;
    p.impl = resolve_implementation(o);
    const std::uint64_t head_d = s.d_k / s.heads, head_dv = s.d_v / s.heads;
    if (p.impl == implementation::fused && (head_d > fused_max_head || head_dv > fused_max_head)) {
        if (o.implementation == implementation::fused)
            throw limit_exceeded("the fused implementation takes heads up to " + std::to_string(fused_max_head) +
                                 " wide; these are " + std::to_string(head_d) + " (Q, K) and " +
                                 std::to_string(head_dv) + " (V); use the staged implementation");
        p.impl = implementation::staged;  // automatic: fall back
    }
    p.fp16 = o.precision == precision::fp16;
    if (p.fp16 && !info.fp16_storage)
        throw unavailable("fp16 precision needs 16-bit storage buffers (storageBuffer16BitAccess), which " + info.name +
                          " does not support; use fp32");

    // Every dimension must fit the shaders' 32-bit indexing; the range checks below are stricter
    // for the tensors, this catches absurd single dimensions early.
    const std::uint64_t dims[] = {s.batch, s.seq, s.d_in, s.d_k, s.d_v, s.heads, s.d_out};
    for (std::uint64_t d : dims)
        if (d > 0x7fffffffu) throw limit_exceeded("a dimension of " + std::to_string(d) + " exceeds 2^31 - 1");
    if (2 * std::uint64_t{s.d_k} + s.d_v > 0x7fffffffu)
        throw limit_exceeded("the packed Q|K|V row (2 d_k + d_v = " + std::to_string(2 * std::uint64_t{s.d_k} + s.d_v) +
                             ") exceeds 2^31 - 1");
    p.batch = static_cast<std::uint32_t>(s.batch);
    p.seq = static_cast<std::uint32_t>(s.seq);
    p.d_in = static_cast<std::uint32_t>(s.d_in);
    p.d_k = static_cast<std::uint32_t>(s.d_k);
    p.d_v = static_cast<std::uint32_t>(s.d_v);
    p.heads = static_cast<std::uint32_t>(s.heads);
    p.d_out = static_cast<std::uint32_t>(s.d_out);
    p.ld = 2 * p.d_k + p.d_v;
    p.bias = !problem.bq.empty() || !problem.bk.empty() || !problem.bv.empty();
    p.mask = !problem.mask.empty();
    p.additive = !problem.additive_mask.empty();
    p.causal = o.causal;
    const std::uint64_t nn = std::uint64_t{s.seq} * s.seq;
    p.mask_batched = p.mask && problem.mask.size() != nn;
    p.additive_batched = p.additive && problem.additive_mask.size() != nn;
    p.scale = o.scale ? *o.scale : default_scale(s);

    const std::uint64_t rows = std::uint64_t{s.batch} * s.seq;
    std::uint64_t at = 0;
    auto place = [&](range& r, std::uint64_t bytes) {
        if (bytes == 0) return;
        r = {at, bytes};
        at = align_up(at + bytes, storage_alignment);
    };
    place(p.x, rows * s.d_in * 4);
    place(p.w, std::uint64_t{s.d_in} * p.ld * 4);
    place(p.b, p.bias ? std::uint64_t{p.ld} * 4 : 0);
    place(p.wo, std::uint64_t{s.d_v} * s.d_out * 4);
    place(p.bo, problem.bo.empty() ? 0 : std::uint64_t{s.d_out} * 4);
    place(p.mask_bits, p.mask ? (problem.mask.size() + 31) / 32 * 4 : 0);
    place(p.additive_mask, problem.additive_mask.size() * 4);
    p.inputs_bytes = at;

    p.qkv_bytes = rows * p.ld * (p.fp16 ? 2 : 4);
    p.scores_bytes = p.impl == implementation::staged ? std::uint64_t{s.batch} * s.heads * nn * 4 : 0;
    p.concat_bytes = s.d_out ? rows * s.d_v * 4 : 0;
    p.out_bytes = rows * s.out_width() * 4;
    p.weights_bytes = o.return_weights ? p.scores_bytes : 0;
    p.readback_bytes = p.out_bytes + p.weights_bytes;

    check_range("the input x (batch x seq x d_in floats)", p.x.size, info, "");
    check_range("the packed projection weights (d_in x (2 d_k + d_v) floats)", p.w.size, info, "");
    check_range("the additive mask", p.additive_mask.size, info, "");
    check_range("the projected Q|K|V (batch x seq x (2 d_k + d_v))", p.qkv_bytes, info,
                "; split the batch into several calls");
    check_range("the staged implementation's score matrix (batch x heads x seq x seq floats)", p.scores_bytes, info,
                "; use the fused implementation, which never stores the scores, or split the batch");
    check_range("the output", p.out_bytes, info, "; split the batch into several calls");
    check_range("the concatenated heads (batch x seq x d_v floats)", p.concat_bytes, info, "");

    p.softmax_workgroup = softmax_workgroup(info, p.seq);
    if (p.impl == implementation::staged && info.type == device_type::cpu) {
        // One softmax invocation strides over a whole row; CPU implementations end an
        // invocation's loops after 65,535 iterations (the products split K instead).
        const std::uint64_t loops =
            softmax_loop_iterations(p.softmax_workgroup, p.seq, info.subgroup_size, info.subgroup_arithmetic);
        if (loops >= cpu_loop_limit)
            throw limit_exceeded("the staged softmax over rows of " + std::to_string(p.seq) + " scores needs " +
                                 std::to_string(loops) + " loop iterations per invocation, more than the 65,535 that " +
                                 info.name + " runs; use the fused implementation");
    }

    const std::uint64_t total = p.inputs_bytes + p.qkv_bytes + p.scores_bytes + p.concat_bytes + p.out_bytes;
    if (info.device_local_memory && total > info.device_local_memory)
        throw limit_exceeded("this call needs " + mib(total) + " of device memory, more than the " +
                             mib(info.device_local_memory) + " of " + info.name);
    return p;
}

std::uint64_t projection_view_bytes(const plan& p) {
    return (std::max(p.x.offset + p.x.size, p.w.offset + p.w.size) + 15) / 16 * 16;
}

kernel_family choose_family(kernel_family asked, device_type type, const family_refusal& no,
                            const family_refusal& coop) {
    if (asked == kernel_family::coopmat) {
        if (coop.why.empty()) return kernel_family::coopmat;
        if (coop.limit) throw limit_exceeded(coop.why);
        throw unavailable(coop.why);
    }
    if (asked == kernel_family::automatic && coop.why.empty() && coop.automatic) return kernel_family::coopmat;
    if (asked == kernel_family::block_tiles) return kernel_family::block_tiles;
    if (asked == kernel_family::automatic && type != device_type::cpu) return kernel_family::block_tiles;
    if (no.why.empty()) return kernel_family::row_tiles;
    if (asked == kernel_family::automatic) return kernel_family::block_tiles;
    if (no.limit) throw limit_exceeded(no.why);
    throw unavailable(no.why);
}

void choose_kernels(plan& p, const device_info& info, const device_facts& facts, kernel_family asked) {
    const std::uint32_t N = p.seq, dh = p.d_k / p.heads, dvh = p.d_v / p.heads;
    const bool fused = p.impl == implementation::fused;
    // The GPU-tile test hook (context_options::fused_tiles_as) is for the gpu family.
    const kernel_family fused_asked =
        facts.fused_tiles_as && asked == kernel_family::automatic ? kernel_family::block_tiles : asked;
    if (!fused && asked == kernel_family::coopmat)
        throw unavailable(
            "the staged implementation (which the weights need) has no cooperative-matrix products: kernel "
            "coopmat runs the fused implementation only");
    p.family =
        fused ? choose_family(fused_asked, info.type, facts.cpu_refusal, facts.coop_refusal) : kernel_family::automatic;
    const bool cpu_family = p.family == kernel_family::row_tiles;
    p.flash_chunk_keys =
        !fused       ? N
        : cpu_family ? facts.cpu_chunk_keys
        : p.family == kernel_family::coopmat
            ? facts.coop_chunk_keys
            : flash_chunk_keys(info, facts.subgroups, N, dh, dvh, facts.max_fused_keys, facts.fused_tiles_as);
    const std::uint32_t dispatches_per_chunk = cpu_family ? 2 : 1;  // flash_cpu: plain and careful pipelines
    const std::uint64_t dispatches =
        (std::uint64_t{N} + p.flash_chunk_keys - 1) / p.flash_chunk_keys * dispatches_per_chunk;
    if (dispatches > 1000)
        throw limit_exceeded("the fused kernel would need " + std::to_string(dispatches) + " dispatches of " +
                             std::to_string(p.flash_chunk_keys) + " keys each for seq = " + std::to_string(N) + " on " +
                             info.name + " (at most 1000 per call)");

    p.cpu_gemm = cpu_kernels(info, asked);
    p.range_guard = info.subgroup_arithmetic
                        ? (p.fp16 ? shader_id::range_guard_subgroup_f16 : shader_id::range_guard_subgroup)
                        : (p.fp16 ? shader_id::range_guard_f16 : shader_id::range_guard);
    const settings& set = facts.set ? *facts.set : settings{};
    p.project = plan_gemm(info, p.cpu_gemm, p.fp16 ? shader_id::project_f16 : shader_id::project,
                          std::uint64_t{p.batch} * N, p.ld, p.d_in);
    // The texel variant reads whole texels of 4 floats: X's rows, the weights' rows and both
    // offsets must start on one (the fallback is the storage-buffer variant planned above).
    if (p.cpu_gemm && facts.projection_texels && p.d_in % 4 == 0 && p.ld % 4 == 0 && p.x.offset % 16 == 0 &&
        p.w.offset % 16 == 0)
        p.project = plan_projection_texels(info, set, p.fp16, std::uint64_t{p.batch} * N, p.ld, p.d_in);
    if (!fused) {
        p.scores = plan_gemm(info, p.cpu_gemm, p.fp16 ? shader_id::scores_f16 : shader_id::scores, N, N, dh);
        p.aggregate = plan_gemm(info, p.cpu_gemm, p.fp16 ? shader_id::aggregate_f16 : shader_id::aggregate, N, dvh, N);
        p.softmax = info.subgroup_arithmetic ? shader_id::softmax_subgroup : shader_id::softmax;
        // Texel variants: Q and K (scores), P and V (aggregation) must start and stride on whole
        // texels of 4 elements: Q|K|V rows of ld, heads of dh and dvh columns, P rows of N.
        if (p.cpu_gemm && facts.staged_texels && cpu_shuffle(info, cpu_lanes(info), set) && p.ld % 4 == 0) {
            if (dh % 4 == 0) p.scores = plan_staged_texels(info, shader_id::scores_cpu_tx, N, N, dh);
            if (dvh % 4 == 0 && N % 4 == 0)
                p.aggregate = plan_staged_texels(info, shader_id::aggregate_cpu_tx, N, dvh, N);
        }
        // The softmax with a row per lane, read through a texel view of the scores (rows of whole
        // texels; each lane walks its row twice, N / 4 steps each, under the loop limit).
        if (p.cpu_gemm && facts.staged_texels && N % 4 == 0 && std::uint64_t{N} / 2 + 4 < cpu_loop_limit - 1024) {
            p.softmax = shader_id::softmax_cpu_tx;
            p.softmax_workgroup = cpu_lanes(info);
        }
    }
    if (p.d_out)
        p.out_projection = plan_gemm(info, p.cpu_gemm, shader_id::project, std::uint64_t{p.batch} * N, p.d_out, p.d_v);
}

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

device_facts device_facts_for(const plan& p, const device_desc& desc, const settings& set) {
    device_facts facts;
    facts.subgroups = desc.subgroups;
    facts.max_fused_keys = set.max_fused_keys;
    facts.fused_tiles_as = set.tiles_as();
    facts.cpu_chunk_keys = p.cpu.chunk_keys;
    const flash_cpu_refusal no = check_flash_cpu(desc, p.cpu);
    facts.cpu_refusal = {no.why, no.limit};
    facts.set = &set;
    // The projection's texel variant reads one RGBA32F view of the inputs from offset 0 through
    // X and the packed weights (settings::project_texels false keeps the storage-buffer variant).
    facts.projection_texels = set.project_texels && desc.texels_rgba32f && projection_view_bytes(p) >= 16 &&
                              projection_view_bytes(p) / 16 <= desc.max_texel_elements;
    // The staged products' views: all of Q|K|V (texels of 4 elements) and all of the scores.
    facts.staged_texels = desc.uniform_texels(p.fp16) && desc.texels_rgba32f &&
                          std::uint64_t{p.batch} * p.seq * p.ld / 4 <= desc.max_texel_elements &&
                          p.scores_bytes / 16 <= desc.max_texel_elements;
    return facts;
}

plan plan_attention(const attention_problem& problem, const device_desc& desc, const settings& set) {
    plan p = make_plan(problem, desc.info, desc.storage_alignment);
    p.layout = attention_layout(p);
    p.cpu = plan_flash_cpu(desc, p.layout, set);
    device_facts facts = device_facts_for(p, desc, set);
    if (p.impl == implementation::fused) {
        facts.coop_refusal = coop_refusal(desc, p.layout, set, p.coop);
        facts.coop_chunk_keys = p.coop.chunk_keys;
    }
    choose_kernels(p, desc.info, facts, problem.options.kernel);
    if (p.impl == implementation::fused && p.family == kernel_family::block_tiles)
        p.gpu = plan_flash_gpu(desc, p.layout, set);
    return p;
}

family_refusal coop_refusal(const device_desc& desc, const flash_layout& layout, const settings& set,
                            flash_coop_plan& plan) {
    coop_tiles tiles;
    const coop_verdict v = check_coop(desc, layout, false, set, tiles);
    if (!v.why.empty()) return {v.why, v.limit, false};
    plan = plan_flash_coop(desc, layout, set);
    return {{}, false, v.automatic};
}

}  // namespace qkv::vulkan::detail
